"""The row kernel's float32 rows on the GGUF block types users bring (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K,
Q6_K; `specdeck.engine.forward.block_codes`): each product has the bits of the float32 row kernel's product of
gguf-py's dequantization, at any number of rows, so greedy speculative text stays plain text."""

import ctypes

import numpy as np
import pytest
import torch
from tiny import PACKED_PATHS

from specdeck.engine.forward import kernel_build
from specdeck.engine.forward.block_codes import FORMATS
from specdeck.engine.forward.row_kernel import KernelLinear, QuantizedLinear, block_shape

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif("kernel" not in PACKED_PATHS, reason="the row kernel does not build here")

KINDS = list(FORMATS)
# each type's float16 fields (scale, minimum), by byte offset in its block
HALVES = {"Q4_0": [0], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
COUNTS = [*range(1, 10), 16]  # rows a call: a step, a verify, more rows than a group of the kernel's
BUILDS = {"this CPU's": None, "AVX2": "haswell"}  # -march= of the kernel's builds checked


def _built(build: str) -> ctypes.CDLL:
    """The kernel's library in `build` (`BUILDS`); the AVX2 one only where this CPU runs AVX2."""
    arch = BUILDS[build]
    if arch is not None and not {"avx2", "fma", "f16c"} <= set(kernel_build.cpu_flags().split()):
        pytest.skip("this CPU has no AVX2")
    built = kernel_build.library() if arch is None else kernel_build.build(arch)
    assert not isinstance(built, str), built
    return built


def _random_blocks(kind: str, rows: int, width: int, seed: int) -> np.ndarray:
    """Blocks of random bytes (every code, every sub-block scale) with float16 scales and minimums
    of a trained model's size: (rows, width / weights a block * bytes a block)."""
    weights, size = block_shape(kind)
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, width // weights, size), dtype=np.uint8)
    for start in HALVES[kind]:
        halves = rng.normal(0, 0.01, (rows, width // weights)).astype(np.float16)
        blocks[..., start : start + 2] = halves[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def _quantized_blocks(kind: str, rows: int, width: int, seed: int) -> np.ndarray:
    """gguf-py's quantization of a random matrix (`QUANTIZABLE`)."""
    matrix = np.random.default_rng(seed).normal(0, 0.02, (rows, width)).astype(np.float32)
    return gguf.quants.quantize(matrix, gguf.GGMLQuantizationType[kind])


QUANTIZABLE = ["Q4_0", "Q5_0", "Q5_1"]  # the types gguf-py quantizes; the K-quants it only decodes
SOURCES = [(kind, "random bytes") for kind in KINDS] + [(kind, "gguf-py's quantization") for kind in QUANTIZABLE]


def _products(kind: str, blocks: np.ndarray, width: int, built) -> tuple[QuantizedLinear, KernelLinear]:
    """The product on `blocks` and the float32 kernel's product on their gguf-py dequantization."""
    decoded = gguf.dequantize(blocks, gguf.GGMLQuantizationType[kind]).reshape(blocks.shape[0], width)
    dense = torch.from_numpy(np.ascontiguousarray(decoded))
    bias = torch.randn(blocks.shape[0], generator=torch.Generator().manual_seed(2))
    return QuantizedLinear(blocks, kind, width, lambda: dense, bias, built), KernelLinear(dense, bias, built)


def _width(kind: str) -> int:
    """An inner dimension of three blocks (K-quants: two super-blocks)."""
    weights = block_shape(kind)[0]
    return 2 * weights if weights == 256 else 3 * weights


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize(("kind", "blocks_from"), SOURCES)
@pytest.mark.parametrize("out", [100, 48])
def test_each_block_type_has_the_bits_of_the_float32_product(out, kind, blocks_from, build):
    """On 1..9 and 16 rows the product on the blocks equals, bit for bit, the float32 row kernel's
    product of gguf-py's dequantization of them: 100 columns (a last block narrower than the rest,
    rows padded to whole vectors) and 48 (whole blocks in both builds)."""
    built, width = _built(build), _width(kind)
    make = _random_blocks if blocks_from == "random bytes" else _quantized_blocks
    quantized, plain = _products(kind, make(kind, out, width, seed=out), width, built)
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(0))
    for n in COUNTS:
        assert torch.equal(quantized(x[:n]), plain(x[:n])), n


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(kind, build):
    """A row's product is the same alone, among 1..15 others and at any place among them (a verify
    gives each token a step's bits)."""
    built, width = _built(build), _width(kind)
    quantized, _ = _products(kind, _random_blocks(kind, 100, width, seed=3), width, built)
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(1))
    alone = torch.cat([quantized(x[j : j + 1]) for j in range(16)])
    for n in COUNTS:
        assert torch.equal(quantized(x[:n]), alone[:n]), n
    order = torch.randperm(16, generator=torch.Generator().manual_seed(4))
    assert torch.equal(quantized(x[order]), alone[order])


@pytest.mark.parametrize("kind", KINDS)
def test_the_packed_weight_stays_near_the_files_bytes(kind):
    """The kernel keeps a type's weight in at most 1.5 times the bytes its blocks take in the file
    (the packed layout is the only copy a product keeps)."""
    width = _width(kind)
    blocks = _random_blocks(kind, 96, width, seed=5)
    quantized, _ = _products(kind, blocks, width, _built("this CPU's"))
    assert quantized._packed.numel() * quantized._packed.element_size() <= 1.5 * blocks.nbytes


@pytest.fixture(scope="module")
def requantized(requantized_builtin) -> list:
    """The built-in SmolLM2-135M file requantized by llama.cpp's own quantizer to Q4_K_M and Q5_K_M
    (which hold Q4_K, Q5_K and Q6_K blocks, and Q5_0 and Q5_1 where rows are not whole super-blocks),
    read by gguf-py; skipped without llama-cpp-python."""
    return [gguf.GGUFReader(str(requantized_builtin(file_type))) for file_type in ("Q4_K_M", "Q5_K_M")]


def test_a_requantized_files_blocks_have_the_bits_of_the_float32_product(requantized):
    """On a real file's blocks of every new type (the first matrix of each), the product of 1, 4 and
    9 rows equals the float32 row kernel's product of gguf-py's dequantization, bit for bit."""
    seen = set()
    for reader in requantized:
        for tensor in reader.tensors:
            kind = tensor.tensor_type.name
            if kind not in FORMATS or kind in seen or len(tensor.shape) != 2:
                continue
            seen.add(kind)
            width = int(tensor.shape[0])  # gguf lists dimensions innermost first
            blocks = np.asarray(tensor.data).reshape(int(tensor.shape[1]), -1)
            quantized, plain = _products(kind, blocks, width, _built("this CPU's"))
            x = torch.randn(9, width, generator=torch.Generator().manual_seed(6))
            for n in (1, 4, 9):
                assert torch.equal(quantized(x[:n]), plain(x[:n])), (tensor.name, n)
    assert seen == {"Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"}


@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0"])
def test_blocks_widened_to_q8_0_keep_every_weight(kind):
    """Q4_0 and Q5_0 blocks taken as Q8_0 blocks (a product whose matrices mix them with Q8_0 runs
    as one) dequantize to the same weights, bit for bit, random blocks and quantized ones alike."""
    import gguf

    from specdeck.engine.forward.block_codes import as_q8_0

    for blocks in (_random_blocks(kind, 16, 64, 3), _quantized_blocks(kind, 16, 64, 4)):
        own = gguf.dequantize(blocks, gguf.GGMLQuantizationType[kind])
        widened = gguf.dequantize(as_q8_0(blocks, kind), gguf.GGMLQuantizationType.Q8_0)
        assert np.array_equal(own.view(np.uint32), widened.view(np.uint32))
