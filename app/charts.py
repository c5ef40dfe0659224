"""Live charts of a session: acceptance per round (with the cumulative rate), tokens/s over time
(speculative and plain on one chart), tokens kept per round as a histogram, and acceptance by
draft position, with the headline figures beside them.

Events only append to preallocated float64 buffers (`SessionSeries`); a timer redraws each chart
at 8 Hz when something changed (one chart per tick, so no single pass of the event loop repaints
all four), from at most `MAX_POINTS` points per curve, on axes that grow in steps (so their ticks
are recomputed a few times per session, not at every redraw): drawing costs the same however fast
tokens arrive and however long the session runs. The predicted
speedup is Leviathan et al. 2023, eq. 1 (see `engine.stats`); the measured one is speculative
tokens/s over plain tokens/s from a compare run.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QTimer
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QFormLayout, QGridLayout, QHBoxLayout, QLabel, QWidget

import pyqtgraph as pg  # after PySide6, so pyqtgraph binds to it

from app.session_model import SessionModel
from engine.events import RoundEvent, SummaryEvent
from engine.export import SessionRecord
from engine.stats import SessionStats

REDRAW_HZ = 8
SYMBOL_LIMIT = 300  # rounds: beyond this, per-round points are drawn as a line (symbols cost per point)
WIDEST_FIGURE = "0.000  (0000000/0000000)"  # the acceptance rate of a 10-million-token session
MAX_POINTS = 500  # per curve: a chart is a few hundred pixels wide, so more points only cost paint time
NICE_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0)  # axis ends: one of these times a power of ten
RANGE_MARGIN = 0.06  # beyond each end of an axis, so that the end ticks' labels still show
SPEC_PEN = pg.mkPen("#1f5fd1", width=2)
PLAIN_PEN = pg.mkPen("#777777", width=2, style=pg.QtCore.Qt.PenStyle.DashLine)

_FIELDS = ("round", "drafted", "accepted", "kept", "elapsed_s", "new_tokens")


class SessionSeries:
    """One session's per-round figures, in float64 buffers that grow by doubling (never per event)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._data = np.full((len(_FIELDS), capacity), np.nan, dtype=np.float64)
        self.size = 0
        self.stats = SessionStats()
        self.summary: SummaryEvent | None = None
        self.shapes: dict[str, int] = {}  # rounds per draft shape ("K=2", "copy 3", "none")

    def add(self, event) -> None:
        self.stats.add(event)
        if isinstance(event, SummaryEvent):
            self.summary = event
        if not isinstance(event, RoundEvent):
            return
        self.shapes[event.shape] = self.shapes.get(event.shape, 0) + 1
        if self.size == self._data.shape[1]:
            grown = np.full((len(_FIELDS), 2 * self.size), np.nan, dtype=np.float64)
            grown[:, : self.size] = self._data
            self._data = grown
        before = self._data[5, self.size - 1] if self.size else 0.0
        self._data[:, self.size] = (event.round, event.drafted, event.accepted, event.new_tokens - before,
                                    event.elapsed_s, event.new_tokens)
        self.size += 1

    def column(self, name: str) -> np.ndarray:
        return self._data[_FIELDS.index(name), : self.size]

    @property
    def acceptance_per_round(self) -> np.ndarray:
        """accepted / drafted per round; NaN where nothing was drafted (prompt lookup found no match)."""
        drafted = self.column("drafted")
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(drafted > 0, self.column("accepted") / drafted, np.nan)

    @property
    def cumulative_acceptance(self) -> np.ndarray:
        drafted = np.cumsum(self.column("drafted"))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(drafted > 0, np.cumsum(self.column("accepted")) / drafted, np.nan)

    @property
    def tokens_per_s(self) -> np.ndarray:
        elapsed = self.column("elapsed_s")
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(elapsed > 0, self.column("new_tokens") / elapsed, np.nan)

    def kept_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(kept tokens per round, number of rounds that kept that many)."""
        kept = self.column("kept").astype(np.int64)
        if not kept.size:
            return np.zeros(0), np.zeros(0)
        counts = np.bincount(kept)
        lengths = np.arange(counts.size)
        return lengths[1:].astype(np.float64), counts[1:].astype(np.float64)


def thinned(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Every stride-th point (and the last), at most about `limit`: enough for a smooth curve."""
    if x.size <= limit:
        return x, y
    stride = -(-x.size // limit)
    index = np.arange(x.size - 1, -1, -stride)[::-1]  # counted back from the last point, which stays
    return x[index], y[index]


def block_means(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Means over consecutive blocks of points (NaNs skipped), at most `limit` blocks."""
    if x.size <= limit:
        return x, y
    stride = -(-x.size // limit)
    usable = x.size // stride * stride
    values = y[:usable].reshape(-1, stride)
    counts = np.isfinite(values).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, np.nansum(values, axis=1) / counts, np.nan)
    return x[:usable].reshape(-1, stride).mean(axis=1), means


def _plot(title: str, left: str, bottom: str) -> pg.PlotWidget:
    widget = pg.PlotWidget(background="w")
    widget.setTitle(title, color="#222", size="10pt")
    widget.setLabel("left", left)
    widget.setLabel("bottom", bottom)
    widget.showGrid(x=True, y=True, alpha=0.2)
    widget.setMenuEnabled(False)
    widget.setMinimumSize(220, 150)
    for side in ("left", "bottom"):
        widget.getAxis(side).enableAutoSIPrefix(False)
    # room for six-digit ticks from the start: an axis that widens as values grow relayouts its plot
    widget.getAxis("left").setStyle(autoExpandTextSpace=False,
                                    tickTextWidth=QFontMetrics(widget.font()).horizontalAdvance("000000"))
    return widget


class SessionCharts(QWidget):
    """The four charts and the figures. `speculative` and `plain` are the two sessions' series;
    given a `SessionModel`, they follow its runs."""

    def __init__(self, model: SessionModel | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._model = model
        self.acceptance_plot = _plot("Acceptance per round (dots), cumulative (line)", "accepted / drafted", "round")
        self.acceptance_plot.setYRange(0, 1.0, padding=RANGE_MARGIN)
        self._per_round = self.acceptance_plot.plot(pen=None, symbol="o", symbolSize=5, symbolBrush="#1b8a2f",
                                                    symbolPen=None)
        self._cumulative = self.acceptance_plot.plot(pen=pg.mkPen("#222", width=2))

        self.speed_plot = _plot("Tokens/s over time", "tokens/s", "decoding time (s)")
        # one row in the bottom right: the axis starts at 0, so the curves run through the upper part
        self.speed_plot.addLegend(offset=(-5, -5), colCount=2, brush=pg.mkBrush(255, 255, 255, 220))
        self._spec_speed = self.speed_plot.plot(pen=SPEC_PEN, name="speculative")
        self._plain_speed = self.speed_plot.plot(pen=PLAIN_PEN, name="plain")

        self.histogram_plot = _plot("Tokens kept per round", "rounds", "tokens kept")
        self._histogram = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#1b8a2f")
        self.histogram_plot.addItem(self._histogram)
        self.histogram_plot.getAxis("bottom").setTickSpacing(1, 1)

        self.position_plot = _plot("Acceptance by draft position", "acceptance", "draft position")
        self.position_plot.setYRange(0, 1.0, padding=RANGE_MARGIN)
        self._by_position = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#1f5fd1")
        self.position_plot.addItem(self._by_position)
        self.position_plot.getAxis("bottom").setTickSpacing(1, 1)

        self.figures = {name: QLabel("–") for name in (
            "acceptance rate", "copied drafts", "mean accepted length", "tokens/s", "plain tokens/s", "rounds",
            "draft shapes", "draft / verify", "predicted speedup", "measured speedup", "greedy outputs")}
        form = QFormLayout()
        bold = QFont()
        bold.setBold(True)
        for name, label in self.figures.items():
            label.setFont(bold)
            # a fixed size, as wide as the widest figure: a label that grew with its text would
            # relayout the panel and resize (so repaint) all four charts
            label.setText(WIDEST_FIGURE)
            label.setFixedSize(label.sizeHint())
            label.setText("–")
            form.addRow(name, label)
        figures = QWidget()
        figures.setLayout(form)

        grid = QGridLayout()
        grid.addWidget(self.acceptance_plot, 0, 0)
        grid.addWidget(self.speed_plot, 0, 1)
        grid.addWidget(self.histogram_plot, 1, 0)
        grid.addWidget(self.position_plot, 1, 1)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(grid, 1)
        layout.addWidget(figures)

        self._dirty = False
        self._parts = (self._draw_acceptance, self._draw_speed, self._draw_histogram, self._draw_by_position)
        self._next_part = 0
        self._timer = QTimer(self)
        self._timer.setInterval(1000 // (REDRAW_HZ * len(self._parts)))
        self._timer.timeout.connect(self._on_redraw_timer)
        self._timer.start()
        self.reset()
        if model is not None:
            model.run_started.connect(lambda compare: self.reset())
            model.events_arrived.connect(self._on_events_arrived)
            model.run_ended.connect(self._on_run_ended)

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

    def _on_redraw_timer(self) -> None:
        """One chart per tick, in turn, so one pass of the event loop never repaints all four."""
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
            self._per_round.setData(*block_means(rounds, spec.acceptance_per_round), connect="finite", symbol=None,
                                    pen=pg.mkPen("#1b8a2f88"))
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

    def _draw_histogram(self) -> None:
        lengths, counts = self.speculative.kept_histogram()
        self._histogram.setOpts(x=lengths, height=counts)
        longest = float(lengths[-1]) if lengths.size else 1.0
        _show_range(self.histogram_plot, x=(0.4, longest + 0.6),
                    y=(0.0, nice_ceiling(1.05 * float(counts.max())) if counts.size else 1.0))

    def _draw_by_position(self) -> None:
        by_position = np.asarray(self.speculative.stats.accepted_by_position, dtype=np.float64)
        self._by_position.setOpts(x=np.arange(1, by_position.size + 1, dtype=np.float64), height=by_position)
        _show_range(self.position_plot, x=(0.4, max(1, by_position.size) + 0.6))

    def _update_figures(self) -> None:
        stats = self.speculative.stats
        f = self.figures
        has_drafts = stats.drafted > 0
        f["acceptance rate"].setText(f"{stats.acceptance_rate:.3f}  ({stats.accepted}/{stats.drafted})" if has_drafts else "–")
        f["copied drafts"].setText(f"{stats.copied_accepted}/{stats.copied_drafted} accepted" if stats.copied_drafted
                                   else "–")
        f["mean accepted length"].setText(f"{stats.mean_accepted_length:.2f}" if stats.rounds else "–")
        f["tokens/s"].setText(_rate(stats.tokens_per_s) if stats.rounds else "–")
        plain = self.plain.stats if self.plain is not None else None
        f["plain tokens/s"].setText(_rate(plain.tokens_per_s) if plain and plain.rounds else "–")
        f["rounds"].setText(str(stats.rounds) if stats.rounds else "–")
        f["draft shapes"].setText(shape_shares(self.speculative.shapes) if has_drafts or stats.rounds else "–")
        f["draft / verify"].setText(f"{stats.draft_ms / stats.rounds:.1f} / {stats.verify_ms / stats.rounds:.1f} ms"
                                    if stats.rounds else "–")
        summary = self.speculative.summary
        f["draft shapes"].setToolTip(_plan_tooltip(summary.plan) if summary is not None and summary.plan else
                                     "The rounds' draft lengths: K=n drafted n tokens, copy n copied n by prompt "
                                     "lookup, none was a plain step")
        predicted = stats.predicted_speedup
        f["predicted speedup"].setText(f"{predicted:.2f}x" if predicted is not None else "–")
        measured = self.measured_speedup
        f["measured speedup"].setText(f"{measured:.2f}x" if measured is not None else "–")
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


def shape_shares(shapes: dict[str, int], shown: int = 2) -> str:
    """The most frequent round shapes with their share of rounds, e.g. "K=2 61%, none 20%"."""
    total = sum(shapes.values())
    if not total:
        return "–"
    common = sorted(shapes.items(), key=lambda item: -item[1])[:shown]
    return ", ".join(f"{shape or 'K'} {count / total:.0%}" for shape, count in common)


def _plan_tooltip(plan: str) -> str:
    """The auto schedule's account of its choices (`SummaryEvent.plan`), one line per part."""
    return "Auto schedule\n" + "\n".join(plan.split("; "))


def nice_ceiling(value: float) -> float:
    """The smallest 1, 1.5, 2, 3, 5 or 7.5 times a power of ten that is at least `value`."""
    if not np.isfinite(value) or value <= 0:
        return 1.0
    decade = 10.0 ** np.floor(np.log10(value))
    return next(step * decade for step in NICE_STEPS if step * decade >= value * (1 - 1e-12))


def _show_range(plot: pg.PlotWidget, x: tuple[float, float] | None = None, y: tuple[float, float] | None = None) -> None:
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
