"""What a round verifies (`DraftTree`): a chain of drafts, copied from earlier text or a drafter's,
and in a tree round the other first tokens the drafter found likely beside the chain's first, all
scored in one target forward with tree attention (SpecInfer, Miao et al. 2024)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.planner.round_shape import round_label


@dataclass(frozen=True)
class DraftTree:
    """The chain (`proposal`, copied from earlier text by a copier if `copied`) and, in a tree,
    `alternatives` to the chain's first token, each beside it."""

    proposal: Proposal
    copied: bool = False
    alternatives: list[int] = field(default_factory=list)

    @classmethod
    def none(cls, vocab_width: int, device: torch.device) -> DraftTree:
        """No drafts: a plain step."""
        return cls(Proposal.none(vocab_width, device))

    @property
    def tokens(self) -> list[int]:
        return self.proposal.tokens

    @property
    def label(self) -> str:
        return round_label(len(self.tokens), self.copied, len(self.alternatives))

    def forward_inputs(self, newest: int) -> tuple[list[int], list[int]]:
        """The target's input for this round and each input's parent (-1: the last cached token):
        the newest kept token, the chain under it, then the alternatives, children of the newest
        kept token like the chain's first draft. Row i of the forward scores what follows input i."""
        n = len(self.tokens)
        return [newest] + self.tokens + self.alternatives, list(range(-1, n)) + [0] * len(self.alternatives)
