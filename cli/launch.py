"""The `specdeck` command's entry point: it starts what a first run waits longest for, then the command.

A first run builds the row kernel (`engine.row_kernel`: a C compiler, seconds on one core). For the
commands that load a model it starts on a thread of its own before the rest of SpecDeck and its
libraries are imported, so that the compiler runs while they import and the models load. Other
commands leave it alone (`specdeck cache --clear` deletes the kernels).
"""

from __future__ import annotations

import sys

LOADS_A_MODEL = ("run", "gui", "bench")  # bare `specdeck` is `specdeck gui`


def main() -> int:
    if (sys.argv[1:2] or ["gui"])[0] in LOADS_A_MODEL:
        from specdeck.engine.forward import row_kernel

        row_kernel.build_in_background()
    from specdeck.cli.main import main as command

    return command()


if __name__ == "__main__":
    sys.exit(main())
