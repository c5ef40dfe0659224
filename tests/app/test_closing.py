"""Closing the window: during a load it goes within 2 s, whatever the load's stage is doing, and
keeps what it remembers; the loading dialog lets the close and Ctrl+Q through."""

from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import Qt

from specdeck.app.model_host import ModelHost

CLOSE_LIMIT_S = 2.0


@pytest.fixture
def stuck_load():
    """A load whose one stage ignores cancelling until released (a large file read in one call)."""
    release = threading.Event()

    def load(spec, progress=None):
        progress("Reading a large file")
        release.wait(60)
        raise RuntimeError("released")

    yield load, release
    release.set()


def _loading_window(qtbot, loop, settings, load):
    from specdeck.app.main_window import MainWindow

    host = ModelHost(load_fn=load)
    window = MainWindow(settings=settings, host=host)
    qtbot.addWidget(window)
    window.show()
    window.model_panel.load_button.click()
    qtbot.waitUntil(lambda: window._progress is not None and "large file" in window._progress.labelText())
    return window


def test_close_during_a_load_ends_within_two_seconds_and_keeps_the_settings(qtbot, loop, settings, stuck_load, errors):
    """A close while a load's stage runs returns within 2 s with the window gone and its settings
    saved; the window says the model thread is still busy, so the app ends without it."""
    load, release = stuck_load
    window = _loading_window(qtbot, loop, settings, load)
    window.decoding_panel.k.setValue(5)
    started = time.perf_counter()
    window.close()
    assert time.perf_counter() - started < CLOSE_LIMIT_S
    assert not window.isVisible() and not window.model_thread_ended
    settings.sync()
    assert int(settings.value("decoding/k")) == 5 and settings.value("window/geometry") is not None
    release.set()
    qtbot.waitUntil(lambda: not window.host.thread_running, timeout=5000)


def test_the_loading_dialog_lets_ctrl_q_close_the_window(qtbot, loop, settings, stuck_load, errors):
    """The loading dialog is not modal, so the window's close button and its shortcuts reach it:
    Ctrl+Q (File > Quit) closes the window during a load."""
    load, release = stuck_load
    window = _loading_window(qtbot, loop, settings, load)
    assert window._progress.windowModality() == Qt.WindowModality.NonModal
    width = window._progress.width()
    window._on_load_progress("A stage with a long name " * 6)
    assert window._progress.width() == width  # a long stage wraps: the dialog keeps its size
    quit_action = window.menus.quit_action
    assert quit_action.isEnabled()
    started = time.perf_counter()
    quit_action.trigger()
    assert time.perf_counter() - started < CLOSE_LIMIT_S and not window.isVisible()
    release.set()
    qtbot.waitUntil(lambda: not window.host.thread_running, timeout=5000)


def test_an_idle_window_closes_within_a_second_and_ends_its_thread(qtbot, loop, settings):
    """With nothing running, a close ends the model thread and returns within 1 s."""
    from specdeck.app.main_window import MainWindow

    window = MainWindow(settings=settings)
    qtbot.addWidget(window)
    window.show()
    started = time.perf_counter()
    window.close()
    assert time.perf_counter() - started < 1.0
    assert window.model_thread_ended and not window.host.thread_running
