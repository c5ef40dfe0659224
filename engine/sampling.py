"""Turning logits into distributions and tokens, the same way for target and drafter.

Speculative sampling is exact only if the target's p and the drafter's q are the distributions
that plain sampling would use, so temperature, top-k and top-p are applied here, once, for both
(Leviathan et al. 2023, section 2.3; Chen et al. 2023, algorithm 2).
"""

from __future__ import annotations

import torch

from engine.config import DecodeConfig


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


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool) -> torch.Tensor:
    """One token id per row: the argmax when greedy, else a draw from `probs`."""
    if greedy:
        return probs.argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where to sample after the draft token was rejected.

    It cannot be all zero: rejection happens only where q(x) > p(x) for the drafted x, so some
    other token has p > q.
    """
    diff = torch.clamp(p - q, min=0.0)
    total = diff.sum()
    return diff / total if total > 0 else p
