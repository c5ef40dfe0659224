"""On the CPU a KV cache is resident by the positions written to it, not by its capacity."""

import gc
import sys

import pytest
import torch

from specdeck.engine.forward.llama_cache import KVCache, LlamaShape
from specdeck.engine.memory import trim_heap

SHAPE = LlamaShape(layers=8, heads=8, kv_heads=8, head_dim=64, rms_eps=1e-5)  # 32 KiB a position, float32
MIB = 1 << 20


def _resident() -> int:
    """This process's resident set, in bytes (Linux)."""
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the resident set from /proc")
def test_a_cache_costs_the_memory_of_the_positions_it_holds():
    """A cache of 2,048 positions (64 MiB) is zeros and almost none of it resident; writing 512
    positions makes those resident, not the rest; doubling it copies what it holds, not its capacity."""
    gc.collect()  # earlier tests' garbage, freed now rather than during the measurement
    trim_heap()
    before = _resident()
    cache = KVCache(SHAPE, torch.float32, torch.device("cpu"), capacity=2048)
    assert _resident() - before < 8 * MIB, "the cache's capacity went resident before anything was written"
    assert not cache.keys.any() and not cache.values.any()
    written = torch.ones(SHAPE.layers, 1, SHAPE.kv_heads, 512, SHAPE.head_dim)
    cache.keys[:, :, :, :512] = written
    cache.values[:, :, :, :512] = written
    cache.length = 512
    held = _resident() - before
    assert held < 28 * MIB  # 512 positions: 16 MiB, and the 8 MiB of `written` (all 2,048: 72 MiB)
    cache.resize(4096)
    assert _resident() - before < held + 8 * MIB  # the old tensors went back as the new ones filled
    assert cache.keys[:, :, :, :512].eq(1).all() and not cache.keys[:, :, :, 512:].any()
