"""GGUF blocks of Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K as the row kernel's 8-bit-row products read
them (`row_kernel.c`, kinds 12 to 17): groups of 32 weights along the inner dimension, each weight
an unsigned quant q of 4, 5 or 6 bits, each group its scales.

The weights are those of gguf-py's dequantization (llama.cpp's `dequantize_row_*`):
  Q4_0 w = d (q - 8), Q5_0 w = d (q - 16), Q5_1 w = d q + m (d, m float16, one pair a block of 32);
  Q4_K, Q5_K w = (d sc) q - dmin mn, 8 groups of 32 a block of 256, sc and mn 6-bit integers;
  Q6_K w = d sc (q - 32), 16 sub-blocks of 16 a block of 256, sc signed 8-bit integers.
`layout` lays a matrix's blocks out per vector of columns and group (the C comment above
`X_BYTES` draws it): the quants' low 4 bits two to a byte, their 5th (and 6th) bits in words
whose shifts put them in place, and the scales as the file stores them (the K-quants' d and dmin
once a block of 256, their sc and mn a byte each), so the layout takes the file's bytes. The
kernel lays blocks out itself (`row_kernel_lay_out`, the same bytes without numpy's scratch of a
byte a weight); `layout` states the layout, and the tests hold the kernel's to it.
"""

from __future__ import annotations

import numpy as np

TYPES = ("Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")  # in the order of their kinds, 12 to 17


def _half(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 32) bits of Q5_0's and Q5_1's 32-bit words, weight i's at bit i."""
    words = qh.copy().view("<u4")
    return ((words >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 32) of a block of 32's 16 bytes: weight i in byte i's low nibble, i + 16 in its high."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


Fields = list[np.ndarray]  # byte fields, one row a group (or, for a header, a block)


def groups_of(blocks: np.ndarray, kind: str) -> tuple[np.ndarray, Fields, Fields]:
    """Blocks (n, bytes) of `kind` as (n * groups a block, 32) quants q, each group's scale fields
    (n * groups, bytes) and each block's header fields (n, bytes; the K-quants' d and -dmin), in
    the order the kernel packs them."""
    n = blocks.shape[0]
    if kind == "Q4_0":
        return _nibbles(blocks[:, 2:18]), [blocks[:, 0:2]], []
    if kind == "Q5_0":
        return _nibbles(blocks[:, 6:22]) | (_fifth_bits(blocks[:, 2:6]) << 4), [blocks[:, 0:2]], []
    if kind == "Q5_1":
        q = _nibbles(blocks[:, 8:24]) | (_fifth_bits(blocks[:, 4:8]) << 4)
        return q, [blocks[:, 0:2], blocks[:, 2:4]], []
    if kind in ("Q4_K", "Q5_K"):
        from gguf.quants import Q4_K

        sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        # -dmin: the sign bit flipped, so that (-dmin) mn is -(dmin mn) to the bit, zeros included
        negated = (np.ascontiguousarray(blocks[:, 2:4]).view("<u2") ^ np.uint16(0x8000)).view(np.uint8)
        qs = blocks[:, 16:144] if kind == "Q4_K" else blocks[:, 48:176]
        chunks = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        q = (chunks & 15).reshape(n, 8, 32)  # group 2c: chunk c's low nibbles, 2c + 1: its high
        if kind == "Q5_K":
            qh = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            q = q | ((qh & 1) << 4)  # group j's 5th bits: bit j of the 32 bytes
        scales = [np.ascontiguousarray(f, dtype=np.uint8).reshape(n * 8, 1) for f in (sc, mn)]
        return q.reshape(n * 8, 32), scales, [blocks[:, 0:2], negated]
    if kind == "Q6_K":
        ql = blocks[:, 0:128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        quants = (ql & 15).reshape(n, 8, 32) | ((qh & 3).reshape(n, 8, 32) << 4)
        sc = blocks[:, 192:208].reshape(n * 8, 2)  # a group's two halves' signed bytes
        return quants.reshape(n * 8, 32), [sc[:, 0:1], sc[:, 1:2]], [blocks[:, 208:210]]
    raise ValueError(f"no 8-bit-row layout for {kind} blocks")


def _high_words(q: np.ndarray, kind: str) -> list[np.ndarray]:
    """A group's 4-byte words of its quants' bits above the low 4 (`row_kernel.c`'s H, H0, H1)."""
    first, second = q[:, :16].reshape(-1, 4, 4) >> 4, q[:, 16:].reshape(-1, 4, 4) >> 4  # (n, u, b)
    if kind in ("Q5_0", "Q5_1", "Q5_K"):
        shifts = np.arange(4, dtype=np.uint8).reshape(1, 4, 1)
        return [np.bitwise_or.reduce((first << shifts) | (second << (shifts + 4)), axis=1)]
    if kind == "Q6_K":
        shifts = 2 * np.arange(4, dtype=np.uint8).reshape(1, 4, 1)
        return [np.bitwise_or.reduce(half << shifts, axis=1) for half in (first, second)]
    return []


def layout(vectors: np.ndarray, kind: str) -> np.ndarray:
    """Vectors of columns (count, lanes, blocks a row, bytes a block) of `kind` in the kernel's layout:
    per vector, per group of 32, each field of the lanes' columns in turn (`groups_of`'s scales, the
    high bits' words), then the low 4 bits in four runs of 4 bytes a column, as Q4_1's; a K-quant
    block's 8 groups after its header fields, each of the lanes' columns in turn."""
    count, lanes, blocks, size = vectors.shape
    q, scales, header = groups_of(vectors.reshape(-1, size), kind)
    groups = q.shape[0] // (count * lanes)
    low = q & 15
    runs = low[:, :16] | (low[:, 16:] << 4)  # byte 4u + b: k = 4u + b low, 16 + 4u + b high
    fields = [*scales, *_high_words(q, kind), runs]
    parts = [np.ascontiguousarray(f).reshape(count, lanes, groups, -1) for f in fields]
    parts[-1] = parts[-1].reshape(count, lanes, groups, 4, 4).transpose(0, 2, 3, 1, 4)  # (count, g, run, lane, 4)
    parts[:-1] = [p.transpose(0, 2, 1, 3) for p in parts[:-1]]  # (count, g, lane, bytes)
    grouped = np.concatenate([np.ascontiguousarray(p).reshape(count, groups, -1) for p in parts], axis=-1)
    if not header:
        return grouped.reshape(-1)
    heads = [  # (count, block, the lanes' bytes)
        np.ascontiguousarray(f.reshape(count, lanes, blocks, -1).transpose(0, 2, 1, 3)).reshape(count, blocks, -1)
        for f in header
    ]
    return np.concatenate([*heads, grouped.reshape(count, blocks, -1)], axis=-1).reshape(-1)
