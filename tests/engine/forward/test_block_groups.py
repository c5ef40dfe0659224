"""The row kernel's products with rows in 8 bits on Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K blocks
(`row_kernel.c`, kinds 12 to 17, laid out by `block_groups`): a row's bits do not depend on the
rows beside it, and a product is the 8-bit scheme's (each row's groups of 32 rounded to 8 bits)
times gguf-py's dequantization of the blocks."""

import numpy as np
import pytest
import torch
from call_shapes import verify_and_steps
from tiny import ON_CPU, PACKED_PATHS
from transformers import LlamaConfig, LlamaForCausalLM

from specdeck.engine import encode_prompt
from specdeck.engine.forward import block_groups, kernel_build, row_kernel
from specdeck.engine.forward.fused_layers import FusedLayers
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.llama_forward import LlamaForward
from specdeck.engine.forward.row_kernel import QuantizedLinear, QuantizedParts, block_shape
from specdeck.engine.loading.models import load_model

gguf = pytest.importorskip("gguf")
needs_int8 = pytest.mark.skipif(
    "kernel" not in PACKED_PATHS or row_kernel.int8_available() is not None, reason="no 8-bit products here"
)
pytestmark = needs_int8

# the kernel's builds the tests check: -march= (None: this CPU's) and the CPU flags each needs
BUILDS = {
    "this CPU's": (None, set()),
    "AVX2": ("haswell", {"avx2", "fma", "f16c"}),
    "AVX2 with AVX-VNNI": ("alderlake", {"avx2", "fma", "f16c", "avx_vnni"}),
}
# where a block's quants (and the K-quants' 6-bit scales) lie, and the K-quants' float16 scales with
# a trained model's spread (gguf-py quantizes the other types, not these)
QUANTS = {
    "Q4_1": (4, 20),
    "Q8_0": (2, 34),
    "Q4_0": (2, 18),
    "Q5_0": (2, 22),
    "Q5_1": (4, 24),
    "Q4_K": (4, 144),
    "Q5_K": (4, 176),
    "Q6_K": (0, 208),
}
HALVES = {"Q4_K": ((0, 0.001), (2, 0.002)), "Q5_K": ((0, 0.001), (2, 0.002)), "Q6_K": ((208, 0.0005),)}


def _built(build: str):
    """The kernel's library in `build` (`BUILDS`); the test is skipped where this CPU cannot run it."""
    arch, flags = BUILDS[build]
    if arch is not None and not flags <= set(kernel_build.cpu_flags().split()):
        pytest.skip(f"this CPU has no {build}")
    built = kernel_build.library() if arch is None else kernel_build.build(arch)
    assert not isinstance(built, str), built
    return built


def _blocks(kind: str, rows: int, width: int) -> np.ndarray:
    """Blocks of `kind` for a (rows, width) matrix as a file stores them: gguf-py's quantization of
    random weights where it has one, else random bytes with float16 scales of a trained model's
    size; row 0's quants all at their largest (the worst case of AVX2's 16-bit pair sums)."""
    rng = np.random.default_rng(width + rows)
    weights, size = block_shape(kind)
    if kind in HALVES:
        blocks = rng.integers(0, 256, (rows, width // weights, size), dtype=np.uint8)
        for start, spread in HALVES[kind]:
            halves = rng.normal(0, spread, (rows, width // weights)).astype(np.float16)
            blocks[..., start : start + 2] = halves[..., None].view(np.uint8)
    else:
        matrix = rng.normal(0, 0.02, (rows, width)).astype(np.float32)
        blocks = gguf.quants.quantize(matrix, gguf.GGMLQuantizationType[kind]).reshape(rows, -1, size)
    first, last = QUANTS[kind]
    blocks[0, :, first:last] = 255
    return blocks.reshape(rows, -1)


def _product(kind: str, shape: tuple[int, int], built) -> tuple[QuantizedLinear, torch.Tensor]:
    blocks = _blocks(kind, *shape)
    decoded = torch.from_numpy(gguf.dequantize(blocks, gguf.GGMLQuantizationType[kind]).reshape(shape).copy())
    bias = torch.randn(shape[0], generator=torch.Generator().manual_seed(1))
    return QuantizedLinear(blocks, kind, shape[1], lambda: decoded, bias, built, activations="int8"), decoded


def _rows(count: int, width: int) -> torch.Tensor:
    """Random rows, one of zeros and one whose every value rounds to 127 in magnitude."""
    x = torch.randn(count, width, generator=torch.Generator().manual_seed(0))
    x[4] = 0.0
    x[5] = torch.where(torch.arange(width) % 3 == 0, -1.0, 1.0)
    return x


def _scheme(x: torch.Tensor, kind: str) -> np.ndarray:
    """The rows as the kernel takes them for `kind`, in float64: each span (32 values, or a K-quant
    block's 256 as llama.cpp's Q8_K) scaled by 127 / max |x|, rounded, and scaled back."""
    groups = x.numpy().reshape(x.shape[0], -1, 256 if kind.endswith("_K") else 32)
    top = np.abs(groups).max(-1, keepdims=True)
    inverse = np.where(top > 0, np.float32(127) / np.maximum(top, 1e-30), 0).astype(np.float32)
    rounded = np.rint(groups * inverse) * (top / np.float32(127)).astype(np.float32)
    return rounded.reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("build", ["this CPU's", "AVX2 with AVX-VNNI", "AVX2"])
@pytest.mark.parametrize("kind", block_groups.TYPES)
@pytest.mark.parametrize("shape", [(200, 512), (100, 768)])
def test_a_rows_product_has_the_same_bits_at_any_row_count(shape, kind, build):
    """A row's product is the same, bit for bit, alone and among 1..9 or 16 rows (groups of rows,
    rows padded to whole vectors, a row of zeros, a row of 8-bit extremes): a verify's tokens get
    the logits a step gives them."""
    built = _built(build)
    product, _ = _product(kind, shape, built)
    x = _rows(16, shape[1])
    alone = torch.cat([product(x[j : j + 1]) for j in range(16)])
    for n in (*range(1, 10), 16):
        assert torch.equal(product(x[:n]), alone[:n]), n


@pytest.mark.parametrize("build", ["this CPU's", "AVX2 with AVX-VNNI", "AVX2"])
@pytest.mark.parametrize("kind", block_groups.TYPES)
def test_a_product_is_the_8_bit_rows_times_the_decoded_blocks(kind, build):
    """Each output is x_q @ dequantized(W)^T + b, x_q the rows rounded to 8 bits per 32 values (the
    K-quants: per 256), to within 1e-5 of its terms' magnitudes: a group's (K-quants: a block's)
    integer sum is exact and its scaling rounds a few times in float32 (2^-24 each), while a quant
    off by one misses by about 1e-3 of them. It is
    also the float32 product of the decoded weights to within the rows' rounding (under 2%, and
    not closer than 1e-4: a product that skipped the rounding would be)."""
    built = _built(build)
    product, decoded = _product(kind, (200, 1024), built)
    x = _rows(9, 1024)
    out = product(x).double().numpy()
    rows, w, b = _scheme(x, kind), decoded.double().numpy(), product.bias.double().numpy()
    magnitude = np.abs(rows) @ np.abs(w).T + np.abs(b)
    assert np.all(np.abs(out - (rows @ w.T + b)) <= 1e-5 * magnitude)
    exact = x.double().numpy() @ w.T + b
    error = np.linalg.norm(out - exact) / np.linalg.norm(exact)
    assert 1e-4 < error < 0.02


@pytest.mark.parametrize("kind", block_groups.TYPES)
def test_packed_blocks_take_about_the_files_bytes(kind):
    """A matrix's packed blocks take at most 1.03 times the file's bytes for it (Q4_0, Q5_0, Q5_1
    and Q6_K their very bytes; Q4_K and Q5_K 4 more a block of 256): a step streams no more than
    the file holds, and a model read in place takes about its file's memory."""
    blocks = _blocks(kind, 256, 1024)
    product = QuantizedLinear(blocks, kind, 1024, lambda: None, activations="int8")
    assert product._kind == row_kernel.INT8_KINDS[kind]
    assert blocks.nbytes <= product._packed.numel() <= 1.03 * blocks.nbytes


@pytest.mark.parametrize("build", ["this CPU's", "AVX2"])
@pytest.mark.parametrize("kind", block_groups.TYPES)
def test_the_kernels_layout_is_the_one_numpy_states(kind, build):
    """The kernel lays blocks out (`row_kernel_lay_out`) byte for byte as
    `specdeck.engine.forward.block_groups.layout` states the layout, padded rows and the quants'
    extremes included."""
    built = _built(build)
    lanes = built.row_kernel_lanes()
    blocks = _blocks(kind, 5 * lanes, 768)
    blocks[-3:] = 0  # rows padded to whole vectors
    vectors = blocks.reshape(5, lanes, -1, block_shape(kind)[1])
    product = QuantizedLinear(blocks, kind, 768, None, built=built, activations="int8")
    assert np.array_equal(product._packed.numpy(), block_groups.layout(vectors, kind))


# The AVX-VNNI build with its one VNNI instruction done exactly by AVX2 ones, so that its code runs
# on any AVX2 CPU: per 32-bit lane, the 4 products of unsigned by signed bytes, summed.
VNNI_ON_AVX2 = """#include <immintrin.h>
static inline __m256i dpbusd_on_avx2(__m256i acc, __m256i u, __m256i s) {
    __m256i u_even = _mm256_and_si256(u, _mm256_set1_epi16(0xFF)), u_odd = _mm256_srli_epi16(u, 8);
    __m256i s_even = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8), s_odd = _mm256_srai_epi16(s, 8);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(u_even, s_even), _mm256_madd_epi16(u_odd, s_odd)));
}
#define _mm256_dpbusd_avx_epi32 dpbusd_on_avx2
#define __AVXVNNI__ 1
"""


@pytest.mark.parametrize("kind", [*block_groups.TYPES, "Q4_1", "Q8_0"])
def test_the_vnni_build_gives_the_avx2_builds_bits(kind, tmp_path, monkeypatch):
    """The AVX-VNNI build's products (run here with its dpbusd done by AVX2 instructions) are the
    AVX2 build's bit for bit, for every type with 8-bit rows: the same integers, scaled in the same
    order, so a CPU with VNNI gives the text one without it gives."""
    avx2 = _built("AVX2")
    shim = tmp_path / "row_kernel.c"
    shim.write_text(VNNI_ON_AVX2 + kernel_build.SOURCE.read_text())  # the source itself: built again when it changes
    monkeypatch.setattr(kernel_build, "SOURCE", shim)
    vnni = kernel_build.build("haswell")
    assert not isinstance(vnni, str), vnni
    blocks = _blocks(kind, 96, 768)
    x = _rows(9, 768)
    products = [QuantizedLinear(blocks, kind, 768, None, built=b, activations="int8")(x) for b in (vnni, avx2)]
    assert torch.equal(*products)


@pytest.fixture(scope="module")
def requantized(requantized_builtin, tmp_path_factory):
    """The built-in SmolLM2-135M file requantized by llama.cpp to Q4_K_M, with a cache of its own for
    its conversion: its rows of 576 are not whole blocks of 256, so its matrices are Q5_0 (attention,
    gate and up), Q4_K and Q6_K (down) and Q8_0."""
    return requantized_builtin("Q4_K_M"), tmp_path_factory.mktemp("cache")


def _load(requantized, monkeypatch, blocks: str | None):
    path, cache = requantized
    monkeypatch.setenv("SPECDECK_CACHE", str(cache))
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    if blocks is None:
        monkeypatch.delenv("SPECDECK_GGUF_BLOCKS", raising=False)
    else:
        monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", blocks)
    return load_model(str(path), ON_CPU)


def test_a_requantized_files_verify_gives_each_token_a_steps_bits(requantized, monkeypatch):
    """A Q4_K_M file's products run on its Q5_0, Q4_K and Q6_K blocks with rows in 8 bits (the report
    says so), every layer in one kernel call: a forward over 8 new tokens gives each the logits of
    one-token steps, bit for bit, so greedy speculative text stays plain text."""
    target = _load(requantized, monkeypatch, None)
    report = weights_of(target.model).products.reason
    assert all(kind in report for kind in ("Q4_K", "Q5_0", "Q6_K", "rows in 8 bits")), report
    lm = CachedModel(target.model)
    assert lm.backend.fused is not None
    together, steps = verify_and_steps(lm, target.tokenizer)
    assert torch.equal(together, steps)


def test_a_requantized_files_logits_stay_near_float32_rows(requantized, monkeypatch):
    """On the Q4_K_M file a prefill's last logits with rows in 8 bits are those of float32 rows but
    for the rows' rounding: the same argmax, within 5% of the largest logit, not equal."""
    ids = torch.tensor(encode_prompt(_load(requantized, monkeypatch, None).tokenizer, "Name three rivers."))
    logits = []
    for blocks in (None, "float32"):
        target = _load(requantized, monkeypatch, blocks)
        with torch.inference_mode():
            logits.append(LlamaForward(target.model).logits(ids, False)[-1])
    fast, exact = logits
    assert not torch.equal(fast, exact)
    assert fast.argmax() == exact.argmax() and (fast - exact).abs().max() < 0.05 * exact.abs().max()


def test_query_key_value_parts_of_two_types_run_on_the_fused_layers(monkeypatch):
    """A layer whose queries and keys are Q4_K and values Q6_K (as in a Q4_K_M file's half of its
    layers) runs on the fused layers as its parts: a verify gives each token a step's bits, and
    the states are the eager path's on the same products to float32 rounding."""
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.02,
    )
    model = LlamaForCausalLM(config).eval()
    fused = LlamaForward(model)
    for layer in fused.weights.layers:  # queries and keys 384 rows, values 128: whole heads of 64
        parts = [
            _product(kind, shape, kernel_build.library())[0]
            for kind, shape in (("Q4_K", (384, 256)), ("Q6_K", (128, 256)))
        ]
        for part in parts:
            part.bias = None
        layer.qkv = QuantizedParts(parts)
    assert FusedLayers.unavailable(fused) is None
    fused.fused = FusedLayers(fused)
    monkeypatch.setenv("SPECDECK_FUSED_LAYERS", "0")
    eager = LlamaForward(model)  # the same lean weights, parts included
    assert eager.fused is None and eager.weights.layers[0].qkv is fused.weights.layers[0].qkv
    tokens = torch.tensor([3, 4, 5, 6, 7])
    with torch.inference_mode():
        fused.hidden(tokens[:1]), eager.hidden(tokens[:1])
        together = fused.hidden(tokens[1:])
        fused.crop(1)
        steps = torch.cat([fused.hidden(tokens[j : j + 1]) for j in range(1, 5)])
        assert torch.equal(together, steps)
        torch.testing.assert_close(together, eager.hidden(tokens[1:]), rtol=1e-4, atol=1e-4)
