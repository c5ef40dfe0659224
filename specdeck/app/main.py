"""`specdeck gui`: open the window on qasync's event loop, or, with `--demo`, run a compare session
on the default pair headlessly, save a screenshot and the CSV, and exit (0, or 2 with the error).

Before Qt starts, `xcb_problem` checks that the system libraries of Qt's X11 platform plugin are
installed: without them Qt aborts the process with a message about plugins that names none of them.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import sys
from collections.abc import Callable, Mapping

import qasync
from PySide6.QtCore import QSettings, QTimer, qFormatLogMessage, qInstallMessageHandler
from PySide6.QtWidgets import QApplication

from specdeck.app.main_window import MainWindow, save_picture
from specdeck.app.worker import error_message, freeze_long_lived_objects
from specdeck.engine.errors import SpecDeckError

DEMO_PRESET = "chat"

# What Qt's xcb plugin (libqxcb.so and libQt6XcbQpa.so) links beyond what QtGui itself needs, which
# a desktop without other Qt 6 programs may lack (libxcb-cursor0 since Qt 6.5): the library, then
# the Debian/Ubuntu and the Fedora package that installs it.
XCB_LIBRARIES = (
    ("libxcb-cursor.so.0", "libxcb-cursor0", "xcb-util-cursor"),
    ("libxcb-icccm.so.4", "libxcb-icccm4", "xcb-util-wm"),
    ("libxcb-image.so.0", "libxcb-image0", "xcb-util-image"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1", "xcb-util-keysyms"),
    ("libxcb-render-util.so.0", "libxcb-render-util0", "xcb-util-renderutil"),
    ("libxcb-util.so.1", "libxcb-util1", "xcb-util"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0", "libxkbcommon-x11"),
    ("libX11-xcb.so.1", "libx11-xcb1", "libX11-xcb"),
    ("libxcb.so.1", "libxcb1", "libxcb"),
    ("libxcb-randr.so.0", "libxcb-randr0", "libxcb"),
    ("libxcb-render.so.0", "libxcb-render0", "libxcb"),
    ("libxcb-shape.so.0", "libxcb-shape0", "libxcb"),
    ("libxcb-shm.so.0", "libxcb-shm0", "libxcb"),
    ("libxcb-sync.so.1", "libxcb-sync1", "libxcb"),
    ("libxcb-xfixes.so.0", "libxcb-xfixes0", "libxcb"),
    ("libxcb-xkb.so.1", "libxcb-xkb1", "libxcb"),
)

# Qt messages known to be harmless; every other message passes through
HARMLESS_QT_MESSAGES = frozenset(
    {
        "This plugin does not support propagateSizeHints()",  # offscreen and Wayland plugins, on every window
    }
)


def loadable(library: str) -> bool:
    """Whether the dynamic loader finds `library` (a soname) the way Qt's plugin loader would."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def uses_xcb(environ: Mapping[str, str]) -> bool:
    """Whether Qt will start its X11 plugin: asked for by name, or the default on an X display."""
    platform = environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    return sys.platform.startswith("linux") and bool(environ.get("DISPLAY")) and not environ.get("WAYLAND_DISPLAY")


def xcb_problem(environ: Mapping[str, str] = os.environ, find: Callable[[str], bool] | None = None) -> str | None:
    """What Qt's X11 plugin lacks here and which packages install it, or None when nothing is missing
    (`find` tells whether a library loads; `loadable` by default)."""
    if not uses_xcb(environ):
        return None
    missing = [entry for entry in XCB_LIBRARIES if not (find or loadable)(entry[0])]
    if not missing:
        return None
    debian = " ".join(dict.fromkeys(package for _, package, _ in missing))
    fedora = " ".join(dict.fromkeys(package for _, _, package in missing))
    return (
        f"The window's X11 back end (Qt's xcb plugin) needs system libraries this machine lacks: "
        f"{', '.join(library for library, _, _ in missing)}. Install them with\n"
        f"  sudo apt install {debian}    (Debian, Ubuntu)\n"
        f"  sudo dnf install {fedora}    (Fedora)"
    )


def filter_qt_messages() -> Callable | None:
    """Drop the known harmless Qt messages and pass the rest on; returns the handler it replaced."""
    previous = None

    def handler(mode, context, message: str) -> None:
        if message in HARMLESS_QT_MESSAGES:
            return
        if previous is not None:
            previous(mode, context, message)
        else:
            print(qFormatLogMessage(mode, context, message), file=sys.stderr)

    previous = qInstallMessageHandler(handler)
    return previous


def application() -> QApplication:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("SpecDeck")
    app.setApplicationName("SpecDeck")
    return app


def choose_preset(window: MainWindow, name: str, given: bool = True) -> None:
    """Open the prompt preset `name`; one the user `given` that does not exist is a SpecDeckError."""
    presets = window.decoding_panel.presets
    if name in presets:
        window.decoding_panel.choose_preset(name)
    elif given:
        raise SpecDeckError(f"There is no preset {name!r}: choose one of {', '.join(presets)}.")


async def demo(window: MainWindow, screenshot: str | None, export_csv: str | None, preset: str | None = None) -> int:
    """Load the default pair, compare speculative and plain decoding on a preset prompt, save what
    was asked for."""
    try:
        choose_preset(window, preset or DEMO_PRESET, given=preset is not None)
        await window.run(compare=True)
        window.charts.redraw()
        QApplication.processEvents()
        if screenshot:
            save_picture(window, screenshot)
        if export_csv:
            window.export_csv(export_csv)
        return 0
    except SpecDeckError as error:
        print(f"specdeck: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        print(f"specdeck: error: {error_message(error)}", file=sys.stderr)
        return 1
    finally:
        window.close()


def run_gui(args) -> int:
    filter_qt_messages()
    app = application()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        if args.demo:
            window = MainWindow(settings=None)
            window.show()
            freeze_long_lived_objects()
            return loop.run_until_complete(demo(window, args.screenshot, args.export_csv, args.preset))
        if args.screenshot or args.export_csv:
            raise SpecDeckError("--screenshot and --export-csv go with --demo.")
        window = MainWindow(settings=QSettings())
        if args.preset:
            choose_preset(window, args.preset)
        window.show()
        # the window's objects live as long as the process: out of later collections, without the
        # full collection `freeze_long_lived_objects` makes first (seconds on a busy machine, in
        # which the window would map black and ignore Run; the imports were frozen uncollected too)
        gc.freeze()
        # Ctrl+C in the terminal closes the window cleanly; the timer lets Python see the signal
        signal.signal(signal.SIGINT, lambda *_: window.close())
        wake = QTimer(interval=250)
        wake.timeout.connect(lambda: None)
        wake.start()
        loop.run_forever()
    if not window.model_thread_ended:
        end_without_the_model_thread()
    return 0


def end_without_the_model_thread() -> None:
    """End the process now, the window closed and its settings saved, while the model thread is
    still inside one stage of a load: Python would wait for that stage at exit, and Qt aborts a
    process whose thread object is destroyed while the thread runs. Files SpecDeck writes are
    written whole or not at all (`specdeck.engine.atomic`), so ending here loses nothing written."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(0)
