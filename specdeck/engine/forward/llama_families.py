"""Which Hugging Face models the lean Llama forward (`specdeck.engine.forward.llama_forward`) reproduces exactly.

A model runs on the lean forward only where it needs nothing the forward leaves out: a decoder of
one of `FAMILIES`, a rotary whose frequencies are fixed when the model loads, the SiLU activation,
attention that is full or a sliding window in each layer, biases the fused products can share, on
the CPU or a CUDA GPU. Any other model runs on Hugging Face's own forward, so every model's logits
are Hugging Face's whichever forward runs it.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel

from specdeck.engine.forward.hf_parts import output_projection

FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})  # Hugging Face `model_type`s this forward reproduces
# Rotary variants whose frequencies are fixed when the model loads ("dynamic" and "longrope"
# change them with the sequence length, which this forward does not follow).
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def supports(model: PreTrainedModel) -> bool:
    """Whether `LlamaForward` reproduces this model's forward (a decoder of `FAMILIES`, with or
    without its output layer)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in FAMILIES:
        return False
    base: Any = getattr(model, "base_model", None)  # a Hugging Face decoder, read by its submodules' names
    if not all(hasattr(base, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if base is not model:
        head = output_projection(model)
        if head is None or getattr(head, "bias", None) is not None:
            return False
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    device = next(model.parameters()).device
    return (
        rope_type in STATIC_ROPE_TYPES
        and config.hidden_act == "silu"
        and attention_windows(config) is not None
        and all(_biases_alike(layer) for layer in base.layers)
        and device.type in ("cpu", "cuda")
    )


def _biases_alike(layer: Any) -> bool:
    """Whether the products fused together either all have a bias or none has."""
    attn, mlp = layer.self_attn, layer.mlp
    return all(
        len({m.bias is None for m in group}) == 1
        for group in ([attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj])
    )


def attention_windows(config) -> list[int | None] | None:
    """Each layer's sliding window (None: it attends to every position), or None where a layer's
    attention is of a kind this forward does not reproduce."""
    layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if config.model_type == "llama":
        return [None] * layers
    if config.model_type == "mistral":  # Mistral's forward gives every layer the same window
        return [window] * layers
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * layers
    if any(kind not in ("full_attention", "sliding_attention") for kind in kinds) or (
        "sliding_attention" in kinds and not window
    ):
        return None
    return [window if kind == "sliding_attention" else None for kind in kinds]
