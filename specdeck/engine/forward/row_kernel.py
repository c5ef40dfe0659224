"""SpecDeck's own product for a few rows (`row_kernel.c`; built and loaded by `kernel_build`).

It streams the weights faster than oneDNN's packed product, and eight rows cost little more than
one: it reads each weight block once, front to back, prefetching ahead, and does up to eight rows'
arithmetic while the block is in cache. Each output is one sum over the inner dimension in order,
so a row's bits do not depend on the rows beside it (`specdeck.engine.forward.linear` checks that too before using
it). Its attention (`attend`) gives a step's and a verify's queries the same property, each query
reading only its own slots.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from specdeck.engine.forward import block_codes, block_groups
from specdeck.engine.forward.kernel_build import library

log = logging.getLogger(__name__)


def unavailable(weight: torch.Tensor) -> str | None:
    """None if the row kernel can run `weight`, else the reason it cannot."""
    if weight.device.type != "cpu":
        return f"the weights are on {weight.device.type}, not the CPU"
    if weight.dtype != torch.float32:
        return f"the row kernel takes float32, not {weight.dtype}"
    built = library()
    return built if isinstance(built, str) else None


class KernelLinear:
    """y = x W^T + b through the row kernel, on a weight packed once into blocks of columns.

    The packed blocks are the only copy this keeps: `dense` rebuilds the plain matrix from them,
    bit for bit, for the rare reader that needs it."""

    path = "kernel"

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, built: ctypes.CDLL | str | None = None
    ) -> None:
        """`built`: the kernel's library to run (by default this CPU's, `library()`)."""
        built = library() if built is None else built
        if isinstance(built, str):
            raise RuntimeError(built)
        self._product = built.row_kernel_product
        self._block, lanes = built.row_kernel_block(), built.row_kernel_lanes()
        self.bias = bias  # added after the sums: element-wise, so each row's bits stay its own
        self.out_features, self.in_features = weight.shape
        self._width = -(-self.out_features // lanes) * lanes  # rows padded to whole vectors
        plain = weight.detach()
        if self._width != self.out_features:
            plain = torch.cat([plain, plain.new_zeros(self._width - self.out_features, self.in_features)])
        whole = self._width // self._block * self._block  # columns in whole blocks; the rest in one more
        blocks = plain[:whole].reshape(-1, self._block, self.in_features).transpose(1, 2)
        self._packed = torch.cat([blocks.reshape(-1), plain[whole:].T.reshape(-1)])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _rows_through(self, x, self._product)

    def dense(self) -> torch.Tensor:
        """The weight matrix (out, in) in plain layout: a new tensor, equal to the one packed."""
        whole = self._width // self._block * self._block
        split = whole * self.in_features
        blocks = self._packed[:split].reshape(-1, self.in_features, self._block).transpose(1, 2)
        rest = self._packed[split:].reshape(self.in_features, -1).T
        return torch.cat([blocks.reshape(whole, self.in_features), rest])[: self.out_features].contiguous()


def _rows_through(linear: KernelLinear | QuantizedLinear, x: torch.Tensor, product) -> torch.Tensor:
    """x's rows (..., in) times `linear`'s packed weight, through `product` (one of the library's
    product functions, its leading arguments bound), plus the bias: rows in x's order. Rows of
    another width or dtype are refused: the kernel reads and writes by pointer, past the ends of
    buffers that do not hold what it expects."""
    if x.shape[-1] != linear.in_features or x.dtype is not torch.float32:
        raise ValueError(
            f"the row kernel multiplies float32 rows of {linear.in_features} values, "
            f"not {x.dtype} rows of shape {tuple(x.shape)}"
        )
    if not x.is_contiguous():
        x = x.contiguous()
    count = x.numel() // linear.in_features
    out = torch.empty((*x.shape[:-1], linear._width), dtype=torch.float32)
    if count:
        packed = linear._packed.data_ptr()
        threads = torch.get_num_threads()
        product(x.data_ptr(), count, linear.in_features, packed, linear._width, out.data_ptr(), threads)
    if linear._width != linear.out_features:
        out = out[..., : linear.out_features].contiguous()
    if linear.bias is not None:
        out.add_(linear.bias)  # after the sums: element-wise, so each row's bits stay its own
    return out


# GGUF block types the kernel reads, by its kind number (`row_kernel.c`, `any_part`): with float32
# rows (`QUANTIZED`, every type the kernel reads; 4 on, `block_codes`' one layout) and with rows in
# 8 bits (`INT8_KINDS`, 12 on `block_groups`' layout; a type missing there takes float32 rows).
QUANTIZED = {"Q4_1": 0, "Q8_0": 1, "Q4_0": 4, "Q5_0": 5, "Q5_1": 6, "Q4_K": 7, "Q5_K": 8, "Q6_K": 9}
INT8_KINDS = {"Q4_1": 2, "Q8_0": 3, "Q4_0": 12, "Q5_0": 13, "Q5_1": 14, "Q4_K": 15, "Q5_K": 16, "Q6_K": 17}


def block_shape(kind: str) -> tuple[int, int]:
    """A GGUF block type's weights along the inner dimension and bytes, a block (gguf-py's table)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[kind]]


ACTIVATIONS = ("float32", "int8")
PACK_WEIGHTS = (
    1 << 22
)  # weights laid out for the 8-bit-row products at once, at most  # how a product on GGUF blocks takes its rows (`QuantizedLinear`)
INT8_MISSING = "the row kernel has no 8-bit products for AVX-512 without VNNI"


def int8_available() -> str | None:
    """None where products on GGUF blocks can take their rows in 8 bits here, else why not."""
    built = library()
    if isinstance(built, str):
        return built
    return None if built.row_kernel_int8() else INT8_MISSING


class QuantizedLinear:
    """y = x W^T + b through the row kernel on a weight kept in a GGUF file's blocks (`QUANTIZED`).

    `blocks` (out, in / weights a block * bytes a block), uint8: the rows' blocks as the file stores
    them. The kernel decodes each weight as gguf-py does and sums it as `KernelLinear` sums the
    decoded matrix, so the product has the bits of `KernelLinear(dequantized)` at any row count, on
    4.5 (Q4_1) to 8.5 (Q8_0) bits a weight instead of 32. `dense` makes the decoded matrix (the file's
    own dequantization), for the rare reader that needs it; `source`, where given, the blocks again
    (from the file: nothing kept twice), for `rows`."""

    path = "kernel"

    def __init__(
        self,
        blocks: np.ndarray,
        kind: str,
        in_features: int,
        dense,
        bias: torch.Tensor | None = None,
        built: ctypes.CDLL | str | None = None,
        source: Callable[[], np.ndarray] | None = None,
        activations: str = "float32",
        exact: bool = True,
    ) -> None:
        """`activations`: "float32" (the float32 product's bits on the decoded weights) or "int8"
        (each row's groups of 32 in 8 bits, for the K-quants its blocks of 256, as llama.cpp
        multiplies: `int8_available`). `exact`: `dense` gives the model's matrix back bit for bit
        (False: blocks quantized from it)."""
        built = library() if built is None else built
        if isinstance(built, str):
            raise RuntimeError(built)
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations are one of {', '.join(ACTIVATIONS)}, not {activations!r}")
        if activations == "int8" and not built.row_kernel_int8():
            raise RuntimeError(INT8_MISSING)
        if kind not in INT8_KINDS:
            activations = "float32"  # this type's blocks have no 8-bit-row products yet
        if activations == "float32" and kind not in QUANTIZED:
            raise ValueError(f"the row kernel reads {kind} blocks only with rows in 8 bits (activations='int8')")
        self._built, self._source, self.activations, self.exact = built, source, activations, exact
        self._cuts: dict[bytes, QuantizedLinear] = {}  # `rows` made before, by their ids
        self._product = built.row_kernel_quantized
        self._kind = INT8_KINDS[kind] if activations == "int8" else QUANTIZED[kind]
        weights, size = block_shape(kind)
        self.kind, self._dense, self.bias = kind, dense, bias
        block, lanes = built.row_kernel_block(), built.row_kernel_lanes()
        self.out_features, self.in_features = blocks.shape[0], in_features
        self._width = -(-self.out_features // lanes) * lanes
        groups = in_features // weights
        if self._width == self.out_features:
            cut = blocks.reshape(self.out_features, groups, size)
        else:
            cut = np.zeros((self._width, groups, size), np.uint8)  # padded rows: d = m = q = 0, w = 0
            cut[: self.out_features] = blocks.reshape(self.out_features, groups, size)
        if activations == "int8":
            vectors = cut.reshape(-1, lanes, groups, size)
            # a few vectors at a time: the layout's scratch (a byte a weight, several times) stays small
            step = max(1, PACK_WEIGHTS // (lanes * in_features))
            first = _pack_int8(vectors[:step], kind, built)
            per_vector = len(first) // min(step, len(vectors))
            packed = np.empty(per_vector * len(vectors), np.uint8)
            for at in range(0, len(vectors), step):
                laid = first if at == 0 else _pack_int8(vectors[at : at + step], kind, built)
                packed[per_vector * at : per_vector * at + len(laid)] = laid
                release_pages(vectors[at : at + step])
            self._packed = torch.from_numpy(packed)
            return
        whole = self._width // block * block
        parts = [_pack(cut[:whole].reshape(-1, block, groups, size), kind)]
        if whole < self._width:
            parts.append(_pack(cut[whole:][None], kind))
        self._packed = torch.from_numpy(np.concatenate(parts))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _rows_through(self, x, functools.partial(self._product, self._kind))

    def dense(self) -> torch.Tensor:
        """The decoded weight matrix (out, in), float32: a new tensor."""
        return self._dense()

    def rows(self, ids: np.ndarray) -> QuantizedLinear | None:
        """The product of the rows `ids` of this weight (no bias), on their blocks: the same bits as
        these rows of this product; None without a `source` of the blocks."""
        if self._source is None:
            return None
        key = ids.tobytes()
        if key not in self._cuts:  # a drafter made per session takes the same rows again
            self._cuts[key] = QuantizedLinear(
                self._source()[ids],
                self.kind,
                self.in_features,
                lambda: self.dense()[ids],
                built=self._built,
                activations=self.activations,
                exact=self.exact,
            )
        return self._cuts[key]


class QuantizedParts:
    """y = x W^T + b where W's rows are parts of different GGUF block types (a Q4_K_M file's query,
    key and value projections, say), each part its own `QuantizedLinear`: the parts' outputs side
    by side, then the bias. Each output is its part's sum, so the bits are those of the parts."""

    path = "kernel"
    exact = True

    def __init__(self, parts: list[QuantizedLinear], bias: torch.Tensor | None = None) -> None:
        self.parts, self.bias = parts, bias
        self.kind = "+".join(dict.fromkeys(part.kind for part in parts))
        self.activations = "int8" if any(part.activations == "int8" for part in parts) else "float32"
        self.out_features = sum(part.out_features for part in parts)
        self.in_features = parts[0].in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat([part(x) for part in self.parts], dim=-1)
        if self.bias is not None:
            out.add_(self.bias)  # after the sums: element-wise, so each row's bits stay its own
        return out

    def dense(self) -> torch.Tensor:
        """The decoded weight matrix (out, in), float32: a new tensor."""
        return torch.cat([part.dense() for part in self.parts])


def release_pages(blocks: np.ndarray) -> None:
    """Drop the pages of `blocks` that this process has read, where they are a view of a file's
    mapping (gguf-py's and `specdeck.engine.forward.gguf_index`'s are): once laid out for the kernel, they would
    otherwise stay resident beside their copy (a 1.7B file's gigabyte twice). The mapping is of the
    file, read-only, so nothing is lost: a later read takes the pages again from the page cache or
    the disk; pages shared with neighbouring bytes go too, for the same reason. Anything else (an
    array of its own) is left alone."""
    root: Any = blocks
    while not isinstance(root, mmap.mmap) and getattr(root, "base", None) is not None:
        root = root.base
    if not isinstance(root, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or not blocks.size:
        return
    start = blocks.ctypes.data - np.frombuffer(root, dtype=np.uint8).ctypes.data
    first = start // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(start + blocks.nbytes, len(root))
    try:
        root.madvise(mmap.MADV_DONTNEED, first, end - first)
    except (OSError, ValueError) as error:  # only costs memory
        log.info("mapped pages were kept: %s", error)


def _pack(blocks: np.ndarray, kind: str) -> np.ndarray:
    """Column blocks (count, columns, groups, bytes) of GGUF blocks in the kernel's layout
    (`row_kernel.c`): per column block, per group of 32, the scales (and minimums) of its columns,
    then the columns' quants k-step by k-step (Q4_1: two k-steps a byte); the other types in
    `block_codes`' layout."""
    if kind in block_codes.FORMATS:
        return block_codes.pack(blocks, kind)
    count, columns, groups, _ = blocks.shape
    fields = blocks.transpose(0, 2, 1, 3)  # (count, groups, columns, bytes)
    scales = [fields[..., 0:2], fields[..., 2:4]] if kind == "Q4_1" else [fields[..., 0:2]]
    parts = [np.ascontiguousarray(s).reshape(count, groups, 2 * columns) for s in scales]
    if kind == "Q4_1":
        q = fields[..., 4:20]  # byte j: weight j in the low nibble, weight j + 16 in the high
        q = np.concatenate([q & 15, q >> 4], axis=-1)  # (count, groups, columns, 32), weight by weight
        pairs = q[..., 0::2] | (q[..., 1::2] << 4)  # k-steps 2p and 2p + 1 in one byte
        parts.append(np.ascontiguousarray(pairs.transpose(0, 1, 3, 2)).reshape(count, groups, 16 * columns))
    else:
        q = fields[..., 2:34]
        parts.append(np.ascontiguousarray(q.transpose(0, 1, 3, 2)).reshape(count, groups, 32 * columns))
    return np.concatenate(parts, axis=-1).reshape(-1)


def _pack_int8(vectors: np.ndarray, kind: str, built: ctypes.CDLL) -> np.ndarray:
    """Vectors of columns (count, lanes, groups, bytes) of GGUF blocks in the layout of the kernel's
    8-bit-activation products (`row_kernel.c`): per vector, per group of 32, the columns' scales
    (and minimums), then runs of 4 quant bytes a column (Q8_0's offset by 128, unsigned); the
    other types as `specdeck.engine.forward.block_groups.layout` lays them out, by the kernel's own
    `row_kernel_lay_out` (the same bytes in a fraction of the time: numpy's takes a byte of scratch
    a weight, several times over, and most of a 1.7B model's load)."""
    if kind in block_groups.TYPES:
        count, lanes, blocks, size = vectors.shape
        groups = blocks * block_shape(kind)[0] // 32
        rows = np.ascontiguousarray(vectors)
        out = np.empty(built.row_kernel_laid_bytes(INT8_KINDS[kind], count, groups), np.uint8)
        built.row_kernel_lay_out(INT8_KINDS[kind], rows.ctypes.data, count, groups, blocks * size, out.ctypes.data)
        return out
    count, lanes, groups, size = vectors.shape
    # a group's blocks side by side, then one gather of their bytes into the layout's order: two
    # passes over the bytes where a copy a field and a concatenation took four
    fields = np.ascontiguousarray(vectors.transpose(0, 2, 1, 3)).reshape(count, groups, lanes * size)
    laid = np.take(fields, _int8_order(kind, lanes), axis=-1)
    if kind == "Q8_0":
        laid[..., 2 * lanes :] ^= np.uint8(128)  # the quants, signed, as unsigned
    return laid.reshape(-1)


@functools.cache
def _int8_order(kind: str, lanes: int) -> np.ndarray:
    """Where each byte of a group's layout for the 8-bit-row products (Q4_1, Q8_0: `_pack_int8`)
    comes from in its `lanes` blocks side by side: the lanes' scales (and minimums), 2 bytes each,
    then run by run of 4 quant bytes, each lane's run."""
    size = block_shape(kind)[1]
    scales, quants = ((0, 2), 4) if kind == "Q4_1" else ((0,), 2)
    order = [lane * size + at + i for at in scales for lane in range(lanes) for i in range(2)]
    runs = range(quants, size, 4)
    order += [lane * size + run + i for run in runs for lane in range(lanes) for i in range(4)]
    return np.array(order, dtype=np.intp)


def attention_unavailable(dtype: torch.dtype, device: torch.device, head_dim: int) -> str | None:
    """None if the kernel's attention (`attend`) runs queries of this kind here, else why not."""
    if device.type != "cpu" or dtype != torch.float32:
        return "the row kernel's attention takes float32 on the CPU"
    built = library()
    if isinstance(built, str):
        return built
    if head_dim % built.row_kernel_lanes() or head_dim > 256:
        return f"the row kernel's attention takes a head size of at most 256 in whole vectors, not {head_dim}"
    return None


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    ends: torch.Tensor,
    window: int | None,
    scale: float,
    built: ctypes.CDLL | str | None = None,
) -> torch.Tensor:
    """Attention (1, heads, m, head_dim) of queries q (1, heads, m, head_dim) over a layer's cached
    keys and values (1, kv_heads, slots, head_dim), query j over slots [ends[j] - window, ends[j])
    (from 0 without a window): each query reads only its own slots, so its bits are those of a
    call of its own. `ends`: int64, one per query; where `attention_unavailable` says None. `built`:
    another build of the kernel (`build`) than the one SpecDeck runs."""
    built = library() if built is None else built
    assert not isinstance(built, str), built
    _, heads, m, head_dim = q.shape
    if q.stride(3) != 1:
        q = q.contiguous()
    if keys.stride(3) != 1 or keys.stride(2) != head_dim or values.stride() != keys.stride():
        raise ValueError("the row kernel's attention reads keys and values laid out as a KV cache's")
    out = torch.empty(1, m, heads, head_dim)  # the layout the output projection reads
    built.row_kernel_attention(
        q.data_ptr(),
        q.stride(2),
        q.stride(1),
        keys.data_ptr(),
        values.data_ptr(),
        keys.stride(1),
        ends.data_ptr(),
        m,
        heads,
        keys.shape[1],
        head_dim,
        window or 0,
        scale,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out.transpose(1, 2)
