#!/usr/bin/env bash
# Put SpecDeck in the desktop's application menu for this user: the desktop entry, the AppStream
# metainfo and the icon in every size, under ${XDG_DATA_HOME:-~/.local/share}.
# From a checkout the menu entry starts `specdeck` from PATH (as `pipx install .` puts it there);
# copied into the bundle folder, the entry starts that bundle.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
app_id=io.github.specdeck.SpecDeck

if [ -x "$here/specdeck" ]; then
    command="\"$here/specdeck\""
    icons="$here/_internal/specdeck/resources/icons"
else
    command=specdeck
    icons="$here/../specdeck/resources/icons"
fi

install -d "$data/applications" "$data/metainfo" "$data/icons/hicolor/scalable/apps"
sed "s|^Exec=specdeck |Exec=$command |" "$here/$app_id.desktop" >"$data/applications/$app_id.desktop"
install -m644 "$here/$app_id.metainfo.xml" "$data/metainfo/$app_id.metainfo.xml"
install -m644 "$icons/specdeck.svg" "$data/icons/hicolor/scalable/apps/$app_id.svg"
for png in "$icons"/specdeck-*.png; do
    size=${png##*-}
    size=${size%.png}
    install -D -m644 "$png" "$data/icons/hicolor/${size}x${size}/apps/$app_id.png"
done
if command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$data/applications" || true
fi
echo "installed $app_id in $data (menu entry runs: ${command//\"/})"
