"""The window's message boxes, in one place so that every error reaches the user the same way."""

from __future__ import annotations

import platform
from pathlib import Path

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import QStandardPaths, qVersion
from PySide6.QtWidgets import QMessageBox, QWidget

from specdeck.engine.export import library_versions


def start_folder() -> Path:
    """Where a file dialog opens: the user's documents folder, or their home where there is none;
    never the folder SpecDeck was started from (a source checkout, or /)."""
    documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    if documents and Path(documents).is_dir():
        return Path(documents)
    return Path.home()


def show_error(parent: QWidget | None, title: str, message: str) -> None:
    QMessageBox.critical(parent, title, message)


def qt_versions() -> dict[str, str]:
    """The window's own libraries' versions (what a session's export adds to the engine's)."""
    import pyqtgraph

    return {"Qt": qVersion(), "PySide6": pyside_version, "pyqtgraph": pyqtgraph.__version__}


def versions(device: str | None) -> dict[str, str]:
    return {
        **library_versions(),
        **qt_versions(),
        "platform": platform.platform(terse=True),
        "device": device or "no models loaded",
    }


def about_text(device: str | None) -> str:
    rows = "".join(f"<tr><td>{name}</td><td>&nbsp;<b>{value}</b></td></tr>" for name, value in versions(device).items())
    return (
        "<h3>SpecDeck</h3><p>A playground for speculative decoding: watch every drafted token being "
        "accepted or rejected, live, next to plain decoding.</p>"
        f"<table>{rows}</table>"
    )


def show_about(parent: QWidget | None, device: str | None) -> None:
    QMessageBox.about(parent, "About SpecDeck", about_text(device))


def shortcuts_text(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td><b>{keys}</b></td><td>&nbsp;&nbsp;{what}</td></tr>" for keys, what in rows)
    return f"<table>{body}</table>"


def show_shortcuts(parent: QWidget | None, rows: list[tuple[str, str]]) -> None:
    """Help > Keyboard shortcuts: (keys, what they do) in a table."""
    QMessageBox.information(parent, "Keyboard shortcuts", shortcuts_text(rows))
