#!/usr/bin/env bash
# Build the one-folder Linux bundle dist/specdeck/ with PyInstaller.
# PYTHON is the interpreter whose packages go into the bundle (default .venv/bin/python); its torch
# must be the CPU build, which keeps the bundle near one gigabyte instead of several.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

"$PYTHON" - <<'PY'
import sys
import torch
if torch.version.cuda or getattr(torch.version, "hip", None):
    sys.exit(f"torch {torch.__version__} is a GPU build: install the CPU build of torch first (see README).")
PY
"$PYTHON" -m PyInstaller --version >/dev/null 2>&1 || {
    echo "PyInstaller is missing: $PYTHON -m pip install pyinstaller" >&2
    exit 1
}

start=$(date +%s)
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m PyInstaller --noconfirm --clean \
    --distpath dist --workpath build/pyinstaller packaging/specdeck.spec
# The menu entry, its metadata and the script that installs them travel with the bundle.
cp packaging/install_desktop_entry.sh packaging/io.github.specdeck.SpecDeck.desktop \
    packaging/io.github.specdeck.SpecDeck.metainfo.xml dist/specdeck/
echo "built dist/specdeck in $(( $(date +%s) - start )) s: $(du -sh dist/specdeck | cut -f1)"
