#!/usr/bin/env bash
# Start the built bundle the way a user without Python or a checkout would: from an empty folder,
# with a bare environment and a fresh model cache (so the built-in model is converted again).
# Checks: the window renders a demo session to a PNG, and a Hugging Face id that cannot be
# downloaded ends in the "could not be reached ... local folder" message, not a traceback.
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)/dist/specdeck
[ -x "$bundle/specdeck" ] || { echo "no bundle at $bundle: run make package first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
specdeck() { env -i HOME="$work" PATH=/usr/bin:/bin LANG=C.UTF-8 SPECDECK_CACHE="$work/cache" "$@"; }
seconds() { echo $(( $(date +%s) - $1 )); }

start=$(date +%s)
specdeck "$bundle/specdeck" --help >/dev/null
echo "ok: --help ($(seconds "$start") s)"

start=$(date +%s)
if specdeck QT_QPA_PLATFORM=offscreen "$bundle/specdeck" gui --demo --screenshot "$work/window.png" 2>"$work/gui.log"; then
    [ "$(head -c 8 "$work/window.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ] \
        || { echo "FAIL: gui --demo wrote no PNG" >&2; exit 1; }
    cp "$work/window.png" "${SCREENSHOT:-/tmp/specdeck-bundle.png}"
    echo "ok: gui --demo --screenshot ($(seconds "$start") s, first launch with model conversion)"
elif grep -q "The window needs" "$work/gui.log"; then
    echo "note: this bundle has no window yet; checking the terminal command instead"
    start=$(date +%s)
    specdeck "$bundle/specdeck" run --max-new-tokens 8 >"$work/run.txt" 2>"$work/run.log" \
        || { cat "$work/run.log" >&2; echo "FAIL: run" >&2; exit 1; }
    grep -q "new tokens" "$work/run.txt" || { cat "$work/run.txt" >&2; echo "FAIL: no summary" >&2; exit 1; }
    echo "ok: run --max-new-tokens 8 ($(seconds "$start") s, first launch with model conversion)"
else
    cat "$work/gui.log" >&2
    echo "FAIL: gui --demo" >&2
    exit 1
fi

start=$(date +%s)
status=0
specdeck HF_HUB_OFFLINE=1 "$bundle/specdeck" run --target HuggingFaceTB/SmolLM2-360M-Instruct \
    --max-new-tokens 1 >/dev/null 2>"$work/hub.log" || status=$?
if [ "$status" = 2 ] && grep -q "could not be reached" "$work/hub.log" && grep -q "local folder" "$work/hub.log" \
        && ! grep -q Traceback "$work/hub.log"; then
    echo "ok: an unreachable Hub id says so ($(seconds "$start") s)"
else
    cat "$work/hub.log" >&2
    echo "FAIL: unreachable Hub id (exit $status)" >&2
    exit 1
fi
