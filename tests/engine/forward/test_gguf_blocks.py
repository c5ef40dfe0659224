"""A GGUF target's products on the file's own quantized blocks (`specdeck.engine.forward.gguf_blocks`): with float32
rows, the bits of the float32 product of the dequantized matrices; with rows in 8 bits (as llama.cpp
multiplies), the exact integer scheme; either way a row's bits do not depend on the rows beside it."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from call_shapes import verify_and_steps
from tiny import ON_CPU, PACKED_PATHS, head_session_keeps_plain_text

from specdeck.engine import DecodeConfig, encode_prompt, generate
from specdeck.engine.forward import gguf_blocks, kernel_build, row_kernel
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.llama_forward import LlamaForward
from specdeck.engine.forward.row_kernel import KernelLinear, QuantizedLinear
from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.models import load_model

gguf = pytest.importorskip("gguf")
needs_kernel = pytest.mark.skipif("kernel" not in PACKED_PATHS, reason="the row kernel does not build here")


def _blocks(kind: str, rows: int, width: int, seed: int) -> np.ndarray:
    """Random GGUF blocks of `kind` for a (rows, width) matrix, with scales (and minimums) of a
    trained model's size, as the file stores them: (rows, width / 32 * bytes a block)."""
    rng = np.random.default_rng(seed)
    size = row_kernel.block_shape(kind)[1]
    blocks = rng.integers(0, 256, (rows, width // 32, size), dtype=np.uint8)
    scales = [0, 2] if kind == "Q4_1" else [0]
    for start, spread in zip(scales, (0.01, 0.05)):
        halves = rng.normal(0, spread, (rows, width // 32)).astype(np.float16)
        blocks[..., start : start + 2] = halves[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def _decoded(blocks: np.ndarray, kind: str, width: int) -> torch.Tensor:
    return torch.from_numpy(gguf.dequantize(blocks, gguf.GGMLQuantizationType[kind]).reshape(-1, width).copy())


# the kernel's builds the tests check: -march= (None: this CPU's) and the CPU flags each needs
BUILDS = {
    "this CPU's": (None, set()),
    "AVX2": ("haswell", {"avx2", "fma", "f16c"}),
    "AVX2 with AVX-VNNI": ("alderlake", {"avx2", "fma", "f16c", "avx_vnni"}),
}


def _built(build: str):
    """The kernel's library in `build` (`BUILDS`); the test is skipped where this CPU cannot run it."""
    arch, flags = BUILDS[build]
    if arch is not None and not flags <= set(kernel_build.cpu_flags().split()):
        pytest.skip(f"this CPU has no {build}")
    built = kernel_build.library() if arch is None else kernel_build.build(arch)
    assert not isinstance(built, str), built
    return built


def _matrix(kind: str, shape: tuple[int, int]) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Random blocks of `kind` for a matrix of `shape`, their gguf-py decoding and a random bias."""
    blocks = _blocks(kind, *shape, seed=shape[0])
    return blocks, _decoded(blocks, kind, shape[1]), torch.randn(shape[0])


@needs_kernel
def test_rows_the_kernel_cannot_read_are_refused_not_multiplied():
    """Rows of another width or another dtype raise before the kernel runs, which would read and
    write past the ends of the buffers."""
    blocks, decoded, bias = _matrix("Q8_0", (64, 96))
    for linear in (QuantizedLinear(blocks, "Q8_0", 96, lambda: decoded, bias), KernelLinear(decoded, bias)):
        assert linear(torch.ones(2, 96)).shape == (2, 64)
        for wrong in (torch.ones(2, 128), torch.ones(2, 96, dtype=torch.bfloat16), torch.ones(2, 96).double()):
            with pytest.raises(ValueError, match="float32 rows of 96 values"):
                linear(wrong)


@needs_kernel
@pytest.mark.parametrize("build", ["this CPU's", "AVX2"])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (100, 64), (8, 32)])
def test_quantized_products_have_the_bits_of_the_float32_product(shape, kind, build):
    """Through the file's blocks a row's product equals, bit for bit, the float32 row kernel's
    product of gguf-py's dequantization of them, alone and among 2..20 rows (groups of rows, a
    last block narrower than the rest, rows padded to whole vectors); in this CPU's build and in
    the AVX2 one."""
    built = _built(build)
    blocks, decoded, bias = _matrix(kind, shape)
    quantized = QuantizedLinear(blocks, kind, shape[1], lambda: decoded, bias, built)
    plain = KernelLinear(decoded, bias, built)
    x = torch.randn(20, shape[1], generator=torch.Generator().manual_seed(0))
    alone = torch.cat([quantized(x[j : j + 1]) for j in range(20)])
    assert torch.equal(alone, plain(x))
    for n in (2, 3, 6, 7, 8, 13, 20):
        assert torch.equal(quantized(x[:n]), alone[:n]), n


needs_int8 = pytest.mark.skipif(
    "kernel" not in PACKED_PATHS or row_kernel.int8_available() is not None, reason="no 8-bit products here"
)


def _int8_reference(x: torch.Tensor, decoded: torch.Tensor) -> np.ndarray:
    """The 8-bit scheme in float64: each row's groups of 32 scaled by 127 / max |x| and rounded."""
    groups = x.numpy().reshape(x.shape[0], -1, 32)
    top = np.abs(groups).max(-1, keepdims=True)
    inverse = np.where(top > 0, np.float32(127) / np.maximum(top, 1e-30), 0).astype(np.float32)
    rounded = np.rint(groups * inverse) * (top / np.float32(127)).astype(np.float32)
    return rounded.reshape(x.shape[0], -1).astype(np.float64) @ decoded.numpy().astype(np.float64).T


@needs_int8
@pytest.mark.parametrize("build", ["this CPU's", "AVX2 with AVX-VNNI", "AVX2"])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (100, 64), (8, 32)])
def test_products_with_8_bit_rows_are_the_integer_scheme_at_any_row_count(shape, kind, build):
    """With rows in 8 bits a row's product is the same, bit for bit, alone and among 2..20 rows
    (groups of rows, rows padded to whole vectors, a row of zeros), on VNNI or, without it, on
    AVX2's 16-bit pair sums (whose Q8_0 path must not saturate: the blocks' quants reach -127 and
    127, times activations at 127 in magnitude); it is the 8-bit scheme's value
    (to float32 rounding) and within 2% of the float32 product of the decoded weights, no closer
    than the activations' rounding allows (a product that ignored it would be nearer)."""
    built = _built(build)
    assert built.row_kernel_int8() and (build == "this CPU's" or built.row_kernel_lanes() == 8)
    blocks, decoded, bias = _matrix(kind, shape)
    quantized = QuantizedLinear(blocks, kind, shape[1], lambda: decoded, bias, built, activations="int8")
    x = torch.randn(20, shape[1], generator=torch.Generator().manual_seed(0))
    x[4] = 0.0
    x[5] = torch.where(torch.arange(shape[1]) % 3 == 0, -1.0, 1.0)  # every activation at 127 in magnitude
    alone = torch.cat([quantized(x[j : j + 1]) for j in range(20)])
    for n in (2, 3, 4, 5, 8, 9, 13, 20):
        assert torch.equal(quantized(x[:n]), alone[:n]), n
    scheme = _int8_reference(x, decoded) + bias.numpy()
    assert np.abs(alone.numpy() - scheme).max() <= 1e-5 * np.abs(scheme).max()
    exact = (x.double() @ decoded.double().T + bias.double()).numpy()
    error = np.linalg.norm(alone.numpy() - exact) / np.linalg.norm(exact)
    assert 1e-4 < error < 0.02


@needs_int8
def test_the_builtin_target_takes_8_bit_rows_by_default(monkeypatch):
    """Where the CPU has VNNI the built-in target's products take their rows in 8 bits (the report
    says so) and SPECDECK_GGUF_BLOCKS=float32 keeps float32 rows; a prefill's last logits on the
    two stay close (the same argmax) without being equal."""
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    monkeypatch.delenv("SPECDECK_GGUF_BLOCKS", raising=False)
    fast = load_model("smollm2-135m-instruct", ON_CPU)
    assert "rows in 8 bits" in weights_of(fast.model).products.reason
    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "float32")
    exact = load_model("smollm2-135m-instruct", ON_CPU)
    assert "rows in 8 bits" not in weights_of(exact.model).products.reason
    ids = torch.tensor(encode_prompt(fast.tokenizer, "Name three rivers of Europe."))
    with torch.inference_mode():
        a, b = LlamaForward(fast.model).logits(ids, False)[-1], LlamaForward(exact.model).logits(ids, False)[-1]
    assert not torch.equal(a, b)
    assert a.argmax() == b.argmax() and (a - b).abs().max() < 0.05 * b.abs().max()


@needs_int8
def test_the_builtin_targets_fused_layers_give_a_verify_the_bits_of_steps(monkeypatch):
    """The built-in target on its blocks with 8-bit rows, each layer one kernel call whose small
    operations the threads share row by row: a forward over 8 new tokens gives each the logits of
    one-token steps, bit for bit (what keeps greedy speculative text plain text)."""
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    monkeypatch.delenv("SPECDECK_GGUF_BLOCKS", raising=False)
    target = load_model("smollm2-135m-instruct", ON_CPU)
    lm = CachedModel(target.model)
    assert lm.backend.fused is not None
    together, steps = verify_and_steps(lm, target.tokenizer)
    assert torch.equal(together, steps)


@pytest.fixture(scope="module")
def builtin_file():
    path = gguf_file("smollm2-135m-instruct")
    assert path is not None
    return gguf_blocks.FileMatrices(path, rows="float32")


@needs_kernel
def test_only_matrices_the_file_holds_bit_for_bit_are_taken(builtin_file):
    """A matrix is taken from the file where the named tensor decodes to it exactly, in whatever
    row order (the converter reorders the query rows), and not where one weight differs, where the
    file's tensor has another block type or where it has no such tensor."""
    tensor = builtin_file._tensors["blk.0.attn_q.weight"]
    matrix = torch.from_numpy(gguf.dequantize(np.asarray(tensor.data), tensor.tensor_type).copy())
    order = torch.randperm(matrix.shape[0], generator=torch.Generator().manual_seed(0))
    reordered = matrix[order].contiguous()
    product = builtin_file.product(["blk.0.attn_q.weight"], [reordered], None)
    assert product is not None and product.kind == "Q4_1"
    assert torch.equal(product.dense(), reordered)
    x = torch.randn(3, matrix.shape[1])
    assert torch.equal(product(x), KernelLinear(reordered)(x))
    changed = reordered.clone()
    changed[5, 7] = torch.nextafter(changed[5, 7], torch.tensor(1.0))
    assert builtin_file.product(["blk.0.attn_q.weight"], [changed], None) is None
    norm = builtin_file._tensors["blk.0.attn_norm.weight"]  # float32 in the file: no blocks
    assert builtin_file.product(["blk.0.attn_norm.weight"], [torch.from_numpy(np.array(norm.data)[None])], None) is None
    assert builtin_file.product(["blk.99.attn_q.weight"], [reordered], None) is None


@needs_kernel
def test_a_match_is_decided_once_per_file_and_weights(tmp_path, monkeypatch):
    """Which rows of the file a matrix matches is kept in the cache: the file opened again takes the
    same matrix without decoding its blocks, a matrix with one weight changed is compared again and
    refused, and a damaged record is read as none."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    path = gguf_file("smollm2-135m-instruct")
    first = gguf_blocks.FileMatrices(path, rows="float32")
    tensor = first._tensors["blk.0.attn_q.weight"]
    matrix = torch.from_numpy(gguf.dequantize(np.asarray(tensor.data), tensor.tensor_type).copy())
    order = torch.randperm(matrix.shape[0], generator=torch.Generator().manual_seed(1))
    reordered = matrix[order].contiguous()
    assert first.product(["blk.0.attn_q.weight"], [reordered], None) is not None
    first.remember()
    compared = []
    real = gguf_blocks._matching_rows
    monkeypatch.setattr(gguf_blocks, "_matching_rows", lambda t, w: compared.append(1) or real(t, w))
    again = gguf_blocks.FileMatrices(path, rows="float32")
    product = again.product(["blk.0.attn_q.weight"], [reordered], None)
    assert product is not None and torch.equal(product.dense(), reordered) and not compared
    changed = reordered.clone()
    changed[3, 9] = torch.nextafter(changed[3, 9], torch.tensor(1.0))
    assert again.product(["blk.0.attn_q.weight"], [changed], None) is None and compared == [1]
    (record,) = (tmp_path / "gguf-tensors").glob("*.rows.json")
    record.write_text("[not json")
    assert gguf_blocks.FileMatrices(path, rows="float32").product(["blk.0.attn_q.weight"], [reordered], None)
    assert compared == [1, 1]


@needs_kernel
def test_verdicts_on_converted_weights_are_kept_with_them(builtin_conversion, tmp_path, monkeypatch):
    """The verdicts on the built-in target's converted weights are kept in their folder, under the
    weights' recorded digest: a cache emptied of all but the converted model (as a first run finds
    it after a cache is cleared but a conversion kept) lays the weights out on the file's blocks
    without decoding a block to compare them."""
    import shutil

    from specdeck.engine.loading.gguf_conversion import conversion_folder

    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    folder = conversion_folder(gguf_file("smollm2-135m-instruct"))
    unjudged = shutil.ignore_patterns(gguf_blocks.ROW_MATCHES_FILE)  # the conversion as it was first written
    shutil.copytree(builtin_conversion / "gguf" / folder.name, folder, ignore=unjudged)
    compared = []
    real = gguf_blocks._matching_rows
    monkeypatch.setattr(gguf_blocks, "_matching_rows", lambda t, w: compared.append(1) or real(t, w))
    converted = replace(ON_CPU, read_in_place=False)  # a model read in place has no converted weights
    weights_of(load_model("smollm2-135m-instruct", converted).model)
    assert compared and (folder / gguf_blocks.ROW_MATCHES_FILE).is_file()
    for entry in tmp_path.iterdir():
        if entry.name != "gguf":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    compared.clear()
    model = load_model("smollm2-135m-instruct", converted).model
    weights_of(model)
    matrices = gguf_blocks.blocks_of(model)
    assert compared == [] and isinstance(matrices, gguf_blocks.FileMatrices)
    assert matrices.product(["blk.0.attn_q.weight"], [model.model.layers[0].self_attn.q_proj.weight], None)
    assert compared == []


@needs_kernel
def test_the_builtin_target_runs_on_its_file_blocks_with_the_float32_bits(builtin_conversion, monkeypatch):
    """The built-in Q4_1 target's products all read the file's blocks (the report says so), and its
    logits after a prefill, a step and a verify are those of the float32 products, bit for bit."""
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "float32")
    on_blocks = load_model("smollm2-135m-instruct", ON_CPU)
    assert "121 of 121 products on SmolLM2-135M-Instruct.Q4_1.gguf's own blocks" in (
        weights_of(on_blocks.model).products.reason  # the weights are read (and packed) here
    )
    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "off")
    monkeypatch.setenv("SPECDECK_CACHE", str(builtin_conversion))
    on_floats = load_model("smollm2-135m-instruct", ON_CPU)
    assert "own blocks" not in weights_of(on_floats.model).products.reason
    ids = encode_prompt(on_blocks.tokenizer, "Name three rivers of Europe.")
    blocks, floats = LlamaForward(on_blocks.model), LlamaForward(on_floats.model)
    with torch.inference_mode():
        for tokens in (ids, [330], [28, 29, 30, 31]):
            assert torch.equal(blocks.logits(torch.tensor(tokens), False), floats.logits(torch.tensor(tokens), False))
    texts = [list(generate(m, ids, DecodeConfig(max_new_tokens=24)))[-1].text for m in (on_blocks, on_floats)]
    assert texts[0] == texts[1]


@needs_kernel
def test_a_product_of_some_rows_keeps_their_bits(builtin_file):
    """A feature head drafts from some rows of the target's output layer: their product on the
    file's blocks gives, bit for bit, those rows' outputs of the whole product."""
    tensor = builtin_file._tensors["blk.3.ffn_gate.weight"]
    matrix = torch.from_numpy(gguf.dequantize(np.asarray(tensor.data), tensor.tensor_type).copy())
    whole = builtin_file.product(["blk.3.ffn_gate.weight"], [matrix], None)
    ids = np.array([5, 900, 17, 1535, 6, 7, 8, 300, 301])
    some = whole.rows(ids)
    x = torch.randn(4, matrix.shape[1])
    assert torch.equal(some(x), whole(x)[:, ids])
    assert torch.equal(some.dense(), matrix[ids])


@needs_kernel
def test_a_gguf_target_takes_the_row_kernel_where_float32_would_take_another_path(tiny_llama, monkeypatch):
    """Where float32 products would run on oneDNN or F.linear (timed faster there for float32
    weights, as on an AVX2 build), a GGUF target's products still take the row kernel, which reads
    the file's blocks; a model from elsewhere, or a path forced by SPECDECK_LINEAR, keeps its choice."""
    from specdeck.engine.forward.linear import PathChoice

    monkeypatch.delenv("SPECDECK_LINEAR", raising=False)
    target = load_model("smollm2-135m-instruct", ON_CPU)
    other, _ = tiny_llama
    timed = PathChoice("packed", "timed on float32 weights")
    chosen = gguf_blocks.prefer_kernel(target.model, lambda: timed)
    assert chosen.path == "kernel" and "blocks" in chosen.reason
    assert gguf_blocks.prefer_kernel(other.model, lambda: timed) is timed
    monkeypatch.setenv("SPECDECK_LINEAR", "packed")
    assert gguf_blocks.prefer_kernel(target.model, lambda: timed) is timed


@needs_int8
def test_a_gguf_targets_feature_head_drafts_on_blocks_of_its_own_weights(monkeypatch):
    """Beside the built-in GGUF target a feature head's layer (here the one on the last state alone)
    multiplies on Q8_0 blocks of its own weights with 8-bit rows (the report says so), its drafts
    are still accepted, its float32 weights stay as trained, bit for bit, and greedy speculative
    text equals plain; with SPECDECK_GGUF_BLOCKS=float32, or beside a target from elsewhere, it
    keeps float32 products."""
    from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
    from specdeck.engine.drafting.heads import load_feature_head
    from specdeck.engine.loading.registry import LAST_STATE_HEAD

    monkeypatch.delenv("SPECDECK_GGUF_BLOCKS", raising=False)
    target = load_model("smollm2-135m-instruct", ON_CPU)
    head = load_feature_head(LAST_STATE_HEAD, target)
    trained = {name: p.detach().clone() for name, p in head.head.named_parameters()}
    ids = encode_prompt(target.tokenizer, "Explain in simple terms why the sky is blue.")
    config = DecodeConfig(k=1, schedule="constant", lookup=0, max_new_tokens=48)
    summary = head_session_keeps_plain_text(target, head, ids, config)
    assert summary.accepted >= 0.15 * summary.drafted
    assert "4 of 4 products on Q8_0 blocks of its own weights" in weights_of(head.head.body).products.reason
    assert all(torch.equal(p, trained[name]) for name, p in head.head.named_parameters())

    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "float32")
    kept = load_feature_head(LAST_STATE_HEAD, target)
    FeatureHeadDrafter(kept.head, target.model, name=kept.name, output_ids=kept.output_ids)
    assert "own weights" not in weights_of(kept.head.body).products.reason


@needs_int8
def test_a_head_that_fuses_lower_layers_drafts_on_its_own_blocks_too(monkeypatch):
    """The bundled head reads the target's layers 3 and 15 beside its last state: beside the GGUF
    target its fusion multiplies on Q8_0 blocks of its own weights as its layer does, its drafts are
    accepted, and greedy speculative text equals plain for K = 1 and 3 (deeper drafts pass more
    rarely: at least one)."""
    from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
    from specdeck.engine.drafting.heads import load_feature_head
    from specdeck.engine.loading.registry import DEFAULT_HEAD

    monkeypatch.delenv("SPECDECK_GGUF_BLOCKS", raising=False)
    target = load_model("smollm2-135m-instruct", ON_CPU)
    head = load_feature_head(DEFAULT_HEAD, target)
    assert head.head.feature_layers == (3, 15)
    drafter = FeatureHeadDrafter(head.head, target.model, name=head.name, output_ids=head.output_ids)
    assert isinstance(drafter._fuse_fc, QuantizedLinear)
    ids = encode_prompt(target.tokenizer, "Explain in simple terms why the sky is blue.")
    config = DecodeConfig(k=1, schedule="constant", lookup=0, max_new_tokens=48)
    summary = head_session_keeps_plain_text(target, head, ids, config)
    assert summary.accepted >= 0.15 * summary.drafted
    config = DecodeConfig(k=3, schedule="constant", lookup=0, max_new_tokens=48)
    assert head_session_keeps_plain_text(target, head, ids, config).accepted > 0


@needs_int8
def test_a_heads_draft_cost_is_keyed_without_timing_float32_paths(monkeypatch):
    """A head whose layer drafts on its own blocks beside the GGUF target runs that layer on the row
    kernel: the key its draft cost is saved under times no float32 product path (the session's
    start would otherwise wait for those timings the first time in a process)."""
    from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
    from specdeck.engine.drafting.heads import load_feature_head
    from specdeck.engine.forward import linear
    from specdeck.engine.loading.registry import DEFAULT_HEAD
    from specdeck.engine.planner.costs import measurement_key

    monkeypatch.delenv("SPECDECK_GGUF_BLOCKS", raising=False)
    monkeypatch.delenv("SPECDECK_LINEAR", raising=False)
    target = load_model("smollm2-135m-instruct", ON_CPU)
    head = load_feature_head(DEFAULT_HEAD, target)
    drafter = FeatureHeadDrafter(head.head, target.model, name=head.name, output_ids=head.output_ids)
    assert gguf_blocks.own_blocks(head.head.body)

    def timed(weights):
        raise AssertionError("a float32 product path was timed")

    monkeypatch.setattr(linear, "choose_path", timed)
    assert measurement_key(drafter.module, type(drafter).__name__)


def test_a_head_beside_a_target_from_elsewhere_keeps_float32_products(tiny_llama):
    """A head beside a target that is not a GGUF file drafts on its float32 products."""
    from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
    from specdeck.engine.drafting.heads import FeatureHead, head_config

    target, _ = tiny_llama
    head = FeatureHead(head_config(target.model.config)).eval()
    FeatureHeadDrafter(head, target.model)
    assert not gguf_blocks.own_blocks(head.body)
    assert "own weights" not in weights_of(head.body).products.reason


@needs_int8
def test_the_products_benchmark_times_every_matrix_of_the_file_both_ways(capsys):
    """`python -m specdeck.bench.products` makes a product of every quantized matrix of the
    built-in file (30 layers of 7, the embedding) and prints one row of timings per row count."""
    from specdeck.bench import products

    products.main(["--rows", "1,3", "--repeats", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("211 products of SmolLM2-135M-Instruct.Q4_1.gguf")
    rows = [line.split("|") for line in out if line.startswith("| 1 ") or line.startswith("| 3 ")]
    assert [r[1].strip() for r in rows] == ["1", "3"] and all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


def test_the_tensor_index_maps_what_gguf_reads_and_heals_when_damaged(tmp_path, monkeypatch):
    """The built-in file's tensors, read stepping over its vocabulary and mapped from the cached
    index, are gguf-py's own (names, types, shapes, layouts, bytes); an index damaged in the cache
    is read again from the file, not trusted."""
    from gguf import GGUFReader

    from specdeck.engine.forward import gguf_index
    from specdeck.engine.loading.registry import BUILTIN_MODELS

    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    path = BUILTIN_MODELS["smollm2-135m-instruct"].path()
    read = {t.name: t for t in GGUFReader(str(path), "r").tensors}
    for attempt in ("first", "from the index", "damaged"):
        if attempt == "damaged":
            (written,) = (tmp_path / "gguf-tensors").glob("*.json")
            written.write_text('{"version": 1, "tensors": [{"name": "x", "offset": 1e15, "bytes": 4}]}')
        mapped = gguf_index.tensors_of(path)
        assert mapped.keys() == read.keys(), attempt
        assert all(
            mapped[n].data.shape == t.data.shape and mapped[n].data.dtype == t.data.dtype for n, t in read.items()
        )
        for name in ("blk.0.attn_q.weight", "output_norm.weight", "token_embd.weight"):
            ours, theirs = mapped[name], read[name]
            assert ours.tensor_type == theirs.tensor_type and ours.shape == tuple(int(n) for n in theirs.shape)
            assert np.array_equal(np.asarray(ours.data), np.asarray(theirs.data)), (attempt, name)
