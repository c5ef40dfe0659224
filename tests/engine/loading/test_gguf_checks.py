"""A GGUF file's metadata must imply exactly the tensors it holds (`specdeck.engine.loading.gguf_checks`):
hypothesis draws small Llama-family files written with gguf-py's GGUFWriter, which pass, and
edits of them (block_count up, down or huge, a renamed architecture, a tensor missing, extra or
of another shape, numbers of the wrong type, a file cut short), each refused before any work with
a message naming the file. SPECDECK_HYPOTHESIS=long draws many more."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeck.engine.cache import gguf_cache
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.gguf_checks import check_gguf
from specdeck.engine.loading.models import LoadOptions, load_model
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET

LONG = os.environ.get("SPECDECK_HYPOTHESIS") == "long"
PROFILE = settings(
    max_examples=500 if LONG else 80,
    deadline=None,
    derandomize=not LONG,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
DAMAGED = r": the file is damaged or was written wrong; re-download or re-convert it\.$"


@dataclass
class Model:
    """A small Llama-family model as a GGUF file holds it: metadata (key -> value and type) and
    tensors (name -> shape, innermost dimension first, as GGUF writes it)."""

    arch: str
    metadata: dict[str, tuple[object, GGUFValueType]] = field(default_factory=dict)
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def write(self, path: Path) -> Path:
        writer = GGUFWriter(str(path), self.arch)
        for key, (value, kind) in self.metadata.items():
            sub = GGUFValueType.STRING if kind == GGUFValueType.ARRAY else None
            writer.add_key_value(key, value, kind, sub)
        for name, shape in self.tensors.items():
            writer.add_tensor(name, np.zeros(shape[::-1], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    def renamed(self, arch: str) -> Model:
        """The same file under another architecture's name, its keys renamed with it."""
        moved = {re.sub(rf"^{self.arch}\.", f"{arch}.", k): v for k, v in self.metadata.items()}
        return Model(arch, moved, dict(self.tensors))


@st.composite
def models(draw) -> Model:
    arch = draw(st.sampled_from(["llama", "mistral", "qwen2", "qwen3"]))
    layers, kv_heads = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    key = 2 * draw(st.integers(1, 4))
    width, hidden, vocab = heads * key, draw(st.integers(1, 24)), draw(st.integers(4, 40))
    u32 = GGUFValueType.UINT32
    metadata = {
        f"{arch}.block_count": (layers, u32),
        f"{arch}.context_length": (64, u32),
        f"{arch}.embedding_length": (width, u32),
        f"{arch}.feed_forward_length": (hidden, u32),
        f"{arch}.attention.head_count": (heads, u32),
        f"{arch}.attention.head_count_kv": (kv_heads, u32),
        "tokenizer.ggml.model": ("gpt2", GGUFValueType.STRING),
        "tokenizer.ggml.tokens": ([f"t{i}" for i in range(vocab)], GGUFValueType.ARRAY),
    }
    tensors = {"token_embd.weight": (width, vocab), "output_norm.weight": (width,)}
    if draw(st.booleans()):
        tensors["output.weight"] = (width, vocab)
    layer = {
        "attn_norm.weight": (width,),
        "attn_q.weight": (width, heads * key),
        "attn_k.weight": (width, kv_heads * key),
        "attn_v.weight": (width, kv_heads * key),
        "attn_output.weight": (heads * key, width),
        "ffn_norm.weight": (width,),
        "ffn_gate.weight": (width, hidden),
        "ffn_up.weight": (width, hidden),
        "ffn_down.weight": (hidden, width),
    }
    if arch == "qwen2":
        layer |= {"attn_q.bias": (heads * key,), "attn_k.bias": (kv_heads * key,), "attn_v.bias": (kv_heads * key,)}
    if arch == "qwen3":
        layer |= {"attn_q_norm.weight": (key,), "attn_k_norm.weight": (key,)}
    for index in range(layers):
        tensors |= {f"blk.{index}.{name}": shape for name, shape in layer.items()}
    return Model(arch, metadata, tensors)


def _more_layers(model, data):
    held = len(_held(model))
    said = held + data.draw(st.integers(1, 3))
    model.metadata[f"{model.arch}.block_count"] = (said, GGUFValueType.UINT32)
    return rf"says {said} layers but holds tensors for {held}"


def _held(model: Model) -> set[int]:
    return {int(name.split(".")[1]) for name in model.tensors if name.startswith("blk.")}


def _fewer_layers(model, data):
    held = len(_held(model))
    said = data.draw(st.integers(0, held - 1))
    model.metadata[f"{model.arch}.block_count"] = (said, GGUFValueType.UINT32)
    return (
        rf"says {said} layers but holds tensors for {held}"
        if said
        else r"says \S+\.block_count is 0, outside 1\.\.1024"
    )


def _huge_layers(model, data):
    said = data.draw(st.sampled_from([10**9, 2**32 - 1, 2**40, 2**63]))
    model.metadata[f"{model.arch}.block_count"] = (said, GGUFValueType.UINT64)
    return rf"says \S+\.block_count is {said}, outside 1\.\.1024 \(no model has that\)"


def _renamed(model, data):
    arch = data.draw(st.sampled_from(["llama", "qwen2", "qwen3"]).filter(lambda a: a != model.arch))
    if {model.arch, arch} == {"llama", "mistral"}:
        arch = "qwen2"
    model.__dict__.update(model.renamed(arch).__dict__)
    return (
        rf"is a {arch} model by its metadata but lacks blk\.0\.|holds tensor blk\.0\.attn_[qk]\S*, which a {arch} model"
    )


def _renamed_unknown(model, data):
    model.arch = data.draw(st.sampled_from(["llama9", "qwen9", "gpt-5"]))
    return rf"names architecture '{re.escape(model.arch)}', which no GGUF reader knows"


def _renamed_keys_left(model, data):
    model.arch = "qwen2" if model.arch != "qwen2" else "llama"
    return rf"has no {model.arch}\.block_count"


def _tensor_missing(model, data):
    del model.tensors[data.draw(st.sampled_from(sorted(set(model.tensors) - {"output.weight"})))]  # output is optional
    return r"lacks |holds layers of different kinds|holds tensors for"


def _tensor_extra(model, data):
    held = len(_held(model))
    name = data.draw(
        st.sampled_from(
            [f"blk.{held}.attn_norm.weight", "blk.0.attn_output.bias", "blk.0.mystery.weight", "pos_embd.weight"]
        )
    )
    model.tensors[name] = (4,)
    return (
        r"holds tensor \S+, which a \w+ model (of its metadata )?has not|holds layers of different kinds|"
        rf"says {held} layers but holds tensors for {held + 1}"
    )


def _tensor_reshaped(model, data):
    name = data.draw(st.sampled_from(sorted(model.tensors)))
    shape = list(model.tensors[name])
    axis = data.draw(st.integers(0, len(shape) - 1))
    shape[axis] += data.draw(st.integers(1, 3))
    model.tensors[name] = tuple(shape)
    return rf"says {re.escape(name)} is [\d x]+ \(from its metadata\) but holds|token_embd\.weight is"


def _number_changed(model, data):
    key = data.draw(
        st.sampled_from(["embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv"])
    )
    value = model.metadata[f"{model.arch}.{key}"][0]
    model.metadata[f"{model.arch}.{key}"] = (value + data.draw(st.integers(1, 5)), GGUFValueType.UINT32)
    return r"but holds|token_embd\.weight is|outside|not divide"


def _vocabulary_changed(model, data):
    tokens = model.metadata["tokenizer.ggml.tokens"][0]
    model.metadata["tokenizer.ggml.tokens"] = (
        tokens[: data.draw(st.integers(1, len(tokens) - 1))],
        GGUFValueType.ARRAY,
    )
    return r"\(embedding_length x vocabulary\) but its token_embd\.weight is"


def _number_of_wrong_type(model, data):
    key = f"{model.arch}.{data.draw(st.sampled_from(['block_count', 'embedding_length', 'attention.head_count']))}"
    value = data.draw(
        st.sampled_from([("30", GGUFValueType.STRING), (30.0, GGUFValueType.FLOAT32), (True, GGUFValueType.BOOL)])
    )
    model.metadata[key] = value
    return rf"says {re.escape(key)} is \S+, not a whole number"


EDITS = [
    _more_layers,
    _fewer_layers,
    _huge_layers,
    _renamed,
    _renamed_unknown,
    _renamed_keys_left,
    _tensor_missing,
    _tensor_extra,
    _tensor_reshaped,
    _number_changed,
    _vocabulary_changed,
    _number_of_wrong_type,
]


@PROFILE
@given(model=models())
def test_a_file_whose_metadata_implies_its_tensors_passes(model):
    """Any small Llama, Mistral, Qwen2 or Qwen3 file whose metadata matches its tensors passes."""
    with tempfile.TemporaryDirectory() as folder:
        check_gguf(model.write(Path(folder) / "model.gguf"))


@pytest.mark.timeout(120)  # a block_count of 10^9 once ran for ever: the whole test is bounded
@PROFILE
@given(model=models(), edit=st.sampled_from(EDITS), data=st.data())
def test_a_file_whose_metadata_and_tensors_disagree_is_refused(model, edit, data):
    """An edit of the metadata or the tensors that makes them disagree is refused, naming the
    file and what it says against what it holds."""
    fault = edit(model, data)
    with tempfile.TemporaryDirectory() as folder:
        path = model.write(Path(folder) / "model.gguf")
        with pytest.raises(SpecDeckError, match=rf"^{re.escape(str(path))} .*({fault}).*{DAMAGED}"):
            check_gguf(path)


@PROFILE
@given(model=models(), data=st.data())
def test_a_file_cut_short_is_refused(model, data):
    """A file that ends inside its header or its tensors' data is refused, naming the file."""
    with tempfile.TemporaryDirectory() as folder:
        path = model.write(Path(folder) / "model.gguf")
        whole = path.read_bytes()
        path.write_bytes(whole[: data.draw(st.integers(0, len(whole) - 32))])  # the last 31 may be padding
        with pytest.raises(
            SpecDeckError,
            match=rf"^{re.escape(str(path))} is not a readable GGUF model .*Check that the download finished",
        ):
            check_gguf(path)


def test_the_built_in_file_passes():
    """The built-in SmolLM2 GGUF's metadata implies exactly its tensors."""
    check_gguf(BUILTIN_MODELS[DEFAULT_TARGET].path())


@pytest.mark.parametrize("backend", ["torch", "llama.cpp", "auto"])
def test_loading_a_file_that_says_one_layer_more_is_refused_before_any_work(tmp_path, backend):
    """Loading a file whose block_count says one layer more than it holds is refused on every
    backend, naming the file, and nothing is written to SpecDeck's cache for it."""
    model = _small_llama()
    model.metadata["llama.block_count"] = (3, GGUFValueType.UINT32)
    path = model.write(tmp_path / "says-three-layers.gguf")
    with pytest.raises(SpecDeckError, match=rf"{re.escape(str(path))} says 3 layers but holds tensors for 2"):
        load_model(str(path), LoadOptions(device="cpu", backend=backend))
    assert not list(gguf_cache().glob("says-three-layers*"))


def _small_llama() -> Model:
    """A two-layer Llama of the smallest shapes."""
    u32 = GGUFValueType.UINT32
    metadata = {
        "llama.block_count": (2, u32),
        "llama.context_length": (64, u32),
        "llama.embedding_length": (4, u32),
        "llama.feed_forward_length": (8, u32),
        "llama.attention.head_count": (2, u32),
        "tokenizer.ggml.model": ("gpt2", GGUFValueType.STRING),
        "tokenizer.ggml.tokens": ([f"t{i}" for i in range(16)], GGUFValueType.ARRAY),
    }
    tensors = {"token_embd.weight": (4, 16), "output_norm.weight": (4,)}
    for index in range(2):
        tensors |= {
            f"blk.{index}.{name}": shape
            for name, shape in {
                "attn_norm.weight": (4,),
                "attn_q.weight": (4, 4),
                "attn_k.weight": (4, 4),
                "attn_v.weight": (4, 4),
                "attn_output.weight": (4, 4),
                "ffn_norm.weight": (4,),
                "ffn_gate.weight": (4, 8),
                "ffn_up.weight": (4, 8),
                "ffn_down.weight": (8, 4),
            }.items()
        }
    return Model("llama", metadata, tensors)
