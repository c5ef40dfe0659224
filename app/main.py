"""`specdeck gui`: open the window on qasync's event loop, or, with `--demo`, run a compare session
on the default pair headlessly, save a screenshot and the CSV, and exit (0, or 2 with the error)."""

from __future__ import annotations

import asyncio
import signal
import sys

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

import qasync

from app.main_window import MainWindow, save_picture
from app.worker import error_message, freeze_long_lived_objects
from engine.errors import SpecDeckError

DEMO_PRESET = "chat"


def application() -> QApplication:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("SpecDeck")
    app.setApplicationName("SpecDeck")
    return app


async def demo(window: MainWindow, screenshot: str | None, export_csv: str | None, preset: str | None = None) -> int:
    """Load the default pair, compare speculative and plain decoding on a preset prompt, save what
    was asked for."""
    try:
        presets = window.decoding_panel.presets
        name = preset or DEMO_PRESET
        if name in presets:
            window.decoding_panel.choose_preset(name)
        elif preset is not None:
            raise SpecDeckError(f"There is no preset {preset!r}: choose one of {', '.join(presets)}.")
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
    except Exception as error:  # noqa: BLE001 - report, exit non-zero
        print(f"specdeck: error: {error_message(error)}", file=sys.stderr)
        return 1
    finally:
        window.close()


def run_gui(args) -> int:
    app = application()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        if args.demo:
            window = MainWindow(settings=None)
            window.show()
            freeze_long_lived_objects()
            return loop.run_until_complete(demo(window, args.screenshot, args.export_csv, args.preset))
        if args.screenshot or args.export_csv or args.preset:
            raise SpecDeckError("--screenshot, --export-csv and --preset go with --demo.")
        window = MainWindow(settings=QSettings())
        window.show()
        freeze_long_lived_objects()
        # Ctrl+C in the terminal closes the window cleanly; the timer lets Python see the signal
        signal.signal(signal.SIGINT, lambda *_: window.close())
        wake = QTimer(interval=250)
        wake.timeout.connect(lambda: None)
        wake.start()
        loop.run_forever()
    return 0
