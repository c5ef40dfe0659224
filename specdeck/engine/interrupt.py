"""Ctrl-C and SIGTERM on the command line: the first one asks the work to stop where it can keep
what it has (the next round of a session, the next run of a benchmark), through the same
`threading.Event` the window's Stop sets; a second one quits at once.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))


@contextmanager
def cancel_on_signals(notice: Callable[[str], None] | None = None) -> Iterator[threading.Event]:
    """Yield an event that the first SIGINT or SIGTERM sets (telling `notice`); the second raises
    KeyboardInterrupt. The earlier handlers come back when the block ends. Off the main thread,
    where Python cannot install handlers, the event is only set by the caller."""
    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return

    def on_signal(number: int, frame) -> None:
        if cancel.is_set():
            for each in SIGNALS:  # a third signal ends the process the ordinary way
                signal.signal(each, signal.SIG_DFL)
            raise KeyboardInterrupt
        cancel.set()
        if notice:
            notice(
                f"{signal.Signals(number).name}: stopping where the work done so far can be kept "
                "(press Ctrl-C again to quit at once)"
            )

    previous = {number: signal.signal(number, on_signal) for number in SIGNALS}
    try:
        yield cancel
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def to_stderr(message: str) -> None:
    """A notice on its own line of stderr (after a progress bar's unfinished line)."""
    print(f"\n[{message}]", file=sys.stderr, flush=True)
