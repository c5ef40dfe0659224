"""GGUF files requantized by llama.cpp's own quantizer (`llama_model_quantize`), for the files users
download in other block types than the built-in one: the tests of every block type and the size
ladder (`specdeck.bench.size_ladder`) make theirs with it, with no hub at hand.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.llamacpp_backend import library

FILE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")  # llama.cpp's LLAMA_FTYPE_MOSTLY_*


def quantize(source: Path, target: Path, file_type: str) -> Path:
    """`source` requantized to `file_type` (one of FILE_TYPES) at `target`, written whole or not at
    all. Requantizing an already quantized file is allowed: its text stays the source's."""
    llama = library()
    if llama is None:
        raise SpecDeckError("Quantizing a GGUF file needs llama-cpp-python, which is not installed (`make` builds it).")
    if file_type not in FILE_TYPES:
        raise SpecDeckError(f"llama.cpp quantizes to {', '.join(FILE_TYPES)}, not {file_type}.")
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.allow_requantize = True
    params.nthread = torch.get_num_threads()

    def save(partial: Path) -> None:
        code = llama.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
        if code != 0:
            raise SpecDeckError(f"llama.cpp could not quantize {source} to {file_type} (code {code}).")

    write_with(target, save)
    return target
