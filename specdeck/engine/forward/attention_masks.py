"""A chunk's attention pattern in the lean forward (`specdeck.engine.forward.llama_forward`): each token tree node's
path from the root, and which cached and new positions each query sees in the forward's one fused
attention call over a first or a long chunk (a chain's causal pattern, a tree's ancestors, a
sliding window's bound).

A tree arrives as each node's parent. A node sits at the position after its parent's and attends
to the cached tokens and its own ancestors, so its path decides both its mask and its rotary
position.
"""

from __future__ import annotations

import torch


def chunk_mask(
    start: int, depths: list[int], paths: list[list[int]] | None, window: int | None, device: torch.device
) -> torch.Tensor | None:
    """Which of the start + n positions each of a chunk's n queries attends to (n, start + n), for
    the one fused call of a first or a long chunk; None where the call needs no mask: one query, or
    a first chunk that fits the window (causal)."""
    n = len(depths)
    if paths is None and (n == 1 or start == 0 and (window is None or n <= window)):
        return None
    if paths is not None:  # query i sees the cache and its own ancestors
        mask = torch.zeros(n, start + n, dtype=torch.bool, device=device)
        mask[:, :start] = True
        for i, path in enumerate(paths):
            mask[i, [start + j for j in path]] = True
    else:  # a chain: query j sees positions up to start + j
        mask = torch.ones(n, start + n, dtype=torch.bool, device=device).tril(start)
    if window is not None:  # and of those only the `window` latest, itself included
        positions = torch.tensor(list(range(start)) + [start + d for d in depths], device=device)
        mask &= positions[start:, None] - positions[None, :] < window
    return mask


def tree_paths(parents: list[int]) -> list[list[int]]:
    """Each node's chunk indices from the tree's root to itself (parents come before children)."""
    paths: list[list[int]] = []
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError(f"node {i}'s parent {parent} must come before it")
        paths.append((paths[parent] if parent >= 0 else []) + [i])
    return paths
