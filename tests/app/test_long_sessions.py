"""Long sessions do not abort the interpreter: PySide6 6.12.0's emit() drops a reference to True
on every call (fatal on Python < 3.12), so pyproject.toml excludes that release."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_many_emits_do_not_abort_the_interpreter():
    """200,000 emits, far more than True has references at start-up, leave Python running."""
    code = (
        "import specdeck.app\n"
        "from PySide6.QtCore import QObject, Signal\n"
        "class Source(QObject):\n"
        "    fired = Signal(int, tuple)\n"
        "source = Source()\n"
        "source.fired.connect(lambda i, batch: None)\n"
        "for i in range(200_000):\n"
        "    source.fired.emit(i, ())\n"
        "print('alive')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "alive"
