"""Which device a model runs on and in which dtype: the one the user named, checked against what
this machine has, or for `auto` the best one here (a GPU before the CPU; a half dtype only where
the GPU computes it, since its rounding makes speculative text part from plain text more often).
"""

from __future__ import annotations

import torch

from specdeck.engine.errors import SpecDeckError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise SpecDeckError(f"Unknown device {name!r}: use auto, cpu, cuda or mps.") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecDeckError("CUDA was asked for, but this torch build sees no CUDA GPU: use --device cpu or auto.")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise SpecDeckError(
            f"{name} was asked for, but this machine has {count} CUDA GPU{'s' if count > 1 else ''} "
            f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}): pick one of those."
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise SpecDeckError("MPS was asked for, but it is not available here: use --device cpu or auto.")
    return device


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 in hardware: a CUDA GPU of compute capability 8.0 or later
    (Ampere on), asked of that GPU, not of the current one (older GPUs only emulate it, slowly)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on GPUs that compute it natively (`native_bfloat16`), float16 on other GPUs,
    float32 on the CPU. In a half dtype a verify over several tokens and a one-token step round
    differently, so near-tied tokens can differ between speculative and plain text; float32 is the
    exact setting (`specdeck bench` names the near-tie where two texts part).

    On the CPU float32 is chosen by measurement: bfloat16 helped only long verifies, slowed plain
    decoding, and its rounding makes greedy ties between batched verify and one-token decoding far
    more common, so speculative text would stop matching plain text.
    """
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if native_bfloat16(device) else torch.float16
        if device.type == "mps":
            return torch.float16
        return torch.float32
    if name not in _DTYPES:
        raise SpecDeckError(f"Unknown dtype {name!r}: use auto, {', '.join(_DTYPES)}.")
    return _DTYPES[name]
