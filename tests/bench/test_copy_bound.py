"""The bound on what copying can gain (`python -m specdeck.bench.copy_bound`)."""

from hypothesis import given
from hypothesis import strategies as st

from specdeck.bench.copy_bound import fastest_ms
from specdeck.engine.planner.costs import CostCurve

FLAT = CostCurve((1, 2, 16), (10.0, 10.0, 10.0))
BY_THE_TOKEN = CostCurve((1, 2, 16), (10.0, 20.0, 160.0))  # a verify of n tokens costs n steps


def test_nothing_to_copy_is_plain_decoding():
    assert fastest_ms(FLAT, [0] * 7) == 70.0


def test_a_copy_that_passes_is_verified_as_far_as_it_passes():
    """Four tokens: the first round's copy passes 2 drafts (3 tokens for one flat verify), then a step."""
    assert fastest_ms(FLAT, [2, 0, 0, 0]) == 20.0
    assert fastest_ms(FLAT, [3, 0, 0, 0]) == 10.0  # three drafts pass, the fourth token is the round's own


def test_copying_gains_nothing_where_a_verify_costs_a_step_per_token():
    assert fastest_ms(BY_THE_TOKEN, [3, 2, 1, 0, 5, 0]) == 60.0


@given(st.lists(st.integers(0, 15), min_size=1, max_size=40))
def test_the_bound_is_never_slower_than_plain_nor_faster_than_one_verify_per_copy(accepted):
    plain = 10.0 * len(accepted)
    assert FLAT.ms(1) <= fastest_ms(FLAT, accepted) <= plain
