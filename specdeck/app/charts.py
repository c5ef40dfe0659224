"""The session's charts in a grid (one widget each, `specdeck.app.session_charts`) and the headline
figures beside or below them (`specdeck.app.session_figures`), fed by the window's `SessionModel`.

Events only append to preallocated float64 buffers (`specdeck.app.chart_series`); a timer redraws one
chart per tick when something changed, at 8 Hz per chart, 2 Hz while a session decodes (painting
a chart takes a few ms of the main thread, which on a small machine is a core the decoding
threads wait for), from at most `MAX_POINTS` points per curve, on axes that grow in steps (so
their ticks are recomputed a few times per session, not at every redraw): drawing costs the same
however fast tokens arrive and however long the session runs. A new session redraws every chart
from empty series, ranges and titles included. The predicted speedup is Leviathan et al. 2023,
eq. 1 (see `specdeck.engine.stats`); the measured one is speculative tokens/s over plain tokens/s from a
compare run.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QBoxLayout, QGridLayout, QWidget

from specdeck.app.chart_plot import CHART_WIDTH, ChartPlot
from specdeck.app.chart_series import SessionSeries
from specdeck.app.session_charts import (
    AcceptanceChart,
    DepthChart,
    ExpectedSpeedupChart,
    KeptChart,
    RoundTimeChart,
    SessionChart,
    SpeedChart,
    VerifyCostChart,
)
from specdeck.app.session_figures import Headline, SessionFigures
from specdeck.app.session_model import SessionModel
from specdeck.engine.events import SummaryEvent
from specdeck.engine.export import SessionRecord

REDRAW_HZ = 8
DECODING_REDRAW_HZ = 2
CHART_COLUMNS = 3  # at most
FIGURES_BESIDE_WIDTH = 1100  # px: narrower, the figures go below the charts, in columns


class SessionCharts(QWidget):
    """The charts (`plots`, in their order on screen) and the figures. `speculative` and `plain`
    are the two sessions' series; given a `SessionModel`, they follow its runs."""

    def __init__(self, model: SessionModel | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self.acceptance_plot = AcceptanceChart()
        self.speed_plot = SpeedChart()
        self.round_time_plot = RoundTimeChart()
        self.histogram_plot = KeptChart()
        self.position_plot = DepthChart()
        # why it pays or not: this machine's verify cost, and what it makes of the session's acceptance
        self.verify_cost_plot = VerifyCostChart()
        self.expected_plot = ExpectedSpeedupChart()
        self.plots: tuple[SessionChart, ...] = (
            self.acceptance_plot,
            self.speed_plot,
            self.round_time_plot,
            self.histogram_plot,
            self.position_plot,
            self.verify_cost_plot,
            self.expected_plot,
        )

        self._figures = SessionFigures()
        self.figures = self._figures.labels
        self.headline = Headline()  # the window places it where it stays in view

        self._grid = QGridLayout()
        self._layout = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addLayout(self._grid, 1)
        self._layout.addWidget(self._figures)
        self._place: tuple[int, bool, int] | None = None
        self._reflow(FIGURES_BESIDE_WIDTH)

        self._dirty = False
        self._next_part = 0
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._on_redraw_timer)
        self.set_decoding(False)
        self.reset()
        if model is not None:
            model.run_started.connect(lambda compare: self.reset())
            model.activity_changed.connect(lambda activity: self.set_decoding(activity.running))
            model.events_arrived.connect(self._on_events_arrived)
            model.run_ended.connect(self._on_run_ended)

    # layout -----------------------------------------------------------------------------------------

    def _reflow(self, width: int) -> None:
        """Charts in as many columns as `width` holds (three at most), the figures right of them when
        there is room, else below in columns. The window scrolls the charts where they are taller
        than the space it has, so no chart is squeezed below a size that shows its whole axes."""
        beside = width >= FIGURES_BESIDE_WIDTH
        # the charts' share of the width: all of it, or what the figures beside them leave
        chart_width = width - self._figures.column_width if beside else width
        chart_columns = max(1, min(CHART_COLUMNS, chart_width // CHART_WIDTH))
        figure_columns = 1 if beside else max(1, min(3, width // self._figures.column_width))
        place = (chart_columns, beside, figure_columns)
        if place == self._place:
            return
        self._place = place
        for i, plot in enumerate(self.plots):
            self._grid.addWidget(plot, i // chart_columns, i % chart_columns)
        self._layout.setDirection(QBoxLayout.Direction.LeftToRight if beside else QBoxLayout.Direction.TopToBottom)
        self._figures.place(beside, figure_columns)

    def resizeEvent(self, event) -> None:
        self._reflow(event.size().width())
        super().resizeEvent(event)

    def readout(self, plot: ChartPlot, x: float) -> str | None:
        """What the chart `plot` says at `x` on its bottom axis (a round, a time, a length, a depth)."""
        return plot.readout(x)

    # feeding ----------------------------------------------------------------------------------------

    def _on_events_arrived(self, record: SessionRecord, batch: tuple) -> None:
        plain = record.mode == "plain"
        if plain and self.plain is None:
            self.start_plain()
        self.add_events(batch, plain=plain)
        if isinstance(batch[-1], SummaryEvent):
            self.redraw()

    def _on_run_ended(self) -> None:
        self.set_identical(self._model.identical)
        self.redraw()

    def set_decoding(self, decoding: bool) -> None:
        """Redraw at the slower pace while a session decodes, so drawing leaves the cores to it."""
        hz = DECODING_REDRAW_HZ if decoding else REDRAW_HZ
        self._timer.setInterval(1000 // (hz * len(self.plots)))

    def reset(self) -> None:
        self.speculative = SessionSeries()
        self.plain: SessionSeries | None = None
        self.identical: bool | None = None
        self.redraw()

    def start_plain(self) -> None:
        """A compare run's second half begins: its events go to the plain series."""
        self.plain = SessionSeries()

    def add_events(self, batch: tuple, plain: bool = False) -> None:
        series = self.plain if plain else self.speculative
        for event in batch:
            series.add(event)
        self._mark_dirty()

    def set_identical(self, identical: bool | None) -> None:
        self.identical = identical
        self._mark_dirty()

    # drawing ----------------------------------------------------------------------------------------

    def _mark_dirty(self) -> None:
        """New data to draw: the redraw timer ticks until every chart shows it. It stops once they
        do, so an idle window runs no Python for the charts (each tick takes the interpreter from
        the model thread)."""
        self._dirty = True
        if not self._timer.isActive():
            self._timer.start()

    def _on_redraw_timer(self) -> None:
        """One chart per tick, in turn, so one pass of the event loop never repaints them all."""
        if not self._dirty:
            self._timer.stop()
            return
        self.plots[self._next_part].draw(self.speculative, self.plain)
        self._next_part = (self._next_part + 1) % len(self.plots)
        self._update_figures()
        if self._next_part == 0:
            self._dirty = False
            self._timer.stop()

    def redraw(self) -> None:
        """Every chart and figure, now (the end of a session, a screenshot)."""
        self._dirty = False
        self._timer.stop()
        self._next_part = 0
        for chart in self.plots:
            chart.draw(self.speculative, self.plain)
        self._update_figures()

    def _update_figures(self) -> None:
        info = self._model.run_info if self._model is not None else None
        self.headline.show_figures(self.speculative, self.plain, self.measured_speedup)
        self._figures.show_figures(
            self.speculative,
            self.plain,
            self.identical,
            self.measured_speedup,
            info.backend if info is not None else None,
        )

    @property
    def measured_speedup(self) -> float | None:
        """Speculative over plain tokens/s, once both sessions of a compare run have ended."""
        if self.plain is None or self.speculative.summary is None or self.plain.summary is None:
            return None
        plain = self.plain.summary.tokens_per_s
        return self.speculative.summary.tokens_per_s / plain if plain > 0 else None
