"""The `specdeck` command's entry point: it starts what a first run waits longest for, then the command.

A first run builds the row kernel (`specdeck.engine.forward.kernel_build`: a C compiler, seconds on one core). For the
commands that load a model it starts on a thread of its own before the rest of SpecDeck and its
libraries are imported, so that the compiler runs while they import and the models load. Other
commands leave it alone (`specdeck cache --clear` deletes the kernels).

Python's garbage collector stays off while SpecDeck and its libraries import: importing torch and
transformers makes millions of objects that live as long as the process, and collecting among them
again and again as they are made took a fifth of the import time. They are then frozen out of
later collections.
"""

from __future__ import annotations

import gc
import sys

LOADS_A_MODEL = ("run", "gui", "bench")  # bare `specdeck` is `specdeck gui`


def main() -> int:
    gc.disable()
    try:
        if (sys.argv[1:2] or ["gui"])[0] in LOADS_A_MODEL:
            from specdeck.engine.forward import kernel_build

            kernel_build.build_in_background()
        from specdeck.cli.main import main as command
    finally:
        gc.freeze()
        gc.enable()
    return command()


if __name__ == "__main__":
    sys.exit(main())
