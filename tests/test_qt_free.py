"""The engine is plain Python and torch: importing all of it loads no Qt."""

import subprocess
import sys


def test_engine_imports_no_qt():
    """Importing every engine module pulls in neither PySide6, pyqtgraph, qasync, app nor cli."""
    code = (
        "import pkgutil, importlib, sys, engine\n"
        "for m in pkgutil.walk_packages(engine.__path__, 'engine.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'qasync', 'app', 'cli')]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == ""
