"""Render specdeck/resources/icons/specdeck.svg to the PNG sizes desktops and window managers ask for.

Run after editing the SVG: `QT_QPA_PLATFORM=offscreen python packaging/render_icons.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICONS = Path(__file__).resolve().parent.parent / "specdeck" / "resources" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render(svg: Path, size: int, target: Path) -> None:
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    if not image.save(str(target)):
        raise SystemExit(f"could not write {target}")


def main() -> int:
    QGuiApplication(sys.argv)
    for size in SIZES:
        render(ICONS / "specdeck.svg", size, ICONS / f"specdeck-{size}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
