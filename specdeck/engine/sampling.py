"""Turning logits into distributions and tokens, the same way for target and drafter.

Speculative sampling is exact only if the target's p and the drafter's q are the distributions
that plain sampling would use, so temperature, top-k and top-p are applied here, once, for both
(Leviathan et al. 2023, section 2.3; Chen et al. 2023, algorithm 2).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError


def logits_to_probs(logits: torch.Tensor, config: DecodeConfig) -> torch.Tensor:
    """Probabilities over the last axis under the session's settings.

    Greedy sessions get the temperature-1 distribution: it only labels tokens with p and q for
    display, since greedy choices are argmaxes.
    """
    logits = logits.float()
    if config.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / config.temperature
    if config.top_k > 0 and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p < 1.0:
        # keep the smallest set of tokens whose mass reaches top_p (the most likely always stays)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= config.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def argmaxes(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first of equal maxima, as torch's). A float32 tensor on the CPU goes
    through numpy, whose argmax over a 49,152-token row takes a tenth of torch's: a greedy round pays
    it every step."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool) -> torch.Tensor:
    """One token id per row: the argmax when greedy, else a draw from `probs` (refused if they are
    not finite: on CUDA the draw would fail inside the device)."""
    if greedy:
        if probs.device.type == "cpu" and probs.dtype == torch.float32:  # numpy's argmax: see `argmaxes`
            return torch.from_numpy(np.asarray(probs.detach().numpy().argmax(axis=-1)))
        return probs.argmax(dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise SpecDeckError(non_finite_message("A model's"))
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def non_finite_message(whose: str, dtype: torch.dtype | None = None, position: int | None = None) -> str:
    where = f" at new token {position}" if position is not None else ""
    name = f" in {str(dtype).removeprefix('torch.')}" if dtype is not None else ""
    return (
        f"{whose} logits{where} are not finite (NaN or infinity): its numbers overflowed{name}. Run it in "
        "float32 (--dtype float32), or in bfloat16 on a GPU that has it; a model that overflows in float32 "
        "has damaged weights."
    )


def require_finite(kept_probs: list[float], dtype: torch.dtype, position: int) -> None:
    """Stop a session whose target gave a non-finite logit. A NaN or infinite logit makes its row's
    softmax NaN, so the kept tokens' probabilities, which the loop reads anyway, show it without
    another wait for the device."""
    if any(math.isnan(p) for p in kept_probs):
        raise SpecDeckError(non_finite_message("The target's", dtype, position))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where to sample after the draft token was rejected.

    It cannot be all zero: rejection happens only where q(x) > p(x) for the drafted x, so some
    other token has p > q.
    """
    diff = torch.clamp(p - q, min=0.0)
    total = diff.sum()
    return diff / total if total > 0 else p


def alternative_chances(r: torch.Tensor, alternatives: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A tree's alternatives judged in turn against the residual r after the first draft's refusal:
    alternative a_i is accepted with r_i(a_i), where r_i is r with a_1..a_(i-1) set to 0 and
    normalised, i.e. r(a_i) / (r(a_i) + the mass of r outside a_1..a_i). Returns those chances and
    the weights of r outside all the alternatives, where the correction is drawn if all are refused.

    Sums of non-negative terms only (no 1 - sum), so a chance of 1 stays 1 where r left no mass
    elsewhere; an alternative with no mass left at all (never reached: an earlier one had chance 1)
    gets 0.
    """
    index = torch.tensor(alternatives, device=r.device)
    on = r[index]
    outside = r.index_fill(0, index, 0.0)
    from_here = torch.flip(torch.cumsum(torch.flip(on, [0]), 0), [0])  # r(a_i) + r(a_(i+1)) + ...
    denominator = from_here + outside.sum()
    chances = torch.where(denominator > 0, on / denominator.clamp(min=torch.finfo(r.dtype).tiny), 0.0)
    return chances, outside
