"""Checks of a model folder before anything is allocated: a damaged or inconsistent config, and a
model that would not fit in the memory this machine has free, are refused with the file, the field
and what to do, instead of a traceback from deep inside torch (or the machine swapping)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from specdeck.engine.bounded import read_json
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
# the config fields of the layer count and of the hidden size (Llama / GPT-2 names)
LAYER_FIELDS = ("num_hidden_layers", "n_layer")
HIDDEN_FIELDS = ("hidden_size", "n_embd")
EMBEDDINGS = ("embed_tokens.weight", "wte.weight")  # (vocabulary, hidden size)
_LAYER = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")  # model.layers.3.mlp..., transformer.h.3.attn...
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
    _check_layers(config_path, config, shapes)
    if device.type == "cpu" and stored:
        _check_memory(name, stored, dtype)


def _check_layers(config_path: Path, config: dict, shapes: dict[str, list[int]]) -> None:
    """Refuse a config that claims more or fewer layers, or another hidden size, than the weights
    hold: transformers would fill missing layers with random weights and run them."""
    if not shapes:
        return
    layers = {int(found.group(1)) for key in shapes if (found := _LAYER.search(key))}
    claimed = next((config[field] for field in LAYER_FIELDS if field in config), None)
    if layers and claimed is not None and claimed != max(layers) + 1:
        raise SpecDeckError(
            f"{config_path}: the config says {claimed} layers, but the weights hold {max(layers) + 1}. "
            "The config does not belong to these weights: restore the model's own config.json."
        )
    hidden = next((config[field] for field in HIDDEN_FIELDS if field in config), None)
    for tensor, shape in shapes.items():
        if hidden is not None and tensor.endswith(EMBEDDINGS) and len(shape) == 2 and shape[1] != hidden:
            raise SpecDeckError(
                f"{config_path}: the hidden size is {hidden}, but the weights' {tensor} has {shape[1]} "
                "columns. The config does not belong to these weights: restore the model's own config.json."
            )


def _read_config(path: Path) -> dict:
    try:
        config = read_json(path, "The model config")
    except (SpecDeckError, ValueError) as error:  # UnicodeDecodeError is a ValueError
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
        except (SafetensorError, OSError) as error:
            raise SpecDeckError(
                f"{path} cannot be read as safetensors weights ({error}): the file is damaged or was "
                "not downloaded whole. Download the model again."
            ) from error
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
