"""A step's and a verify's decoder layers in one call of the row kernel each.

On the CPU a decode step of SmolLM2-135M spends about a quarter of its time outside the matrix
products: thirty small tensor operations a layer (norms, the rotary, the cache writes, residual
adds, the activation), each a few microseconds of dispatch for a few thousand numbers.
`row_kernel_layer` (`row_kernel.c`) does a whole layer in one call, in one team of threads: the
norms, the rotary, the cache writes and the activation row by row, the products and the
attention with the same code as their own calls. Every row's numbers are computed alone, so a
verify's rows get the bits a step gives them, as on the eager path; the two paths round the
small operations differently, so a model runs every step and every verify on one of them
(`LlamaForward` takes this one wherever it runs and gives up token trees, whose side branches
attend on the eager path). `SPECDECK_FUSED_LAYERS=0` keeps the eager path, for comparing.
"""

from __future__ import annotations

import ctypes
import os

import torch

from specdeck.engine import row_kernel
from specdeck.engine.row_kernel import KernelLinear, QuantizedLinear

LIMIT = 64  # rows a call takes at most (the kernel's bound)


class FusedLayers:
    """The decoder layers of a lean forward (`LlamaForward`) as row kernel calls."""

    def __init__(self, forward) -> None:
        s, w = forward.shape, forward.weights
        self.shape, self.norm = s, w.norm
        library = row_kernel.library()
        assert not isinstance(library, str), library  # `unavailable` said it runs
        self._library = library
        self._windows = [window or 0 for window in forward.windows]
        self._layers = []
        for layer in w.layers:
            products = (layer.qkv, layer.out, layer.gate_up, layer.down)
            kinds = (ctypes.c_int64 * 4)(*[-1 if isinstance(p, KernelLinear) else p._kind for p in products])
            weights = (ctypes.c_void_p * 4)(*[p._packed.data_ptr() for p in products])
            widths = (ctypes.c_int64 * 4)(*[p.out_features for p in products])
            norms = (layer.input_norm.float().contiguous(), layer.post_norm.float().contiguous())
            arrays = (kinds, weights, widths)
            self._layers.append((*norms, *[ctypes.addressof(a) for a in arrays], arrays))
        self._qkv, self._gate_up = w.layers[0].qkv.out_features, w.layers[0].gate_up.out_features
        self._keep = w  # the packed products the pointers point into

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
            for product in (layer.qkv, layer.out, layer.gate_up, layer.down):
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
        heads_width = s.heads * s.head_dim
        scratch = torch.empty(n * (2 * hidden + self._qkv + heads_width + self._gate_up + self._gate_up // 2))
        capacity = cache.keys.shape[3]
        threads = torch.get_num_threads()
        tapped = []
        for i, (input_norm, post_norm, kinds, weights, widths, _) in enumerate(self._layers):
            self._library.row_kernel_layer(
                x.data_ptr(),
                n,
                hidden,
                input_norm.data_ptr(),
                post_norm.data_ptr(),
                s.rms_eps,
                kinds,
                weights,
                widths,
                cos.data_ptr(),
                sin.data_ptr(),
                cache.keys[i].data_ptr(),
                cache.values[i].data_ptr(),
                capacity * s.head_dim,
                start,
                s.heads,
                s.kv_heads,
                s.head_dim,
                self._windows[i],
                s.head_dim**-0.5,
                scratch.data_ptr(),
                threads,
            )
            if i + 1 in taps:
                tapped.append(x.clone())
        return x, torch.stack(tapped, dim=1) if tapped else None
