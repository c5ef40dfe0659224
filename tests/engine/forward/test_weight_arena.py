"""A model's packed weights gathered into one run of memory on huge pages (`weight_arena`): the same
products, bit for bit, read from one mapping in the order a step multiplies them."""

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import ON_CPU, PACKED_PATHS

from specdeck.engine.forward import row_kernel, weight_arena
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.row_kernel import KernelLinear, QuantizedLinear, QuantizedParts
from specdeck.engine.loading.models import load_model

needs_kernel = pytest.mark.skipif("kernel" not in PACKED_PATHS, reason="the row kernel does not build here")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _q8_0(rows: int, width: int, seed: int) -> QuantizedLinear:
    """A Q8_0 product of random blocks (quants of any byte, scales of a trained model's size)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, width // 32, 34), dtype=np.uint8)
    blocks[..., 0:2] = rng.normal(0, 0.01, (rows, width // 32)).astype(np.float16)[..., None].view(np.uint8)
    activations = "int8" if row_kernel.int8_available() is None else "float32"
    return QuantizedLinear(blocks.reshape(rows, -1), "Q8_0", width, None, activations=activations)


def _mapping(address: int) -> dict[str, str]:
    """/proc/self/smaps' fields of the mapping that holds `address`."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(end, 16) for end in head.split("-"))
            if inside:
                break
            inside = low <= address < high
        elif inside:
            fields[head.rstrip(":")] = line.split(":", 1)[1].strip()
    return fields


def _in_one_run(parts: list) -> None:
    """The parts' buffers lie one after another, each on a cache line, in one huge-page mapping."""
    at = parts[0]._packed.data_ptr()
    for part in parts:
        assert part._packed.data_ptr() == at
        at += -(-part._packed.nbytes // weight_arena.ALIGN) * weight_arena.ALIGN
    if THP.is_file() and "[never]" not in THP.read_text():
        assert _mapping(parts[0]._packed.data_ptr())["THPeligible"] == "1"


@needs_kernel
@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="no /proc/self/smaps to read mappings in")
def test_gathered_products_give_the_same_bits_from_one_run_of_memory():
    """Float32, Q8_0 and a product of Q8_0 parts give the same bits after their weights moved into
    one mapping, in the order given; the buffers they had are no longer theirs."""
    products = [
        KernelLinear(torch.randn(40, 64)),
        _q8_0(24, 64, 1),
        QuantizedParts([_q8_0(16, 64, 2), _q8_0(8, 64, 3)]),
    ]
    x = torch.randn(3, 64)
    before = [product(x) for product in products]
    own = [part._packed for part in weight_arena.packed_parts(products)]
    assert weight_arena.gather(products, smallest=0) is not None
    parts = weight_arena.packed_parts(products)
    _in_one_run(parts)
    assert all(part._packed.data_ptr() != buffer.data_ptr() for part, buffer in zip(parts, own))
    for product, expected in zip(products, before):
        assert torch.equal(product(x), expected)


@needs_kernel
@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="no /proc/self/smaps to read mappings in")
def test_a_model_on_the_row_kernel_reads_its_weights_in_step_order(monkeypatch):
    """The built-in target on the row kernel holds every layer's products and then the output layer
    in one run of memory, in the order a step multiplies them."""
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    target = load_model("smollm2-135m-instruct", ON_CPU)
    weights = weights_of(target.model)
    order = [p for layer in weights.layers for p in (layer.qkv, layer.out, layer.gate_up, layer.down)]
    _in_one_run(weight_arena.packed_parts([*order, weights.output]))
