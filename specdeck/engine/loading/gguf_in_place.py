"""A GGUF model built on its file's own blocks: no float32 copy written, none held.

Where the row kernel reads every large matrix of a file
(`specdeck.engine.forward.row_kernel.QUANTIZED`) the products run on the file's blocks anyway
(`specdeck.engine.forward.gguf_blocks`), so dequantizing the file into a float32 folder first
(`specdeck.engine.loading.gguf_conversion`: 540 MB and about 20 s for the built-in 135M model, 6.8
GB for a 1.7B one) only costs time and disk. Here the model is built from the file's metadata
(transformers reads a GGUF file's config), its small tensors (norms, biases) are dequantized as
transformers' GGUF loader dequantizes them, and each large matrix is left a placeholder of its
shape whose product the lean forward takes straight from the memory-mapped blocks. The token
embedding stays in the file's blocks too (`specdeck.engine.forward.token_rows`): a lookup
dequantizes the rows it reads (a float32 table would be 400 MB for a 1.7B model), and a tied output
layer multiplies on those blocks.

llama.cpp's converter reorders the query and key rows of Llama models for its rotary; transformers'
loader puts them back (its `TensorProcessor`). The same processor, run on row numbers instead of
weights, gives the order in which the products take the file's rows: the in-place model's logits
are the converted model's, bit for bit. Hugging Face's own forward (the benchmark's `generate()`)
brings the float32 matrices back from the blocks the first time it runs (`specdeck.engine.forward.lean_weights`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from specdeck.engine.atomic import write_text
from specdeck.engine.errors import unreadable_gguf
from specdeck.engine.forward import gguf_blocks, kernel_build
from specdeck.engine.forward.gguf_index import config_path, tensors_of, tensors_only_reader
from specdeck.engine.forward.row_kernel import QuantizedLinear, QuantizedParts
from specdeck.engine.forward.token_rows import BlockEmbedding, TokenRows

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Progress = Callable[[str], None]
log = logging.getLogger(__name__)


EMBEDDING = "token_embd.weight"  # the token embedding's name in a GGUF file


class InPlaceRefused(Exception):
    """The file cannot be read in place after all (the loader converts it instead); says why."""


def kinds_in_words(counts: dict[str, int]) -> str:
    """{"Q4_K": 24, "Q6_K": 6} as "24 Q4_K, 6 Q6_K"."""
    return ", ".join(f"{count} {kind}" for kind, count in counts.items())


def refusal(path: Path, device: torch.device, dtype: str, progress: Progress | None = None) -> str | None:
    """None where `load_in_place` reads `path`'s matrices in place here, else why not, in words."""
    if device.type != "cpu":
        return f"the model runs on {device.type}, and the row kernel on the CPU"
    if dtype not in ("auto", "float32"):
        return f"--dtype {dtype} asks for {dtype} weights"
    if gguf_blocks.blocks_off():
        return "SPECDECK_GGUF_BLOCKS=off keeps every product on float32 weights"
    forced = os.environ.get("SPECDECK_LINEAR", "").strip().lower()
    if forced not in ("", "kernel"):
        return f"SPECDECK_LINEAR={forced} takes the products off the row kernel"
    built = kernel_build.library(progress)
    if isinstance(built, str):
        return f"the row kernel does not run here ({built})"
    try:
        kinds = gguf_blocks.matrix_kinds(path)
    except Exception as error:  # gguf's reader raises many types on a damaged file: the conversion names it
        return f"its tensors do not read ({type(error).__name__})"
    if not kinds:
        return "it holds no decoder matrices by llama.cpp's names"
    unread = gguf_blocks.unread_kinds(kinds)
    if unread:
        return f"the row kernel does not read its {kinds_in_words(unread)} matrices"
    return None


def load_in_place(path: Path, progress: Progress | None = None) -> PreTrainedModel:
    """The model of the GGUF file `path`, float32 on the CPU, its large matrices the file's blocks
    (`refusal` said None); an `InPlaceRefused` where its layout is not one this reads."""
    from accelerate import init_empty_weights  # type: ignore[import-untyped]
    from gguf import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    from specdeck.engine.forward.lean_weights import weights_of
    from specdeck.engine.forward.llama_families import supports

    if progress:
        progress(f"Reading {path.name} in place (its blocks run on the row kernel; nothing is converted)")
    config = _config(path)
    # parameters on the meta device: no memory; and no random initialisation of them (a third of a
    # second of meta-tensor calls for the 135M model), since every one is assigned below
    with init_empty_weights(include_buffers=False), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor = TENSOR_PROCESSORS.get(config.model_type, TensorProcessor)(config=config.to_dict())
    hf_names = _names(model)
    matrices = gguf_blocks.matrix_kinds(path)
    state: dict[str, torch.Tensor] = {}
    rows: dict[str, np.ndarray] = {}
    embedding: TokenRows | None = None
    for name, tensor in tensors_of(path).items():
        if name not in hf_names:
            continue  # as transformers' loader skips it
        if name in matrices or name == EMBEDDING:
            count, width = tensor.shape[::-1]  # gguf lists dimensions innermost first
            # the converter's row order undone on row numbers: row i of the model is the file's rows[name][i]
            order = processor.process(weights=np.arange(count).reshape(count, 1), name=name).weights
            rows[name] = np.asarray(order, dtype=np.int64).reshape(count)
            state[hf_names[name]] = torch.zeros((), dtype=torch.float32).expand(count, width)
            if name == EMBEDDING:
                same = np.array_equal(rows[name], np.arange(count))
                embedding = TokenRows(tensor, None if same else rows[name])
        else:
            weights = processor.process(weights=dequantize(np.asarray(tensor.data), tensor.tensor_type), name=name)
            state[hf_names[name]] = torch.from_numpy(np.copy(weights.weights)).to(torch.float32)
    model.load_state_dict(state, strict=False, assign=True)
    if embedding is not None:  # lookups on the file's blocks; a tied output layer takes its weight
        model.set_input_embeddings(BlockEmbedding(embedding))
    model.tie_weights()
    missing = [name for name, param in model.named_parameters() if param.is_meta]
    if missing:
        raise InPlaceRefused(f"the file has no tensor for {missing[0]}")
    if not supports(model):
        raise InPlaceRefused(f"the lean forward does not run this {config.model_type} model")
    model.eval()
    gguf_blocks.remember(model, path, rows=rows)
    lean = weights_of(model)  # the placeholders released to the products now, their values kept in blocks
    products = [p for layer in lean.layers for p in (layer.qkv, layer.out, layer.gate_up, layer.down)]
    if "output.weight" in matrices:  # a tied output layer multiplies the real embedding
        products.append(lean.output)
    if not all(isinstance(p, QuantizedLinear | QuantizedParts) for p in products):
        raise InPlaceRefused("a product did not take the file's blocks")
    return model


def _config(path: Path):
    """The model config in the file's metadata, as transformers reads it: read once (gguf-py parses
    every field, a tokenizer's tens of thousands of strings included: seconds) and kept beside the
    file's tensor index."""
    from transformers import AutoConfig

    kept = config_path(path)
    try:
        fields = json.loads(kept.read_text(encoding="utf-8"))
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    try:
        config = _parsed_config(path)
    except Exception as error:  # the gguf reader raises many types on a damaged file
        raise unreadable_gguf(path, error) from error
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # what runs is said by the products, not by a quantizer
    try:  # a cache that cannot be written only costs the next load the parse
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_text(kept, config.to_json_string(use_diff=True))
    except Exception as error:
        log.info("the config of %s was not kept: %s", path, error)
    return config


def _parsed_config(path: Path):
    """transformers' config of the file, parsed with the tensor index's reader, which steps over
    arrays (`gguf_index`: a tokenizer's 100k strings, each parsed on its own, are 4 of the 4.4 s a
    first launch took to read the built-in model's config), or in full where the config drew on an
    array: a field left an empty list, or a vocabulary size (counted from the tokenizer's strings
    where the file does not state it) other than the token embedding's rows."""
    import gguf
    from transformers import AutoConfig

    whole = gguf.GGUFReader  # transformers' reader of a Llama file's config imports it at each call
    gguf.GGUFReader = tensors_only_reader()  # type: ignore[misc]
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    finally:
        gguf.GGUFReader = whole  # type: ignore[misc]
    embedding = tensors_of(path).get(EMBEDDING)
    rows = embedding.shape[-1] if embedding is not None else None
    drew_on_an_array = any(isinstance(value, list) and not value for value in config.to_dict().values())
    if getattr(config, "vocab_size", None) == rows and not drew_on_an_array:
        return config
    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


def _names(model: PreTrainedModel) -> dict[str, str]:
    """Each of the model's parameters by its name in a GGUF file (gguf-py's table, as transformers
    reads a file; built once here, where transformers builds it once a submodule)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == model.config.model_type), None)
    if arch is None:
        raise InPlaceRefused(f"gguf-py does not name the tensors of {model.config.model_type} models")
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict():
        stem, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(stem)
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names
