"""Choosing the backend (`engine.backends`): what auto picks, what an impossible request says, and
what happens where llama-cpp-python is not installed."""

import pytest
import torch

from specdeck.engine import backends
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.llamacpp_backend import library
from specdeck.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET

CPU = torch.device("cpu")


@pytest.fixture
def not_installed(monkeypatch):
    """llama-cpp-python missing, and the process not yet told about it."""
    monkeypatch.setattr("specdeck.engine.llamacpp_backend.library", lambda: None)
    monkeypatch.setattr(backends, "_told_missing", False)


def test_models_that_are_no_gguf_file_run_on_torch():
    """auto runs a model folder (the bundled draft) on torch; asking llama.cpp for it says it runs
    .gguf files."""
    assert backends.choose_backend(DEFAULT_DRAFT, "auto", CPU, "auto") == "torch"
    with pytest.raises(SpecDeckError, match="runs .gguf files"):
        backends.choose_backend(DEFAULT_DRAFT, "llama.cpp", CPU, "auto")


def test_without_llama_cpp_gguf_runs_on_torch_and_says_so_once(not_installed):
    """Where llama-cpp-python is missing, auto runs the built-in GGUF on torch and says why once per
    process; asking for llama.cpp says how to install it."""
    said = []
    for _ in range(2):
        assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto", said.append) == "torch"
    assert len(said) == 1 and "GGUF files run on torch" in said[0]
    with pytest.raises(SpecDeckError, match="pip install llama-cpp-python"):
        backends.choose_backend(DEFAULT_TARGET, "llama.cpp", CPU, "auto")


def test_llama_cpp_refuses_what_only_torch_does():
    """A GPU device or a dtype is torch's to honour: llama.cpp refuses them, auto leaves them to torch."""
    for device, dtype in ((torch.device("cuda"), "auto"), (CPU, "bfloat16")):
        with pytest.raises(SpecDeckError, match="--backend torch"):
            backends.choose_backend(DEFAULT_TARGET, "llama.cpp", device, dtype)
        assert backends.choose_backend(DEFAULT_TARGET, "auto", device, dtype) == "torch"
    with pytest.raises(SpecDeckError, match="Unknown backend"):
        backends.choose_backend(DEFAULT_TARGET, "onnx", CPU, "auto")


@pytest.mark.skipif(library() is None, reason="llama-cpp-python is not installed (`make` builds it)")
@pytest.mark.parametrize("llama_ms, torch_ms, expected", [(5.0, 20.0, "llama.cpp"), (20.0, 5.0, "torch")])
def test_auto_picks_the_faster_backend_once_measured(monkeypatch, tmp_path, llama_ms, torch_ms, expected):
    """auto picks the backend whose plain step measured faster, and later loads read the saved
    verdict instead of measuring again."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(backends, "_llama_cpp_step_ms", lambda path: measured.append("llama.cpp") or llama_ms)
    monkeypatch.setattr(backends, "_torch_step_ms", lambda name, progress: measured.append("torch") or torch_ms)
    for _ in range(2):
        assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto") == expected
    assert measured == ["llama.cpp", "torch"]
