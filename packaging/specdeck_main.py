"""Entry point of the PyInstaller bundle: the same `specdeck` command the wheel installs."""

import sys

from specdeck.cli.launch import main

if __name__ == "__main__":
    sys.exit(main())
