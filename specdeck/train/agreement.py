"""Where a feature head's first drafts agree with its target, measured without decoding.

Over the target's own greedy answers, teacher-forced, each answer token is scored as a round of one
draft with no prompt lookup would score it: the head reads the target's states up to the token
before and proposes the next one from its output tokens. The tally keeps apart the tokens prompt
lookup could have copied (`specdeck.train.head_objective.copyable_pairs`): beside lookup, a head drafts only the
others, so a head that agrees more only where lookup copies makes the default pair no faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdeck.engine.drafting.heads import LoadedHead
from specdeck.engine.forward.lean_weights import embedding_weight, output_weight
from specdeck.engine.loading.models import LoadedModel
from specdeck.train.head_objective import copyable_pairs, unrolled
from specdeck.train.stream import batch_states
from specdeck.train.teacher import generate_scored


@dataclass
class Tally:
    """Answer tokens scored, those the head's first draft matched, and the same for the tokens
    prompt lookup could have copied; `covered`: tokens among the head's output tokens."""

    tokens: int = 0
    agreed: int = 0
    copyable: int = 0
    copyable_agreed: int = 0
    covered: int = 0

    def add(self, other: Tally) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def rates(self) -> dict[str, float]:
        """Agreement over all tokens, over those lookup could not copy and over those it could; the
        share lookup could copy; the share among the head's output tokens."""
        other = self.tokens - self.copyable
        return {
            "agreement": self.agreed / max(self.tokens, 1),
            "not copyable": (self.agreed - self.copyable_agreed) / max(other, 1),
            "copyable": self.copyable_agreed / max(self.copyable, 1),
            "copyable share": self.copyable / max(self.tokens, 1),
            "covered": self.covered / max(self.tokens, 1),
        }


def greedy_answer(target: LoadedModel, prompt_ids: list[int], tokens: int) -> tuple[torch.Tensor, int]:
    """The prompt and the target's greedy answer to it (at most `tokens`), and where the answer starts."""
    shard = generate_scored(target, [prompt_ids], tokens, greedy=True, seed=0, top_k=1)
    return shard.ids[0], shard.first[0]


@torch.no_grad()
def head_tally(target: LoadedModel, loaded: LoadedHead, ids: torch.Tensor, first: int) -> Tally:
    """How the head's first drafts fare on the answer that starts at `first` in `ids`: pair j reads
    the target's states of token j and the embedding of token j + 1, and drafts token j + 2, which
    the target's own choice there (its argmax over the whole vocabulary) accepts or not."""
    head = loaded.head
    model = target.torch_model
    states, padded = batch_states(target, [ids], tuple(head.feature_layers))
    dtype = next(head.parameters()).dtype
    states = states.to(dtype)
    embeds = embedding_weight(model)[padded[:, 1:]].to(dtype)
    predicted = unrolled(head, head.fuse(states[:, :-1]), embeds, 1)[0][0]
    final = states[0, :, -1] if states.dim() == 4 else states[0]
    weight = output_weight(model).to(dtype)
    answer = slice(first, len(ids) - 1)  # pairs whose drafted token is in the answer
    truth = (final[1:][answer] @ weight.T).argmax(-1)
    allowed = loaded.output_ids if loaded.output_ids is not None else torch.arange(weight.shape[0])
    allowed = allowed.to(truth.device)
    drafts = allowed[(predicted[answer] @ weight[allowed].T).argmax(-1)]
    agree = drafts == truth
    copyable = copyable_pairs(padded)[0, answer]
    inside = torch.zeros(weight.shape[0], dtype=torch.bool, device=truth.device)
    inside[allowed] = True
    return Tally(
        tokens=len(truth),
        agreed=int(agree.sum()),
        copyable=int(copyable.sum()),
        copyable_agreed=int((agree & copyable).sum()),
        covered=int(inside[truth].sum()),
    )


__all__ = ["Tally", "greedy_answer", "head_tally"]
