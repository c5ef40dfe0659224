"""The window on a real X screen with a window manager (Xvfb and openbox): on a first launch the
whole frame fits a 1366x768 screen with the headline figures in view, and at 1024x700 nothing is
clipped. The window runs in a process of its own, on Qt's xcb platform; skipped where Xvfb,
openbox or Qt's X11 libraries are missing (`apt-get install xvfb openbox`)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdeck.app.main import xcb_problem

# what the window process reports, once the window manager has framed it and the fit settled
PROBE = r"""
import json, os, sys
from PySide6.QtCore import QPoint, QSettings, QTimer
from PySide6.QtWidgets import QApplication
from specdeck.app.main_window import MainWindow

app = QApplication([])
window = MainWindow(settings=QSettings(sys.argv[1], QSettings.Format.IniFormat))
window.show()
window.session_model.run_started.emit(True)  # a compare run's layout: both views and their headers


def rect(widget):
    corner = widget.mapToGlobal(QPoint(0, 0))
    return [corner.x(), corner.y(), widget.width(), widget.height(), widget.isVisible()]


def report():
    frame, area = window.frameGeometry(), window.screen().availableGeometry()
    charts = window.charts.parentWidget()  # the scroll area's viewport
    print(json.dumps({
        "frame": [frame.x(), frame.y(), frame.width(), frame.height()],
        "inner": [window.geometry().x(), window.geometry().y()],
        "area": [area.x(), area.y(), area.width(), area.height()],
        "headline": [rect(label) for label in window.charts.headline.labels.values()],
        "headers": [rect(view.title) for view in (window.speculative_view, window.plain_view)]
        + [rect(view.show_rejected) for view in (window.speculative_view,)],
        "charts_viewport": rect(charts),
        "plots": [rect(plot) for plot in window.charts.plots],
    }), flush=True)
    window.close()
    app.quit()


QTimer.singleShot(int(sys.argv[2]), report)
app.exec()
if not window.model_thread_ended:  # the engine still importing: ended as `specdeck gui` ends then
    os._exit(0)
"""


def _first_launch():
    """`packaging/first_launch.py`, the script that times a launch on such a screen: it starts one."""
    pytest.importorskip("PIL")  # the script grabs the screen with Pillow
    path = Path(__file__).resolve().parents[2] / "packaging" / "first_launch.py"
    spec = importlib.util.spec_from_file_location("first_launch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _probe(tmp_path: Path, size: str) -> dict:
    if not (shutil.which("Xvfb") and shutil.which("openbox")):
        pytest.skip("needs Xvfb and openbox (apt-get install xvfb openbox)")
    servers, display = _first_launch().x_screen(size)
    try:
        environ = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "XDG_CONFIG_HOME": str(tmp_path)}
        problem = xcb_problem(environ)
        if problem is not None:
            pytest.skip(problem.splitlines()[0])
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(tmp_path / "fresh.ini"), "2500"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for server in reversed(servers):  # the window manager, then the X server
            server.terminate()
            server.wait()
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _inside(outer: list[int], inner: list) -> bool:
    x, y, width, height = outer[:4]
    return x <= inner[0] and y <= inner[1] and inner[0] + inner[2] <= x + width and inner[1] + inner[3] <= y + height


def test_first_launch_fits_the_frame_and_the_figures_on_a_1366_by_768_screen(tmp_path):
    """With a fresh settings file the framed window lies inside the screen's free part, and the
    headline figures (tokens/s, acceptance, speedup) are on screen without scrolling."""
    found = _probe(tmp_path, "1366x768")
    assert found["inner"][1] > found["frame"][1], "the window manager framed the window"
    assert _inside(found["area"], found["frame"]), found
    for label in found["headline"]:
        assert label[4] and _inside(found["frame"], label), (label, found["frame"])


def test_nothing_is_clipped_on_a_1024_by_700_screen(tmp_path):
    """At 1024x700 the views' headers are whole, and every chart lies within the charts' width
    (the charts scroll down, never sideways)."""
    found = _probe(tmp_path, "1024x700")
    assert _inside(found["area"], found["frame"]), found
    for header in found["headers"]:
        assert header[4] and header[3] < 40, header  # one line: a header squeezed into a column is tall
    viewport = found["charts_viewport"]
    for plot in found["plots"]:
        assert viewport[0] <= plot[0] and plot[0] + plot[2] <= viewport[0] + viewport[2], (plot, viewport)
