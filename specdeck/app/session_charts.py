"""The session's charts, one small widget each: acceptance per round (with the cumulative rate),
tokens/s over decoding time (speculative and plain), each round's time split into drafting and
verifying, tokens kept per round, acceptance by draft depth, and why it pays or not: this
machine's verify cost in plain steps and the speedup it makes of the session's acceptance at each
K, each beside a flat verify (`specdeck.app.cost_series`).

Each chart draws a session's series (`draw(speculative, plain)`), sets its own ranges and title
from them (so nothing of an earlier session stays), and says what its point under the mouse
shows (`readout`). They look and behave as `specdeck.app.chart_plot` says; `specdeck.app.charts` lays them out
and decides when they draw.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg  # after PySide6, so pyqtgraph binds to it

from specdeck.app.chart_plot import (
    DRAFT_COLOUR,
    PLAIN_COLOUR,
    PLAIN_PEN,
    SPEC_COLOUR,
    SPEC_PEN,
    VERIFY_COLOUR,
    ChartPlot,
    colour_key,
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
from specdeck.app.cost_series import speedup_by_k, speedup_readout, verify_cost, verify_readout
from specdeck.app.verdict import curve_of

SYMBOL_LIMIT = 300  # rounds: beyond this, per-round points are drawn as a line (symbols cost per point)


class SessionChart(ChartPlot):
    """A chart of one session (and the plain half of a compare run, where it has one)."""

    def __init__(self, title: str, left: str, bottom: str) -> None:
        super().__init__(title, left, bottom)
        self.speculative = SessionSeries()
        self.plain: SessionSeries | None = None

    def draw(self, speculative: SessionSeries, plain: SessionSeries | None) -> None:
        self.speculative, self.plain = speculative, plain
        self._draw()

    def _draw(self) -> None:
        raise NotImplementedError


class AcceptanceChart(SessionChart):
    def __init__(self) -> None:
        super().__init__("Acceptance per round", "accepted / drafted", "round")
        self.per_round = self.plot(pen=None, symbol="o", symbolSize=5, symbolBrush="#1b8a2f", symbolPen=None)
        self.cumulative = self.plot(pen=pg.mkPen("#222", width=2))

    def _draw(self) -> None:
        spec = self.speculative
        rounds = spec.column("round")
        if rounds.size > SYMBOL_LIMIT:
            x, y = block_means(rounds, spec.acceptance_per_round)
            self.per_round.setData(x, y, connect="finite", symbol=None, pen=pg.mkPen("#1b8a2f88"))
        else:  # symbols only where the round drafted: a plain-step round has no acceptance to mark
            drafted = np.isfinite(spec.acceptance_per_round)
            self.per_round.setData(rounds[drafted], spec.acceptance_per_round[drafted], symbol="o", pen=None)
        self.cumulative.setData(*thinned(rounds, spec.cumulative_acceptance), connect="finite")
        self.show_range(x=(0.0, nice_ceiling(rounds[-1] if rounds.size else 1.0)), y=(0.0, 1.0))

    def readout(self, x: float) -> str | None:
        return acceptance_readout(self.speculative, x)


class SpeedChart(SessionChart):
    def __init__(self) -> None:
        # the key is in the title: a legend inside the chart would cover the curves
        title = f"Tokens/s {colour_key(SPEC_COLOUR, 'speculative')} {colour_key(PLAIN_COLOUR, 'plain')}"
        super().__init__(title, "tokens/s", "decoding time (s)")
        self.spec_speed = self.plot(pen=SPEC_PEN, name="speculative")
        self.plain_speed = self.plot(pen=PLAIN_PEN, name="plain")

    def _draw(self) -> None:
        series = [s for s in (self.speculative, self.plain) if s is not None]
        curves = [thinned(s.column("elapsed_s"), s.tokens_per_s) for s in series]
        self.spec_speed.setData(*curves[0], connect="finite")
        self.plain_speed.setData(*(curves[1] if len(curves) > 1 else ([], [])), connect="finite")
        elapsed = max((float(s.column("elapsed_s")[-1]) for s in series if s.size), default=1.0)
        rates = [y[np.isfinite(y)] for _, y in curves]
        fastest = max((float(r.max()) for r in rates if r.size), default=1.0)
        self.show_range(x=(0.0, nice_ceiling(elapsed)), y=(0.0, nice_ceiling(1.05 * fastest)))

    def readout(self, x: float) -> str | None:
        return speed_readout(self.speculative, self.plain, x)


class RoundTimeChart(SessionChart):
    """Each round's draft time, and its verify time stacked on it (block means past MAX_POINTS)."""

    def __init__(self) -> None:
        title = f"Round time {colour_key(DRAFT_COLOUR, 'draft')} {colour_key(VERIFY_COLOUR, 'verify')}"
        super().__init__(title, "ms", "round")
        self.draft_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=DRAFT_COLOUR, pen=None)
        self.verify_bars = pg.BarGraphItem(x=[], y0=[], height=[], width=0.8, brush=VERIFY_COLOUR, pen=None)
        self.addItem(self.draft_bars)
        self.addItem(self.verify_bars)

    def _draw(self) -> None:
        spec = self.speculative
        rounds, draft = block_means(spec.column("round"), spec.column("draft_ms"))
        _, verify = block_means(spec.column("round"), spec.column("verify_ms"))
        width = 0.8 * (rounds[1] - rounds[0]) if rounds.size > 1 else 0.8
        self.draft_bars.setOpts(x=rounds, height=draft, width=width)
        self.verify_bars.setOpts(x=rounds, y0=draft, height=verify, width=width)
        longest = float(np.nanmax(draft + verify)) if rounds.size else 1.0
        right = float(rounds[-1]) + width / 2 if rounds.size else 1.0
        self.show_range(x=(0.0, nice_ceiling(right)), y=(0.0, nice_ceiling(1.05 * longest)))

    def readout(self, x: float) -> str | None:
        return round_time_readout(self.speculative, x)


class KeptChart(SessionChart):
    def __init__(self) -> None:
        super().__init__("Tokens kept per round", "rounds", "tokens kept")
        self.histogram = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#1b8a2f")
        self.addItem(self.histogram)
        self.getAxis("bottom").setTickSpacing(1, 1)

    def _draw(self) -> None:
        lengths, counts = self.speculative.kept_histogram()
        self.histogram.setOpts(x=lengths, height=counts)
        longest = float(lengths[-1]) if lengths.size else 1.0
        highest = nice_ceiling(1.05 * float(counts.max())) if counts.size else 1.0
        self.show_range(x=(0.4, longest + 0.6), y=(0.0, highest))

    def readout(self, x: float) -> str | None:
        return histogram_readout(self.speculative, x)


class DepthChart(SessionChart):
    def __init__(self) -> None:
        super().__init__("Acceptance by draft depth", "acceptance", "draft depth")
        self.by_position = pg.BarGraphItem(x=[], height=[], width=0.8, brush=SPEC_COLOUR)
        self.addItem(self.by_position)
        self.getAxis("bottom").setTickSpacing(1, 1)

    def _draw(self) -> None:
        by_position = np.asarray(self.speculative.stats.accepted_by_position, dtype=np.float64)
        self.by_position.setOpts(x=np.arange(1, by_position.size + 1, dtype=np.float64), height=by_position)
        self.show_range(x=(0.4, max(1, by_position.size) + 0.6), y=(0.0, 1.0))

    def readout(self, x: float) -> str | None:
        return position_readout(self.speculative, x)


class VerifyCostChart(SessionChart):
    """The verify's cost in steps, beside a flat verify; empty where the session measured no
    costs (not the auto schedule)."""

    def __init__(self) -> None:
        title = f"Verify cost {colour_key(SPEC_COLOUR, 'this machine')} {colour_key(PLAIN_COLOUR, 'flat')}"
        super().__init__(title, "steps", "tokens verified")
        self.here = self.plot(pen=SPEC_PEN, symbol="o", symbolSize=4, symbolBrush=SPEC_COLOUR)
        self.flat = self.plot(pen=PLAIN_PEN)

    def _draw(self) -> None:
        curve = curve_of(self.speculative.start)
        if curve is None:
            self.here.setData([], [])
            self.flat.setData([], [])
            self.show_range(x=(1.0, 16.0), y=(0.0, 1.0))
            return
        tokens, steps = verify_cost(curve)
        self.here.setData(tokens, steps)
        self.flat.setData(tokens, np.ones_like(tokens))
        self.show_range(x=(1.0, float(tokens[-1])), y=(0.0, nice_ceiling(float(steps.max()))))

    def readout(self, x: float) -> str | None:
        return verify_readout(curve_of(self.speculative.start), x)


class ExpectedSpeedupChart(SessionChart):
    """The speedup each K makes of the session's acceptance, on this machine's verify cost and on
    a flat one; its title names the session's acceptance, and only where it has costs to draw."""

    def __init__(self) -> None:
        super().__init__(self.title_for(None), "x plain", "K")
        self.here = self.plot(pen=SPEC_PEN, symbol="o", symbolSize=4, symbolBrush=SPEC_COLOUR)
        self.flat = self.plot(pen=PLAIN_PEN)
        self.addItem(pg.InfiniteLine(1.0, angle=0, pen=pg.mkPen("#999", width=1)))
        self.getAxis("bottom").setTickSpacing(1, 1)
        self.title = self.title_for(None)

    @staticmethod
    def title_for(acceptance: float | None) -> str:
        at = f" at a = {acceptance:.2f}" if acceptance is not None else ""
        return f"Expected speedup{at} {colour_key(SPEC_COLOUR, 'here')} {colour_key(PLAIN_COLOUR, 'flat verify')}"

    def _draft_ms(self) -> float:
        start = self.speculative.start
        return start.draft_ms if start is not None else 0.0

    def _draw(self) -> None:
        curve = curve_of(self.speculative.start)
        acceptance = self.speculative.stats.acceptance_rate if curve is not None else None
        if self.title_for(acceptance) != self.title:
            self.title = self.title_for(acceptance)
            self.set_title(self.title)
        if curve is None or acceptance is None:
            self.here.setData([], [])
            self.flat.setData([], [])
            self.show_range(x=(0.5, 8.5), y=(0.0, 1.0))
            return
        ks, here = speedup_by_k(curve, acceptance, self._draft_ms())
        _, flat = speedup_by_k(curve, acceptance, self._draft_ms(), flat=True)
        self.here.setData(ks, here)
        self.flat.setData(ks, flat)
        self.show_range(x=(0.5, float(ks[-1]) + 0.5), y=(0.0, nice_ceiling(float(max(here.max(), flat.max(), 1.0)))))

    def readout(self, x: float) -> str | None:
        curve = curve_of(self.speculative.start)
        return speedup_readout(curve, self.speculative.stats.acceptance_rate, self._draft_ms(), x)
