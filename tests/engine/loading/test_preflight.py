"""A damaged model folder, or one too large for the free memory, is refused before anything loads,
with the file and the field named."""

import json
import shutil

import pytest
from tiny import ON_CPU, build_pair

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading import preflight
from specdeck.engine.loading.models import load_model


@pytest.fixture
def model_dirs(tmp_path):
    """Fresh copies of a tiny Llama and a tiny GPT-2, free to damage."""
    llama, _ = build_pair(tmp_path / "llama", "llama")
    gpt2, _ = build_pair(tmp_path / "gpt2", "gpt2")
    return llama, gpt2


def _edit_config(folder, **fields):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("field, value", [("vocab_size", 0), ("hidden_size", -64), ("num_hidden_layers", "two")])
def test_nonsense_config_fields_are_named(model_dirs, field, value):
    """A config field that cannot be right is refused with the file and the field."""
    llama, _ = model_dirs
    _edit_config(llama, **{field: value})
    with pytest.raises(SpecDeckError, match=rf"config\.json: {field} is .*positive whole number"):
        load_model(str(llama), ON_CPU)


def test_positions_that_disagree_with_the_weights_are_named(model_dirs):
    """A GPT-2 config whose n_positions is not the position table's size is refused before loading."""
    _, gpt2 = model_dirs
    _edit_config(gpt2, n_positions=1024)
    with pytest.raises(SpecDeckError, match=r"n_positions is 1024, but the weights' .*wpe\.weight has 512 rows"):
        load_model(str(gpt2), ON_CPU)


def test_a_config_that_is_not_json_is_named(model_dirs):
    """A config.json that is not JSON (a truncated copy) names itself."""
    llama, _ = model_dirs
    (llama / "config.json").write_text('{"vocab_size": 3')
    with pytest.raises(SpecDeckError, match=r"config\.json cannot be read as a model config"):
        load_model(str(llama), ON_CPU)


def test_a_model_larger_than_free_memory_is_refused_with_both_sizes(model_dirs, monkeypatch):
    """With less memory free than the weights need, loading stops before it starts and says how much."""
    llama, _ = model_dirs
    monkeypatch.setattr(preflight, "available_memory", lambda: 1000)
    with pytest.raises(SpecDeckError, match=r"needs about 0\.\d GB of memory in float32, and 0\.0 GB are free"):
        load_model(str(llama), ON_CPU)


def test_running_out_of_memory_while_loading_says_so(model_dirs, monkeypatch):
    """A MemoryError inside the loader becomes a message about memory, not a traceback."""
    from transformers import AutoModelForCausalLM

    llama, _ = model_dirs

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", out_of_memory)
    with pytest.raises(SpecDeckError, match="does not fit in the memory"):
        load_model(str(llama), ON_CPU)


def test_a_damaged_tokenizer_file_is_named(model_dirs):
    """A tokenizer.json that fails to load is named in the message."""
    llama, _ = model_dirs
    shutil.copy(llama / "config.json", llama / "tokenizer.json")  # valid JSON, not a tokenizer
    with pytest.raises(SpecDeckError, match=r"tokenizer of .* could not be read from .*tokenizer\.json"):
        load_model(str(llama), ON_CPU)


@pytest.mark.parametrize("arch, field", [("llama", "num_hidden_layers"), ("gpt2", "n_layer")])
def test_a_config_claiming_more_layers_than_the_weights_hold_is_refused(model_dirs, arch, field):
    """More layers in the config than in the weights would run random layers: refused, both counts named."""
    folder = model_dirs[0 if arch == "llama" else 1]
    held = json.loads((folder / "config.json").read_text())[field]
    _edit_config(folder, **{field: held + 2})
    with pytest.raises(
        SpecDeckError, match=rf"config\.json: the config says {held + 2} layers, but the weights hold {held}"
    ):
        load_model(str(folder), ON_CPU)


def test_a_hidden_size_that_disagrees_with_the_weights_is_named(model_dirs):
    """A hidden size other than the embedding's width is refused with both sizes, not a traceback."""
    llama, _ = model_dirs
    hidden = json.loads((llama / "config.json").read_text())["hidden_size"]
    _edit_config(llama, hidden_size=hidden * 2)
    with pytest.raises(
        SpecDeckError, match=rf"the hidden size is {hidden * 2}, but the weights' .* has {hidden} columns"
    ):
        load_model(str(llama), ON_CPU)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_safetensors_header_is_named(model_dirs, damage):
    """Weights whose header is garbage or cut short are named with what to do, not a traceback."""
    llama, _ = model_dirs
    weights = llama / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"\xff" * 64 + data[64:] if damage == "garbage" else data[:40])
    with pytest.raises(SpecDeckError, match=r"model\.safetensors cannot be read as safetensors weights .*Download"):
        load_model(str(llama), ON_CPU)
