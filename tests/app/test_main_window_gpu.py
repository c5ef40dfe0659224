"""The window on the GPU: Compare's greedy runs agree, and running out of GPU memory leaves it
usable. What needs a real GPU is in the GPU set (`pytest -m cuda`, skipped with the reason where
there is none); what the window does with a GPU's out-of-memory error runs everywhere, the error
raised as CUDA's allocator raises it."""

from __future__ import annotations

import pytest
import torch

TIMEOUT_MS = 120_000


def _run(qtbot, window, button) -> None:
    button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=TIMEOUT_MS)


@pytest.fixture
def gpu_window(window, device):
    """The window set to load its tiny pair on the GPU in float32."""
    window.model_panel.device.setCurrentText(device.type)
    window.model_panel.dtype.setCurrentText("float32")
    return window


@pytest.mark.cuda
def test_compare_on_the_gpu_marks_greedy_runs_identical(qtbot, gpu_window, errors, device):
    """Compare on the GPU: the speculative and the plain greedy text are the same, and the window says so."""
    _run(qtbot, gpu_window, gpu_window.compare_button)
    assert errors == []
    assert gpu_window.session_model.pair.device.startswith(device.type)
    speculative, plain = gpu_window.session_model.records
    assert (speculative.mode, plain.mode) == ("speculative", "plain")
    assert speculative.summary.new_tokens > 0
    assert speculative.summary.text == plain.summary.text
    assert gpu_window.session_model.identical is True
    assert "greedy outputs identical" in gpu_window.verdict.text()


def _out_of_memory_once(monkeypatch, run_out) -> list[int]:
    """The next session runs out of GPU memory through `run_out()`; the sessions after it run."""
    from specdeck.engine import session as engine_session

    real_generate, calls = engine_session.generate, []

    def too_big_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            run_out()
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(engine_session, "generate", too_big_once)
    return calls


def test_running_out_of_gpu_memory_says_what_to_try_and_the_next_run_completes(qtbot, window, errors, monkeypatch):
    """A session that runs out of GPU memory shows one error saying what to try, and the next run
    on the same resident pair completes (the error raised as CUDA's allocator raises it)."""

    def run_out():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 280.00 GiB.")

    _out_of_memory_once(monkeypatch, run_out)
    _run(qtbot, window, window.model_panel.load_button)
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1 and errors[0][1].startswith("Out of memory on the GPU.")
    assert window.idle and window.run_button.isEnabled()
    _run(qtbot, window, window.run_button)
    assert len(errors) == 1 and window.session_model.records[-1].summary.new_tokens > 0


@pytest.mark.cuda
def test_running_out_of_gpu_memory_gives_the_memory_back(qtbot, gpu_window, errors, cuda, monkeypatch):
    """A session that asks the GPU for more than it has (a real CUDA allocation) gives back the
    memory it held, and the next run on the GPU completes."""

    def run_out():
        torch.empty(2 * torch.cuda.get_device_properties(cuda).total_memory, dtype=torch.uint8, device=cuda)

    _out_of_memory_once(monkeypatch, run_out)
    _run(qtbot, gpu_window, gpu_window.model_panel.load_button)
    held = torch.cuda.memory_allocated(cuda)
    _run(qtbot, gpu_window, gpu_window.run_button)
    assert len(errors) == 1 and errors[0][1].startswith("Out of memory on the GPU.")
    assert torch.cuda.memory_allocated(cuda) == held
    _run(qtbot, gpu_window, gpu_window.run_button)
    assert len(errors) == 1 and gpu_window.session_model.records[-1].summary.new_tokens > 0
