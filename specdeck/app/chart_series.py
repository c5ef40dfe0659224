"""A session's per-round figures for the charts, in buffers that grow by doubling, and the ways
the charts thin them: every stride-th point, block means, axis ends that grow in steps.

Qt-free: `specdeck.app.charts` draws from these.
"""

from __future__ import annotations

import numpy as np

from specdeck.engine.events import RoundEvent, SessionStarted, SummaryEvent
from specdeck.engine.stats import SessionStats

MAX_POINTS = 500  # per curve: a chart is a few hundred pixels wide, so more points only cost paint time
NICE_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0)  # axis ends: one of these times a power of ten

_FIELDS = ("round", "drafted", "accepted", "kept", "elapsed_s", "new_tokens", "draft_ms", "verify_ms", "match_length")


class SessionSeries:
    """One session's per-round figures, in float64 buffers that grow by doubling (never per event)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._data = np.full((len(_FIELDS), capacity), np.nan, dtype=np.float64)
        self.size = 0
        self.stats = SessionStats()
        self.summary: SummaryEvent | None = None
        self.start: SessionStarted | None = None
        self.shapes: dict[str, int] = {}  # rounds per draft shape ("K=2", "copy 3", "none")
        self.round_shapes: list[str] = []  # each round's shape, in order

    def add(self, event) -> None:
        self.stats.add(event)
        if isinstance(event, SummaryEvent):
            self.summary = event
        if isinstance(event, SessionStarted):
            self.start = event
        if not isinstance(event, RoundEvent):
            return
        self.shapes[event.shape] = self.shapes.get(event.shape, 0) + 1
        self.round_shapes.append(event.shape)
        if self.size == self._data.shape[1]:
            grown = np.full((len(_FIELDS), 2 * self.size), np.nan, dtype=np.float64)
            grown[:, : self.size] = self._data
            self._data = grown
        before = self._data[5, self.size - 1] if self.size else 0.0
        self._data[:, self.size] = (
            event.round,
            event.drafted,
            event.accepted,
            event.new_tokens - before,
            event.elapsed_s,
            event.new_tokens,
            event.draft_ms,
            event.verify_ms,
            event.match_length,
        )
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


def shape_shares(shapes: dict[str, int], shown: int = 2) -> str:
    """The most frequent round shapes with their share of rounds, e.g. "K=2 61%, none 20%"."""
    total = sum(shapes.values())
    if not total:
        return "–"
    common = sorted(shapes.items(), key=lambda item: -item[1])[:shown]
    return ", ".join(f"{shape or 'K'} {count / total:.0%}" for shape, count in common)


def nice_ceiling(value: float) -> float:
    """The smallest 1, 1.5, 2, 3, 5 or 7.5 times a power of ten that is at least `value`."""
    if not np.isfinite(value) or value <= 0:
        return 1.0
    decade = 10.0 ** np.floor(np.log10(value))
    return next(step * decade for step in NICE_STEPS if step * decade >= value * (1 - 1e-12))


# what a point of each chart says when the mouse is over it ----------------------------------------


def _round_index(series: SessionSeries, x: float) -> int | None:
    """The index of the round nearest `x` on a round axis, None outside the session."""
    if not series.size:
        return None
    i = int(round(x)) - 1
    return i if 0 <= i < series.size else None


def acceptance_readout(series: SessionSeries, x: float) -> str | None:
    i = _round_index(series, x)
    if i is None:
        return None
    drafted, accepted = int(series.column("drafted")[i]), int(series.column("accepted")[i])
    this = f"accepted {accepted}/{drafted}" if drafted else "drafted nothing (a plain step)"
    cumulative = series.cumulative_acceptance[i]
    return f"round {i + 1}: {this}" + ("" if np.isnan(cumulative) else f"; cumulative {cumulative:.3f}")


def speed_readout(speculative: SessionSeries, plain: SessionSeries | None, x: float) -> str | None:
    """Each session's tokens/s at the last round that ended by decoding time `x` (seconds)."""
    parts = []
    for name, series in (("speculative", speculative), ("plain", plain)):
        if series is None or not series.size:
            continue
        i = int(np.searchsorted(series.column("elapsed_s"), x, side="right")) - 1
        if i >= 0:
            parts.append(f"{name} {series.tokens_per_s[i]:.1f} tokens/s ({int(series.column('new_tokens')[i])} tokens)")
    return f"at {x:.2f} s: " + ", ".join(parts) if parts else None


def round_time_readout(series: SessionSeries, x: float) -> str | None:
    i = _round_index(series, x)
    if i is None:
        return None
    shape = series.round_shapes[i] or "–"
    matched = int(series.column("match_length")[i])
    where = f" after a {matched}-token match" if matched else ""  # how much of the text repeated earlier text
    return (
        f"round {i + 1}, {describe_shape(shape)}{where}: draft {series.column('draft_ms')[i]:.1f} ms, "
        f"verify {series.column('verify_ms')[i]:.1f} ms, kept {int(series.column('kept')[i])}"
    )


def histogram_readout(series: SessionSeries, x: float) -> str | None:
    lengths, counts = series.kept_histogram()
    k = int(round(x))
    if not lengths.size or not 1 <= k <= lengths[-1]:
        return None
    n = int(counts[k - 1])
    return f"{n} round{'s' if n != 1 else ''} kept {k} token{'s' if k != 1 else ''}"


def position_readout(series: SessionSeries, x: float) -> str | None:
    d = int(round(x))
    stats = series.stats
    if not 1 <= d <= len(stats.drafted_at):
        return None
    return (
        f"draft depth {d}: accepted {stats.accepted_at[d - 1]} of {stats.drafted_at[d - 1]} "
        f"({stats.accepted_by_position[d - 1]:.2f})"
    )


def describe_shape(shape: str) -> str:
    """A round's shape in words: "K=3 w2" is a chain of 3 drafts with 2 candidates for the first token."""
    if shape == "none":
        return "no draft (a plain step)"
    if shape.startswith("copy"):
        return f"{shape.split()[1]} tokens copied"
    chain, _, width = shape.partition(" w")
    text = f"chain of {chain.removeprefix('K=')}" if chain.startswith("K=") else chain
    return text + (f", tree width {width}" if width else "")
