"""Choosing the backend (`specdeck.engine.loading.backends`): what auto picks, what an impossible request says, and
what happens where llama-cpp-python is not installed."""

import pytest
import torch

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.llamacpp_backend import library
from specdeck.engine.loading import backends, preflight
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET

CPU = torch.device("cpu")


def not_loaded(name, progress):  # what the loader passes; these tests time torch without loading
    raise AssertionError("loaded the model to time torch")


@pytest.fixture
def not_installed(monkeypatch):
    """llama-cpp-python missing, and the process not yet told about it."""
    monkeypatch.setattr("specdeck.engine.forward.llamacpp_backend.library", lambda: None)
    monkeypatch.setattr(backends, "_told_missing", False)


def test_models_that_are_no_gguf_file_run_on_torch():
    """auto runs a model folder (the bundled draft) on torch; asking llama.cpp for it says it runs
    .gguf files."""
    assert backends.choose_backend(DEFAULT_DRAFT, "auto", CPU, "auto") == "torch"
    with pytest.raises(SpecDeckError, match="runs .gguf files"):
        backends.choose_backend(DEFAULT_DRAFT, "llama.cpp", CPU, "auto")


def test_without_llama_cpp_gguf_runs_on_torch_and_says_so_once(not_installed, monkeypatch):
    """Where llama-cpp-python is missing and the row kernel would not read the file, auto runs the
    built-in GGUF on torch, each choice saying why and the missing library named once per process;
    asking for llama.cpp says how to install it."""
    monkeypatch.setattr(backends, "kernel_refusal", lambda path, progress=None: "the row kernel is away")
    said = []
    for _ in range(2):
        assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto", said.append, not_loaded) == "torch"
    assert len([line for line in said if "GGUF files run on torch" in line]) == 1
    assert said[-1] == "Backend auto: torch (float32), since the row kernel is away and llama.cpp is not installed"
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
    monkeypatch.setattr(
        backends, "kernel_refusal", lambda path, progress=None: "no row kernel"
    )  # a machine the kernel does not build for
    measured = []
    monkeypatch.setattr(backends, "_llama_cpp_step_ms", lambda path: measured.append("llama.cpp") or llama_ms)
    monkeypatch.setattr(backends, "_torch_step_ms", lambda name, progress, load: measured.append("torch") or torch_ms)
    for _ in range(2):
        assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto", None, not_loaded) == expected
    assert measured == ["llama.cpp", "torch"]


@pytest.mark.skipif(library() is None, reason="llama-cpp-python is not installed (`make` builds it)")
def test_a_llama_cpp_that_crashes_leaves_specdeck_running_on_torch(monkeypatch, tmp_path):
    """Where llama.cpp dies of a native fault while it is timed (as a build for another CPU can), auto
    runs the file on torch and says why, then and on later loads, without timing llama.cpp again."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    monkeypatch.setattr(backends, "kernel_refusal", lambda path, progress=None: "no row kernel")
    monkeypatch.setattr(backends, "_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(backends, "_torch_step_ms", lambda name, progress, load: 30.0)
    said: list[str] = []
    assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto", said.append, not_loaded) == "torch"
    monkeypatch.setattr(backends, "_CHILD", "raise SystemExit('timed again')")
    assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto", said.append, not_loaded) == "torch"
    crashes = [line for line in said if "llama.cpp crashed on this machine" in line]
    assert len(crashes) == 2 and "signal 11" in crashes[0] and "runs on torch" in crashes[0]


@pytest.mark.skipif(library() is None, reason="llama-cpp-python is not installed (`make` builds it)")
def test_llama_cpp_is_timed_in_a_child_process(tmp_path):
    """The child times real one-token steps of the built-in file, and a file it cannot read comes
    back as a SpecDeckError with llama.cpp's reason."""
    assert 0.0 < backends._llama_cpp_step_ms(BUILTIN_MODELS[DEFAULT_TARGET].path()) < 10_000.0
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(SpecDeckError, match="not a readable GGUF model"):
        backends._llama_cpp_step_ms(damaged)


@pytest.mark.skipif(library() is None, reason="llama-cpp-python is not installed (`make` builds it)")
def test_where_the_row_kernel_reads_the_files_blocks_auto_takes_torch_untimed(monkeypatch, tmp_path):
    """Where the row kernel builds and a small GGUF file's blocks run on it, auto takes torch at once,
    timing neither backend (a first load would wait seconds); with the blocks off it times them."""
    from specdeck.engine.forward import kernel_build

    if isinstance(kernel_build.library(), str):
        pytest.skip("the row kernel does not build here")
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    monkeypatch.setattr(preflight, "available_memory", lambda: 64 << 30)  # whatever else runs beside the test
    timed = []
    monkeypatch.setattr(backends, "_llama_cpp_step_ms", lambda path: timed.append("llama.cpp") or 1.0)
    monkeypatch.setattr(backends, "_torch_step_ms", lambda name, progress, load: timed.append("torch") or 2.0)
    assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto", None, not_loaded) == "torch" and timed == []
    monkeypatch.setenv("SPECDECK_GGUF_BLOCKS", "off")
    assert backends.choose_backend(DEFAULT_TARGET, "auto", CPU, "auto", None, not_loaded) == "llama.cpp"
    assert timed == ["llama.cpp", "torch"]
