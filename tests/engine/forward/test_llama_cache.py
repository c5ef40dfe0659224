"""On the CPU a KV cache is resident by the positions written to it, not by its capacity."""

import ctypes
import gc
import os
import sys
import weakref

import pytest
import torch

from specdeck.engine.forward.llama_cache import KVCache, LlamaShape

SHAPE = LlamaShape(layers=8, heads=8, kv_heads=8, head_dim=64, rms_eps=1e-5)  # 32 KiB a position, float32
MIB = 1 << 20


def _resident(tensor: torch.Tensor) -> int:
    """Bytes of `tensor`'s pages that are in memory (Linux's `mincore`): its own, whatever else the
    process allocates meanwhile. A page only read maps the system's zero page and counts too, so
    the tests read a cache's contents last."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start = tensor.data_ptr() // page * page
    length = tensor.data_ptr() + tensor.numel() * tensor.element_size() - start
    pages = -(-length // page)
    vector = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(byte & 1 for byte in vector) * page


def _held(cache: KVCache) -> int:
    return _resident(cache.keys) + _resident(cache.values)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="asks Linux which pages are resident")
def test_a_cache_costs_the_memory_of_the_positions_it_holds():
    """A cache of 2,048 positions (64 MiB) has almost none of it resident; writing 512 positions
    makes those resident (16 MiB), not the rest; doubling it copies what it holds, not its
    capacity, and lets the old tensors go; what was never written reads as zeros."""
    cache = KVCache(SHAPE, torch.float32, torch.device("cpu"), capacity=2048)
    assert _held(cache) < 1 * MIB, "the cache's capacity went resident before anything was written"
    written = torch.ones(SHAPE.layers, 1, SHAPE.kv_heads, 512, SHAPE.head_dim)
    cache.keys[:, :, :, :512] = written
    cache.values[:, :, :, :512] = written
    cache.length = 512
    assert 16 * MIB <= _held(cache) < 17 * MIB  # 512 positions of 32 KiB (all 2,048: 64 MiB)
    old = weakref.ref(cache.keys)
    cache.resize(4096)
    assert 16 * MIB <= _held(cache) < 17 * MIB  # the copied positions only, of 128 MiB
    gc.collect()
    assert old() is None, "the old keys are still held after the resize"
    assert cache.keys[:, :, :, :512].eq(1).all() and not cache.keys[:, :, :, 512:].any()
