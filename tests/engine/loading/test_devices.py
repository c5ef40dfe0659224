"""Devices, dtypes and failures a user meets the first time SpecDeck runs on a GPU, checked here
with the GPU's answers stood in: the dtype `auto` picks, a GPU index that does not exist, token ids
a model has no row for, logits that overflowed, and running out of memory."""

import types

import pytest
import torch
from tiny import ON_CPU

from specdeck.engine import DecodeConfig, generate, load_model
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.loading.devices import resolve_device, resolve_dtype


@pytest.fixture
def two_gpus(monkeypatch):
    """Two CUDA GPUs, an Ampere (8.0) as cuda:0 and a Turing (7.5) as cuda:1; the capability each
    call asked about is recorded."""
    asked = []

    def capability(device):
        asked.append(device)
        return {0: (8, 0), 1: (7, 5)}[torch.device(device).index or 0]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    return asked


def test_auto_picks_bfloat16_only_where_the_chosen_gpu_computes_it(two_gpus):
    """`auto` gives bfloat16 on an Ampere GPU, float16 on an older one, asked of the GPU chosen
    (not of the current one), and float32 on the CPU."""
    assert resolve_dtype("auto", resolve_device("cuda:0")) == torch.bfloat16
    assert resolve_dtype("auto", resolve_device("cuda:1")) == torch.float16
    assert [torch.device(d).index for d in two_gpus] == [0, 1]
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("float32", resolve_device("cuda:1")) == torch.float32


def test_a_gpu_index_beyond_the_machines_gpus_is_refused(two_gpus):
    """cuda:2 on a machine with two GPUs is refused with the indices it has."""
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(SpecDeckError, match=r"2 CUDA GPUs \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")


def test_token_ids_without_an_embedding_row_are_refused_before_the_device(tiny_llama):
    """An id past the model's rows (or negative) gets a message naming the vocabulary, and the
    cache is untouched: the next forward runs as if nothing happened."""
    lm = CachedModel(tiny_llama[0].model)
    rows = tiny_llama[0].model.get_input_embeddings().num_embeddings
    for bad in ([3, rows], [-1]):
        with pytest.raises(SpecDeckError, match=rf"outside this model's vocabulary \(ids 0 to {rows - 1}\)"):
            lm.forward(bad)
    assert len(lm) == 0
    assert lm.forward([3, 4]).shape[0] == 2


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_non_finite_logits_stop_the_session_with_a_message(tiny_root, temperature):
    """A target whose logits overflow stops at once with a message naming the dtype to use, greedy
    (where argmax would silently pick a NaN) and sampling."""
    from tiny import build_pair

    target_dir, _ = build_pair(tiny_root / "overflow", "llama")
    target = load_model(str(target_dir), ON_CPU)
    with torch.no_grad():
        target.model.model.norm.weight.fill_(float("inf"))
    where = "at new token 0 " if temperature == 0 else ""  # sampling stops at the draw, before the token
    with pytest.raises(SpecDeckError, match=rf"logits {where}are not finite.*--dtype float32"):
        list(generate(target, [3, 4, 5], DecodeConfig(max_new_tokens=5, temperature=temperature)))


def test_running_out_of_memory_in_the_terminal_says_what_to_try(monkeypatch, capsys):
    """`specdeck run` that runs out of GPU memory ends with one line saying what to try, not a traceback."""
    from specdeck.cli.main import main

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(
        "specdeck.engine.session.load_pair", lambda *args, **kwargs: types.SimpleNamespace(description="pair")
    )
    monkeypatch.setattr("specdeck.engine.session.run_session", out_of_memory)
    assert main(["run", "--prompt", "hello", "--jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdeck: error: Out of memory on the GPU.")
    assert all(advice in err for advice in ("smaller dtype", "shorter context", "--device cpu"))
    assert "Traceback" not in err
