import gc
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one thread per test process, sessions and the commands tests start included: the suite runs in
# parallel processes (`make test`), and a session would otherwise count them as busy cores
os.environ.setdefault("SPECDECK_THREADS", "1")

from pathlib import Path

from specdeck.engine.forward import kernel_build

# a fresh cache's first build of the row kernel (a compiler, seconds on one core) runs while torch
# and the test modules import, as the `specdeck` command starts it (`specdeck.cli.launch`)
kernel_build.build_in_background()

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import ON_CPU, build_cross_pair, build_pair  # noqa: E402

from specdeck.engine.loading.models import LoadedModel, load_model  # noqa: E402
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET  # noqa: E402


def pytest_unconfigure(config) -> None:
    """The interpreter's exit then skips collecting among what the tests made (millions of objects
    with torch and transformers), as the `specdeck` command's does (`specdeck.cli.launch`)."""
    gc.freeze()


# Tiny test models gain nothing from intra-op threads, and several test processes may share the
# cores: one thread each avoids oversubscription.
torch.set_num_threads(1)


def _accelerator() -> tuple[torch.device | None, str]:
    """The GPU this machine offers the GPU set, or None and why not. `SPECDECK_TEST_DEVICE` names
    one instead (`cpu` rehearses the set's device-independent tests on a machine without a GPU)."""
    named = os.environ.get("SPECDECK_TEST_DEVICE")
    if named:
        return torch.device(named), ""
    if torch.cuda.is_available():
        return torch.device("cuda"), ""
    if torch.backends.mps.is_available():
        return torch.device("mps"), ""
    return None, f"needs a GPU: this torch ({torch.__version__}) sees no CUDA or MPS device"


@pytest.fixture
def device() -> torch.device:
    """The device of the GPU set (`pytest -m cuda`): CUDA where there is one, else MPS; skipped elsewhere."""
    found, why = _accelerator()
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture
def cuda(device) -> torch.device:
    """`device` where it is a CUDA GPU; skipped on others (the check needs torch.cuda's counters)."""
    if device.type != "cuda":
        pytest.skip(f"needs CUDA (torch.cuda's memory and synchronisation counters), not {device.type}")
    return device


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session", params=["llama", "gpt2"])
def tiny_pair(request, tiny_root) -> tuple[LoadedModel, LoadedModel]:
    """A tiny seeded target and a noisy copy of it as draft (agrees often, not always)."""
    target_dir, draft_dir = build_pair(tiny_root, request.param, noise=0.2)
    return load_model(str(target_dir), ON_CPU), load_model(str(draft_dir), ON_CPU)


@pytest.fixture(scope="session")
def tiny_llama(tiny_root) -> tuple[LoadedModel, LoadedModel]:
    target_dir, draft_dir = build_pair(tiny_root / "llama-only", "llama", noise=0.2)
    return load_model(str(target_dir), ON_CPU), load_model(str(draft_dir), ON_CPU)


@pytest.fixture(scope="session")
def cross_pair(tiny_root) -> tuple[LoadedModel, LoadedModel]:
    """A Llama with a SentencePiece byte-fallback tokenizer and a GPT-2 with a byte-level BPE one,
    both trained on the same text (either drafts for the other)."""
    llama, gpt2 = build_cross_pair(tiny_root / "cross")
    return load_model(str(llama), ON_CPU), load_model(str(gpt2), ON_CPU)


@pytest.fixture(scope="session")
def builtin_conversion(tmp_path_factory) -> Path:
    """SpecDeck's cache for this test run, holding the built-in target's float32 conversion (in
    `gguf/`): made once for all test processes (the first to ask converts, the others wait for it),
    where each test that compares with it or copies it would otherwise convert it again."""
    from filelock import FileLock

    from specdeck.engine.cache import cache_root
    from specdeck.engine.loading.gguf_conversion import convert_gguf

    shared = tmp_path_factory.getbasetemp().parent  # one folder for every process of `pytest -n`
    with FileLock(shared / "builtin-conversion.lock"):
        convert_gguf(BUILTIN_MODELS[DEFAULT_TARGET].path())
    return cache_root()


@pytest.fixture
def set_cost_curve(monkeypatch) -> None:
    """The auto schedule plans with a set cost curve of its target, one where drafts pay (a verify of
    16 tokens costs 1.2 steps), rather than one measured (seconds a target): for tests of what the
    schedule's choices keep, not of the choices."""
    from specdeck.engine.planner.costs import CostCurve

    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 10.2, 10.5, 11.0, 12.0))
    monkeypatch.setattr("specdeck.engine.loop.schedule.cost_curve", lambda model, *args, **kwargs: curve)


@pytest.fixture(scope="session")
def requantized_builtin(tmp_path_factory):
    """The built-in file requantized by llama.cpp's own quantizer to a file type ("Q4_K_M", "Q6_K",
    ...; "Q4_1" is the file itself): each made once for all test processes, as `builtin_conversion`;
    skipped without llama-cpp-python."""
    from filelock import FileLock

    from specdeck.engine.forward.llamacpp_backend import library
    from specdeck.engine.forward.llamacpp_quantize import quantize

    if library() is None:
        pytest.skip("llama-cpp-python is not installed (`make` builds it)")
    source = BUILTIN_MODELS[DEFAULT_TARGET].path()
    shared = tmp_path_factory.getbasetemp().parent / "requantized"
    shared.mkdir(exist_ok=True)

    def file(file_type: str) -> Path:
        if file_type == "Q4_1":
            return source
        path = shared / f"SmolLM2-135M-Instruct.{file_type}.gguf"
        with FileLock(shared / f"{file_type}.lock"):
            return path if path.is_file() else quantize(source, path, file_type)

    return file
