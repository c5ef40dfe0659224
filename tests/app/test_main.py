"""`specdeck gui` before the window: the check for Qt's X11 libraries, and Qt's known chatter."""

import pytest
from PySide6.QtCore import qInstallMessageHandler, qWarning

from specdeck.app.main import XCB_LIBRARIES, filter_qt_messages, xcb_problem
from specdeck.cli import main as specdeck_cli

X_DESKTOP = {"DISPLAY": ":0"}
ABSENT = {"libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"}


def lacking(*libraries):
    return lambda library: library not in libraries


def test_missing_xcb_libraries_are_named_with_their_packages(monkeypatch):
    """On an X desktop without libxcb-cursor0 and friends the check names each library and the
    Debian/Ubuntu and Fedora packages that install it."""
    monkeypatch.setattr("sys.platform", "linux")
    problem = xcb_problem(X_DESKTOP, lacking(*ABSENT))
    assert "libxcb-cursor.so.0, libxcb-icccm.so.4, libxcb-keysyms.so.1" in problem
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1" in problem
    assert "sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms" in problem


def test_nothing_to_say_when_complete_or_not_on_x(monkeypatch):
    """All libraries present, a Wayland session, or another Qt platform: no complaint."""
    monkeypatch.setattr("sys.platform", "linux")
    assert xcb_problem(X_DESKTOP, lacking()) is None
    assert xcb_problem({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}, lacking(*ABSENT)) is None
    assert xcb_problem({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}, lacking(*ABSENT)) is None
    assert xcb_problem({"QT_QPA_PLATFORM": "xcb"}, lacking(*ABSENT)) is not None


def test_every_library_has_both_package_names():
    """Each library the plugin links comes with a Debian and a Fedora package."""
    assert all(".so." in library and debian and fedora for library, debian, fedora in XCB_LIBRARIES)


def test_gui_falls_back_to_the_terminal_job(monkeypatch, capsys):
    """`specdeck gui` with the X libraries missing says what to install and runs `specdeck run`
    on the default pair instead of letting Qt abort."""
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr("specdeck.app.main.loadable", lacking(*ABSENT))
    monkeypatch.setattr("specdeck.app.main.run_gui", lambda args: pytest.fail("the window must not start"))
    ran = []
    specdeck = specdeck_cli.main

    def main(argv=None):
        if argv == ["run"]:
            ran.append(argv)
            return 0
        return specdeck(argv)

    monkeypatch.setattr(specdeck_cli, "main", main)
    assert specdeck_cli.main(["gui"]) == 0
    assert ran == [["run"]]
    err = capsys.readouterr().err
    assert "sudo apt install libxcb-cursor0" in err and "specdeck run" in err


@pytest.mark.qt_log_ignore("something else went wrong")
def test_known_qt_chatter_is_dropped_and_the_rest_kept(qtlog):
    """The offscreen plugin's propagateSizeHints() notice is dropped; other Qt warnings still arrive."""
    previous = filter_qt_messages()
    try:
        qWarning("This plugin does not support propagateSizeHints()")
        qWarning("something else went wrong")
    finally:
        qInstallMessageHandler(previous)
    assert [record.message for record in qtlog.records] == ["something else went wrong"]
