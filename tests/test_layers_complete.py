"""Every module of the package is in a layer of the import contracts
(pyproject.toml), so `lint-imports` checks which way each one's imports point."""

from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _layered(container: str | None) -> set[str]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    names: set[str] = set()
    for contract in contracts["contracts"]:
        if contract.get("containers", [None]) == [container] and "layers" in contract:
            for layer in contract["layers"]:
                names |= {part.strip() for part in layer.replace("|", ":").split(":")}
    return names


ROOMS = [f"engine/{room}" for room in ("loop", "drafting", "planner", "loading", "forward", "remote")]
PACKAGE = ROOT / "specdeck"


@pytest.mark.parametrize("folder", ["engine", "app", "cli", "bench", "train", *ROOMS])
def test_every_module_is_in_a_layer(folder):
    """Each module (and each sub-package, as one) of engine/, its rooms, app/, cli/, bench/ and
    train/ is named in its folder's layers contract."""
    modules = {p.stem for p in (PACKAGE / folder).glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in (PACKAGE / folder).iterdir() if (p / "__init__.py").is_file()}
    missing = sorted(modules - _layered("specdeck." + folder.replace("/", ".")))
    assert not missing, f"not in a layer of pyproject.toml's contract for {folder}/: {missing}"


def test_every_package_is_in_the_top_layers():
    """Every sub-package of specdeck/ is in the contract that orders the command line, the window,
    the benchmarks, training, the engine and the bundled files."""
    packages = {f"specdeck.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    for folder in packages:
        assert folder in _layered(None), f"{folder} is in no layer of the top-level contract"
    assert {"app", "bench", "train"} <= {name.split(".")[1] for name in packages}


def test_every_room_of_the_engine_has_its_contract():
    """A sub-package of engine/ is a room with a layers contract of its own, so a new one cannot
    go unchecked."""
    rooms = {f"engine/{p.name}" for p in (PACKAGE / "engine").iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(ROOMS)


def test_no_layer_lets_two_modules_import_each_other():
    """No layer of any contract uses `a : b` (two modules that may import each other): with every
    module in a layer and independent siblings (`a | b`), lint-imports then finds any import circle,
    also one hidden in a function-level import."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    shared = [layer for c in contracts["contracts"] for layer in c.get("layers", []) if ":" in layer]
    assert not shared, shared
