"""Statistical checks that sampled output follows the target: chi-square goodness of fit at a
false-alarm rate of 0.1% (Wilson-Hilferty quantile), and the exact distribution of a session's
first two tokens to test against."""

import math
from dataclasses import replace

import torch

from specdeck.engine import DecodeConfig, TokenEvent, generate
from specdeck.engine.sampling import logits_to_probs

Z_999 = 3.090  # standard normal 99.9% quantile


def chi_square_quantile(df: int, z: float = Z_999) -> float:
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: dict, expected_probs: dict, n: int) -> tuple[float, int]:
    """Statistic and degrees of freedom, pooling cells expected fewer than 5 times into one."""
    stat, df, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for cell, prob in expected_probs.items():
        exp = prob * n
        if exp < 5:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += exp
        else:
            stat += (counts.get(cell, 0) - exp) ** 2 / exp
            df += 1
    pooled_obs += sum(c for cell, c in counts.items() if cell not in expected_probs)
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        df += 1
    elif pooled_obs:
        return math.inf, max(df, 1)
    return stat, df


def sample_two_tokens(target, ids, config: DecodeConfig, make_drafter, n: int) -> tuple[dict, int]:
    """The kept tokens of n sessions under `config` with seeds 0..n-1, counted, and how many sessions
    rejected a draft."""
    counts: dict = {}
    rejections = 0
    for seed in range(n):
        events = list(generate(target, ids, replace(config, seed=seed), make_drafter()))
        kept = tuple(e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept)
        rejections += any(isinstance(e, TokenEvent) and e.state.value == "rejected" for e in events)
        counts[kept] = counts.get(kept, 0) + 1
    return counts, rejections


def exact_two_token_distribution(target, ids, config) -> dict:
    """p(t1) p(t2 | t1) under the session's temperature / top-k / top-p (p(t1) alone where t1 ends
    the text)."""
    with torch.inference_mode():
        p1 = logits_to_probs(target.model(input_ids=torch.tensor([ids], device=target.device)).logits[0, -1], config)
        joint = {}
        for t1 in p1.nonzero().flatten().tolist():
            if t1 in target.eos_ids:
                joint[(t1,)] = float(p1[t1])
                continue
            p2 = logits_to_probs(
                target.model(input_ids=torch.tensor([ids + [t1]], device=target.device)).logits[0, -1], config
            )
            for t2 in p2.nonzero().flatten().tolist():
                joint[(t1, t2)] = float(p1[t1] * p2[t2])
    return joint
