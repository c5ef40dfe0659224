"""The charts of a long session still draw every curve, from a bounded number of points."""

from __future__ import annotations

import numpy as np

from specdeck.app.chart_series import MAX_POINTS, nice_ceiling, thinned
from specdeck.app.charts import SessionCharts
from specdeck.engine.events import RoundEvent, TokenEvent, TokenState


def _long_session(rounds: int) -> tuple:
    """`rounds` rounds of 4 drafts, 2 accepted, 2 rejected and a resample (3 tokens kept), 10 ms each."""
    events = []
    for i in range(1, rounds + 1):
        pos = 3 * (i - 1)
        events += [
            TokenEvent(TokenState.ACCEPTED, 1, "a", pos, i, 0.9, 0.8),
            TokenEvent(TokenState.ACCEPTED, 1, "b", pos + 1, i, 0.9, 0.8),
            TokenEvent(TokenState.REJECTED, 2, "c", pos + 2, i, 0.1, 0.6),
            TokenEvent(TokenState.REJECTED, 2, "d", pos + 2, i, 0.1, 0.6),
            TokenEvent(TokenState.RESAMPLED, 3, "e", pos + 2, i, 0.5, 0.1),
            RoundEvent(i, 4, 2, 1.0, 4.0, 3 * i, 0.01 * i),
        ]
    return tuple(events)


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
    x, y = charts.acceptance_plot.cumulative.getData()
    assert 0 < x.size <= MAX_POINTS and x[-1] == rounds and y[-1] == 0.5
    x, y = charts.speed_plot.spec_speed.getData()
    assert 0 < x.size <= MAX_POINTS and np.isclose(x[-1], 0.01 * rounds) and np.isclose(y[-1], 300.0)


def test_every_curve_and_bar_stays_inside_its_chart(qtbot):
    """As a session grows, each chart's axes grow with it: no point or bar is drawn outside the view."""
    charts = SessionCharts()
    qtbot.addWidget(charts)
    for rounds in (3, 40, 1_000, 4_000):
        charts.reset()
        charts.add_events(_long_session(rounds))
        charts.redraw()
        for plot, items in (
            (charts.acceptance_plot, (charts.acceptance_plot.per_round, charts.acceptance_plot.cumulative)),
            (charts.speed_plot, (charts.speed_plot.spec_speed,)),
            (charts.round_time_plot, (charts.round_time_plot.draft_bars, charts.round_time_plot.verify_bars)),
            (charts.histogram_plot, (charts.histogram_plot.histogram,)),
            (charts.position_plot, (charts.position_plot.by_position,)),
        ):
            (x0, x1), (y0, y1) = plot.getViewBox().viewRange()
            for item in items:
                bounds = item.boundingRect() if hasattr(item, "setOpts") else item.curve.boundingRect()
                assert x0 <= bounds.left() and bounds.right() <= x1, (plot.plotItem.titleLabel.text, rounds)
                assert y0 <= bounds.top() and bounds.bottom() <= y1, (plot.plotItem.titleLabel.text, rounds)


def test_nice_ceiling_steps():
    """Axis ends are 1, 1.5, 2, 3, 5 or 7.5 times a power of ten, the first at or above the value."""
    assert [nice_ceiling(v) for v in (0.7, 1, 1.2, 2.9, 4, 6, 9, 2668, 0.0)] == [0.75, 1, 1.5, 3, 5, 7.5, 10, 3000, 1.0]


def test_draft_shapes_figure_shows_what_the_rounds_drafted(qtbot):
    """The figures name the most frequent round shapes with their share, and the summary's plan
    (why the auto schedule chose them) is the figure's tooltip."""
    from specdeck.engine.events import SummaryEvent

    charts = SessionCharts()
    qtbot.addWidget(charts)
    shapes = ["K=2", "K=2", "none", "K=2", "copy 3", "none"]
    charts.add_events(
        tuple(
            RoundEvent(
                i + 1,
                0 if s == "none" else int(s[-1]),
                0,
                1.0,
                4.0,
                i + 1,
                0.01 * (i + 1),
                copied=s.startswith("copy"),
                shape=s,
            )
            for i, s in enumerate(shapes)
        )
    )
    charts.redraw()
    assert charts.figures["draft shapes"].text() == "K=2 50%, none 33%"
    assert charts.figures["draft / verify"].text() == "1.0 / 4.0 ms"  # mean per round
    plan = "chosen per round: K=2 x3; drafter acceptance by depth: 0.90/0.40"
    charts.add_events(
        (SummaryEvent("", 6, 6, 7, 0, 0.0, 1.0, 10.0, 0.6, 1.0, 1.0, (), None, "max_new_tokens", plan=plan),)
    )
    charts.redraw()
    assert "drafter acceptance by depth: 0.90/0.40" in charts.figures["draft shapes"].toolTip()


def test_hovering_a_chart_reads_out_the_point_under_the_mouse(qtbot):
    """Each chart names what its point at x shows: the round, its figures, its shape and time split."""
    charts = SessionCharts()
    qtbot.addWidget(charts)
    events = list(_long_session(3))
    events[5] = RoundEvent(1, 4, 2, 1.0, 4.0, 3, 0.01, shape="K=4 w2")
    charts.add_events(tuple(events))
    charts.redraw()
    assert charts.readout(charts.acceptance_plot, 1.2) == "round 1: accepted 2/4; cumulative 0.500"
    assert charts.readout(charts.round_time_plot, 0.9) == (
        "round 1, chain of 4, tree width 2: draft 1.0 ms, verify 4.0 ms, kept 3"
    )
    assert charts.readout(charts.histogram_plot, 3) == "3 rounds kept 3 tokens"
    assert charts.readout(charts.position_plot, 2) == "draft depth 2: accepted 3 of 3 (1.00)"
    assert charts.readout(charts.speed_plot, 0.025).startswith("at 0.03 s: speculative 300.0 tokens/s")
    assert charts.readout(charts.acceptance_plot, 7) is None


def test_a_copied_round_reads_out_its_match_length(qtbot):
    """A round that copied text says how long the match with earlier text was; a model's round does not."""
    charts = SessionCharts()
    qtbot.addWidget(charts)
    charts.add_events(
        (
            RoundEvent(1, 5, 5, 0.1, 4.0, 6, 0.01, copied=True, shape="copy 5", match_length=12),
            RoundEvent(2, 2, 1, 1.0, 4.0, 8, 0.02, shape="K=2"),
        )
    )
    charts.redraw()
    assert charts.readout(charts.round_time_plot, 1) == (
        "round 1, 5 tokens copied after a 12-token match: draft 0.1 ms, verify 4.0 ms, kept 6"
    )
    assert "match" not in charts.readout(charts.round_time_plot, 2)


def test_figures_explain_themselves(qtbot):
    """Every figure has a tooltip; the predicted speedup's names the formula and its source."""
    charts = SessionCharts()
    qtbot.addWidget(charts)
    assert all(label.toolTip() for label in charts.figures.values())
    assert "Leviathan" in charts.figures["predicted speedup"].toolTip()


def test_cost_charts_show_the_sessions_measured_curve_and_what_it_makes_of_acceptance(qtbot):
    """From the costs a session's start carries: the verify's cost in steps (one at one token, the
    flat line at one throughout) and the expected speedup by K at the session's acceptance, which on
    a flat verify is Leviathan et al.'s (1 - a^(K+1)) / ((1 - a)(cK + 1)); nothing without costs."""
    from specdeck.engine.events import SessionStarted
    from specdeck.engine.stats import predicted_speedup

    charts = SessionCharts()
    qtbot.addWidget(charts)
    charts.add_events(_long_session(10))
    charts.redraw()
    assert charts.verify_cost_plot.here.getData()[0] is None or charts.verify_cost_plot.here.getData()[0].size == 0
    start = SessionStarted(
        "speculative", "head", 10, 5.0, curve_tokens=(1, 2, 4, 8, 16), curve_ms=(4.0, 4.4, 5.0, 8.0, 14.0), draft_ms=0.5
    )
    charts.reset()
    charts.add_events((start, *_long_session(10)))
    charts.redraw()
    tokens, steps = charts.verify_cost_plot.here.getData()
    assert tokens[0] == 1 and steps[0] == 1.0 and np.isclose(steps[7], 2.0) and np.isclose(steps[15], 3.5)
    assert np.all(charts.verify_cost_plot.flat.getData()[1] == 1.0)
    ks, flat = charts.expected_plot.flat.getData()
    for k, value in zip(ks, flat):
        assert np.isclose(value, predicted_speedup(0.5, k, 0.5 / 4.0)), k
    _, here = charts.expected_plot.here.getData()
    assert np.isclose(here[0], 1.5 * 4.0 / (0.5 + 4.4))  # K=1 keeps 1.5 tokens for a draft and a 2-token verify
    assert "on a flat verify" in charts.readout(charts.expected_plot, 2)


def test_charts_redraw_less_often_while_a_session_decodes(qtbot):
    """Painting a chart takes the main thread a few ms, which on a small machine is a core the
    decoding threads wait for: while a session runs, the charts still follow it, at a slower pace."""
    from specdeck.app.session_model import SessionModel

    model = SessionModel()
    charts = SessionCharts(model=model)
    qtbot.addWidget(charts)
    drawn = []
    for chart in charts.plots:
        chart.draw = lambda *series, chart=chart, draw=chart.draw: (drawn.append(chart), draw(*series))[1]
    events = _long_session(400)

    def draws_in_one_second(first_round: int) -> int:
        drawn.clear()
        for i in range(first_round, first_round + 50):
            charts.add_events(events[6 * i : 6 * i + 6])
            qtbot.wait(20)
        return len(drawn)

    idle = draws_in_one_second(0)
    model.set_activity(running=True)
    decoding = draws_in_one_second(50)
    model.set_activity(running=False)
    assert decoding >= 4, "the charts stopped following the session"
    assert decoding * 2 < idle, (decoding, idle)


def _charts_in_a_page(qtbot):
    """The charts in a scroll area shorter than they are, as the window shows them."""
    from PySide6.QtWidgets import QScrollArea

    charts = SessionCharts()
    page = QScrollArea()
    page.setWidget(charts)
    page.setWidgetResizable(True)
    page.resize(800, 300)
    qtbot.addWidget(page)
    page.show()
    qtbot.waitExposed(page)
    charts.add_events(_long_session(40))
    charts.redraw()
    return page, charts


def _wheel(widget, modifiers) -> None:
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    centre = QPointF(widget.width() / 2, widget.height() / 2)
    event = QWheelEvent(
        centre,
        QPointF(widget.mapToGlobal(centre.toPoint())),
        QPoint(0, 0),
        QPoint(0, -120),
        Qt.MouseButton.NoButton,
        modifiers,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def test_the_wheel_over_a_chart_scrolls_the_page_and_zooms_only_with_ctrl(qtbot):
    """A plain wheel over a chart scrolls the page and leaves the chart's ranges; Ctrl+wheel zooms."""
    from PySide6.QtCore import Qt

    page, charts = _charts_in_a_page(qtbot)
    plot = charts.acceptance_plot
    ranges = plot.getViewBox().viewRange()
    _wheel(plot.viewport(), Qt.KeyboardModifier.NoModifier)
    assert page.verticalScrollBar().value() > 0
    assert plot.getViewBox().viewRange() == ranges
    _wheel(plot.viewport(), Qt.KeyboardModifier.ControlModifier)
    assert plot.getViewBox().viewRange() != ranges


def test_a_zoomed_chart_shows_the_next_session_whole(qtbot):
    """A range left by zooming never sticks: the next session's charts show its data whole."""
    from PySide6.QtCore import Qt

    page, charts = _charts_in_a_page(qtbot)
    for _ in range(3):
        for plot in charts.plots:
            _wheel(plot.viewport(), Qt.KeyboardModifier.ControlModifier)
    charts.reset()
    charts.add_events(_long_session(12))
    charts.redraw()
    assert (
        charts.acceptance_plot.getViewBox().viewRange()[1][0]
        < 0
        < 1
        < charts.acceptance_plot.getViewBox().viewRange()[1][1]
    )
    (x0, x1), (y0, y1) = charts.position_plot.getViewBox().viewRange()
    assert x0 < 1 and x1 > 2 and y0 < 0 and y1 > 1
    (x0, x1), _ = charts.acceptance_plot.getViewBox().viewRange()
    assert x0 <= 0 and x1 >= 12


def test_a_hovered_value_stays_while_the_mouse_does(qtbot):
    """The readout of the point under the mouse stays shown, also seconds later, until the mouse leaves."""
    page, charts = _charts_in_a_page(qtbot)
    plot = charts.acceptance_plot
    view = plot.getViewBox()
    plot._on_mouse_moved(view.mapViewToScene(pg_point(3.0, 0.5)))
    assert plot.hover.isVisible() and plot.hover.text().startswith("round 3: accepted 2/4")
    qtbot.wait(2000)
    assert plot.hover.isVisible()
    plot._on_mouse_moved(view.mapViewToScene(pg_point(-50.0, 0.5)))
    assert not plot.hover.isVisible()


def pg_point(x: float, y: float):
    from PySide6.QtCore import QPointF

    return QPointF(x, y)


def test_the_expected_speedup_title_follows_the_current_session(qtbot):
    """The Expected-speedup title names the acceptance of the session shown, and none once a
    session without measured costs (a constant K) follows one with them."""
    from specdeck.engine.events import SessionStarted

    charts = SessionCharts()
    qtbot.addWidget(charts)
    start = SessionStarted(
        "speculative", "head", 10, 5.0, curve_tokens=(1, 2, 4, 8, 16), curve_ms=(4.0, 4.4, 5.0, 8.0, 14.0), draft_ms=0.5
    )
    charts.add_events((start, *_long_session(10)))
    charts.redraw()
    assert "a = 0.50" in charts.expected_plot.title
    charts.reset()
    charts.add_events(_long_session(10))
    charts.redraw()
    assert "a = " not in charts.expected_plot.title
