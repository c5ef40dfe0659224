"""Memory: giving it back when weights are replaced or a model is dropped, and saying what to try
when a device runs out of it.

Freed tensors do not leave the process by themselves: PyTorch's CUDA caching allocator keeps its
blocks for reuse (other programs, and `nvidia-smi`, see them taken) until `empty_cache`, and
glibc's heap keeps freed pages below its top until `malloc_trim`. Reference cycles among a dropped
model's modules wait for the garbage collector.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

import torch

TRY_INSTEAD = (
    "Try a smaller dtype (bfloat16 or float16), a shorter context (a shorter prompt or fewer new "
    "tokens), a smaller model, or the CPU (--device cpu)."
)


def give_back(collect: bool = True) -> None:
    """Collect garbage (unless the caller just did), then return what was freed to the system: the
    CUDA cache where this process has used CUDA, the C heap's free pages everywhere."""
    if collect:
        gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    trim_heap()


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    library = ctypes.CDLL(name) if name else None
    return getattr(library, "malloc_trim", None)


def trim_heap() -> None:
    """Return the C heap's free pages to the system where the C library is glibc (else nothing)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a device or the host running out of memory."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    )


def out_of_memory_message(error: BaseException) -> str:
    """What ran out and what to try, for a user who saw a session or a load fail."""
    where = "the GPU" if isinstance(error, torch.OutOfMemoryError) else "this machine"
    if "mps" in str(error).lower():
        where = "the Apple GPU (MPS)"
    return f"Out of memory on {where}. {TRY_INSTEAD}"
