"""Checks of a model folder before anything is allocated: a damaged or inconsistent config, and a
model that would not fit in the memory this machine has free, are refused with the file, the field
and what to do, instead of a traceback from deep inside torch (or the machine swapping)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdeck.engine.errors import SpecDeckError

# config fields that must be positive whole numbers where a config has them (Llama / GPT-2 names)
POSITIVE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "n_embd",
    "num_hidden_layers",
    "n_layer",
    "num_attention_heads",
    "n_head",
    "max_position_embeddings",
    "n_positions",
    "intermediate_size",
)
# weights whose first dimension a config field fixes
SHAPED_BY = {
    "vocab_size": ("embed_tokens.weight", "wte.weight"),
    "max_position_embeddings": ("embed_positions.weight", "wpe.weight"),
    "n_positions": ("wpe.weight",),
}
HEADROOM = 1.2  # the weights plus activations, caches and the libraries' own copies


def check_model_folder(folder: Path, name: str, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a folder whose config.json is damaged or disagrees with its weights, or whose weights
    need more memory than is free; silent where there is nothing to check (a hub id not on disk)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        return
    config = _read_config(config_path)
    for field in POSITIVE_FIELDS:
        value = config.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise SpecDeckError(
                f"{config_path}: {field} is {value!r}, but it must be a positive whole number. "
                "The file is damaged or was edited by hand: restore it from the model's source."
            )
    shapes, stored = _weights(folder)
    for field, suffixes in SHAPED_BY.items():
        if field not in config:
            continue
        for tensor, shape in shapes.items():
            if tensor.endswith(suffixes) and shape and shape[0] != config[field]:
                raise SpecDeckError(
                    f"{config_path}: {field} is {config[field]}, but the weights' {tensor} has "
                    f"{shape[0]} rows. The config does not belong to these weights: restore the "
                    "model's own config.json."
                )
    if device.type == "cpu" and stored:
        _check_memory(name, stored, dtype)


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise SpecDeckError(f"{path} cannot be read as a model config ({error}): the file is damaged.") from error
    if not isinstance(config, dict):
        raise SpecDeckError(f"{path} is not a model config (it holds a {type(config).__name__}, not a JSON object).")
    return config


def _weights(folder: Path) -> tuple[dict[str, list[int]], int]:
    """Every tensor's shape from the safetensors headers (no weight is read), and their element count."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as weights:
                for key in weights.keys():
                    shapes[key] = list(weights.get_slice(key).get_shape())
        except (SafetensorError, OSError):
            continue  # the loader says what is wrong with a damaged file
    elements = sum(_count(shape) for shape in shapes.values())
    return shapes, elements


def _count(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def _check_memory(name: str, elements: int, dtype: torch.dtype) -> None:
    needed = elements * torch.finfo(dtype).bits // 8 * HEADROOM
    free = available_memory()
    if free is not None and needed > free:
        smaller = " or a smaller dtype (--dtype bfloat16 halves it)" if dtype == torch.float32 else ""
        raise SpecDeckError(
            f"{name} needs about {needed / 1e9:.1f} GB of memory in {str(dtype).removeprefix('torch.')}, "
            f"and {free / 1e9:.1f} GB are free: close other programs, or choose a smaller model"
            f"{smaller}."
        )


def available_memory() -> int | None:
    """Bytes of memory the system can give now (Linux MemAvailable), or None where it cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
