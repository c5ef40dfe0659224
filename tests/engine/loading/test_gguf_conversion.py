"""Model files that are damaged or unsafe get a message saying what is wrong and what to do."""

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny import ON_CPU, build_pair

from specdeck.bench.ladder_files import LadderShape, write_random_gguf
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.gguf_conversion import WEIGHTS_RECORD_FILE, convert_gguf
from specdeck.engine.loading.models import load_model
from specdeck.engine.loading.registry import DEFAULT_TARGET

CONVERTED = replace(ON_CPU, read_in_place=False)  # a GGUF file through its float32 conversion


class RunsAShellCommand:
    """Pickles to a call of os.system, as a malicious pytorch_model.bin does."""

    def __reduce__(self):
        return os.system, ("true",)


def test_pickled_weights_that_carry_code_are_refused_plainly(tmp_path):
    """A pytorch_model.bin that calls code is not run; the message says so and what to use instead."""
    target, _ = build_pair(tmp_path, "gpt2")
    for weights in target.glob("*.safetensors"):
        weights.unlink()
    torch.save({"weight": RunsAShellCommand()}, target / "pytorch_model.bin")
    with pytest.raises(SpecDeckError) as refused:
        load_model(str(target), ON_CPU)
    message = str(refused.value)
    assert "hold Python code" in message and "system" in message and "did not run it" in message
    assert "safetensors" in message and "weights_only" not in message


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> Path:
    """A GGUF file of the built-in model's kind, shrunk to 2 layers of 64 and a 512-token vocabulary:
    it goes through the same conversion steps as the built-in file, its tokenizer a hundredth the size."""
    path = tmp_path_factory.mktemp("small") / "small.gguf"
    write_random_gguf(LadderShape("small", 64, 128, 2, 4, 2), path, vocab=512)
    return path


@pytest.fixture(scope="module")
def converted_cache(small_gguf, tmp_path_factory) -> Path:
    """A cache holding the small file's float32 conversion, made once for the tests that damage a
    copy of it."""
    cache = tmp_path_factory.mktemp("converted")
    before = os.environ.get("SPECDECK_CACHE")
    os.environ["SPECDECK_CACHE"] = str(cache)
    try:
        convert_gguf(small_gguf)
    finally:
        if before is None:
            del os.environ["SPECDECK_CACHE"]
        else:
            os.environ["SPECDECK_CACHE"] = before
    return cache


def _copy_of(converted_cache: Path, tmp_path: Path, monkeypatch) -> Path:
    """A cache of this test's own holding the conversion, set as SpecDeck's cache."""
    cache = tmp_path / "cache"
    shutil.copytree(converted_cache, cache)
    monkeypatch.setenv("SPECDECK_CACHE", str(cache))
    return cache


def test_damaged_gguf_cache_is_detected_and_rebuilt(small_gguf, converted_cache, tmp_path, monkeypatch):
    """Truncated cached weights are noticed at the next start, converted again with a notice, and load."""
    _copy_of(converted_cache, tmp_path, monkeypatch)
    gguf = small_gguf
    folder = convert_gguf(gguf)
    assert (folder / WEIGHTS_RECORD_FILE).is_file()
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as file:
        file.truncate(size // 2)
    notices: list[str] = []
    assert load_model(str(gguf), CONVERTED, progress=notices.append).vocab_width > 0
    assert any("is damaged" in n and f"{size // 2} bytes, {size} were written" in n for n in notices)
    assert weights.stat().st_size == size


def test_a_changed_byte_in_the_cached_weights_is_caught_while_they_load(
    small_gguf, converted_cache, tmp_path, monkeypatch
):
    """The checksum runs beside the load rather than before it: a byte changed in place (same size)
    is still caught before the model is used, converted again with a notice, and the model loads
    with the file's own weights."""
    _copy_of(converted_cache, tmp_path, monkeypatch)
    gguf = small_gguf
    whole = load_model(str(gguf), CONVERTED).model.get_input_embeddings().weight.detach().clone()
    weights = convert_gguf(gguf) / "model.safetensors"
    with weights.open("r+b") as file:  # a byte of the last tensor's data, far from the header
        file.seek(-5, 2)
        byte = file.read(1)
        file.seek(-5, 2)
        file.write(bytes([byte[0] ^ 0x40]))
    notices: list[str] = []
    loaded = load_model(str(gguf), CONVERTED, progress=notices.append)
    assert any("is damaged" in n and "checksum" in n for n in notices), notices
    assert torch.equal(loaded.model.get_input_embeddings().weight, whole)


def test_a_converted_gguf_is_a_folder_other_tools_load(small_gguf, converted_cache, monkeypatch):
    """A GGUF file of the built-in model's kind converts into a standard Hugging Face folder: its tied output layer saved
    once under the embedding's name (a vLLM server reads that name; one stored only as
    lm_head.weight served uniform log-probabilities), loading with transformers alone into a model
    whose output layer is its embedding."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("SPECDECK_CACHE", str(converted_cache))
    folder = convert_gguf(small_gguf)
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        embedding = weights.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in names
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert torch.equal(model.get_output_embeddings().weight, embedding)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_cache_damage_names_a_changed_byte_and_records_older_caches(tmp_path):
    """Same size but another byte fails the checksum; a cache without a record is recorded if it reads, else damaged."""
    from safetensors.torch import save_file

    from specdeck.engine.loading.gguf_conversion import cache_damage, record_weights

    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(weights))
    record_weights(tmp_path)
    assert cache_damage(tmp_path) is None
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert "checksum" in cache_damage(tmp_path)
    (tmp_path / WEIGHTS_RECORD_FILE).unlink()
    assert cache_damage(tmp_path) is None and (tmp_path / WEIGHTS_RECORD_FILE).is_file()
    (tmp_path / WEIGHTS_RECORD_FILE).unlink()
    weights.write_bytes(bytes(data[:-8]))
    assert "cannot be read" in cache_damage(tmp_path)


def test_a_conversion_without_room_is_refused_and_leaves_nothing(small_gguf, tmp_path, monkeypatch):
    """A cache disk without room for the built-in file's converted weights is named before any work
    (the size it needs, what it has); one that fills up while they are written gives one line, no
    traceback, and no half-written folder."""
    import collections

    import safetensors.torch
    from safetensors import SafetensorError

    from specdeck.engine.loading import gguf_conversion

    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    usage = collections.namedtuple("usage", "total used free")
    with monkeypatch.context() as small:
        small.setattr(gguf_conversion.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 10 << 20))
        with pytest.raises(SpecDeckError, match=r"needs about 5\d\d MB in .* which has 10 MB free"):
            load_model(DEFAULT_TARGET, CONVERTED)

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(SpecDeckError, match="Cannot write the converted weights .* No space left"):
        load_model(str(small_gguf), CONVERTED)
    folder = gguf_conversion.conversion_folder(small_gguf)
    assert not folder.exists() and not [p for p in folder.parent.iterdir() if p.name.startswith(".")]
