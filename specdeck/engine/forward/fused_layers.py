"""A step's and a verify's decoder layers, all of them in one call of the row kernel.

On the CPU a decode step of SmolLM2-135M spent about a quarter of its time outside the matrix
products: thirty small tensor operations a layer (norms, the rotary, the cache writes, residual
adds, the activation), each a few microseconds of dispatch for a few thousand numbers.
`row_kernel_layers` (`row_kernel.c`) runs every layer in one call and one team of threads: the
norms, the rotary, the cache writes and the activation row by row, the products and the
attention with the same code as their own calls, the threads waiting for each other five times a
layer. Every row's numbers are computed alone, so a verify's rows get the bits a step gives them,
as on the eager path; the two paths round the small operations differently, so a model runs
every step and every verify on one of them (`LlamaForward` takes this one wherever it runs and
gives up token trees, whose side branches attend on the eager path). A query/key/value product
of parts (a Q4_K_M file's Q4_K queries and keys beside Q6_K values) runs as its parts, each
thread its heads from the part that holds them. `SPECDECK_FUSED_LAYERS=0` keeps the eager path,
for comparing."""

from __future__ import annotations

import ctypes
import os

import torch

from specdeck.engine.forward import kernel_build, row_kernel
from specdeck.engine.forward.row_kernel import INT8_KINDS, KernelLinear, QuantizedLinear, QuantizedParts

LIMIT = 64  # rows a call takes at most (the kernel's bound)
QKV_PARTS = 3  # parts a layer's query/key/value product may have (`row_kernel_layers`)


def _qkv_parts(product) -> list:
    """A query/key/value product as the kernel's parts: itself, or a `QuantizedParts`' parts."""
    return list(product.parts) if isinstance(product, QuantizedParts) else [product]


def _parts_unavailable(product, head_dim: int) -> str | None:
    """None where the fused layers take `product`'s parts (8-bit rows, whole heads each), else why not."""
    if isinstance(product, QuantizedParts) and product.bias is not None:
        return "a product has a bias or a width the kernel pads"
    parts = _qkv_parts(product)
    if len(parts) == 1:
        return None
    if len(parts) > QKV_PARTS:
        return f"its query/key/value product has {len(parts)} parts"
    for part in parts:
        if not isinstance(part, QuantizedLinear) or part.activations != "int8" or part.kind not in INT8_KINDS:
            return "a query/key/value part does not take its rows in 8 bits"
        if part.out_features % head_dim:
            return "a query/key/value part is not a whole number of heads wide"
    return None


class FusedLayers:
    """The decoder layers of a lean forward (`LlamaForward`) in one row kernel call."""

    def __init__(self, forward) -> None:
        s, w = forward.shape, forward.weights
        self.shape, self.norm = s, w.norm
        library = kernel_build.library()
        assert not isinstance(library, str), library  # `unavailable` said it runs
        self._library = library
        layers = w.layers
        norms = [
            t for layer in layers for t in (layer.input_norm.float().contiguous(), layer.post_norm.float().contiguous())
        ]
        # six a layer: the query/key/value parts (None where a layer has fewer), out, gate_up, down
        products = [
            p
            for layer in layers
            for p in (
                *(_qkv_parts(layer.qkv) + [None] * QKV_PARTS)[:QKV_PARTS],
                layer.out,
                layer.gate_up,
                layer.down,
            )
        ]
        self._arrays = (
            (ctypes.c_void_p * len(norms))(*[t.data_ptr() for t in norms]),
            (ctypes.c_int64 * len(products))(
                *[0 if p is None else -1 if isinstance(p, KernelLinear) else p._kind for p in products]
            ),
            (ctypes.c_void_p * len(products))(*[None if p is None else p._packed.data_ptr() for p in products]),
            (ctypes.c_int64 * len(products))(*[0 if p is None else p.out_features for p in products]),
            (ctypes.c_int64 * len(layers))(*[window or 0 for window in forward.windows]),
        )
        self._qkv = max(layer.qkv.out_features for layer in layers)
        self._gate_up = max(layer.gate_up.out_features for layer in layers)
        self._keep = (w, norms)  # what the pointers point into

    @staticmethod
    def unavailable(forward) -> str | None:
        """None where `FusedLayers(forward)` runs its model, else why not."""
        if os.environ.get("SPECDECK_FUSED_LAYERS", "1").strip() == "0":
            return "SPECDECK_FUSED_LAYERS=0"
        s, w = forward.shape, forward.weights
        if forward.steps is not None:
            return "the steps run at one fixed shape"
        reason = row_kernel.attention_unavailable(w.embed.dtype, w.embed.device, s.head_dim)
        if reason:
            return reason
        for layer in w.layers:
            if layer.qk_norm is not None:
                return "the model normalises its query and key heads"
            reason = _parts_unavailable(layer.qkv, s.head_dim)
            if reason:
                return reason
            for product in (*_qkv_parts(layer.qkv), layer.out, layer.gate_up, layer.down):
                if not isinstance(product, KernelLinear | QuantizedLinear):
                    return "its products are not on the row kernel"
                if product.bias is not None or product._width != product.out_features:
                    return "a product has a bias or a width the kernel pads"
        return None

    def run(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, start: int, taps: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The residual stream after the last layer (n, hidden) and the taps' (n, len(taps), hidden)
        for inputs x (n, hidden) at positions start, start + 1, ... after `start` cached ones (in a
        cache with room for them)."""
        s = self.shape
        n, hidden = x.shape
        assert n <= LIMIT
        x = x.float().contiguous().clone()
        cos, sin = cos.reshape(n, s.head_dim).contiguous(), sin.reshape(n, s.head_dim).contiguous()
        scratch = torch.empty(n * (self._qkv + s.heads * s.head_dim + hidden + 3 * self._gate_up // 2))
        norms, kinds, weights, widths, windows = self._arrays
        order = sorted({tap for tap in taps if 1 <= tap <= len(windows)})  # in layer order, as the eager path
        tapped = torch.empty(n, len(order), hidden) if order else None
        self._library.row_kernel_layers(
            x.data_ptr(),
            n,
            hidden,
            len(windows),
            norms,
            s.rms_eps,
            kinds,
            weights,
            widths,
            cos.data_ptr(),
            sin.data_ptr(),
            cache.keys.data_ptr(),
            cache.values.data_ptr(),
            cache.keys.stride(0),
            cache.keys.stride(2),
            start,
            s.heads,
            s.kv_heads,
            s.head_dim,
            windows,
            s.head_dim**-0.5,
            (ctypes.c_int64 * len(order))(*order),
            len(order),
            None if tapped is None else tapped.data_ptr(),
            scratch.data_ptr(),
            torch.get_num_threads(),
        )
        return x, tapped
