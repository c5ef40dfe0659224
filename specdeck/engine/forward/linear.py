"""Matrix products whose cost stays flat in the number of tokens, where this machine allows it.

A decode step multiplies one row of activations by every weight matrix; a verify multiplies a few
rows. Both read the same weights from memory, so a verify over 8 tokens should cost about what one
step costs. On the CPU, `F.linear` (MKL, weights as stored) does not deliver that: for 2 to 16 rows
it leaves its fast path and a product costs 2-5x the one-row product on some machines
(`docs/engine.md`, "A verify that costs what a step costs"). oneDNN's inner-product primitive on a weight reordered once
into its own blocked layout (what PyTorch's inductor does when it freezes a model on the CPU) stays
close to flat up to 16 rows and gives every row the same bits whether it goes alone or with others,
which keeps greedy speculative text identical to plain text even where two logits nearly tie.
SpecDeck's own row kernel (`specdeck.engine.forward.row_kernel`, float32 on AVX-512 or AVX2, built for the machine)
does the same by construction and streams the weights faster where it builds.

The path is chosen once per process and kind of weight, by measurement on this machine: a packed
product (the row kernel or oneDNN's) is used only where it runs, it is shape-invariant (checked bit
for bit), and it is no slower than `F.linear`; the fastest of those wins. Otherwise every product
stays on `F.linear`, and the choice's reason says why. `SPECDECK_LINEAR=dense`, `=packed` or
`=kernel` overrides the choice (for benchmarks and tests).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward import row_kernel
from specdeck.engine.forward.row_kernel import KernelLinear, QuantizedLinear, QuantizedParts

log = logging.getLogger(__name__)

PATHS = ("dense", "packed", "kernel")
# Paths whose products hold the weight in a layout of their own (the model's plain matrices can go)
# and give every row the bits of its own call.
PACKED = ("packed", "kernel")
_NAMES = {"dense": "F.linear", "packed": "oneDNN's packed product", "kernel": "SpecDeck's row kernel"}
SLICE = 1024  # the longest inner dimension one packed product reduces over, where the whole is not invariant
# Fewer rows than this go in padded with zeros where that streams faster: on some CPUs oneDNN's one-row
# kernel reads a packed weight more slowly than its blocked kernel for four, on others faster, so it is
# measured per machine (`min_rows`). Shape invariance makes a padded row's result the same bits.
MIN_ROWS = 4
_ROWS = (1, 2, 4, 8)  # row counts a choice is measured at: a step and the verifies that matter
_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)  # row counts whose rows must have the bits of their own calls
_DRAWS = 3  # draws of random rows a layout's bits are checked on


@dataclass(frozen=True)
class Layout:
    """How a packed product runs: the longest inner dimension one oneDNN call reduces over (None:
    the whole row), and how many rows a call takes at least (fewer are padded with zeros)."""

    slice: int | None = SLICE
    min_rows: int = MIN_ROWS


class DenseLinear:
    """y = x W^T + b with the weight as stored (`F.linear`)."""

    path = "dense"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def dense(self) -> torch.Tensor:
        """The weight matrix (out, in), as stored."""
        return self.weight


class PackedLinear:
    """y = x W^T + b through oneDNN on a weight reordered once into its blocked layout.

    For some row counts oneDNN splits a long reduction otherwise than for others (measured on AMD
    EPYC from 1,152 columns on); where it does, the inner dimension is cut into equal slices of at
    most `SLICE` columns, each its own product, summed in order, so each row's sum keeps its order
    however many rows there are. The layout (`layout_for`) is measured once per shape on this
    machine. The packed slices are the only copy this keeps: `dense` rebuilds the plain matrix from
    them, bit for bit, for the rare reader that needs it."""

    path = "packed"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, layout: Layout | None = None) -> None:
        self.bias = bias  # added after the slices' sum: element-wise, so each row's bits stay its own
        self.out_features, width = weight.shape
        # Layout() where no layout keeps the bits: only SPECDECK_LINEAR=packed asks for that
        self.layout = layout or layout_for(weight) or Layout()
        pieces = -(-width // (self.layout.slice or width))
        step = -(-width // pieces)
        self._slices = [(start, min(start + step, width)) for start in range(0, width, step)]
        self._packed = [
            torch.ops.mkldnn._reorder_linear_weight(weight.detach()[:, a:b].contiguous(), None) for a, b in self._slices
        ]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        if count < self.layout.min_rows:  # each row's bits are the same alone as in a batch
            rows = torch.cat([rows, rows.new_zeros(self.layout.min_rows - count, rows.shape[1])])
        out: torch.Tensor | None = None
        for (a, b), packed in zip(self._slices, self._packed):
            part = rows if len(self._slices) == 1 else rows[:, a:b]
            part = torch.ops.mkldnn._linear_pointwise(part.contiguous(), packed, None, "none", [], "")
            out = part if out is None else out.add_(part)
        assert out is not None  # a product has at least one slice
        if self.bias is not None:
            out.add_(self.bias)
        if out.shape[0] != count:
            out = out[:count]
        return out.view(*x.shape[:-1], self.out_features)

    def dense(self) -> torch.Tensor:
        """The weight matrix (out, in) in plain layout: a new tensor, equal to the one packed."""
        return torch.cat([packed.to_dense() for packed in self._packed], dim=1)


Linear = DenseLinear | PackedLinear | KernelLinear | QuantizedLinear | QuantizedParts


@dataclass(frozen=True)
class PathChoice:
    path: str
    reason: str  # why: measured costs, or why the packed path cannot be used here
    min_rows: int = MIN_ROWS  # rows a packed call takes at least (`min_rows`)

    def describe(self) -> str:
        """For reports: the path in words, and why."""
        return f"{_NAMES[self.path]} ({self.reason})"


_MEASURED: dict[tuple, object] = {}


def packed_available(weight: torch.Tensor) -> str | None:
    """None if the packed path can run `weight`, else the reason it cannot."""
    if weight.device.type != "cpu":
        return f"the weights are on {weight.device.type}, not the CPU"
    if weight.dtype not in (torch.float32, torch.bfloat16):
        return f"oneDNN's packed product takes float32 or bfloat16, not {weight.dtype}"
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return "this build of torch has no oneDNN packed linear"
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "oneDNN has no bfloat16 product on this CPU (it needs AVX-512 or AVX-NE-CONVERT)"
    return None


def _time_ms(fn, x: torch.Tensor, repeats: int = 5) -> float:
    fn(x)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def _shape_invariant(linear: Linear, width: int, dtype: torch.dtype) -> bool:
    """Whether every row comes out with the same bits in a call of 1 to 16 rows as in a call of its
    own (a step's), on `_DRAWS` draws of random rows. A row's own call is the comparison that counts:
    a kernel may treat a row by its place in the call (oneDNN's bfloat16 product on a Xeon with AMX
    gave the 4th and 8th rows of a call other bits), and in bfloat16 such a difference shows only
    where it crosses a rounding boundary, so one draw can miss it."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(_DRAWS):
        x = torch.randn(max(_COUNTS), width, generator=generator).to(dtype)
        alone = torch.cat([linear(x[j : j + 1]) for j in range(max(_COUNTS))])
        if not all(torch.equal(linear(x[:n]), alone[:n]) for n in _COUNTS):
            return False
    return True


def min_rows(weight: torch.Tensor) -> int:
    """Rows a packed call takes at least on this machine, by one row through `weight` (the model's
    largest, which streams from memory on any CPU) alone against padded to `MIN_ROWS` (best of 7,
    alternated), where one row alone gives the bits it gets in a batch; measured once per shape."""

    def measure() -> int:
        layout = layout_for(weight, 1)  # checks the bits of one-row calls, once
        if layout is None or layout.min_rows != 1:
            return MIN_ROWS
        alone, padded = (
            PackedLinear(weight, layout=layout),
            PackedLinear(weight, layout=replace(layout, min_rows=MIN_ROWS)),
        )
        x = torch.randn(1, weight.shape[1], dtype=weight.dtype)
        best = {1: float("inf"), MIN_ROWS: float("inf")}
        with torch.inference_mode():
            for _ in range(7):
                for rows, product in ((1, alone), (MIN_ROWS, padded)):
                    best[rows] = min(best[rows], _time_ms(product, x, repeats=1))
        return 1 if best[1] <= best[MIN_ROWS] else MIN_ROWS

    return _memo(weight, "min_rows", measure)


def layout_for(weight: torch.Tensor, rows: int = MIN_ROWS) -> Layout | None:
    """The layout a packed product of `weight`'s shape takes on this machine, with calls of at least
    `rows` rows: the whole row in one call where that keeps every row's bits whatever the row count,
    else `SLICE`-column slices, else (with one row allowed) the same padded to `MIN_ROWS`. None where
    no layout keeps the bits. Measured once per shape."""

    def measure() -> Layout | None:
        cuts = (None, SLICE) if weight.shape[1] > SLICE else (None,)
        for layout in [Layout(cut, rows) for cut in cuts] + [Layout(cut, MIN_ROWS) for cut in cuts if rows != MIN_ROWS]:
            if _shape_invariant(PackedLinear(weight, layout=layout), weight.shape[1], weight.dtype):
                return layout
        return None

    return _memo(weight, f"layout, {rows} rows a call at least", measure)


def choose_path(weights: Sequence[torch.Tensor]) -> PathChoice:
    """One product path for all of a model's `weights` on this machine (mixing paths would lose the
    shape invariance that only a model wholly on one packed path has). The fastest packed path (the
    row kernel, oneDNN's) that runs every weight, gives every shape's rows the same bits alone as in
    a batch, and times no slower than `F.linear` on the largest weight; each check measured once per
    shape."""
    forced = os.environ.get("SPECDECK_LINEAR", "").strip().lower()
    if forced and forced not in PATHS:
        raise SpecDeckError(
            f"SPECDECK_LINEAR must be one of {', '.join(PATHS)} (got {forced!r}): set it to one, or unset it."
        )
    if forced == "dense":
        return PathChoice("dense", "SPECDECK_LINEAR=dense")
    largest = max(weights, key=lambda w: w.numel())
    shapes = list({(tuple(w.shape), w.dtype): w for w in weights}.values())
    candidates: dict[str, tuple[float, int]] = {}  # path -> (ms over 1+2+4+8 rows, rows a call at least)
    refused: list[str] = []  # why a packed path is out
    for path, candidate in (("kernel", _kernel_candidate), ("packed", _onednn_candidate)):
        if forced not in ("", path):
            continue
        found = candidate(weights, shapes, largest, timed=not forced)
        if isinstance(found, str):
            refused.append(found)
        elif forced:
            return PathChoice(path, f"SPECDECK_LINEAR={path}", found[1])
        else:
            candidates[path] = found
    if not candidates:
        if forced:
            return PathChoice("dense", f"SPECDECK_LINEAR={forced}, but {refused[0]}")
        off_cpu = largest.device.type != "cpu"  # one reason for both paths, said once
        return PathChoice("dense", f"the weights are on {largest.device.type}" if off_cpu else "; ".join(refused))
    dense_ms = _memo(largest, "dense timing", lambda: _time_rows(DenseLinear(largest), largest))
    path = min(candidates, key=lambda name: candidates[name][0])
    timings = ", ".join(f"{_NAMES[name]} {ms:.2f} ms" for name, (ms, _) in candidates.items())
    reason = f"{'+'.join(map(str, _ROWS))} rows through a {tuple(largest.shape)} weight: {timings}, F.linear {dense_ms:.2f} ms"
    if path == "packed":
        rows = candidates["packed"][1]
        reason += f"; packed calls take {rows} row{'s' if rows > 1 else ''} at least"
    if candidates[path][0] > dense_ms:
        return PathChoice("dense", reason)
    return PathChoice(path, reason, candidates[path][1])


def _kernel_candidate(
    weights: Sequence[torch.Tensor], shapes: list[torch.Tensor], largest: torch.Tensor, timed: bool
) -> tuple[float, int] | str:
    """The row kernel's milliseconds over 1+2+4+8 rows through `largest` (0 where not `timed`) and
    the rows a call takes at least; or why it cannot run these weights."""
    missing = next((reason for reason in map(row_kernel.unavailable, weights) if reason), None)
    if missing:
        return f"no row kernel: {missing}"
    if not timed:
        return 0.0, 1
    if not all(
        _memo(w, "kernel bits", lambda w=w: _shape_invariant(KernelLinear(w), w.shape[1], w.dtype)) for w in shapes
    ):
        return "the row kernel gives a row other bits alone than in a batch"
    return _memo(largest, "kernel timing", lambda: _time_rows(KernelLinear(largest), largest)), 1


def _onednn_candidate(
    weights: Sequence[torch.Tensor], shapes: list[torch.Tensor], largest: torch.Tensor, timed: bool
) -> tuple[float, int] | str:
    """oneDNN's packed product, as `_kernel_candidate`: its milliseconds and the rows a call takes at
    least (measured, `min_rows`), or why not."""
    missing = next((reason for reason in map(packed_available, weights) if reason), None)
    if missing:
        return f"no oneDNN packed product: {missing}"
    if not timed:
        return 0.0, MIN_ROWS
    rows = min_rows(largest)
    odd = next((w for w in shapes if layout_for(w, rows) is None), None)
    if odd is not None:
        return f"oneDNN's packed product of a {tuple(odd.shape)} weight gives a row other bits alone than in a batch"
    packed = PackedLinear(largest, layout=layout_for(largest, rows))
    return _memo(largest, f"packed timing, {rows} rows", lambda: _time_rows(packed, largest)), rows


def _memo(weight: torch.Tensor, what: str, measure):
    key = (what, tuple(weight.shape), weight.dtype, torch.get_num_threads())
    if key not in _MEASURED:
        _MEASURED[key] = measure()
        log.info("matrix products %s %s: %s", key[1], what, _MEASURED[key])
    return _MEASURED[key]


def _time_rows(product: Linear, weight: torch.Tensor) -> float:
    """Milliseconds of `product` (of `weight`) over 1, 2, 4 and 8 rows, summed (the best of 5 each)."""
    with torch.inference_mode():
        inputs = [torch.randn(n, weight.shape[1], dtype=weight.dtype) for n in _ROWS]
        return sum(_time_ms(product, x) for x in inputs)


def make_linear(weight: torch.Tensor, choice: PathChoice | None = None, bias: torch.Tensor | None = None) -> Linear:
    """`weight` (out, in) and `bias` as a product on `choice`'s path (by default, the one chosen for
    the weight alone)."""
    choice = choice or choose_path([weight])
    if choice.path == "dense":
        return DenseLinear(weight, bias)
    if choice.path == "kernel":
        return KernelLinear(weight, bias)
    return PackedLinear(weight, bias, layout_for(weight, choice.min_rows))


def bfloat16_pays(weights: Sequence[torch.Tensor]) -> PathChoice:
    """Whether a drafter's float32 `weights` should draft in bfloat16 on this machine: where the
    products' bfloat16 path runs, and one row through all of them (as a draft step reads them) takes
    at most `BF16_SHARE` of float32's time, measured once per process and set of shapes (bfloat16
    halves the bytes read where the CPU computes it natively; where it is emulated it is slower).
    Drafts only change speed, never the text, so a drafter may round where the target may not.
    `SPECDECK_DRAFT_DTYPE=float32` or `=bfloat16` overrides the choice."""
    forced = os.environ.get("SPECDECK_DRAFT_DTYPE", "").strip().lower()
    if forced and forced not in ("float32", "bfloat16"):
        raise SpecDeckError(
            f"SPECDECK_DRAFT_DTYPE must be float32 or bfloat16 (got {forced!r}): set it to one, or unset it."
        )
    if forced:
        return PathChoice(forced, f"SPECDECK_DRAFT_DTYPE={forced}")
    if any(w.dtype != torch.float32 for w in weights):
        return PathChoice(str(weights[0].dtype).removeprefix("torch."), "the drafter is not in float32")
    missing = next((reason for reason in map(packed_available, weights) if reason), None)
    if missing:
        return PathChoice("float32", missing)
    key = (tuple(tuple(w.shape) for w in weights), torch.get_num_threads())
    if key not in _DTYPE_TIMINGS:
        _DTYPE_TIMINGS[key] = _dtype_timings(weights)
    float_ms, bf16_ms = _DTYPE_TIMINGS[key]
    reason = f"one row through the drafter's products: float32 {float_ms:.2f} ms, bfloat16 {bf16_ms:.2f} ms"
    return PathChoice("bfloat16" if bf16_ms <= BF16_SHARE * float_ms else "float32", reason)


BF16_SHARE = 0.8  # bfloat16 drafting where it takes at most this share of float32's time
_DTYPE_TIMINGS: dict[tuple, tuple[float, float]] = {}


def _dtype_timings(weights: Sequence[torch.Tensor]) -> tuple[float, float]:
    """Milliseconds of one row through every weight, in float32 and in bfloat16 (the best of 5,
    the two alternating)."""
    sets = {
        dtype: [(make_linear(w.detach().to(dtype)), torch.randn(1, w.shape[1], dtype=dtype)) for w in weights]
        for dtype in (torch.float32, torch.bfloat16)
    }
    best = dict.fromkeys(sets, float("inf"))
    with torch.inference_mode():
        for _ in range(6):
            for dtype, products in sets.items():
                started = time.perf_counter()
                for product, x in products:
                    product(x)
                best[dtype] = min(best[dtype], (time.perf_counter() - started) * 1e3)
    return best[torch.float32], best[torch.bfloat16]
