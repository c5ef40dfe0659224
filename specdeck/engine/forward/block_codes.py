"""GGUF block types as the row kernel's float32 rows read them: integer codes with a scale and an offset.

Each type here dequantizes, in gguf-py (`gguf/quants.py`), to w = s q + mn per group of 32 weights
(Q6_K: 16): q a small unsigned integer, s a scale and mn an offset (Q4_0: -8 s; Q5_0: -16 s; Q6_K:
-32 s; Q5_1: the block's minimum m; Q4_K and Q5_K: minus the sub-block's scaled minimum dmin mc).
s is exact in float32 (a float16 times an integer of at most 8 bits), and so is s q, so the kernel's
fma(q, s, mn) rounds once, where gguf-py's s q + mn does, to the same value (`row_kernel.c`, kinds 4
to 9). `pack` lays every type out in that one layout: s (and mn, where it is not a fixed multiple of
s) as float32, q's low 4 bits as nibbles and its higher bits as a plane of 32 bits a group, 1.1 to
1.33 times the file's bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Codes = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # q (blocks, weights), s and mn (blocks, groups)


@dataclass(frozen=True)
class CodeFormat:
    """How a block type's codes are laid out for the kernel (`row_kernel.c`'s `CODE_TYPES`)."""

    group: int  # weights sharing a scale
    high_bits: int  # bits of q above the low 4
    minimum: bool  # mn is stored; else it is -2^(bits of q - 1) s, which the kernel computes


FORMATS = {
    "Q4_0": CodeFormat(32, 0, False),
    "Q5_0": CodeFormat(32, 1, False),
    "Q5_1": CodeFormat(32, 1, True),
    "Q4_K": CodeFormat(32, 0, True),
    "Q5_K": CodeFormat(32, 1, True),
    "Q6_K": CodeFormat(16, 2, False),
}


def _half(fields: np.ndarray) -> np.ndarray:
    """Float16 fields (blocks, 2) as float32 (blocks, 1)."""
    return np.ascontiguousarray(fields).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """Weights' low 4 bits in gguf-py's order: each run of `run` bytes holds `run` weights in its low
    nibbles, then the next `run` in its high ones."""
    shifts = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return ((qs.reshape(qs.shape[0], -1, 1, run) >> shifts) & np.uint8(15)).reshape(qs.shape[0], -1)


def _planes(qh: np.ndarray, run: int, bits: int) -> np.ndarray:
    """Weights' high bits in gguf-py's order: each run of `run` bytes holds `bits` bits of `run`
    weights at bits 0.., then of the next `run` weights at bits `bits`.., and so on."""
    shifts = (np.arange(8 // bits, dtype=np.uint8) * bits).reshape(1, 1, -1, 1)
    planes = (qh.reshape(qh.shape[0], -1, 1, run) >> shifts) & np.uint8((1 << bits) - 1)
    return planes.reshape(qh.shape[0], -1)


def _q4_0(blocks: np.ndarray) -> Codes:
    return _nibbles(blocks[:, 2:], 16), _half(blocks[:, :2]), None


def _q5_0(blocks: np.ndarray) -> Codes:
    return _nibbles(blocks[:, 6:], 16) | (_planes(blocks[:, 2:6], 1, 1) << 4), _half(blocks[:, :2]), None


def _q5_1(blocks: np.ndarray) -> Codes:
    q = _nibbles(blocks[:, 8:], 16) | (_planes(blocks[:, 4:8], 1, 1) << 4)
    return q, _half(blocks[:, :2]), _half(blocks[:, 2:4])


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's s = d sc and mn = -dmin mc, (blocks, 8), as gguf-py computes them."""
    from gguf.quants import Q4_K

    sc, mc = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
    return _half(blocks[:, :2]) * sc.astype(np.float32), -(_half(blocks[:, 2:4]) * mc.astype(np.float32))


def _q4_k(blocks: np.ndarray) -> Codes:
    return (_nibbles(blocks[:, 16:], 32), *_k_scales(blocks))


def _q5_k(blocks: np.ndarray) -> Codes:
    return (_nibbles(blocks[:, 48:], 32) | (_planes(blocks[:, 16:48], 32, 1) << 4), *_k_scales(blocks))


def _q6_k(blocks: np.ndarray) -> Codes:
    q = _nibbles(blocks[:, :128], 64) | (_planes(blocks[:, 128:192], 32, 2) << 4)
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    return q, _half(blocks[:, 208:]) * scales, None


CODES: dict[str, Callable[[np.ndarray], Codes]] = {
    "Q4_0": _q4_0,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


def pack(blocks: np.ndarray, kind: str) -> np.ndarray:
    """Column blocks (count, columns, blocks a row, bytes) of GGUF blocks of `kind` in the kernel's
    layout (`row_kernel.c`, kinds 4 to 9): per column block, per group, the columns' s (and mn), the
    plane of their high bits where q has any, then their low 4 bits, two k-steps a byte."""
    count, columns, per_row, size = blocks.shape
    form = FORMATS[kind]
    q, scale, offset = CODES[kind](blocks.reshape(-1, size))
    groups = per_row * q.shape[1] // form.group
    q = q.reshape(count, columns, groups, form.group).transpose(0, 2, 1, 3)  # (count, groups, columns, G)

    def by_group(values: np.ndarray) -> np.ndarray:
        """Per-group float32 values (count columns blocks, groups a block) as bytes by group."""
        grouped = values.reshape(count, columns, groups).transpose(0, 2, 1)
        return np.ascontiguousarray(grouped, dtype=np.float32).view(np.uint8)

    parts = [by_group(scale)]
    if form.minimum:
        assert offset is not None
        parts.append(by_group(offset))
    if form.high_bits:
        shifts = np.arange(form.group, dtype=np.uint32) * np.uint32(form.high_bits)
        plane = ((q >> 4).astype(np.uint32) << shifts).sum(axis=-1, dtype=np.uint32)  # disjoint bits: sum = or
        parts.append(np.ascontiguousarray(plane).view(np.uint8))
    low = q & np.uint8(15)
    pairs = low[..., 0::2] | (low[..., 1::2] << np.uint8(4))  # (count, groups, columns, G / 2)
    parts.append(np.ascontiguousarray(pairs.transpose(0, 1, 3, 2)).reshape(count, groups, -1))
    return np.concatenate(parts, axis=-1).reshape(-1)


WIDENS_TO_Q8_0 = ("Q4_0", "Q5_0", "Q8_0")  # types whose every block is a Q8_0 block with fewer bits


def as_q8_0(blocks: np.ndarray, kind: str) -> np.ndarray:
    """Rows of `kind` blocks (one of `WIDENS_TO_Q8_0`) as Q8_0 blocks of the same weights: the same
    float16 scale d, and q - 8 (Q4_0) or q - 16 (Q5_0) as signed bytes, so every weight d (q - c)
    dequantizes to the same value. A product whose matrices mix these types then runs as one."""
    if kind == "Q8_0":
        return blocks
    rows = blocks.shape[0]
    cut = blocks.reshape(-1, 18 if kind == "Q4_0" else 22)
    q, _, _ = _q4_0(cut) if kind == "Q4_0" else _q5_0(cut)
    signed = (q.astype(np.int16) - (8 if kind == "Q4_0" else 16)).astype(np.int8).view(np.uint8)
    return np.concatenate([cut[:, :2], signed], axis=1).reshape(rows, -1)
