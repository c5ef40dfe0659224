"""What a drafter's token costs on this machine: its milliseconds per drafted token, measured once
per model and kept in SpecDeck's cache beside the target's cost curves
(`specdeck.engine.planner.costs`), under the same key: its config, dtype, product path, threads
and CPU. Copying drafters, which have no model, are timed each time they are asked (a copy costs
microseconds)."""

from __future__ import annotations

import time
import weakref
from pathlib import Path

import torch

from specdeck.engine.planner.costs import cached_measurement, measurement_key
from specdeck.engine.planner.round_shape import ProposalShape

_DRAFT_MS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def measure_draft_ms(
    drafter, vocab_width: int, hidden_size: int, k: int = 4, passes: int = 3, context: int = 64
) -> float:
    """Milliseconds per drafted token: the best of `passes` proposals of up to k tokens after a
    `context`-token prompt (a warm-up first). Feature heads get zero vectors for the target's states:
    their cost does not depend on the values."""
    from specdeck.engine.config import DecodeConfig

    ids = [(7 * i + 3) % vocab_width for i in range(context + passes + 1)]
    seen = ids[:context]
    drafter.begin(seen, DecodeConfig(k=k, schedule="constant", lookup=0), vocab_width, None)
    pending = len(seen) - 1
    best = float("inf")
    for pass_no in range(passes + 1):
        if drafter.needs_states:
            weight = next(drafter.module.parameters())
            taps = (len(drafter.feature_layers) + 1,) if drafter.feature_layers else ()
            drafter.observe(torch.zeros(pending, *taps, hidden_size, device=weight.device, dtype=weight.dtype))
        started = time.perf_counter()
        proposal = drafter.propose(seen, ProposalShape(k))
        elapsed = (time.perf_counter() - started) * 1e3
        if pass_no and proposal.tokens:
            best = min(best, elapsed / len(proposal.tokens))
        seen = ids[: len(seen) + 1]
        pending = 1
    return round(best, 4) if best < float("inf") else 0.0


def draft_cost(drafter, vocab_width: int, hidden_size: int, cache_dir: Path | None = None) -> float:
    """The drafter's milliseconds per token on this machine, measured once per model (and cached)."""
    module = drafter.module
    if module is None:
        return measure_draft_ms(drafter, vocab_width, hidden_size)
    if module not in _DRAFT_MS:
        path = cache_dir / f"draft-{measurement_key(module, type(drafter).__name__)}.json" if cache_dir else None
        value = cached_measurement(path, lambda: measure_draft_ms(drafter, vocab_width, hidden_size), "draft cost")
        _DRAFT_MS[module] = (
            float(value) if isinstance(value, (int, float)) else measure_draft_ms(drafter, vocab_width, hidden_size)
        )
    return _DRAFT_MS[module]
