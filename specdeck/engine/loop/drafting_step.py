"""A round's drafting (`DraftingStep`): copy first, then the model. Where the text so far repeats,
a copier (prompt lookup, or a hybrid's suffix drafter) copies what followed at no model cost, and
the round verifies the copy as far as the schedule finds it pays; otherwise the drafter drafts the
round's `ProposalShape`. This is the one place that order lives: a drafter only proposes."""

from __future__ import annotations

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.loop.schedule import Schedule
from specdeck.engine.planner.round_shape import Shape


class DraftingStep:
    """A session's drafting: the drafter and, before a drafter that does not copy text itself, its
    copier (`Drafter.copier`, `DecodeConfig.lookup`: where the text so far repeats, copying what
    followed costs no model call)."""

    def __init__(self, drafter: Drafter | None, config: DecodeConfig, vocab_width: int, device: torch.device) -> None:
        self.drafter = drafter
        copies = drafter is not None and config.lookup > 0 and not drafter.copies_text
        self.copier = drafter.copier(device) if drafter is not None and copies else None
        # the most tokens a round copies: a copier's `lookup`; a drafter that copies, up to max K
        self.copy_length = config.lookup if copies else config.max_k if drafter and drafter.copies_text else 0
        self.name = (drafter.name + (f" + {self.copier.name}" if self.copier else "")) if drafter else ""
        self.config = config
        self.vocab_width = vocab_width
        self.device = device
        # a plain step's empty q, made once: a tensor made each step costs a plain step more than its drafting
        self._no_q = DraftTree.none(vocab_width, device).proposal.dists

    def _none(self) -> DraftTree:
        """No drafts (a plain step): a new tree on the session's one empty q."""
        return DraftTree(Proposal([], self._no_q))

    def begin(self, prompt_ids: list[int], generator: torch.Generator) -> None:
        for drafter in (self.drafter, self.copier):
            if drafter is not None:
                drafter.begin(prompt_ids, self.config, self.vocab_width, generator)

    def propose(self, ids: list[int], shape: Shape, room: int, schedule: Schedule) -> DraftTree:
        """This round's drafts after the kept tokens `ids`, as `shape` plans them: a copy where the
        text repeats, else the drafter's (with shape.width - 1 alternatives to its first); never
        more than `room`, what could still be kept, and none for a plain step.

        A copier's copy replaces the planned round only where it pays more (`Schedule.copy_length`);
        a drafter that copies is always asked under the auto schedule (copies cost nothing to find)
        and its copy verified as far as it pays better than a plain step (at least its first draft
        in a tree round)."""
        if self.drafter is None or room <= 0:
            return self._none()
        if self.copier is not None and shape.copy:
            copied = self.copier.propose(ids, shape.copy_part(room))
            n = schedule.copy_length(copied)
            if n:
                return DraftTree(copied.first(n), copied=True)
        if self.drafter.copies_text and schedule.judges_copies and shape.copy:
            proposal = self.drafter.propose(ids, shape.copy_part(room))
            n = schedule.copy_length(proposal, beside_plan=False)
            n = max(n, min(1, len(proposal.tokens)) if shape.k and shape.width > 1 else 0)
            if not n:
                return self._none()
            proposal = proposal.first(n)
            return DraftTree(proposal, alternatives=proposal.alternatives(shape.width if shape.k else 1))
        if shape.k:
            proposal = self.drafter.propose(ids, shape.model_part(room))
            return DraftTree(proposal, alternatives=proposal.alternatives(shape.width))
        return self._none()

    def end(self, ids: list[int]) -> None:
        for drafter in (self.drafter, self.copier):
            if drafter is not None:
                drafter.end(ids)
