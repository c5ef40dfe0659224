"""The `specdeck` command's entry point: it starts what a first run waits longest for, then the command.

A first run builds the row kernel (`specdeck.engine.forward.kernel_build`: a C compiler, seconds on one core). For the
commands that load a model it starts on a thread of its own before the rest of SpecDeck and its
libraries are imported, so that the compiler runs while they import and the models load. Other
commands leave it alone (`specdeck cache --clear` deletes the kernels).

`specdeck gui` also starts importing the engine (torch, transformers) on a thread of its own
before the window's modules import (`specdeck.app.engine_import`): the window's model thread, which
loads the models, then finds it done or under way, and Run pressed at the window's first paint
waits seconds less for its first token. The two threads share the interpreter, so the window
paints a little later.

Python's garbage collector stays off while SpecDeck and its libraries import: importing torch and
transformers makes millions of objects that live as long as the process, and collecting among them
again and again as they are made took a fifth of the import time. They are then frozen out of
later collections, and all the command made is frozen as it ends, so that the interpreter's exit
does not collect among them either.
"""

from __future__ import annotations

import gc
import sys

LOADS_A_MODEL = ("run", "gui", "bench")  # bare `specdeck` is `specdeck gui`


def main() -> int:
    name = (sys.argv[1:2] or ["gui"])[0]
    gc.disable()
    ahead = None
    try:
        if name in LOADS_A_MODEL:
            from specdeck.engine.forward import kernel_build

            kernel_build.build_in_background()
        if name == "gui":
            try:
                from specdeck.app.engine_import import import_engine_ahead
            except ImportError:  # no PySide6: `specdeck gui` says what to install, in one line
                pass
            else:
                ahead = import_engine_ahead()
        from specdeck.cli.main import main as command
    finally:
        if ahead is None:  # else its thread freezes them with its own and turns collection on as it ends
            gc.freeze()
            gc.enable()
    try:
        return command()
    finally:
        gc.freeze()  # the exit's collections then skip all the command made, millions of objects with torch


if __name__ == "__main__":
    sys.exit(main())
