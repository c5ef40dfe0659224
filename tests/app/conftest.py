"""Fixtures for the window's tests: offscreen Qt, qasync's loop over pytest-qt's application,
a tiny seeded target/draft pair, and a window with its settings in a temporary file."""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
import qasync
import torch
from PySide6.QtCore import QSettings
from tiny import build_pair, set_tiny_pair

# the tiny models run fastest on one thread, and the tests then leave the other core to the GUI
torch.set_num_threads(1)


def pytest_collection_modifyitems(items) -> None:
    # the offscreen platform plugin warns that it cannot size windows to their hints; harmless
    for item in items:
        item.add_marker(pytest.mark.qt_log_ignore("propagateSizeHints"))


@pytest.fixture
def loop(qapp):
    """qasync's event loop, running whenever pytest-qt processes Qt events (as in the real app)."""
    event_loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(event_loop)
    yield event_loop
    # not `stop()`: it calls QApplication.exit(), which with no exec() running would make every
    # later nested Qt event loop (qtbot.wait) return at once
    qapp.aboutToQuit.disconnect(event_loop._after_run_forever)
    event_loop._QEventLoop__is_running = False
    event_loop._after_run_forever()
    asyncio.events._set_running_loop(None)
    event_loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target folder, draft folder): a tiny Llama and a noisy copy that agrees with it often."""
    return build_pair(tmp_path_factory.mktemp("models"), "llama", noise=0.3)


@pytest.fixture
def settings(tmp_path):
    return QSettings(str(tmp_path / "specdeck.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def errors(monkeypatch):
    """Every error dialog the window would show, as (title, message), instead of a modal box."""
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(
        "specdeck.app.dialogs.show_error", lambda parent, title, message: shown.append((title, message))
    )
    return shown


@pytest.fixture
def window(qtbot, loop, settings, tiny_pair, errors):
    """The main window, set to load the tiny pair with the draft-model drafter."""
    from specdeck.app.main_window import MainWindow

    win = MainWindow(settings=settings)
    qtbot.addWidget(win)
    set_tiny_pair(win, tiny_pair, max_new_tokens=40)
    # a fixed K: the tiny draft costs what its tiny target costs, so the auto schedule would mostly
    # take plain steps, and these tests are about how drafts are shown
    win.decoding_panel.schedule.setCurrentText("constant")
    win.decoding_panel.k.setValue(4)
    win.show()
    yield win
    if win.host.thread_running:
        win.close()
