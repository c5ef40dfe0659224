"""One chart of a session's charts (`specdeck.app.charts`), as they all look: a pyqtgraph plot with room
for its axes' labels, a colour key for its title, the series' colours and pens, and ranges that
grow in steps. Kept apart from the charts' feeding, drawing and layout, so that every chart is
built and ranged one way.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg  # after PySide6, so pyqtgraph binds to it
from PySide6.QtGui import QFontMetrics

RANGE_MARGIN = 0.06  # beyond each end of an axis, so that the end ticks' labels still show
CHART_WIDTH = 250  # px a chart needs to show its title and axes whole
CHART_HEIGHT = 180
SPEC_COLOUR, PLAIN_COLOUR, DRAFT_COLOUR, VERIFY_COLOUR = "#1f5fd1", "#777777", "#e69f00", "#56b4e9"
SPEC_PEN = pg.mkPen(SPEC_COLOUR, width=2)
PLAIN_PEN = pg.mkPen(PLAIN_COLOUR, width=2, style=pg.QtCore.Qt.PenStyle.DashLine)


def new_plot(title: str, left: str, bottom: str) -> pg.PlotWidget:
    widget = pg.PlotWidget(background="w")
    widget.setTitle(title, color="#222", size="10pt")
    widget.setLabel("left", left)
    widget.setLabel("bottom", bottom)
    widget.showGrid(x=True, y=True, alpha=0.2)
    widget.setMenuEnabled(False)
    widget.setMinimumSize(CHART_WIDTH - 20, CHART_HEIGHT)
    # room right of the bottom axis for its last tick's label
    widget.getPlotItem().layout.setContentsMargins(2, 2, 14, 2)
    for side in ("left", "bottom"):
        widget.getAxis(side).enableAutoSIPrefix(False)
    # room for six-digit ticks from the start: an axis that widens as values grow relayouts its plot
    widget.getAxis("left").setStyle(
        autoExpandTextSpace=False, tickTextWidth=QFontMetrics(widget.font()).horizontalAdvance("000000")
    )
    return widget


def colour_key(colour: str, text: str) -> str:
    return f"<span style='color:{colour}'>&#9632; {text}</span>"


def show_range(plot: pg.PlotWidget, x: tuple[float, float] | None = None, y: tuple[float, float] | None = None) -> None:
    """Set a chart's ranges, which grow in steps as the data does, and settle its view now.

    A range that followed the data exactly would change at every redraw, and each change makes
    pyqtgraph recompute and redraw both axes' ticks, labels and grid (most of a chart's paint time).
    Settling now rather than while the chart paints keeps that to one paint per redraw."""
    view = plot.getViewBox()
    shown = view.viewRange()
    for axis, wanted in enumerate((x, y)):
        if wanted is None:
            continue
        margin = RANGE_MARGIN * (wanted[1] - wanted[0])
        padded = (wanted[0] - margin, wanted[1] + margin)
        if not np.allclose(shown[axis], padded):
            (view.setXRange if axis == 0 else view.setYRange)(*padded, padding=0)
    view.prepareForPaint()
