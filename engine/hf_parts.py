"""A Hugging Face model's token embedding and output layer, with their real types.

`PreTrainedModel.get_input_embeddings()` and `get_output_embeddings()` are declared to return any
`torch.nn.Module`, whose attributes torch types as `Tensor | Module`; every decoder this engine runs
has an `Embedding` and a `Linear` there, and these say so once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def input_embedding(model: PreTrainedModel) -> torch.nn.Embedding:
    """The token embedding table (vocabulary rows, hidden columns)."""
    return cast(torch.nn.Embedding, model.get_input_embeddings())


def output_projection(model: PreTrainedModel) -> torch.nn.Linear:
    """The output layer (vocabulary rows); its weight may be a released stand-in on the packed path:
    read values through `engine.lean_weights.output_weight`."""
    return cast(torch.nn.Linear, model.get_output_embeddings())
