"""Which backend runs a model: torch (every model) or llama.cpp (`.gguf` files, where
llama-cpp-python is installed; `specdeck.engine.forward.llamacpp_backend`).

`auto` goes by what would run the file on torch. Where the row kernel builds and reads the block
types of all of the file's large matrices (`specdeck.engine.forward.row_kernel.QUANTIZED`), torch
reads the file in place (`specdeck.engine.loading.gguf_in_place`) and its step beats llama.cpp's:
auto takes torch unmeasured, if the file fits in memory about three times over (the mapping, the
products' packed blocks, the rest). Else torch would run float32 weights, or some of them, and auto
picks llama.cpp for a GGUF file when it measures faster on this machine: one-token forwards (a plain
decoding step) after a short context on both backends, with the threads torch uses. The verdict is
saved with the measured costs (`specdeck cache --clear` forgets it), so the measurement runs once
per file, machine and thread count. A model that would not fit in memory dequantized for torch goes
to llama.cpp unmeasured. llama.cpp is timed in a child process: a build that crashes on this CPU (a
native fault, which no Python code survives) ends the child alone, and the file runs on torch, with
the reason said and saved. Whichever it takes, auto says why in one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.registry import BACKENDS, gguf_file

STEPS = 12  # timed one-token forwards per backend (their median counts)
CONTEXT = 64  # cached tokens before them

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


_told_missing = False


def llama_cpp_installed(progress: Progress | None = None) -> bool:
    """Whether llama-cpp-python imports here; where it does not, say so once per process."""
    from specdeck.engine.forward.llamacpp_backend import library

    global _told_missing
    if library() is not None:
        return True
    if not _told_missing:
        _told_missing = True
        notice = (
            "llama-cpp-python is not installed, so GGUF files run on torch (dequantized to float32): "
            "`make` installs it, or `pip install llama-cpp-python`"
        )
        (progress or log.warning)(notice)
    return False


def choose_backend(
    name: str,
    requested: str,
    device: torch.device,
    dtype: str,
    progress: Progress | None = None,
    load_on_torch: Callable[[str, Progress | None], object] | None = None,
) -> str:
    """ "torch" or "llama.cpp" for the model `name`, as `requested` (auto, torch or llama.cpp) allows;
    a request llama.cpp cannot serve is a `SpecDeckError` that says why. `load_on_torch(name,
    progress)` loads the model on torch where auto must time both (the loader passes itself, so
    that choosing a backend does not import loading)."""
    if requested not in BACKENDS:
        raise SpecDeckError(f"Unknown backend {requested!r}: use {', '.join(BACKENDS)}.")
    if requested == "torch":
        return "torch"
    path = gguf_file(name)
    if requested == "llama.cpp":
        if path is None:
            raise SpecDeckError(
                f"The llama.cpp backend runs .gguf files, and {name} is not one: use --backend torch or auto."
            )
        if device.type != "cpu":
            raise SpecDeckError(
                f"The llama.cpp backend runs on the CPU here, not on {device.type}: "
                "use --device cpu, or --backend torch."
            )
        if dtype not in ("auto", "float32"):
            raise SpecDeckError(
                f"--dtype {dtype} applies to torch: llama.cpp runs the file's own quantized weights. "
                "Drop --dtype, or use --backend torch."
            )
        if not llama_cpp_installed(progress):
            raise SpecDeckError(
                "The llama.cpp backend needs llama-cpp-python, which is not installed: "
                "`pip install llama-cpp-python` (it builds llama.cpp, about 12 minutes on 2 cores), "
                "or use --backend torch."
            )
        return "llama.cpp"
    if path is None or device.type != "cpu" or dtype not in ("auto", "float32"):
        return "torch"
    say = progress or log.info
    why = kernel_refusal(path, progress)
    if why is None:
        say(f"Backend auto: torch, where every large matrix of {path.name} runs as its own blocks on the row kernel")
        return "torch"
    if not llama_cpp_installed(progress):
        say(f"Backend auto: torch (float32), since {why} and llama.cpp is not installed")
        return "torch"
    verdict = step_verdict(name, path, progress, load_on_torch)
    if verdict is None:
        say(f"Backend auto: torch (float32), since {why}")
        return "torch"
    chosen = "llama.cpp" if verdict["llama.cpp"] < verdict["torch"] else "torch"
    steps = " and ".join(
        f"{ms:.1f} ms on {backend}" if ms < float("inf") else f"none on {backend}" for backend, ms in verdict.items()
    )
    say(f"Backend auto: {chosen}, since {why}, and a step measured {steps}")
    return chosen


def blocks_on_row_kernel(path: Path, progress: Progress | None = None) -> bool:
    """Whether torch runs every large matrix of `path` as its own blocks on SpecDeck's row kernel
    here (`kernel_refusal`)."""
    return kernel_refusal(path, progress) is None


def kernel_refusal(path: Path, progress: Progress | None = None) -> str | None:
    """None where torch reads `path` in place, every large matrix its own blocks on SpecDeck's row
    kernel, whose plain step beats llama.cpp's on the same file, so that auto need not time
    llama.cpp (seconds of a first load); else why not, in words: the blocks are off, the kernel
    does not build (a build under way is not waited for: it goes by whether it can), it does not
    read some of the file's block types (how many matrices it does read, said), or the file does
    not fit about three times in the memory available."""
    from specdeck.engine.forward import kernel_build
    from specdeck.engine.forward.gguf_blocks import blocks_off, matrix_kinds, unread_kinds
    from specdeck.engine.loading.preflight import available_memory

    if blocks_off():
        return "SPECDECK_GGUF_BLOCKS=off keeps torch's products on float32 weights"
    if kernel_build.building():  # not waited for here: the load goes on beside the build
        if (reason := kernel_build.buildable()) is not None:
            return f"the row kernel does not build here ({reason})"
    elif isinstance(built := kernel_build.library(progress), str):
        return f"the row kernel does not build here ({built})"
    try:
        kinds = matrix_kinds(path)
    except Exception as error:  # gguf's reader raises many types on a damaged file
        return f"the tensors of {path.name} do not read ({type(error).__name__})"
    unread = unread_kinds(kinds)
    if unread or not kinds:
        types = ", ".join(f"{count} {kind}" for kind, count in unread.items())
        read = len(kinds) - sum(unread.values())
        return f"the row kernel reads {read} of the {len(kinds)} large matrices of {path.name} (not {types or 'any'})"
    memory = available_memory()
    size = path.stat().st_size
    if memory is None or 3 * size > memory:
        free = "an unknown amount" if memory is None else f"{memory / 1e9:.1f} GB"
        return f"{path.name} read in place takes about {3 * size / 1e9:.1f} GB, and {free} is free"
    return None


def llama_cpp_faster(
    name: str,
    path: Path,
    progress: Progress | None = None,
    load_on_torch: Callable[[str, Progress | None], object] | None = None,
) -> bool:
    """Whether a plain step of `path` is faster on llama.cpp than on torch here (`step_verdict`)."""
    verdict = step_verdict(name, path, progress, load_on_torch)
    return verdict is not None and verdict["llama.cpp"] < verdict["torch"]


def step_verdict(
    name: str,
    path: Path,
    progress: Progress | None = None,
    load_on_torch: Callable[[str, Progress | None], object] | None = None,
) -> dict[str, float] | None:
    """The milliseconds of a plain step of `path` on llama.cpp and on torch here, by backend
    (measured once, then saved); torch's step is timed on the model `load_on_torch` loads. None
    where none is given and none was saved, or llama.cpp cannot read the file."""
    from specdeck.engine.atomic import write_text
    from specdeck.engine.cache import costs_cache, machine_name
    from specdeck.engine.forward.gguf_blocks import activations
    from specdeck.engine.forward.llamacpp_backend import library

    stat = path.stat()
    key = "\n".join(
        [
            str(path.resolve()),
            str(stat.st_size),
            str(stat.st_mtime_ns),
            machine_name(),
            str(torch.get_num_threads()),
            torch.__version__,
            library().__version__,
            # torch's step as timed: on the file's blocks with each layer one kernel call (since 2026-11-25)
            f"torch: GGUF blocks {os.environ.get('SPECDECK_GGUF_BLOCKS', 'on')} rows in {activations()}, "
            f"fused layers {os.environ.get('SPECDECK_FUSED_LAYERS', '1')}",
        ]
    )
    saved = costs_cache() / f"backend-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    try:
        verdict = json.loads(saved.read_text(encoding="utf-8"))
        if "crash" in verdict:
            (progress or log.warning)(verdict["crash"])
        return {backend: float(verdict[backend]) for backend in ("llama.cpp", "torch")}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if load_on_torch is None:  # nothing to time torch's step on: stay on torch, decide nothing
        return None
    if progress:
        progress(f"Timing {name} on llama.cpp and on torch (once on this machine)")
    try:
        verdict = {"llama.cpp": _llama_cpp_step_ms(path)}
    except LlamaCppCrashed as crash:  # saved as never faster, so it is not tried again
        (progress or log.warning)(str(crash))
        verdict = {"llama.cpp": float("inf"), "crash": str(crash)}
    except SpecDeckError:  # a file llama.cpp cannot read: torch's loader says what is wrong with it
        return None
    verdict["torch"] = _torch_step_ms(name, progress, load_on_torch)
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        write_text(saved, json.dumps(verdict))
    except (OSError, SpecDeckError) as error:
        log.warning("could not save the backend timing to %s (%s)", saved, error)
    return {backend: verdict[backend] for backend in ("llama.cpp", "torch")}


class LlamaCppCrashed(SpecDeckError):
    """llama.cpp ended the process that ran it (a native fault) on this machine."""


# The child that times llama.cpp: the file and the thread count in, the milliseconds out (last line),
# a SpecDeckError's message on stderr with exit status 2.
_CHILD = """
import gc, sys, torch
from specdeck.engine.loading.backends import llama_cpp_step_ms_here
from specdeck.engine.errors import SpecDeckError
torch.set_num_threads(int(sys.argv[2]))
try:
    print(llama_cpp_step_ms_here(sys.argv[1]))
except SpecDeckError as error:
    sys.exit(f"SpecDeckError: {error}")
finally:
    gc.freeze()  # the exit then skips collecting among torch's objects, which the load would wait for
"""
_SAID = "SpecDeckError: "


def _llama_cpp_step_ms(path: Path) -> float:
    """A llama.cpp plain step's milliseconds on `path`, timed in a child process (see the module's
    docstring): a `LlamaCppCrashed` where llama.cpp ended it, a `SpecDeckError` where it could not
    run the file. A frozen bundle has no Python to start a child with: it times in this process."""
    if getattr(sys, "frozen", False):
        return llama_cpp_step_ms_here(str(path))
    try:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path), str(torch.get_num_threads())],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SpecDeckError(f"llama.cpp could not be timed on {path.name}: {error}") from error
    if child.returncode < 0:
        raise LlamaCppCrashed(
            f"llama.cpp crashed on this machine running {path.name} (signal {-child.returncode}), so it runs "
            "on torch. Rebuilding llama-cpp-python for this CPU may mend it; `specdeck cache --clear` "
            "times it again."
        )
    said = [line.removeprefix(_SAID) for line in child.stderr.splitlines() if line.startswith(_SAID)]
    if child.returncode != 0 or not child.stdout.strip():
        raise SpecDeckError(
            said[-1] if said else f"llama.cpp could not be timed on {path.name} (exit status {child.returncode})."
        )
    return float(child.stdout.strip().splitlines()[-1])


def llama_cpp_step_ms_here(path: str) -> float:
    """A llama.cpp plain step's milliseconds on the file at `path`, in this process."""
    from specdeck.engine.forward.llamacpp_backend import LlamaCppForward, LlamaCppModel

    model = LlamaCppModel(Path(path))
    return _step_ms(LlamaCppForward(model), model.vocab_width)


def _torch_step_ms(
    name: str, progress: Progress | None, load_on_torch: Callable[[str, Progress | None], object]
) -> float:
    """A torch plain step's milliseconds, or infinity where the dequantized model would not fit in memory."""
    from specdeck.engine.forward.kvcache import CachedModel

    try:
        loaded: Any = load_on_torch(name, progress)
    except SpecDeckError:  # too large for this machine's memory, or unreadable to torch
        return float("inf")
    return _step_ms(CachedModel(loaded.model).backend, loaded.vocab_width)


@torch.inference_mode()
def _step_ms(backend, vocab: int) -> float:
    """The median milliseconds of STEPS one-token forwards after CONTEXT cached tokens (two untimed first)."""
    ids = torch.tensor([(7 * i + 3) % vocab for i in range(CONTEXT + STEPS + 2)])
    backend.logits(ids[:CONTEXT], last_only=True)
    times = []
    for i in range(CONTEXT, CONTEXT + STEPS + 2):
        started = time.perf_counter()
        backend.logits(ids[i : i + 1], last_only=False)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[2:])
