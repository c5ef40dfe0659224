"""The model card an exported feature head carries: what it drafts for, its architecture, how it
was trained and on which sources (with their licenses), and its held-out agreement by depth.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from specdeck.engine.drafting.heads import FeatureHead

if TYPE_CHECKING:
    from specdeck.train.head import HeadConfig


def model_card(
    target_name: str,
    config: HeadConfig,
    head: FeatureHead,
    positions: int,
    sequences: int,
    step: int,
    agree: list[float],
    output_ids: torch.Tensor | None,
    sources: dict[str, str],
    states: str = "computed once",
) -> str:
    listed = "\n".join(f"- {name}: {text}" for name, text in sources.items())
    params = sum(p.numel() for n, p in head.named_parameters() if not n.startswith("body.embed_tokens"))
    vocab = f"{len(output_ids)} tokens (`output_tokens.json`)" if output_ids is not None else "the whole vocabulary"
    shape = head.config
    layers = " and ".join(map(str, head.feature_layers))
    fused = (
        f"the residual streams after the target's first {layers} layers (each scaled to unit RMS) and its last "
        "hidden state, mixed by one linear map, "
        if head.feature_layers
        else "the target's last hidden state "
    )
    grown = (
        f"\nIt started from the weights of `{config.init_from}` (its own card lists what it learnt from), the "
        "fusion weights on lower layers and the output maps of decoder layers it lacked from zero.\n"
        if config.init_from
        else ""
    )
    return f"""# Feature head for {target_name}

An EAGLE-style drafter (Li et al. 2024, 2025) for {target_name} in speculative decoding: from
{fused}and the next token's embedding it predicts the target's next hidden state, and the target's
own output layer turns that into draft tokens. It uses the target's embedding and output layer, so
it only works with {target_name}.

## Architecture
{f"A linear map from {len(head.feature_layers) + 1} x {shape.hidden_size} to {shape.hidden_size} (the fusion), then a" if head.feature_layers else "A"} linear map from 2 x {shape.hidden_size} to {shape.hidden_size}, {"one Llama decoder layer" if shape.num_hidden_layers == 1 else f"{shape.num_hidden_layers} Llama decoder layers"} ({shape.num_attention_heads}
heads, {shape.num_key_value_heads} key/value heads, MLP {shape.intermediate_size}) with its own KV cache,
and a final RMSNorm; {params / 1e6:.1f}M parameters. It proposes only from {vocab}, the target's most
frequent tokens in the training text; q = 0 elsewhere keeps rejection sampling exact.

## Training
{sequences} sequences, {positions} positions seen, from the sources below, with the target's hidden
states {states}. Loss per pair: cross-entropy to the target's next-token distribution over
the output tokens{f" plus {config.feature_weight} x smooth-L1 to its next hidden state" if config.feature_weight else ""},
over {config.unroll} passes run as drafting runs them (each later pass reads the states the
previous one predicted and attends as a deeper draft would). {step} steps of {config.batch_sequences}
sequences, AdamW, lr {config.lr}, seed {config.seed}. Top-1 agreement with the target at the answer
positions of held-out sequences (one in 20, never trained on), by draft depth: {", ".join(f"{a:.3f}" for a in agree)}.
{grown}
Settings: `{json.dumps(asdict(config))}`

## Data
{listed}
No benchmark prompts were used.
"""
