"""The engine, the benchmarks and training are plain Python and torch: importing all of them loads no
Qt, and nothing of the window or the command line. The import contracts (pyproject.toml) check the
imports written in the code; this imports every module, so an import made at run time counts too."""

import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specdeck"
QT_FREE = ["engine", "bench", "train"]
FORBIDDEN = ("PySide6", "pyqtgraph", "qasync", "specdeck.app", "specdeck.cli")


def test_engine_bench_and_train_import_no_qt():
    """Importing every module of specdeck.engine, specdeck.bench and specdeck.train pulls in neither
    PySide6, pyqtgraph, qasync, specdeck.app nor specdeck.cli."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"for name in {[f'specdeck.{package}' for package in QT_FREE]}:\n"
        "    package = importlib.import_module(name)\n"
        "    for module in pkgutil.walk_packages(package.__path__, name + '.'):\n"
        "        importlib.import_module(module.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=240)
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    # the walk reached every module of the three packages, so an empty answer means no Qt
    files = {path.relative_to(PACKAGE.parent).with_suffix("") for p in QT_FREE for path in (PACKAGE / p).rglob("*.py")}
    expected = {".".join(f.parts[:-1] if f.name == "__init__" else f.parts) for f in files}
    assert expected <= loaded, f"not imported: {sorted(expected - loaded)}"
    bad = sorted({top for name in loaded for top in FORBIDDEN if name == top or name.startswith(top + ".")})
    assert not bad, f"importing the Qt-free packages loaded {bad}"
