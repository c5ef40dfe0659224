"""Attention that gives a query the same bits however many queries share the call.

A verify gives each drafted token the logits a one-token step would give it only where every part
of the forward computes a row the same way alone as beside others. The products do where
`specdeck.engine.forward.linear` packs them; PyTorch's fused CPU attention (`scaled_dot_product_attention`) does not:
a query's output changes in its last bits with the queries beside it, so a verify used to attend
query by query, one call each, as a step does, and paid for every call.

Here attention is spelled out as two batched matrix products and a softmax over each key/value
head's group of query heads: q k^T, scaled, plus a mask, softmax, times v. Every call spans its
keys rounded up to `SPAN` slots, the slots after a query's own position (and before its window)
masked out, so a step at position p and a verify's query at p make calls over the same keys and
slots. Where this machine's products keep a row's reduction order whatever the row count
(`rows_invariant`, checked once per shape), a verify's queries whose spans agree share one call;
elsewhere every query, a step's included, gets PyTorch's fused call over its span: as exact, and
as many calls as before. Where the row kernel builds (`specdeck.engine.forward.row_kernel`: float32 on the CPU), a
call runs there instead, each query over its own slots, without a mask (`Call.ends`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdeck.engine.forward import row_kernel

log = logging.getLogger(__name__)

SPAN = 64  # a call spans its keys rounded up to a multiple of this many slots
_ROWS = 16  # row counts 1.._ROWS are checked against each row alone
_LENGTHS = (SPAN, 5 * SPAN, 17 * SPAN)  # spans the check runs at: one block, several, past 1024 keys
_INVARIANT: dict[tuple, bool] = {}


@dataclass(frozen=True)
class Call:
    """One attention call of a chunk's queries `rows` [a, b) over the first `length` slots; `mask`
    adds 0 where a query attends and -inf elsewhere. Spelled out, its rows are those of the call's
    scores, (group * (b - a), length): each of a key/value head's `group` query heads, then each
    query. `fused`: one query through PyTorch's fused kernel, mask (1, length)."""

    rows: tuple[int, int]
    length: int
    mask: torch.Tensor | None
    fused: bool = False
    ends: torch.Tensor | None = None  # the row kernel's attention: each query's end (no mask)
    window: int | None = None


def span(end: int) -> int:
    """The slots a call for a query attending up to position end - 1 spans."""
    return -(-end // SPAN) * SPAN


def plan(
    rows: list[int],
    ends: list[int],
    window: int | None,
    group: int,
    batched: bool,
    dtype: torch.dtype,
    device: torch.device,
    share: bool = True,
    kernel: bool = False,
) -> list[Call]:
    """The calls for a chunk's queries `rows` (ascending), query j attending to the positions before
    ends[j] (and of those only the `window` latest, itself included), `group` query heads to a
    key/value head. `kernel` (the row kernel's attention runs here, `specdeck.engine.forward.row_kernel`): one call
    for each run of consecutive queries where `share`, each query over its own slots. Else
    `batched` (this machine keeps a row's bits in a spelled-out call, `rows_invariant`):
    spelled-out calls, consecutive queries with the same span sharing one where `share`; else one
    fused call per query, over its span as a step's."""
    batches: list[list[int]] = []
    for j in rows:
        if kernel and share and batches and batches[-1][-1] == j - 1:
            batches[-1].append(j)
        elif batched and share and batches and batches[-1][-1] == j - 1 and span(ends[batches[-1][0]]) == span(ends[j]):
            batches[-1].append(j)
        else:
            batches.append([j])
    if kernel:
        return [
            Call(
                (queries[0], queries[-1] + 1),
                span(max(ends[j] for j in queries)),
                None,
                ends=torch.tensor([ends[j] for j in queries], dtype=torch.int64),
                window=window,
            )
            for queries in batches
        ]
    calls = []
    for queries in batches:
        length = span(ends[queries[-1]])
        slots = torch.arange(length, device=device)
        end = torch.tensor([ends[j] for j in queries], device=device)[:, None]
        seen = slots < end
        if window is not None:
            seen &= slots >= end - window
        mask = torch.zeros(len(queries), length, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))
        rows_of = (queries[0], queries[-1] + 1)
        calls.append(
            Call(rows_of, length, mask.repeat(group, 1)) if batched else Call(rows_of, length, mask, fused=True)
        )
    return calls


def run(call: Call, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """`call` for its queries q (1, heads, m, head_dim) over a layer's cached keys and values
    (1, kv_heads, slots, head_dim) that hold every slot the call spans."""
    if call.ends is not None:
        return row_kernel.attend(q, keys, values, call.ends, call.window, scale)
    assert call.mask is not None  # a spelled-out or fused call
    return attend(q, keys[:, :, : call.length], values[:, :, : call.length], call.mask, scale, call.fused)


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float, fused: bool = False
) -> torch.Tensor:
    """Attention (1, heads, m, head_dim) of queries q (1, heads, m, head_dim) over keys and values
    (1, kv_heads, length, head_dim) under a `Call`'s mask (and its `fused`); query heads share
    key/value heads in groups, as grouped-query attention's repeat does. The masked slots must hold
    finite numbers (a zeroed cache does): they are multiplied by a probability of zero."""
    if fused:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    _, heads, m, head_dim = q.shape
    kv_heads = keys.shape[1]
    scores = torch.baddbmm(
        mask, q.reshape(kv_heads, heads // kv_heads * m, head_dim), keys[0].transpose(1, 2), alpha=scale
    )
    return torch.bmm(scores.softmax(dim=-1), values[0]).view(1, heads, m, head_dim)


def rows_invariant(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `attend` gives every query the same bits in a call of 1 to 16 queries as alone, on
    this machine at this shape and dtype (random queries and keys at three spans; once per process,
    shape and thread count)."""
    key = (heads, kv_heads, head_dim, dtype, device.type, torch.get_num_threads())
    if key not in _INVARIANT:
        _INVARIANT[key] = _check(heads, kv_heads, head_dim, dtype, device)
        log.info(
            "attention rows %s: %s", key, "the same bits in a batch" if _INVARIANT[key] else "a fused call per query"
        )
    return _INVARIANT[key]


def _check(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    generator = torch.Generator().manual_seed(0)
    scale = head_dim**-0.5
    with torch.inference_mode():
        for length in _LENGTHS:
            keys, values = (
                torch.randn(1, kv_heads, length, head_dim, generator=generator).to(dtype=dtype, device=device)
                for _ in range(2)
            )
            q = torch.randn(1, heads, _ROWS, head_dim, generator=generator).to(dtype=dtype, device=device)
            ends = [length - _ROWS + 1 + j for j in range(_ROWS)]
            group = heads // kv_heads
            alone = [
                attend(q[:, :, j : j + 1], keys, values, _mask_of(ends[j : j + 1], group, dtype, device), scale)
                for j in range(_ROWS)
            ]
            for m in range(1, _ROWS + 1):
                out = attend(q[:, :, :m], keys, values, _mask_of(ends[:m], group, dtype, device), scale)
                if not all(torch.equal(out[:, :, j : j + 1], alone[j]) for j in range(m)):
                    return False
    return True


def _mask_of(ends: list[int], group: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    (call,) = plan(list(range(len(ends))), ends, None, group, True, dtype, device)
    assert call.mask is not None
    return call.mask
