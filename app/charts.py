"""Live charts of a session: acceptance per round (with the cumulative rate), tokens/s over time
(speculative and plain on one chart), each round's time split into drafting and verifying (its
shape, chain length and tree width, on hover), tokens kept per round as a histogram,
acceptance by draft depth, and why it pays or not: this machine's verify cost in plain steps and
the speedup it makes of the session's acceptance at each K, each beside a flat verify (`app.cost_series`);
the headline figures beside or below them.

Events only append to preallocated float64 buffers (`app.chart_series`); a timer redraws one
chart per tick when something changed, at 8 Hz per chart, 2 Hz while a session decodes (painting
a chart takes a few ms of the main thread, which on a small machine is a core the decoding
threads wait for), from at most `MAX_POINTS` points per
curve, on axes that grow in steps (so their ticks are recomputed a few times per session, not at
every redraw): drawing costs the same however fast tokens arrive and however long the session
runs. Hovering a chart reads out the point under the mouse. The predicted speedup is Leviathan et
al. 2023, eq. 1 (see `engine.stats`); the measured one is speculative tokens/s over plain tokens/s
from a compare run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyqtgraph as pg  # after PySide6, so pyqtgraph binds to it
from PySide6.QtCore import QTimer
from PySide6.QtGui import QCursor, QFont, QFontMetrics
from PySide6.QtWidgets import QBoxLayout, QGridLayout, QLabel, QToolTip, QWidget

from specdeck.app.chart_series import (
    SessionSeries,
    acceptance_readout,
    block_means,
    histogram_readout,
    nice_ceiling,
    position_readout,
    round_time_readout,
    shape_shares,
    speed_readout,
    thinned,
)
from specdeck.app.cost_series import curve_of, speedup_by_k, speedup_readout, verify_cost, verify_readout
from specdeck.app.session_model import SessionModel
from specdeck.engine.events import SummaryEvent
from specdeck.engine.export import SessionRecord

REDRAW_HZ = 8
DECODING_REDRAW_HZ = 2
SYMBOL_LIMIT = 300  # rounds: beyond this, per-round points are drawn as a line (symbols cost per point)
WIDEST_FIGURE = "0.000  (000000/000000)"  # the acceptance rate of a million-token session
RANGE_MARGIN = 0.06  # beyond each end of an axis, so that the end ticks' labels still show
CHART_WIDTH = 250  # px a chart needs to show its title and axes whole
CHART_HEIGHT = 180
CHART_COLUMNS = 3  # at most
FIGURES_BESIDE_WIDTH = 1100  # px: narrower, the figures go below the charts, in columns
SPEC_COLOUR, PLAIN_COLOUR, DRAFT_COLOUR, VERIFY_COLOUR = "#1f5fd1", "#777777", "#e69f00", "#56b4e9"
SPEC_PEN = pg.mkPen(SPEC_COLOUR, width=2)
PLAIN_PEN = pg.mkPen(PLAIN_COLOUR, width=2, style=pg.QtCore.Qt.PenStyle.DashLine)

FIGURE_TIPS = {
    "acceptance rate": "Drafts the target accepted, of all drafts proposed (a draft discarded after an earlier "
    "rejection counts as not accepted; acceptance by depth counts judged drafts only)",
    "copied drafts": "Drafts that prompt lookup copied from earlier text (Lookup > 0): accepted of copied",
    "mean accepted length": "Tokens kept per round, the target's own token included: plain decoding scores 1",
    "tokens/s": "Kept tokens per second of decoding, prefill excluded",
    "plain tokens/s": "The same for the plain half of a compare run",
    "rounds": "Target forwards (one verify per round)",
    "draft shapes": "The rounds' draft shapes: K=n drafted a chain of n tokens (wN: N candidates for the first), "
    "copy n copied n by prompt lookup, none was a plain step",
    "draft / verify": "Mean time per round spent drafting and in the target's verify forward",
    "predicted speedup": "Leviathan et al. 2023, eq. 1: (1 - a^(K+1)) / ((1 - a)(cK + 1)), with a the measured "
    "acceptance rate, K the mean drafts per round and c the measured cost of one draft token "
    "over one verify: what the rounds should gain over plain decoding on this machine",
    "measured speedup": "Speculative tokens/s over plain tokens/s, measured by Compare on the same prompt and settings",
    "greedy outputs": "Whether Compare's speculative and plain texts are identical (greedy runs must be)",
    "backend": "What ran the target: torch, or llama.cpp on the GGUF file's quantized weights (their type named)",
}


def _plot(title: str, left: str, bottom: str) -> pg.PlotWidget:
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


def _key(colour: str, text: str) -> str:
    return f"<span style='color:{colour}'>&#9632; {text}</span>"


class SessionCharts(QWidget):
    """The five charts and the figures. `speculative` and `plain` are the two sessions' series;
    given a `SessionModel`, they follow its runs."""

    def __init__(self, model: SessionModel | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self.acceptance_plot = _plot("Acceptance per round", "accepted / drafted", "round")
        self.acceptance_plot.setYRange(0, 1.0, padding=RANGE_MARGIN)
        self._per_round = self.acceptance_plot.plot(
            pen=None, symbol="o", symbolSize=5, symbolBrush="#1b8a2f", symbolPen=None
        )
        self._cumulative = self.acceptance_plot.plot(pen=pg.mkPen("#222", width=2))

        # the key is in the title: a legend inside the chart would cover the curves
        self.speed_plot = _plot(
            f"Tokens/s {_key(SPEC_COLOUR, 'speculative')} {_key(PLAIN_COLOUR, 'plain')}",
            "tokens/s",
            "decoding time (s)",
        )
        self._spec_speed = self.speed_plot.plot(pen=SPEC_PEN, name="speculative")
        self._plain_speed = self.speed_plot.plot(pen=PLAIN_PEN, name="plain")

        self.round_time_plot = _plot(
            f"Round time {_key(DRAFT_COLOUR, 'draft')} {_key(VERIFY_COLOUR, 'verify')}", "ms", "round"
        )
        self._draft_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=DRAFT_COLOUR, pen=None)
        self._verify_bars = pg.BarGraphItem(x=[], y0=[], height=[], width=0.8, brush=VERIFY_COLOUR, pen=None)
        self.round_time_plot.addItem(self._draft_bars)
        self.round_time_plot.addItem(self._verify_bars)

        self.histogram_plot = _plot("Tokens kept per round", "rounds", "tokens kept")
        self._histogram = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#1b8a2f")
        self.histogram_plot.addItem(self._histogram)
        self.histogram_plot.getAxis("bottom").setTickSpacing(1, 1)

        self.position_plot = _plot("Acceptance by draft depth", "acceptance", "draft depth")
        self.position_plot.setYRange(0, 1.0, padding=RANGE_MARGIN)
        self._by_position = pg.BarGraphItem(x=[], height=[], width=0.8, brush=SPEC_COLOUR)
        self.position_plot.addItem(self._by_position)
        self.position_plot.getAxis("bottom").setTickSpacing(1, 1)

        # why it pays or not: this machine's verify cost, and what it makes of the session's acceptance
        self.verify_cost_plot = _plot(
            f"Verify cost {_key(SPEC_COLOUR, 'this machine')} {_key(PLAIN_COLOUR, 'flat')}", "steps", "tokens verified"
        )
        self._verify_cost = self.verify_cost_plot.plot(pen=SPEC_PEN, symbol="o", symbolSize=4, symbolBrush=SPEC_COLOUR)
        self._flat_cost = self.verify_cost_plot.plot(pen=PLAIN_PEN)
        self.expected_plot = _plot(
            f"Expected speedup {_key(SPEC_COLOUR, 'this machine')} {_key(PLAIN_COLOUR, 'flat verify')}", "x plain", "K"
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

        self.figures = {name: QLabel("–") for name in FIGURE_TIPS}
        bold = QFont()
        bold.setBold(True)
        self._figure_names = {}
        for name, label in self.figures.items():
            label.setFont(bold)
            # a fixed size, as wide as the widest figure: a label that grew with its text would
            # relayout the panel and resize (so repaint) all the charts
            label.setText(WIDEST_FIGURE)
            label.setFixedSize(label.sizeHint())
            label.setText("–")
            label.setToolTip(FIGURE_TIPS[name])
            self._figure_names[name] = QLabel(name)
            self._figure_names[name].setToolTip(FIGURE_TIPS[name])
        self._figures_grid = QGridLayout()
        self._figures_grid.setVerticalSpacing(2)
        self._figures = QWidget()
        self._figures.setLayout(self._figures_grid)

        self._grid = QGridLayout()
        self._layout = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addLayout(self._grid, 1)
        self._layout.addWidget(self._figures)
        self._figure_column_width = (
            max(label.width() for label in self.figures.values())
            + max(label.sizeHint().width() for label in self._figure_names.values())
            + 24
        )
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
        figure_columns = 1 if beside else max(1, min(3, width // self._figure_column_width))
        place = (chart_columns, beside, figure_columns)
        if place == self._place:
            return
        self._place = place
        for i, plot in enumerate(self.plots):
            self._grid.addWidget(plot, i // chart_columns, i % chart_columns)
        self._layout.setDirection(QBoxLayout.Direction.LeftToRight if beside else QBoxLayout.Direction.TopToBottom)
        for i, name in enumerate(self.figures):
            row, column = (i, 0) if beside else (i // figure_columns, 2 * (i % figure_columns))
            self._figures_grid.addWidget(self._figure_names[name], row, column)
            self._figures_grid.addWidget(self.figures[name], row, column + 1)

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
        _show_range(self.acceptance_plot, x=(0.0, nice_ceiling(rounds[-1] if rounds.size else 1.0)))

    def _draw_speed(self) -> None:
        series = [s for s in (self.speculative, self.plain) if s is not None]
        curves = [thinned(s.column("elapsed_s"), s.tokens_per_s) for s in series]
        self._spec_speed.setData(*curves[0], connect="finite")
        self._plain_speed.setData(*(curves[1] if len(curves) > 1 else ([], [])), connect="finite")
        elapsed = max((float(s.column("elapsed_s")[-1]) for s in series if s.size), default=1.0)
        rates = [y[np.isfinite(y)] for _, y in curves]
        fastest = max((float(r.max()) for r in rates if r.size), default=1.0)
        _show_range(self.speed_plot, x=(0.0, nice_ceiling(elapsed)), y=(0.0, nice_ceiling(1.05 * fastest)))

    def _draw_round_time(self) -> None:
        """Each round's draft time, and its verify time stacked on it (block means past MAX_POINTS)."""
        spec = self.speculative
        rounds, draft = block_means(spec.column("round"), spec.column("draft_ms"))
        _, verify = block_means(spec.column("round"), spec.column("verify_ms"))
        width = 0.8 * (rounds[1] - rounds[0]) if rounds.size > 1 else 0.8
        self._draft_bars.setOpts(x=rounds, height=draft, width=width)
        self._verify_bars.setOpts(x=rounds, y0=draft, height=verify, width=width)
        longest = float(np.nanmax(draft + verify)) if rounds.size else 1.0
        _show_range(
            self.round_time_plot,
            x=(0.0, nice_ceiling(float(rounds[-1]) + width / 2 if rounds.size else 1.0)),
            y=(0.0, nice_ceiling(1.05 * longest)),
        )

    def _draw_histogram(self) -> None:
        lengths, counts = self.speculative.kept_histogram()
        self._histogram.setOpts(x=lengths, height=counts)
        longest = float(lengths[-1]) if lengths.size else 1.0
        _show_range(
            self.histogram_plot,
            x=(0.4, longest + 0.6),
            y=(0.0, nice_ceiling(1.05 * float(counts.max())) if counts.size else 1.0),
        )

    def _draw_by_position(self) -> None:
        by_position = np.asarray(self.speculative.stats.accepted_by_position, dtype=np.float64)
        self._by_position.setOpts(x=np.arange(1, by_position.size + 1, dtype=np.float64), height=by_position)
        _show_range(self.position_plot, x=(0.4, max(1, by_position.size) + 0.6))

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
            f"Expected speedup at a = {acceptance:.2f} {_key(SPEC_COLOUR, 'here')} {_key(PLAIN_COLOUR, 'flat verify')}"
        )

    def _update_figures(self) -> None:
        stats = self.speculative.stats
        f = self.figures
        has_drafts = stats.drafted > 0
        f["acceptance rate"].setText(
            f"{stats.acceptance_rate:.3f}  ({stats.accepted}/{stats.drafted})" if has_drafts else "–"
        )
        f["copied drafts"].setText(
            f"{stats.copied_accepted}/{stats.copied_drafted} accepted" if stats.copied_drafted else "–"
        )
        f["mean accepted length"].setText(f"{stats.mean_accepted_length:.2f}" if stats.rounds else "–")
        f["tokens/s"].setText(_rate(stats.tokens_per_s) if stats.rounds else "–")
        plain = self.plain.stats if self.plain is not None else None
        f["plain tokens/s"].setText(_rate(plain.tokens_per_s) if plain and plain.rounds else "–")
        f["rounds"].setText(str(stats.rounds) if stats.rounds else "–")
        f["draft shapes"].setText(shape_shares(self.speculative.shapes) if has_drafts or stats.rounds else "–")
        f["draft / verify"].setText(
            f"{stats.draft_ms / stats.rounds:.1f} / {stats.verify_ms / stats.rounds:.1f} ms" if stats.rounds else "–"
        )
        summary = self.speculative.summary
        f["draft shapes"].setToolTip(
            _plan_tooltip(summary.plan) if summary is not None and summary.plan else FIGURE_TIPS["draft shapes"]
        )
        predicted = stats.predicted_speedup
        f["predicted speedup"].setText(f"{predicted:.2f}x" if predicted is not None else "–")
        measured = self.measured_speedup
        f["measured speedup"].setText(f"{measured:.2f}x" if measured is not None else "–")
        info = self._model.run_info if self._model is not None else None
        f["backend"].setText(info.backend if info is not None else "–")
        if self.identical is None:
            f["greedy outputs"].setText("–")
            f["greedy outputs"].setStyleSheet("")
        else:
            f["greedy outputs"].setText("identical ✓" if self.identical else "differ ✗")
            f["greedy outputs"].setStyleSheet(f"color: {'#1b8a2f' if self.identical else '#c62828'};")

    @property
    def measured_speedup(self) -> float | None:
        """Speculative over plain tokens/s, once both sessions of a compare run have ended."""
        if self.plain is None or self.speculative.summary is None or self.plain.summary is None:
            return None
        plain = self.plain.summary.tokens_per_s
        return self.speculative.summary.tokens_per_s / plain if plain > 0 else None


def _plan_tooltip(plan: str) -> str:
    """The auto schedule's account of its choices (`SummaryEvent.plan`), one line per part."""
    return "Auto schedule\n" + "\n".join(plan.split("; "))


def _show_range(
    plot: pg.PlotWidget, x: tuple[float, float] | None = None, y: tuple[float, float] | None = None
) -> None:
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


def _rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:.1f}" if tokens_per_s >= 10 else f"{tokens_per_s:.2f}"
