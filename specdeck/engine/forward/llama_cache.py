"""The lean Llama forward's KV cache and the shape it is laid out by.

Every layer's keys and values sit in two preallocated tensors that a forward writes its chunk into
and a crop only shortens, so no step concatenates a layer's cache as Hugging Face's does. The cache
starts zeroed because the fixed-shape steps (`specdeck.engine.forward.graphed_steps`) attend over its whole capacity.
On the CPU its zeros are the system's untouched pages, resident only once a position is written: a
cache costs the memory of the positions a session holds, not of its capacity.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float

    @classmethod
    def of(cls, config) -> LlamaShape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            config.rms_norm_eps,
        )


class KVCache:
    """Every layer's keys and values in two tensors (layers, 1, kv_heads, capacity, head_dim).

    Positions [0, length) are valid. Cropping only lowers `length` (the stale rows beyond it are
    overwritten by the next forward); running out of room doubles the capacity.
    """

    def __init__(self, shape: LlamaShape, dtype: torch.dtype, device: torch.device, capacity: int = 256) -> None:
        self.shape, self.dtype, self.device = shape, dtype, device
        self.keys = self._empty(capacity)
        self.values = self._empty(capacity)
        self.length = 0

    def _empty(self, capacity: int) -> torch.Tensor:
        s = self.shape
        # zeroed: the fixed-shape forward attends over every slot, masked ones times zero (not NaN)
        return zeros((s.layers, 1, s.kv_heads, capacity, s.head_dim), self.dtype, self.device)

    def reserve(self, length: int) -> None:
        """Room for `length` positions: the capacity doubled as often as that takes."""
        capacity = self.keys.shape[3]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        self.resize(capacity)

    def resize(self, capacity: int) -> None:
        """New tensors of `capacity` positions holding the cached ones (at most `capacity`): on the CPU
        only the copied positions' pages of them become resident (`zeros`)."""
        self.length = min(self.length, capacity)
        keys, values = self._empty(capacity), self._empty(capacity)
        keys[:, :, :, : self.length] = self.keys[:, :, :, : self.length]
        values[:, :, :, : self.length] = self.values[:, :, :, : self.length]
        self.keys, self.values = keys, values


def zeros(size: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor; on the CPU in an anonymous mapping of its own, whose pages the system hands out
    zeroed when first written: `torch.zeros` writes every page at once, so a cache of 256 positions
    of a 1.7B model would be 100 MB resident before a short session wrote a tenth of them. The
    tensor keeps the mapping; the mapping goes back to the system with it."""
    count = math.prod(size)
    if device.type != "cpu" or count == 0:
        return torch.zeros(size, dtype=dtype, device=device)
    memory = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE)  # private: a fork gets a copy
    return torch.frombuffer(memory, dtype=dtype).view(size)
