"""The charts of a long session still draw every curve, from a bounded number of points."""

from __future__ import annotations

import numpy as np

from app.charts import MAX_POINTS, SessionCharts, thinned
from engine.events import RoundEvent


def _long_session(rounds: int) -> tuple:
    """`rounds` rounds of 4 drafts, 2 accepted (3 tokens kept), 10 ms each."""
    return tuple(RoundEvent(i, 4, 2, 1.0, 4.0, 3 * i, 0.01 * i) for i in range(1, rounds + 1))


def test_thinned_keeps_the_last_point_and_at_most_the_limit():
    """Thinning a long curve keeps its last point, its order, and no more than the limit."""
    x = np.arange(10_001, dtype=np.float64)
    tx, ty = thinned(x, 2 * x, limit=500)
    assert 0 < tx.size <= 500
    assert tx[-1] == x[-1] and np.all(np.diff(tx) > 0)
    assert np.array_equal(ty, 2 * tx)


def test_long_session_curves_reach_the_last_round(qtbot):
    """With more rounds than a curve draws points, the cumulative acceptance and tokens/s curves
    still run to the last round with the session's figures."""
    charts = SessionCharts()
    qtbot.addWidget(charts)
    rounds = 4 * MAX_POINTS + 3
    charts.add_events(_long_session(rounds))
    charts.redraw()
    x, y = charts._cumulative.getData()
    assert 0 < x.size <= MAX_POINTS and x[-1] == rounds and y[-1] == 0.5
    x, y = charts._spec_speed.getData()
    assert 0 < x.size <= MAX_POINTS and np.isclose(x[-1], 0.01 * rounds) and np.isclose(y[-1], 300.0)
