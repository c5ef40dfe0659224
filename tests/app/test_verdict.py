"""A run's verdict: the reason for a measured speedup far from the predicted one points the way
the two differ, a stopped run says it was stopped, and greedy texts are compared only whole."""

from __future__ import annotations

from specdeck.app.verdict import verdict_of, why_off
from specdeck.engine.events import SessionStarted, SummaryEvent
from specdeck.engine.planner.costs import CostCurve

CURVE = CostCurve((1, 2, 4, 8), (4.0, 4.5, 5.5, 8.0))


def _summary(text: str, tokens_per_s: float, predicted: float | None = 1.4, stop: str = "max_new_tokens"):
    return SummaryEvent(text, len(text), 40, 80, 40, 0.5, 2.0, tokens_per_s, 1.0, 5.0, 0.5, (), predicted, stop)


def test_within_a_fifth_of_the_prediction_nothing_is_said():
    """A measured speedup within 20% of the predicted one, or no prediction, needs no reason."""
    assert why_off(1.25, 1.4, 4.1, CURVE, 200) is None
    assert why_off(1.0, None, 4.1, CURVE, 200) is None


def test_slow_plain_steps_explain_a_speedup_above_the_prediction_as_the_plain_run_being_slowed():
    """Above the prediction with slow plain steps: the plain run was slowed, flattering the speedup."""
    above = why_off(4.05, 2.33, 14.6, CURVE, 200) or ""
    assert "14.6 ms" in above and "plain run" in above and "look larger" in above


def test_slow_plain_steps_explain_a_speedup_below_the_prediction_as_the_rounds_slowing_more():
    """Below the prediction with slow plain steps: the rounds lost more to the busy machine than the
    steps did; the same words never explain both directions."""
    below = why_off(0.76, 0.95 * 1.5, 14.6, CURVE, 200) or ""
    above = why_off(4.05, 2.33, 14.6, CURVE, 200) or ""
    assert "14.6 ms" in below and "rounds slowed down more" in below and below != above


def test_other_reasons_follow_the_direction():
    """Short runs are named only for a shortfall, copies only for a gain, the pace otherwise."""
    assert "short run" in (why_off(0.8, 1.4, 4.2, CURVE, 10) or "")
    assert "copies" in (why_off(2.0, 1.3, 4.0, CURVE, 10) or "")
    assert "pace" in (why_off(0.9, 1.3, 4.0, CURVE, 200) or "")


def test_a_compare_verdict_gives_both_rates_the_speedup_and_the_greedy_check():
    """Both halves ended: the rates, the measured speedup, and identical texts marked so."""
    start = SessionStarted("speculative", "head", 10, 5.0, curve_tokens=CURVE.tokens, curve_ms=CURVE.forward_ms)
    verdict = verdict_of("float32", _summary("abc", 300.0), _summary("abc", 150.0), start, True, True)
    assert verdict.measured == 2.0 and verdict.identical is True
    assert "300.0 against 150.0 tokens/s on float32" in verdict.html() and "identical" in verdict.html()


def test_a_stopped_run_says_it_was_stopped_and_claims_no_comparison_of_texts():
    """Stopped during the speculative half: it says so and that plain decoding did not run;
    stopped during the plain half: the texts are not compared (one ends early)."""
    stopped = verdict_of("float32", _summary("ab", 300.0, stop="cancelled"), None, None, True, True)
    assert "Stopped</b> after 2 tokens: plain decoding did not run" in stopped.html()
    half = verdict_of("float32", _summary("abc", 300.0), _summary("a", 150.0, stop="cancelled"), None, True, True)
    assert "Plain decoding stopped</b> after 1 tokens" in half.html() and half.identical is None
    assert "Stopped" not in verdict_of("float32", _summary("abc", 300.0), None, None, True, False).html()
