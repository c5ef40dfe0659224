"""Why speculation pays here or not: the session's measured cost curve (a verify of n tokens in
plain steps) and the speedup it gives each K at the session's acceptance, beside a flat verify
(a forward bound by reading the weights, whatever its width, as on a large model on a GPU).

A round of K drafts keeps (1 - a^(K+1)) / (1 - a) tokens at acceptance a (Leviathan et al. 2023,
eq. 1) for K draft tokens and one verify of K + 1 tokens, where plain decoding keeps one token a
step. Qt-free: `specdeck.app.charts` draws from these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specdeck.engine.stats import expected_tokens_per_round

if TYPE_CHECKING:
    from specdeck.engine.planner.costs import CostCurve

VERIFY_TOKENS = 16  # the widest verify drawn
MAX_K = 8  # the longest draft drawn


def verify_cost(curve: CostCurve) -> tuple[np.ndarray, np.ndarray]:
    """(tokens verified, the verify's cost in one-token steps) at 1..VERIFY_TOKENS."""
    tokens = np.arange(1, VERIFY_TOKENS + 1)
    return tokens.astype(np.float64), np.array([curve.ms(int(n)) / curve.ms(1) for n in tokens])


def expected_speedup(curve: CostCurve, acceptance: float, draft_ms: float, k: int, flat: bool = False) -> float:
    """Plain decoding's time for the tokens a round of K drafts keeps, over the round's time: K drafts
    and a verify of K + 1 tokens (`flat`: a verify that costs one step)."""
    step = curve.ms(1)
    verify = step if flat else curve.ms(k + 1)
    return expected_tokens_per_round(acceptance, k) * step / (k * draft_ms + verify)


def speedup_by_k(
    curve: CostCurve, acceptance: float, draft_ms: float, flat: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(K, expected speedup over plain decoding) for K = 1..MAX_K."""
    ks = np.arange(1, MAX_K + 1)
    return ks.astype(np.float64), np.array([expected_speedup(curve, acceptance, draft_ms, int(k), flat) for k in ks])


def verify_readout(curve: CostCurve | None, x: float) -> str | None:
    n = int(round(x))
    if curve is None or not 1 <= n <= VERIFY_TOKENS:
        return None
    return (
        f"a verify of {n} token{'s' if n > 1 else ''}: {curve.ms(n):.1f} ms, {curve.ms(n) / curve.ms(1):.2f} steps "
        "on this machine (1 step where a forward is bound by reading the weights)"
    )


def speedup_readout(curve: CostCurve | None, acceptance: float, draft_ms: float, x: float) -> str | None:
    k = int(round(x))
    if curve is None or not 1 <= k <= MAX_K:
        return None
    here = expected_speedup(curve, acceptance, draft_ms, k)
    flat = expected_speedup(curve, acceptance, draft_ms, k, flat=True)
    return f"K={k} at acceptance {acceptance:.2f}: {here:.2f}x on this machine, {flat:.2f}x on a flat verify"
