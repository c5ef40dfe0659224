"""Live charts of a session: acceptance per round (with the cumulative rate), tokens/s over time
(speculative and plain on one chart), each round's time split into drafting and verifying (its
shape, chain length and tree width, on hover), tokens kept per round as a histogram,
acceptance by draft depth, and why it pays or not: this machine's verify cost in plain steps and
the speedup it makes of the session's acceptance at each K, each beside a flat verify (`specdeck.app.cost_series`);
the headline figures beside or below them (`specdeck.app.session_figures`). Each chart is built and ranged
as `specdeck.app.chart_plot` says.

Events only append to preallocated float64 buffers (`specdeck.app.chart_series`); a timer redraws one
chart per tick when something changed, at 8 Hz per chart, 2 Hz while a session decodes (painting
a chart takes a few ms of the main thread, which on a small machine is a core the decoding
threads wait for), from at most `MAX_POINTS` points per
curve, on axes that grow in steps (so their ticks are recomputed a few times per session, not at
every redraw): drawing costs the same however fast tokens arrive and however long the session
runs. Hovering a chart reads out the point under the mouse. The predicted speedup is Leviathan et
al. 2023, eq. 1 (see `specdeck.engine.stats`); the measured one is speculative tokens/s over plain tokens/s
from a compare run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyqtgraph as pg  # after PySide6, so pyqtgraph binds to it
from PySide6.QtCore import QTimer
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QBoxLayout, QGridLayout, QToolTip, QWidget

from specdeck.app.chart_plot import (
    CHART_WIDTH,
    DRAFT_COLOUR,
    PLAIN_COLOUR,
    PLAIN_PEN,
    RANGE_MARGIN,
    SPEC_COLOUR,
    SPEC_PEN,
    VERIFY_COLOUR,
    colour_key,
    new_plot,
    show_range,
)
from specdeck.app.chart_series import (
    SessionSeries,
    acceptance_readout,
    block_means,
    histogram_readout,
    nice_ceiling,
    position_readout,
    round_time_readout,
    speed_readout,
    thinned,
)
from specdeck.app.cost_series import curve_of, speedup_by_k, speedup_readout, verify_cost, verify_readout
from specdeck.app.session_figures import SessionFigures
from specdeck.app.session_model import SessionModel
from specdeck.engine.events import SummaryEvent
from specdeck.engine.export import SessionRecord

REDRAW_HZ = 8
DECODING_REDRAW_HZ = 2
SYMBOL_LIMIT = 300  # rounds: beyond this, per-round points are drawn as a line (symbols cost per point)
CHART_COLUMNS = 3  # at most
FIGURES_BESIDE_WIDTH = 1100  # px: narrower, the figures go below the charts, in columns


class SessionCharts(QWidget):
    """The five charts and the figures. `speculative` and `plain` are the two sessions' series;
    given a `SessionModel`, they follow its runs."""

    def __init__(self, model: SessionModel | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self.acceptance_plot = new_plot("Acceptance per round", "accepted / drafted", "round")
        self.acceptance_plot.setYRange(0, 1.0, padding=RANGE_MARGIN)
        self._per_round = self.acceptance_plot.plot(
            pen=None, symbol="o", symbolSize=5, symbolBrush="#1b8a2f", symbolPen=None
        )
        self._cumulative = self.acceptance_plot.plot(pen=pg.mkPen("#222", width=2))

        # the key is in the title: a legend inside the chart would cover the curves
        self.speed_plot = new_plot(
            f"Tokens/s {colour_key(SPEC_COLOUR, 'speculative')} {colour_key(PLAIN_COLOUR, 'plain')}",
            "tokens/s",
            "decoding time (s)",
        )
        self._spec_speed = self.speed_plot.plot(pen=SPEC_PEN, name="speculative")
        self._plain_speed = self.speed_plot.plot(pen=PLAIN_PEN, name="plain")

        self.round_time_plot = new_plot(
            f"Round time {colour_key(DRAFT_COLOUR, 'draft')} {colour_key(VERIFY_COLOUR, 'verify')}", "ms", "round"
        )
        self._draft_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=DRAFT_COLOUR, pen=None)
        self._verify_bars = pg.BarGraphItem(x=[], y0=[], height=[], width=0.8, brush=VERIFY_COLOUR, pen=None)
        self.round_time_plot.addItem(self._draft_bars)
        self.round_time_plot.addItem(self._verify_bars)

        self.histogram_plot = new_plot("Tokens kept per round", "rounds", "tokens kept")
        self._histogram = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#1b8a2f")
        self.histogram_plot.addItem(self._histogram)
        self.histogram_plot.getAxis("bottom").setTickSpacing(1, 1)

        self.position_plot = new_plot("Acceptance by draft depth", "acceptance", "draft depth")
        self.position_plot.setYRange(0, 1.0, padding=RANGE_MARGIN)
        self._by_position = pg.BarGraphItem(x=[], height=[], width=0.8, brush=SPEC_COLOUR)
        self.position_plot.addItem(self._by_position)
        self.position_plot.getAxis("bottom").setTickSpacing(1, 1)

        # why it pays or not: this machine's verify cost, and what it makes of the session's acceptance
        self.verify_cost_plot = new_plot(
            f"Verify cost {colour_key(SPEC_COLOUR, 'this machine')} {colour_key(PLAIN_COLOUR, 'flat')}",
            "steps",
            "tokens verified",
        )
        self._verify_cost = self.verify_cost_plot.plot(pen=SPEC_PEN, symbol="o", symbolSize=4, symbolBrush=SPEC_COLOUR)
        self._flat_cost = self.verify_cost_plot.plot(pen=PLAIN_PEN)
        self.expected_plot = new_plot(
            f"Expected speedup {colour_key(SPEC_COLOUR, 'this machine')} {colour_key(PLAIN_COLOUR, 'flat verify')}",
            "x plain",
            "K",
        )
        self._expected_here = self.expected_plot.plot(pen=SPEC_PEN, symbol="o", symbolSize=4, symbolBrush=SPEC_COLOUR)
        self._expected_flat = self.expected_plot.plot(pen=PLAIN_PEN)
        self.expected_plot.addItem(pg.InfiniteLine(1.0, angle=0, pen=pg.mkPen("#999", width=1)))
        self.expected_plot.getAxis("bottom").setTickSpacing(1, 1)

        self.plots = (
            self.acceptance_plot,
            self.speed_plot,
            self.round_time_plot,
            self.histogram_plot,
            self.position_plot,
            self.verify_cost_plot,
            self.expected_plot,
        )
        self.readouts: dict[pg.PlotWidget, Callable[[float], str | None]] = {
            self.acceptance_plot: lambda x: acceptance_readout(self.speculative, x),
            self.speed_plot: lambda x: speed_readout(self.speculative, self.plain, x),
            self.round_time_plot: lambda x: round_time_readout(self.speculative, x),
            self.histogram_plot: lambda x: histogram_readout(self.speculative, x),
            self.position_plot: lambda x: position_readout(self.speculative, x),
            self.verify_cost_plot: lambda x: verify_readout(curve_of(self.speculative.start), x),
            self.expected_plot: lambda x: speedup_readout(
                curve_of(self.speculative.start), self.speculative.stats.acceptance_rate, self._draft_ms(), x
            ),
        }
        for plot in self.plots:
            plot.scene().sigMouseMoved.connect(lambda position, plot=plot: self._on_mouse_moved(plot, position))

        self._figures = SessionFigures()
        self.figures = self._figures.labels

        self._grid = QGridLayout()
        self._layout = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addLayout(self._grid, 1)
        self._layout.addWidget(self._figures)
        self._place: tuple[int, bool, int] | None = None
        self._reflow(FIGURES_BESIDE_WIDTH)

        self._dirty = False
        self._parts = (
            self._draw_acceptance,
            self._draw_speed,
            self._draw_round_time,
            self._draw_histogram,
            self._draw_by_position,
            self._draw_costs,
        )
        self._next_part = 0
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._on_redraw_timer)
        self.set_decoding(False)
        self._timer.start()
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
        chart_columns = max(1, min(CHART_COLUMNS, width // CHART_WIDTH))
        beside = width >= FIGURES_BESIDE_WIDTH
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

    # hover ------------------------------------------------------------------------------------------

    def readout(self, plot: pg.PlotWidget, x: float) -> str | None:
        """What the chart `plot` says at `x` on its bottom axis (a round, a time, a length, a depth)."""
        return self.readouts[plot](x)

    def _on_mouse_moved(self, plot: pg.PlotWidget, position) -> None:
        view = plot.getViewBox()
        text = None
        if view.sceneBoundingRect().contains(position):
            text = self.readout(plot, view.mapSceneToView(position).x())
        if text:
            QToolTip.showText(QCursor.pos(), text, plot)
        else:
            QToolTip.hideText()

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
        self._timer.setInterval(1000 // (hz * len(self._parts)))

    def reset(self) -> None:
        self.speculative = SessionSeries()
        self.plain: SessionSeries | None = None
        self.identical: bool | None = None
        self._dirty = True
        self.redraw()

    def start_plain(self) -> None:
        """A compare run's second half begins: its events go to the plain series."""
        self.plain = SessionSeries()

    def add_events(self, batch: tuple, plain: bool = False) -> None:
        series = self.plain if plain else self.speculative
        for event in batch:
            series.add(event)
        self._dirty = True

    def set_identical(self, identical: bool | None) -> None:
        self.identical = identical
        self._dirty = True

    # drawing ----------------------------------------------------------------------------------------

    def _on_redraw_timer(self) -> None:
        """One chart per tick, in turn, so one pass of the event loop never repaints them all."""
        if not self._dirty:
            return
        part = self._parts[self._next_part]
        self._next_part = (self._next_part + 1) % len(self._parts)
        part()
        self._update_figures()
        if self._next_part == 0:
            self._dirty = False

    def redraw(self) -> None:
        """Every chart and figure, now (the end of a session, a screenshot)."""
        self._dirty = False
        self._next_part = 0
        for part in self._parts:
            part()
        self._update_figures()

    def _draw_acceptance(self) -> None:
        spec = self.speculative
        rounds = spec.column("round")
        if rounds.size > SYMBOL_LIMIT:
            self._per_round.setData(
                *block_means(rounds, spec.acceptance_per_round),
                connect="finite",
                symbol=None,
                pen=pg.mkPen("#1b8a2f88"),
            )
        else:  # symbols only where the round drafted: a plain-step round has no acceptance to mark
            drafted = np.isfinite(spec.acceptance_per_round)
            self._per_round.setData(rounds[drafted], spec.acceptance_per_round[drafted], symbol="o", pen=None)
        self._cumulative.setData(*thinned(rounds, spec.cumulative_acceptance), connect="finite")
        show_range(self.acceptance_plot, x=(0.0, nice_ceiling(rounds[-1] if rounds.size else 1.0)))

    def _draw_speed(self) -> None:
        series = [s for s in (self.speculative, self.plain) if s is not None]
        curves = [thinned(s.column("elapsed_s"), s.tokens_per_s) for s in series]
        self._spec_speed.setData(*curves[0], connect="finite")
        self._plain_speed.setData(*(curves[1] if len(curves) > 1 else ([], [])), connect="finite")
        elapsed = max((float(s.column("elapsed_s")[-1]) for s in series if s.size), default=1.0)
        rates = [y[np.isfinite(y)] for _, y in curves]
        fastest = max((float(r.max()) for r in rates if r.size), default=1.0)
        show_range(self.speed_plot, x=(0.0, nice_ceiling(elapsed)), y=(0.0, nice_ceiling(1.05 * fastest)))

    def _draw_round_time(self) -> None:
        """Each round's draft time, and its verify time stacked on it (block means past MAX_POINTS)."""
        spec = self.speculative
        rounds, draft = block_means(spec.column("round"), spec.column("draft_ms"))
        _, verify = block_means(spec.column("round"), spec.column("verify_ms"))
        width = 0.8 * (rounds[1] - rounds[0]) if rounds.size > 1 else 0.8
        self._draft_bars.setOpts(x=rounds, height=draft, width=width)
        self._verify_bars.setOpts(x=rounds, y0=draft, height=verify, width=width)
        longest = float(np.nanmax(draft + verify)) if rounds.size else 1.0
        show_range(
            self.round_time_plot,
            x=(0.0, nice_ceiling(float(rounds[-1]) + width / 2 if rounds.size else 1.0)),
            y=(0.0, nice_ceiling(1.05 * longest)),
        )

    def _draw_histogram(self) -> None:
        lengths, counts = self.speculative.kept_histogram()
        self._histogram.setOpts(x=lengths, height=counts)
        longest = float(lengths[-1]) if lengths.size else 1.0
        show_range(
            self.histogram_plot,
            x=(0.4, longest + 0.6),
            y=(0.0, nice_ceiling(1.05 * float(counts.max())) if counts.size else 1.0),
        )

    def _draw_by_position(self) -> None:
        by_position = np.asarray(self.speculative.stats.accepted_by_position, dtype=np.float64)
        self._by_position.setOpts(x=np.arange(1, by_position.size + 1, dtype=np.float64), height=by_position)
        show_range(self.position_plot, x=(0.4, max(1, by_position.size) + 0.6))

    def _draft_ms(self) -> float:
        start = self.speculative.start
        return start.draft_ms if start is not None else 0.0

    def _draw_costs(self) -> None:
        """The verify's cost in steps and the expected speedup by K at the session's acceptance,
        each beside a flat verify; empty where the session measured no costs (not the auto schedule)."""
        curve = curve_of(self.speculative.start)
        if curve is None:
            for item in (self._verify_cost, self._flat_cost, self._expected_here, self._expected_flat):
                item.setData([], [])
            return
        tokens, steps = verify_cost(curve)
        self._verify_cost.setData(tokens, steps)
        self._flat_cost.setData(tokens, np.ones_like(tokens))
        self.verify_cost_plot.setYRange(0, nice_ceiling(float(steps.max())), padding=RANGE_MARGIN)
        acceptance = self.speculative.stats.acceptance_rate
        ks, here = speedup_by_k(curve, acceptance, self._draft_ms())
        _, flat = speedup_by_k(curve, acceptance, self._draft_ms(), flat=True)
        self._expected_here.setData(ks, here)
        self._expected_flat.setData(ks, flat)
        self.expected_plot.setYRange(0, nice_ceiling(float(max(here.max(), flat.max(), 1.0))), padding=RANGE_MARGIN)
        self.expected_plot.setTitle(
            f"Expected speedup at a = {acceptance:.2f} {colour_key(SPEC_COLOUR, 'here')} {colour_key(PLAIN_COLOUR, 'flat verify')}"
        )

    def _update_figures(self) -> None:
        info = self._model.run_info if self._model is not None else None
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
