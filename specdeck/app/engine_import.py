"""The engine's import (torch, transformers, the benchmark harness): the seconds a first launch
waits longest for, and where they start.

`import_engine` is what the model thread calls before its first load (`ModelWorker.start_engine`).
`specdeck gui` starts the same import at launch, on a thread of its own (`import_engine_ahead`),
while the window's modules import and the window is built: Run pressed at the window's first
paint then waits only for the rest of it. The model thread's own call finds what is done and
waits for what is under way: Python imports a module once, whichever thread asks first, and an
import asked for meanwhile waits for it.

Qt-free and importing nothing heavy itself, so that the command line starts it before the window's
modules.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Engine:
    """The engine's modules the model thread calls, once imported (`import_engine`)."""

    session: ModuleType  # specdeck.engine.session: load_pair, add_drafters, run_session
    memory: ModuleType  # specdeck.engine.memory: give_back, out of memory in words
    service: ModuleType  # specdeck.bench.service: the benchmark harness and its files


def import_engine() -> Engine:
    """Import the engine, torch and transformers (at once where `import_engine_ahead` did).

    Garbage collection stays off meanwhile and what they made is frozen after, as
    `specdeck.cli.launch` does for what it imports: millions of objects that live as long as the
    process, which collecting again and again as they are made would slow by a fifth."""
    gc.disable()
    try:
        from specdeck.bench import service
        from specdeck.engine import memory, session
        from specdeck.engine.quiet import silence_libraries

        silence_libraries()  # SpecDeck reports its own progress; the libraries keep quiet
    finally:
        gc.freeze()
        gc.enable()
    return Engine(session, memory, service)


def import_engine_ahead() -> threading.Thread:
    """Start `import_engine` on a daemon thread and return it. Garbage collection is off from now
    until it ends (the caller's imports are spared the collections too). A failure here is left
    for the model thread's own `import_engine` to meet again and say."""

    def run() -> None:
        try:
            import_engine()
        except Exception:  # said by the model thread, which imports it again
            pass

    gc.disable()
    thread = threading.Thread(target=run, name="specdeck-engine-import", daemon=True)
    thread.start()
    return thread
