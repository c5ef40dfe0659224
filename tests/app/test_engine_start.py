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


def _last_json_line(code: str, timeout: int):
    """What the last line of `code`'s output says in JSON, run by a fresh Python on Qt's offscreen
    platform (a process of its own: what it imports is its own)."""
    environment = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=timeout, env=environment
    )
    return json.loads(out.stdout.splitlines()[-1])


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
    loaded = set(_last_json_line(code, timeout=120))
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


def test_the_window_command_starts_the_engine_import_and_the_kernel_at_launch(monkeypatch):
    """`specdeck` and `specdeck gui` start importing the engine before the window's modules import
    (and building the kernel, as every command that loads a model); `specdeck run` imports it itself."""
    from specdeck.app import engine_import
    from specdeck.cli import launch, main
    from specdeck.engine.forward import kernel_build

    started: list[str] = []
    monkeypatch.setattr(kernel_build, "build_in_background", lambda: started.append("kernel"))
    monkeypatch.setattr(engine_import, "import_engine_ahead", lambda: started.append("engine"))
    monkeypatch.setattr(main, "main", lambda: 0)
    for argv, expected in ((["specdeck"], ["kernel", "engine"]), (["specdeck", "gui"], ["kernel", "engine"])):
        monkeypatch.setattr(sys, "argv", argv)
        started.clear()
        assert launch.main() == 0
        assert started == expected, argv
    monkeypatch.setattr(sys, "argv", ["specdeck", "run"])
    started.clear()
    assert launch.main() == 0 and started == ["kernel"]


def test_the_window_paints_while_the_engine_imports_ahead():
    """In a fresh process whose engine import started first (as `specdeck gui` starts it) and is
    held inside torch's import (for a minute at most), the window imports, is built and paints
    while it is held: nothing the window needs waits for the engine; once released, the engine is
    there for the model thread."""
    code = (
        "import importlib.abc, importlib.machinery, json, sys, threading, time\n"
        "release, timed_out = threading.Event(), threading.Event()\n"
        "class Hold(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name != 'torch':\n"
        "            return None\n"
        "        spec = importlib.machinery.PathFinder.find_spec(name, path)\n"
        "        run = spec.loader.exec_module\n"
        "        def exec_module(module):\n"
        "            if not release.wait(60):\n"
        "                timed_out.set()\n"
        "            run(module)\n"
        "        spec.loader.exec_module = exec_module\n"
        "        return spec\n"
        "sys.meta_path.insert(0, Hold())\n"
        "from specdeck.app.engine_import import import_engine, import_engine_ahead\n"
        "ahead = import_engine_ahead()\n"
        "from PySide6.QtCore import QEvent, QObject\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from specdeck.app.main_window import MainWindow\n"
        "window = MainWindow(settings=None)\n"
        "seen = {}\n"
        "class First(QObject):\n"
        "    def eventFilter(self, watched, event):\n"
        "        if watched is window and event.type() == QEvent.Type.Paint and not seen:\n"
        "            seen['importing'] = not timed_out.is_set()\n"
        "        return False\n"
        "first = First()\n"
        "window.installEventFilter(first)\n"
        "window.show()\n"
        "deadline = time.monotonic() + 60\n"
        "while not seen and time.monotonic() < deadline:\n"
        "    app.processEvents()\n"
        "    time.sleep(0.01)\n"
        "release.set()\n"
        "ahead.join(300)\n"
        "engine = import_engine()\n"
        "seen['engine'] = engine.session.__name__\n"
        "window.removeEventFilter(first)\n"
        "window.host.shutdown()\n"
        "print(json.dumps(seen))\n"
    )
    seen = _last_json_line(code, timeout=400)
    assert seen == {"importing": True, "engine": "specdeck.engine.session"}


def test_the_window_command_without_qt_says_what_to_install():
    """Where PySide6 does not import, `specdeck gui` still ends in one line saying what to
    reinstall, not a traceback from the import it starts at launch."""
    code = (
        "import sys\n"
        "sys.modules['PySide6'] = None\n"  # what Python does for a package that is not installed
        "sys.argv = ['specdeck', 'gui']\n"
        "from specdeck.cli import launch\n"
        "sys.exit(launch.main())\n"
    )
    environment = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("specdeck: error: The window needs PySide6, pyqtgraph and qasync (")
    assert line.endswith("reinstall SpecDeck with its dependencies.")
