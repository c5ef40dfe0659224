"""A guard against a reference-counting bug in PySide6's `SignalInstance.emit` (seen in 6.12.0).

`emit()` returns `True` without taking a new reference, so every emit, ours or pyqtgraph's, removes
one reference to `True`. From CPython 3.12 the bools are immortal and nothing happens; on 3.10 and
3.11 a window that redraws its charts for a few minutes reaches zero and the interpreter aborts
("bool_dealloc: deallocating True or False"). The guard checks for the bug with one probe emit and,
only where it shows, gives `True`, `False` and `None` a reference count too large to ever reach zero,
which is what CPython 3.12 does for them.
"""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal

_HEADROOM = 1 << 40  # references: more than any session could emit


class _Probe(QObject):
    fired = Signal()


def emit_loses_references() -> bool:
    """Whether `emit()` here takes a reference to True that it never gave."""
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(8):
        probe.fired.emit()
    return sys.getrefcount(True) < before - 4


def install() -> bool:
    """Apply the guard if this interpreter and PySide6 need it; return whether it was applied."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython" or not emit_loses_references():
        return False
    for singleton in (True, False, None):
        ctypes.c_ssize_t.from_address(id(singleton)).value += _HEADROOM
    return True
