"""The draft's shape: a small Llama that shares the target's vocabulary and embedding space.

It is a plain `LlamaForCausalLM`, so every drafter and Hugging Face's assisted generation load it
unchanged. Its tied embedding starts as the target's embedding projected on the target
embedding's top principal directions (PCA via the eigenvectors of E^T E): token i's row is
E_i V, so the draft starts out already knowing which tokens are alike, and with the embedding
frozen its logits h V^T E^T are the target's own output layer seen through a rank-`hidden` lens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdeck.engine.forward.hf_parts import input_embedding
from specdeck.engine.forward.lean_weights import embedding_weight
from specdeck.engine.loading.models import LoadedModel


@dataclass(frozen=True)
class DraftShape:
    hidden: int = 256
    layers: int = 2
    intermediate: int = 768
    head_dim: int = 64


def pca_embedding(target_embedding: torch.Tensor, width: int) -> torch.Tensor:
    """The rows of E projected on E's `width` leading principal directions (uncentred)."""
    e = target_embedding.detach().float()
    _, eigenvectors = torch.linalg.eigh(e.T @ e)  # eigenvalues in ascending order
    basis = eigenvectors[:, -width:].flip(-1)
    return e @ basis


def build_draft(target: LoadedModel, shape: DraftShape, seed: int) -> LlamaForCausalLM:
    """A seeded draft for `target`: same vocabulary size, special ids and RoPE settings."""
    source = target.model.config
    embedding = embedding_weight(target.torch_model)
    hidden = min(shape.hidden, embedding.shape[1])
    head_dim = min(shape.head_dim, hidden)
    heads = hidden // head_dim
    config = LlamaConfig(
        vocab_size=embedding.shape[0],
        hidden_size=hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=head_dim,
        max_position_embeddings=source.max_position_embeddings,
        rope_parameters=getattr(source, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=source.bos_token_id,
        eos_token_id=source.eos_token_id,
        pad_token_id=getattr(source, "pad_token_id", None),
    )
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(config)
    with torch.no_grad():
        input_embedding(draft).weight.copy_(pca_embedding(embedding, hidden))
    draft.tie_weights()
    return draft
