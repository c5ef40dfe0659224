"""Parts of a Hugging Face model and tokenizer with their real types.

`PreTrainedModel.get_input_embeddings()` and `get_output_embeddings()` are declared to return any
`torch.nn.Module`, whose attributes torch types as `Tensor | Module`; every decoder this engine runs
has an `Embedding` and a `Linear` there. A causal LM's class has `generate()`, which the base class
does not declare; a tokenizer decodes one sequence to one string. These say so once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def input_embedding(model: PreTrainedModel) -> torch.nn.Embedding:
    """The token embedding table (vocabulary rows, hidden columns)."""
    return cast(torch.nn.Embedding, model.get_input_embeddings())


def output_projection(model: PreTrainedModel) -> torch.nn.Linear:
    """The output layer (vocabulary rows); its weight may be a released stand-in on the packed path:
    read values through `specdeck.engine.forward.lean_weights.output_weight`."""
    return cast(torch.nn.Linear, model.get_output_embeddings())


def generate_of(model: PreTrainedModel) -> Callable[..., torch.Tensor]:
    """The model's `generate()` (a causal LM's class has it; its options are many and loosely typed)."""
    return cast(Any, model).generate


def decode(tokenizer: PreTrainedTokenizerBase, ids: list[int], **options: bool) -> str:
    """The text of one sequence of token ids."""
    return cast(str, tokenizer.decode(ids, **options))
