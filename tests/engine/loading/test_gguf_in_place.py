"""A GGUF file read in place (`specdeck.engine.loading.gguf_in_place`): no float32 copy written, the converted
model's logits bit for bit, and files the row kernel cannot read converted as before."""

import numpy as np
import pytest
import torch

from specdeck.engine import DecodeConfig, encode_prompt, generate
from specdeck.engine.cache import TOKENIZER_SUFFIX
from specdeck.engine.forward import gguf_blocks, kernel_build
from specdeck.engine.forward.llama_forward import LlamaForward
from specdeck.engine.forward.row_kernel import QuantizedLinear, QuantizedParts
from specdeck.engine.loading import backends, gguf_in_place, preflight
from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.models import LoadOptions, load_model
from specdeck.engine.loading.registry import DEFAULT_TARGET

gguf = pytest.importorskip("gguf")
needs_kernel = pytest.mark.skipif(isinstance(kernel_build.library(), str), reason="the row kernel does not build here")
CPU = torch.device("cpu")


def _weights_written(cache) -> list:
    """What of the cache's converted models holds weights (a tokenizer's folder holds none)."""
    folder = cache / "gguf"
    return [p for p in folder.iterdir() if not p.name.endswith(TOKENIZER_SUFFIX)] if folder.is_dir() else []


@needs_kernel
def test_the_builtin_target_read_in_place_writes_no_weights_and_keeps_the_converted_bits(
    builtin_conversion, tmp_path, monkeypatch
):
    """The built-in Q4_1 target loads with no float32 folder in the cache (its tokenizer only) and
    gives, bit for bit, the converted model's logits: the lean forward's after a prefill, a step and
    a verify, Hugging Face's own forward (the matrices brought back from the blocks, the query and
    key rows in transformers' order), and the same greedy text."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    in_place = load_model(DEFAULT_TARGET, LoadOptions(device="cpu"))
    assert gguf_blocks.read_in_place(in_place.model) and _weights_written(tmp_path) == []
    monkeypatch.setenv("SPECDECK_CACHE", str(builtin_conversion))
    converted = load_model(DEFAULT_TARGET, LoadOptions(device="cpu", read_in_place=False))
    assert not gguf_blocks.read_in_place(converted.model)
    ids = encode_prompt(in_place.tokenizer, "Name three rivers of Europe.")
    lean = LlamaForward(in_place.model), LlamaForward(converted.model)
    with torch.inference_mode():
        for tokens in (ids, [330], [28, 29, 30, 31]):
            first, second = (forward.logits(torch.tensor(tokens), False) for forward in lean)
            assert torch.equal(first, second)
        hf = [m.model(torch.tensor([ids])).logits for m in (in_place, converted)]
    assert torch.equal(hf[0], hf[1])
    texts = [list(generate(m, ids, DecodeConfig(max_new_tokens=24)))[-1].text for m in (in_place, converted)]
    assert texts[0] == texts[1] and texts[0].strip()
    assert in_place.runs == converted.runs and "Q4_1 blocks on the row kernel" in in_place.runs


@needs_kernel
def test_reading_in_place_draws_no_weights_it_then_replaces(monkeypatch):
    """The model read in place is built without initialising its parameters: every one is the file's,
    assigned after, and drawing random values for them first only delays the first token."""
    from transformers import PreTrainedModel

    drawn = []
    monkeypatch.setattr(PreTrainedModel, "_init_weights", lambda self, module: drawn.append(module))
    model = load_model(DEFAULT_TARGET, LoadOptions(device="cpu"))
    assert gguf_blocks.read_in_place(model.model) and drawn == []


def test_the_config_read_without_the_tokenizers_strings_is_the_full_reads(monkeypatch):
    """A first launch reads the built-in file's config with the tokenizer's arrays stepped over, and
    gets the config transformers' full read gives; where the shortcut's vocabulary size does not
    match the token embedding, the full read is taken instead."""
    from transformers import AutoConfig

    path = gguf_file(DEFAULT_TARGET)
    full = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    assert gguf_in_place._parsed_config(path).to_dict() == full
    reads = []
    original = AutoConfig.from_pretrained
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda *a, **k: reads.append(1) or original(*a, **k))
    monkeypatch.setattr(gguf_in_place, "tensors_of", lambda path: {})  # no embedding to match
    assert gguf_in_place._parsed_config(path).to_dict() == full and len(reads) == 2


@needs_kernel
def test_matrices_of_different_block_types_make_one_product_of_parts():
    """Matrices of two block types fused into one product run each on its own blocks: the product's
    outputs are each part's, bit for bit, and its matrix is theirs stacked."""
    path = gguf_file(DEFAULT_TARGET)
    matrices = gguf_blocks.FileMatrices(path, rows="float32")
    tensors = [matrices._tensors[name] for name in ("blk.0.attn_q.weight", "token_embd.weight")]
    decoded = [torch.from_numpy(gguf.dequantize(np.asarray(t.data), t.tensor_type).copy()) for t in tensors]
    fused = matrices.product(["blk.0.attn_q.weight", "token_embd.weight"], decoded, None)
    assert isinstance(fused, QuantizedParts) and fused.kind == "Q4_1+Q8_0"
    alone = [
        matrices.product([name], [d], None) for name, d in zip(("blk.0.attn_q.weight", "token_embd.weight"), decoded)
    ]
    assert all(isinstance(part, QuantizedLinear) for part in alone)
    x = torch.randn(3, decoded[0].shape[1])
    assert torch.equal(fused(x), torch.cat([part(x) for part in alone], dim=-1))
    assert torch.equal(fused.dense(), torch.cat(decoded))


def _tiny_file(path, kind: str):
    """A GGUF file of a one-layer Llama's tensors, its large matrices in `kind` (F16, or Q8_0)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if kind == "F16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    rng = np.random.default_rng(0)
    shapes = {"attn_q": 64, "attn_k": 64, "attn_v": 64, "attn_output": 64, "ffn_gate": 128, "ffn_up": 128}
    for name, rows in {**shapes, "ffn_down": 64}.items():
        width = 128 if name == "ffn_down" else 64
        matrix = rng.normal(0, 0.02, (rows, width)).astype(np.float32)
        if kind == "F16":
            writer.add_tensor(f"blk.0.{name}.weight", matrix.astype(np.float16))
        else:
            blocks = gguf.quants.quantize(matrix, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(f"blk.0.{name}.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", rng.normal(0, 0.02, (100, 64)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@needs_kernel
def test_auto_says_why_a_file_the_kernel_cannot_read_is_timed(tmp_path, monkeypatch):
    """A file whose matrices are F16 blocks, which the row kernel does not read, is not read in place
    (the refusal names the type), and auto times both backends and says so in one line; a file of
    Q8_0 matrices runs in place on torch, untimed, and says that."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    monkeypatch.setattr(preflight, "available_memory", lambda: 64 << 30)
    monkeypatch.setattr(backends, "llama_cpp_installed", lambda progress=None: True)
    monkeypatch.setattr(backends, "_llama_cpp_step_ms", lambda path: 1.0)
    monkeypatch.setattr(backends, "_torch_step_ms", lambda name, progress, load: 2.0)
    unread = _tiny_file(tmp_path / "tiny-f16.gguf", "F16")
    assert "does not read its 7 F16 matrices" in gguf_in_place.refusal(unread, CPU, "auto")
    said: list[str] = []
    assert backends.choose_backend(str(unread), "auto", CPU, "auto", said.append, lambda *_: None) == "llama.cpp"
    assert said[-1:] == [
        "Backend auto: llama.cpp, since the row kernel reads 0 of the 7 large matrices of tiny-f16.gguf "
        "(not 7 F16), and a step measured 1.0 ms on llama.cpp and 2.0 ms on torch"
    ]
    read = _tiny_file(tmp_path / "tiny-q8.gguf", "Q8_0")
    assert gguf_in_place.refusal(read, CPU, "auto") is None
    said.clear()
    assert backends.choose_backend(str(read), "auto", CPU, "auto", said.append, lambda *_: None) == "torch"
    assert said == [
        "Backend auto: torch, where every large matrix of tiny-q8.gguf runs as its own blocks on the row kernel"
    ]


@needs_kernel
def test_each_backend_names_what_runs_the_builtin_target(builtin_conversion, monkeypatch):
    """The label says what runs: the file's blocks on the row kernel (and how rows go), float32
    with the blocks off, llama.cpp and the file's type there; the pair's description says the same."""
    from specdeck.engine.forward.gguf_blocks import activations
    from specdeck.engine.forward.llamacpp_backend import library

    rows = "8-bit rows" if activations() == "int8" else "float32 rows"
    assert load_model(DEFAULT_TARGET, LoadOptions(device="cpu")).runs == f"Q4_1 blocks on the row kernel ({rows})"
    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "off")
    monkeypatch.setenv("SPECDECK_CACHE", str(builtin_conversion))
    assert load_model(DEFAULT_TARGET, LoadOptions(device="cpu")).runs == "float32"
    monkeypatch.delenv("SPECDECK_GGUF_BLOCKS")
    if library() is not None:
        assert load_model(DEFAULT_TARGET, LoadOptions(device="cpu", backend="llama.cpp")).runs == "llama.cpp Q4_1"


@needs_kernel
def test_a_tied_output_layers_rows_read_alone_are_the_whole_tables(tmp_path, monkeypatch):
    """A head's rows of the output layer (and its target's fingerprint) read from the file's blocks
    alone have the bits the whole table dequantized gives them, in the order asked."""
    from specdeck.engine.forward.lean_weights import output_rows, output_weight

    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    model = load_model(DEFAULT_TARGET, LoadOptions(device="cpu")).model
    ids = torch.tensor([49151, 0, 7, 7, 30000, 1])
    assert torch.equal(output_rows(model, ids), output_weight(model)[ids])
