"""A smaller model drafting for the target (`DraftModelDrafter`), with a KV cache of its own; the
target's first layers draft through it too (`specdeck.engine.drafting.layer_skip`).

A draft that proposes only some tokens computes only their rows of its output layer
(`output_logits`): for a small draft with a large vocabulary that layer is most of its cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdeck.engine.context import context_length
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import DrawnChain, Proposal
from specdeck.engine.forward.hf_parts import input_embedding
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.lean_weights import output_weight
from specdeck.engine.forward.linear import Linear, make_linear
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel, matrices_of
from specdeck.engine.planner.round_shape import ProposalShape
from specdeck.engine.sampling import logits_to_probs

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def output_logits(hidden: torch.Tensor, layer: Linear, output_ids: torch.Tensor | None, width: int) -> torch.Tensor:
    """Logits over `width` token ids from an output layer cut to the rows `output_ids` (all rows if
    None): -inf, so q = 0, for every id outside them."""
    if output_ids is None:
        return layer(hidden)
    logits = hidden.new_full((width,), float("-inf"))
    logits[output_ids] = layer(hidden)
    return logits


class DraftModelDrafter(Drafter):
    """A small causal LM. Its cache follows the same invariant as the target's (`specdeck.engine.forward.kvcache`).

    With `output_ids` the draft only ever proposes those tokens: its output layer is cut down to
    their rows, which for a small draft with a large vocabulary is most of its cost per token.
    Every other token gets q = 0, which rejection sampling allows (it stays exact for any q).

    A draft whose vocabulary is a prefix of the target's never proposes the target's extra tokens
    (q = 0 there too); where the prompt or the target's text holds one, the draft reads
    `stand_in` (its end-of-text token) in its place, which only makes its next guesses worse.
    """

    def __init__(
        self, model: PreTrainedModel | LlamaCppModel, name: str = "draft model", output_ids: torch.Tensor | None = None
    ) -> None:
        self.name = name
        self.module = model
        self.context_length = context_length(model)
        self._lm = CachedModel(model)
        self._embeddable = input_embedding(matrices_of(model)).num_embeddings
        self.stand_in = _stand_in(model.config.eos_token_id, self._embeddable)
        self._cached: list[int] = []  # token ids whose keys/values are in the cache
        self._output_ids = None
        if output_ids is not None:
            weight = output_weight(matrices_of(model))
            self._output_ids = output_ids.to(weight.device, torch.long)
            self._head = make_linear(weight[self._output_ids].contiguous())

    def begin(self, prompt_ids, config, vocab_width, generator) -> None:
        super().begin(prompt_ids, config, vocab_width, generator)
        self._lm.reset()
        self._cached = []
        if len(prompt_ids) > 1:
            self._lm.forward(self._readable(prompt_ids[:-1]), last_only=True)
            self._cached = list(prompt_ids[:-1])

    def _sync(self, ids: list[int]) -> list[int]:
        """Crop the cache to its longest prefix still in `ids`; return the ids left to feed."""
        valid = 0
        limit = min(len(self._cached), len(ids) - 1)
        while valid < limit and self._cached[valid] == ids[valid]:
            valid += 1
        self._lm.crop(valid)
        del self._cached[valid:]
        return ids[valid:]

    def _readable(self, ids: list[int]) -> list[int]:
        """`ids` with every token the draft has no embedding for replaced by `stand_in`."""
        return [i if i < self._embeddable else self.stand_in for i in ids]

    def _next_logits(self, feed: list[int]) -> torch.Tensor:
        """The draft's logits (over the target's vocabulary width) for the token after `feed`."""
        feed = self._readable(feed)
        if self._output_ids is None:
            return self._fit(self._lm.forward(feed, last_only=True)[-1])
        return output_logits(self._lm.forward_hidden(feed)[-1], self._head, self._output_ids, self.vocab_width)

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary width: ids the draft cannot emit get q = 0."""
        width = logits.shape[-1]
        if width == self.vocab_width:
            return logits
        if width > self.vocab_width:
            return logits[..., : self.vocab_width]
        pad = logits.new_full((*logits.shape[:-1], self.vocab_width - width), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def propose(self, ids: list[int], shape: ProposalShape) -> Proposal:
        feed = self._sync(ids)
        chain = DrawnChain(self.config, self.generator, shape)
        for _ in range(shape.k):
            logits = self._next_logits(feed)
            self._cached.extend(feed)
            token = chain.draw(logits_to_probs(logits, self.config))
            if token is None or not chain.open:
                break
            feed = [token]
        return chain.proposal(self.vocab_width, self._lm.device)


def _stand_in(eos: int | list[int] | None, embeddable: int) -> int:
    """The token a draft reads in place of one it cannot embed: its (first) end-of-text token, else 0."""
    first = eos[0] if isinstance(eos, list) and eos else eos
    return first if isinstance(first, int) and 0 <= first < embeddable else 0
