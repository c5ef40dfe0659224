"""The lean forward's steps and verifies at one fixed shape, replayed as CUDA graphs on a GPU.

On a GPU a small model's step is bound by launching kernels, not by the GPU: SmolLM2-135M's 30
layers launch about 900 of them a step, which took 24 ms on an H100 from Python while the
arithmetic takes well under one. A CUDA graph records a step's kernels once and replays them with
one launch. A graph needs every shape fixed, so a fixed-shape forward always runs `ROWS` rows (a
chunk of n <= ROWS new tokens, the rest padding) and attends over the cache's whole capacity with
a mask built on the device from where the chunk starts: nothing in it depends on the host's view
of the cache, and the same graph serves every step until the cache grows.

The fixed shape makes it exact as well. A plain step and a verify run the same kernels on the same
shapes, and no kernel mixes one row's arithmetic with another's (products, norms and attention all
reduce within a row), so a verified token gets, bit for bit, the logits a plain step would give it;
a chunk longer than `ROWS` runs as several chunks of `ROWS`, which keeps that true. The padding
rows hold finite values (the cache starts zeroed and the inputs keep earlier rows), since a masked
position still enters attention's sums multiplied by zero, and zero times NaN is NaN.

Without capture (`capture=False`) the same arithmetic runs eagerly: that is how the CPU test suite
checks it, and the reference the GPU tests compare the graphs with.
"""

from __future__ import annotations

import gc
import logging
import os
import weakref
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from specdeck.engine.forward.llama_forward import LlamaForward

log = logging.getLogger(__name__)

ROWS = 16  # rows of every fixed-shape forward: the longest chunk one replay takes
# Slots a cache run by fixed-shape steps holds at least: each growth means capturing again (about
# 50 ms for SmolLM2 on an H100), and attending over empty slots costs next to nothing on a GPU.
MIN_CAPACITY = 2048
# Devices whose steps run at one fixed shape, unless SPECDECK_CUDA_GRAPHS=0
FIXED_SHAPE_DEVICES = frozenset({"cuda"})


def fixed_shape_on(device: torch.device) -> bool:
    """Whether the lean forward runs its steps at one fixed shape on `device` by default (as CUDA
    graphs on a GPU): on `FIXED_SHAPE_DEVICES`, unless SPECDECK_CUDA_GRAPHS=0."""
    return device.type in FIXED_SHAPE_DEVICES and os.environ.get("SPECDECK_CUDA_GRAPHS", "1") != "0"


class FixedShapeSteps:
    """The fixed-shape forward of one `LlamaForward` and its KV cache, where `capture` is set captured
    as a CUDA graph per set of taps on the cache's storage (captured again when the cache grows)."""

    def __init__(self, forward: LlamaForward, capture: bool, rows: int = ROWS) -> None:
        # the forward owns these steps: a weak reference back keeps the two out of a reference
        # cycle, whose graphs the garbage collector would destroy at any moment (a capture too)
        self._forward = weakref.ref(forward)
        self.capture, self.rows = capture, rows
        weights = forward.weights
        device, dtype = weights.embed.device, weights.embed.dtype
        width = weights.embed.shape[1]
        self.inputs = torch.zeros(rows, width, dtype=dtype, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self._output_rows = torch.zeros(rows, width, dtype=dtype, device=device)
        self._storage: tuple[int, int] | None = None  # the cache storage the graphs were captured on
        # the graph for each set of taps (a plain session takes none, a fused head's some)
        self._graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph | None, tuple | None]] = {}

    def takes(self, n: int, start: int, tree: bool) -> bool:
        """Whether this forward runs a chunk: any chain after cached positions (in `ROWS`-row
        pieces) and a first chunk that fits in one. A longer first prompt runs eagerly, as one
        forward, in plain and speculative sessions alike; so do trees (`LlamaForward.supports_trees`)."""
        return not tree and (n <= self.rows or start > 0)

    def hidden(self, inputs: torch.Tensor) -> torch.Tensor:
        """The final norm's output (n, hidden) for input vectors (n, hidden) appended after the
        cached positions, as `LlamaForward.hidden_from_inputs`; the residual streams of its taps
        are left in `forward.tapped`."""
        n = inputs.shape[0]
        if n > self.rows:
            pieces, taps = [], []
            for i in range(0, n, self.rows):
                pieces.append(self.hidden(inputs[i : i + self.rows]))
                taps.append(self.forward.tapped)
            self.forward.tapped = None if taps[0] is None else torch.cat(taps)  # type: ignore[arg-type]
            return torch.cat(pieces)
        cache = self.forward.cache
        start = cache.length
        self.inputs[:n].copy_(inputs)
        graph, outputs = self.ready()
        if graph is not None:
            graph.replay()
            hidden, tapped = outputs  # type: ignore[misc]
        else:
            hidden, tapped = self._compute()
        cache.length = start + n
        self.forward.tapped = None if tapped is None else tapped[:n].clone()
        return hidden[:n].clone()

    def ready(self) -> tuple[torch.cuda.CUDAGraph | None, tuple | None]:
        """Room in the cache for the next chunk, and its graph captured: called by each chunk, and
        after a prompt that ran eagerly, so that the capture counts as part of the prompt, not of
        the first step. (A warm-up writes the padding rows' keys past the cached positions only.)
        Returns the graph and its outputs, (None, None) where the steps run uncaptured."""
        cache = self.forward.cache
        cache.reserve(max(cache.length + self.rows, MIN_CAPACITY))
        self.start.fill_(cache.length)
        storage = (cache.keys.data_ptr(), cache.keys.shape[3])
        if storage != self._storage:  # a grown cache: every graph read and wrote the old one
            self._graphs.clear()
            self._storage = storage
        taps = self.forward.taps
        if taps not in self._graphs:
            self._graphs[taps] = self._capture()
        return self._graphs[taps]

    def size_for(self, tokens: int) -> None:
        """Give the cache the capacity a session of `tokens` positions gets: the least power of two
        holding them and one more chunk, MIN_CAPACITY at least, whatever it held before (a forward
        taken over from an earlier session is resized). Attention spans the whole capacity, masked
        slots included, and a sum over more of them need not round alike on every kernel: so a plain
        and a speculative run of one request attend over as many slots."""
        capacity = MIN_CAPACITY
        while capacity < tokens + self.rows:
            capacity *= 2
        cache = self.forward.cache
        if cache.keys.shape[3] != capacity:
            cache.resize(capacity)

    def output(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer on up to `ROWS` final states, as a `ROWS`-row product (its bits for a row
        do not depend on how many rows were asked for)."""
        n = hidden.shape[0]
        if n > self.rows:
            return torch.cat([self.output(hidden[i : i + self.rows]) for i in range(0, n, self.rows)])
        self._output_rows[:n].copy_(hidden)
        return self.forward.weights.output(self._output_rows)[:n]

    @property
    def forward(self) -> LlamaForward:
        forward = self._forward()
        assert forward is not None, "the forward these steps belong to is gone"
        return forward

    def _capture(self) -> tuple[torch.cuda.CUDAGraph | None, tuple | None]:
        """A graph of the fixed-shape forward on the cache as it stands, with the taps asked for, and
        its outputs; (None, None) without capture."""
        if not self.capture:
            return None, None
        try:
            return self._record()
        except Exception as error:  # a GPU, driver or torch build without graph capture for one of these kernels
            self.capture = False
            log.warning(
                "CUDA graphs could not be captured here (%s: %s): steps and verifies run kernel by "
                "kernel at the same fixed shape, as exact and slower.",
                type(error).__name__,
                error,
            )
            return None, None

    def _record(self) -> tuple[torch.cuda.CUDAGraph, tuple]:
        """Warm-up, then capture: the graph and its outputs."""
        device = self.inputs.device
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: the libraries' workspaces and kernel choices, outside capture
                self._compute()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # Nothing may free CUDA memory or destroy another graph while this one is captured: the
        # collector stays off (it would free any garbage's tensors and graphs), and only this
        # thread's calls count (the window's thread may free what it holds meanwhile). The graph
        # gets a memory pool of its own, freed with it.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = self._compute()
        finally:
            if collecting:
                gc.enable()
        return graph, outputs

    def _compute(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward over all `ROWS` rows at once: (final states, taps' residual streams or None).
        Every shape here is fixed; where the chunk starts comes from the device."""
        fwd = self.forward
        s, cache, device = fwd.shape, fwd.cache, self.inputs.device
        rows, capacity = self.rows, cache.keys.shape[3]
        positions = self.start + torch.arange(rows, device=device)  # the chunk's, which are its slots too
        cos, sin = fwd._rotary(positions.float(), self.inputs.dtype)
        distance = positions[:, None] - torch.arange(capacity, device=device)[None, :]  # query's position - key's
        masks = {
            window: ((distance >= 0) if window is None else (distance >= 0) & (distance < window))[None, None]
            for window in set(fwd.windows)
        }
        scale = s.head_dim**-0.5

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = cache.keys[i], cache.values[i]
            keys.index_copy_(2, positions, k)
            values.index_copy_(2, positions, v)
            mask = masks[fwd.windows[i]]
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)

        return fwd.run_layers(self.inputs[None], cos, sin, attend)
