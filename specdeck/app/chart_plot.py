"""One chart of a session's charts (`specdeck.app.session_charts`), as they all look and behave: a pyqtgraph
plot with room for its axes' labels, a colour key for its title, the series' colours and pens,
ranges that grow in steps, a wheel that scrolls the page, and a readout of the point under the
mouse that stays while the mouse does. Kept apart from what each chart draws, so that every chart
is built, ranged and hovered one way.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg  # after PySide6, so pyqtgraph binds to it
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QLabel

RANGE_MARGIN = 0.06  # beyond each end of an axis, so that the end ticks' labels still show
CHART_WIDTH = 250  # px a chart needs to show its title and axes whole
CHART_HEIGHT = 180
SPEC_COLOUR, PLAIN_COLOUR, DRAFT_COLOUR, VERIFY_COLOUR = "#1f5fd1", "#777777", "#e69f00", "#56b4e9"
SPEC_PEN = pg.mkPen(SPEC_COLOUR, width=2)
PLAIN_PEN = pg.mkPen(PLAIN_COLOUR, width=2, style=pg.QtCore.Qt.PenStyle.DashLine)
READOUT_STYLE = "background: rgba(255, 255, 255, 235); color: #222; border: 1px solid #bbb; padding: 1px 3px;"


def colour_key(colour: str, text: str) -> str:
    return f"<span style='color:{colour}'>&#9632; {text}</span>"


class ChartPlot(pg.PlotWidget):
    """A chart: `draw` sets its data and ranges, `readout(x)` says what its point at `x` on the
    bottom axis shows (None where there is none).

    The mouse wheel scrolls the page the chart is on; with Ctrl it zooms the chart, until its next
    draw sets the chart's own ranges again. Dragging never pans: a chart shows what its session
    says, never a range left over from an earlier one. Hovering shows the readout in a label over
    the chart's top edge, kept as long as the mouse stays on the chart."""

    def __init__(self, title: str, left: str, bottom: str) -> None:
        super().__init__(background="w")
        self.set_title(title)
        self.setLabel("left", left)
        self.setLabel("bottom", bottom)
        self.showGrid(x=True, y=True, alpha=0.2)
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        self.setMinimumSize(CHART_WIDTH - 20, CHART_HEIGHT)
        # room right of the bottom axis for its last tick's label
        self.getPlotItem().layout.setContentsMargins(2, 2, 14, 2)
        for side in ("left", "bottom"):
            self.getAxis(side).enableAutoSIPrefix(False)
        # room for six-digit ticks from the start: an axis that widens as values grow relayouts its plot
        self.getAxis("left").setStyle(
            autoExpandTextSpace=False, tickTextWidth=QFontMetrics(self.font()).horizontalAdvance("000000")
        )
        self.hover = QLabel(self)
        self.hover.setStyleSheet(READOUT_STYLE)
        self.hover.setWordWrap(True)
        self.hover.hide()
        self.scene().sigMouseMoved.connect(self._on_mouse_moved)

    def set_title(self, title: str) -> None:
        self.setTitle(title, color="#222", size="10pt")

    def readout(self, x: float) -> str | None:
        return None

    # the wheel and the hover ------------------------------------------------------------------------

    def wheelEvent(self, event) -> None:
        """Ctrl+wheel zooms; a plain wheel goes to the page the chart is on (the nearest scroll
        area around it), which scrolls. Handed on explicitly: Qt passes an ignored wheel event on
        to the parent only where it came from the window system."""
        if not event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            page = self.parentWidget()
            while page is not None and not isinstance(page, QAbstractScrollArea):
                page = page.parentWidget()
            if page is None:
                event.ignore()
            else:
                QApplication.sendEvent(page.viewport(), event.clone())
            return
        view = self.getViewBox()
        view.setMouseEnabled(x=True, y=True)
        super().wheelEvent(event)
        view.setMouseEnabled(x=False, y=False)

    def _on_mouse_moved(self, position) -> None:
        view = self.getViewBox()
        text = self.readout(view.mapSceneToView(position).x()) if view.sceneBoundingRect().contains(position) else None
        self.show_readout(text)

    def show_readout(self, text: str | None) -> None:
        """Show `text` over the chart's top edge (None hides it)."""
        if not text:
            self.hover.hide()
            return
        self.hover.setText(text)
        self.hover.setFixedWidth(self.width() - 8)
        self.hover.adjustSize()
        self.hover.move(4, 2)
        self.hover.show()
        self.hover.raise_()

    def leaveEvent(self, event) -> None:
        self.hover.hide()
        super().leaveEvent(event)

    # ranges -----------------------------------------------------------------------------------------

    def show_range(self, x: tuple[float, float], y: tuple[float, float]) -> None:
        """Set the chart's ranges, which grow in steps as the data does, and settle its view now.

        A range that followed the data exactly would change at every redraw, and each change makes
        pyqtgraph recompute and redraw both axes' ticks, labels and grid (most of a chart's paint time).
        Settling now rather than while the chart paints keeps that to one paint per redraw."""
        view = self.getViewBox()
        shown = view.viewRange()
        for axis, wanted in enumerate((x, y)):
            margin = RANGE_MARGIN * (wanted[1] - wanted[0])
            padded = (wanted[0] - margin, wanted[1] + margin)
            if not np.allclose(shown[axis], padded):
                (view.setXRange if axis == 0 else view.setYRange)(*padded, padding=0)
        view.prepareForPaint()
