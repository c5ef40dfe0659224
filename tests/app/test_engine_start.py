"""The window before the engine: it is built and shown without torch, the model thread imports the
engine once it shows, and a Run pressed meanwhile waits visibly and then runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter

from tiny import set_tiny_pair

from specdeck.app import worker
from specdeck.app.model_host import STARTING

TIMEOUT_MS = 60_000
HEAVY = (
    "torch",
    "transformers",
    "pydantic",  # the served target's answer schemas: only a server's first answer needs them
    "specdeck.engine.session",
    "specdeck.bench.runner",
    "specdeck.engine.planner.costs",
)


def test_building_the_window_imports_neither_torch_nor_transformers():
    """A fresh process that imports the window's module and builds the MainWindow has loaded no torch,
    no transformers, no pydantic and none of the engine's modules that need them (they would delay the first paint
    by seconds)."""
    code = (
        "import json, sys\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from specdeck.app.main_window import MainWindow\n"
        "window = MainWindow(settings=None)\n"
        "loaded = sorted(sys.modules)\n"
        "window.close()\n"
        "print(json.dumps(loaded))\n"
    )
    environment = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, env=environment
    )
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert "specdeck.app.main_window" in loaded and "specdeck.engine.pair_spec" in loaded
    assert not loaded & set(HEAVY), f"building the window imported {sorted(loaded & set(HEAVY))}"


def test_run_before_the_engine_started_waits_visibly_then_runs(qtbot, loop, settings, tiny_pair, errors, monkeypatch):
    """While the model thread imports the engine the status bar says so with its busy bar; Run pressed
    then shows that it waits for the engine, and runs once it is there."""
    from specdeck.app.main_window import MainWindow

    release = threading.Event()
    real_import = worker.import_engine

    def slow_import():
        release.wait(30)  # the seconds torch and transformers take on a first launch
        return real_import()

    monkeypatch.setattr(worker, "import_engine", slow_import)
    window = MainWindow(settings=settings)
    qtbot.addWidget(window)
    set_tiny_pair(window, tiny_pair, max_new_tokens=20)
    window.show()
    qtbot.waitUntil(lambda: window.host.engine_starting, timeout=5000)  # after the first paint
    assert window.statusBar().currentMessage() == STARTING and window.waiting.isVisible()

    window.run_button.click()
    qtbot.wait(300)
    assert window.session_model.activity.loading and window.waiting.isVisible()
    assert window._progress is not None and window._progress.labelText() == STARTING
    assert not window.speculative_view.tokens
    release.set()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)
    assert errors == [] and window.speculative_view.tokens
    assert window.session_model.records[0].summary is not None and not window.waiting.isVisible()
    window.close()


def test_an_idle_window_leaves_the_interpreter_to_the_model_thread(qtbot, window):
    """With the window shown, its charts drawn and the busy bar moving (as while the engine imports),
    the GUI thread runs almost no Python: every call there takes the interpreter from the model thread,
    whose import or session then waits."""
    window.show()
    qtbot.waitExposed(window)
    window.waiting.show()
    counts = []
    for _ in range(3):  # the quietest half second: the charts' first draw may fall in the first
        calls: list[str] = []

        def count(frame, event, arg, calls: list[str] = calls) -> None:
            if event == "call":
                calls.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

        sys.setprofile(count)
        try:
            qtbot.wait(500)
        finally:
            sys.setprofile(None)
        counts.append(Counter(calls))
    quietest = min(counts, key=lambda counted: counted.total())
    assert quietest.total() < 20, f"{quietest.total()} Python calls in an idle half second: {quietest.most_common(4)}"
