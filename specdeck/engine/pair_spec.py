"""What to load as a target/drafter pair (`PairSpec`) and the drafter a pair gets by default.

`PairSpec` is the one description of a pair that the command line, the window's model panel and
the Benchmark tab all build; its defaults are the defaults of all three. It writes itself as the
command-line arguments that build it again. A target that is a server's address (`--target
http://HOST:PORT/v1`) is a remote target (`specdeck.engine.remote.remote_target`), served as
`target_model`. The loaded pair is `specdeck.engine.pair.ModelPair`.

Plain Python, no torch: the window builds specs from its panels before the engine has imported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from specdeck.engine.drafting.kinds import DrafterKind, TargetPath
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.identity import builtin_difference
from specdeck.engine.loading.registry import DEFAULT_HEAD, DEFAULT_TARGET, LAST_STATE_HEAD, gguf_file, names_head
from specdeck.engine.remote.remote_http import DEFAULT_TIMEOUT_S, is_url

__all__ = ["DrafterKind", "PairSpec", "default_drafter"]


DEFAULT_DRAFTER = DrafterKind.PROMPT_LOOKUP  # for targets without a built-in draft


def default_drafter(target: str, backend: str | None = None) -> DrafterKind:
    """The drafter a pair gets when none is chosen. The built-in target's (and that of a file of the
    same model, `DrafterKind.builtin_model`) is its feature head, except
    on llama.cpp: there a verify of n tokens costs about n one-token steps on a CPU (each row is its
    own quantized product), so a model's short drafts lose time and only long copies pay; the
    suffix drafter copies them at no model cost and otherwise steps plainly. Another target gets
    prompt lookup. `backend` is what runs the target (`LoadedModel.backend`), None before it loads."""
    if not DrafterKind.FEATURE_HEAD.builtin_model(target):
        return DEFAULT_DRAFTER
    return DrafterKind.SUFFIX if backend == "llama.cpp" else DrafterKind.FEATURE_HEAD


@dataclass(frozen=True)
class PairSpec:
    """Which target and drafter to load, and how. `drafter` and `draft` left None are chosen by
    `resolved()`: the built-in target's feature head, or prompt lookup for another target."""

    target: str = DEFAULT_TARGET
    draft: str | None = None  # a draft model or a feature head
    drafter: DrafterKind | None = None
    device: str = "auto"  # auto, cpu, cuda, cuda:N, mps
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    trust_remote_code: bool = False
    backend: str = "auto"  # what runs a .gguf model: auto, torch, llama.cpp (`specdeck.engine.loading.backends`)
    # a remote target: the model's name on the server, the local tokenizer that is the served model's
    # (default: the draft model's, else the built-in target's), and the longest a request may take
    target_model: str = ""
    tokenizer: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    draft_layers: int | None = None  # the layer-skip drafter's first layers; None: chosen by measurement

    def __post_init__(self) -> None:
        # what a text field or an option holds: blanks mean the default, a kind may come as its name
        object.__setattr__(self, "target", (self.target or "").strip() or DEFAULT_TARGET)
        object.__setattr__(self, "draft", (self.draft or "").strip() or None)
        object.__setattr__(self, "target_model", (self.target_model or "").strip())
        object.__setattr__(self, "tokenizer", (self.tokenizer or "").strip() or None)
        object.__setattr__(self, "device", (self.device or "").strip() or "auto")
        object.__setattr__(self, "dtype", (self.dtype or "").strip() or "auto")
        object.__setattr__(self, "backend", (self.backend or "").strip() or "auto")
        if self.drafter is not None and not isinstance(self.drafter, DrafterKind):
            object.__setattr__(self, "drafter", DrafterKind.named(self.drafter))

    @property
    def remote(self) -> bool:
        """Whether the target is served (its name is an address)."""
        return is_url(self.target)

    @property
    def remote_tokenizer(self) -> str:
        """Whose tokenizer a remote target is read with: `tokenizer`, else a draft model's, else the
        built-in target's."""
        if self.tokenizer:
            return self.tokenizer
        if self.drafter is DrafterKind.DRAFT_MODEL and self.draft:
            return self.draft
        return DEFAULT_TARGET

    def with_drafter(self, drafter: DrafterKind | None, draft: str | None) -> PairSpec:
        """The same target and options with another drafter (the layer count only for a kind that
        takes one)."""
        layers = self.draft_layers if drafter is not None and drafter.takes_layers else None
        return replace(self, drafter=drafter, draft=draft, draft_layers=layers)

    def resolved(self, backend: str | None = None) -> PairSpec:
        """This spec with its drafter kind and model chosen, or a `SpecDeckError` saying what is missing.

        With nothing chosen the target gets `default_drafter` (for the built-in target, its feature
        head, or the suffix drafter where `backend`, what runs the loaded target, is llama.cpp; its
        distilled draft with the draft-model drafter); a draft that names a feature head (an alias or
        a folder) picks the feature-head drafter by itself. On llama.cpp the built-in head, chosen or
        named, is the one on the last state alone: the default head also reads lower layers, which
        llama.cpp does not hand out."""
        drafter, draft = self.drafter, self.draft
        if drafter is not None:
            drafter.refuse(self.path_before_load(backend), draft)
        if drafter is not None and drafter.takes_layers:
            if draft and not draft.isdigit():  # bench's layer-skip:N names the layers
                raise SpecDeckError(
                    f"The {drafter.label} drafter drafts with the target's own layers, not {draft!r}: give "
                    f"it a number of layers (--draft-layers N, in bench --drafters {drafter}:N) or nothing."
                )
            return replace(self, draft=None, draft_layers=int(draft) if draft else self.draft_layers)
        if drafter is not None and not drafter.needs_model and draft:
            raise SpecDeckError(
                f"The {drafter.label} drafter needs no draft model: drop --draft or choose --drafter draft-model."
            )
        if drafter is None and draft:
            drafter = DrafterKind.FEATURE_HEAD if names_head(draft) else DrafterKind.DRAFT_MODEL
        elif drafter is None:
            drafter = default_drafter(self.target, backend)
        draft = draft or drafter.builtin_model(self.target)
        if draft == DEFAULT_HEAD and backend == "llama.cpp" and drafter.reads_head:
            draft = LAST_STATE_HEAD
        if drafter.needs_model and not draft:
            why = (
                ""
                if self.remote
                else f" (SpecDeck's own are for {DEFAULT_TARGET}, and {builtin_difference(self.target)})"
            )
            raise SpecDeckError(
                f"The {drafter} drafter needs a model{why}: pass --draft (in bench --drafters: {drafter}:MODEL)."
            )
        drafter.refuse(self.path_before_load(backend), draft)
        return replace(self, drafter=drafter, draft=draft)

    def path_before_load(self, backend: str | None = None) -> TargetPath | None:
        """The path the target runs on where it is known before a torch target loads: a server's
        address, or llama.cpp (`backend`, what runs the loaded target, or `--backend llama.cpp`)."""
        if self.remote:
            return TargetPath.SERVED
        if backend == "llama.cpp" or (backend is None and self.backend == "llama.cpp"):
            return TargetPath.LLAMA_CPP
        return None

    def default_note(self, backend: str | None = None) -> str | None:
        """Where no drafter is chosen and SpecDeck's own drafters do not attach to the target, the
        line that says which drafter it gets and why (`specdeck.engine.loading.identity`); else None."""
        if self.drafter is not None or self.draft or self.remote:
            return None
        why = builtin_difference(self.target)
        if why is None:
            return None
        name = Path(self.target).name if gguf_file(self.target) else self.target
        return (
            f"{name} gets {default_drafter(self.target, backend).label}: SpecDeck's feature head and "
            f"draft are for {DEFAULT_TARGET}, and {why}"
        )

    @property
    def drafter_entry(self) -> str:
        """The drafter as `specdeck bench --drafters` lists it: kind or kind:MODEL (layer-skip:N)."""
        if self.draft_layers is not None:
            return f"{self.drafter}:{self.draft_layers}"
        return f"{self.drafter}:{self.draft}" if self.draft else str(self.drafter)

    def model_arguments(self) -> list[str]:
        """The command-line arguments for the target and how to load it; defaults are left out."""
        default = PairSpec()
        arguments = ["--target", self.target] if self.target != default.target else []
        if self.remote:
            arguments += ["--target-model", self.target_model] + (
                ["--tokenizer", self.tokenizer] if self.tokenizer else []
            )
            arguments += ["--timeout", f"{self.timeout_s:g}"] if self.timeout_s != default.timeout_s else []
        for flag, value, default_value in (
            ("--device", self.device, default.device),
            ("--dtype", self.dtype, default.dtype),
            ("--backend", self.backend, default.backend),
        ):
            if value != default_value:
                arguments += [flag, value]
        return arguments + (["--trust-remote-code"] if self.trust_remote_code else [])

    def drafter_arguments(self) -> list[str]:
        """The command-line arguments for the drafter and its model, if chosen."""
        return (
            (["--drafter", str(self.drafter)] if self.drafter else [])
            + (["--draft", self.draft] if self.draft else [])
            + (["--draft-layers", str(self.draft_layers)] if self.draft_layers is not None else [])
        )

    def arguments(self) -> list[str]:
        """The `specdeck run` or `specdeck bench` arguments that build this spec again."""
        return self.model_arguments() + self.drafter_arguments()
