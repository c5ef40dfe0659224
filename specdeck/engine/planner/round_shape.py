"""What a round plans (`Shape`): copy from the text or draft, how many tokens, how many candidates
for the first token, and where a model drafter's chain stops. The planner makes one each round and
the decoding loop carries it out, naming it by `round_label` in its events and plans; a drafter is
asked for its part of it as a `ProposalShape` (`Drafter.propose(ids, shape)`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """One round's plan: copy up to `copy` tokens where the text repeats, else draft `k` (0: none),
    with `width` candidates for the first token (a tree: the chain under the first)."""

    copy: int
    k: int
    width: int = 1
    floors: tuple[float, ...] = ()  # a model drafter's chain stops before depth d + 1 below floors[d]

    def model_part(self, room: int) -> ProposalShape:
        """What the drafter is asked for: K drafts (never more than `room`), the width, the floors."""
        return ProposalShape(min(self.k, room), self.width, self.floors)

    def copy_part(self, room: int) -> ProposalShape:
        """What a copier is asked for: up to `copy` tokens (never more than `room`), a chain alone."""
        return ProposalShape(min(self.copy, room))


@dataclass(frozen=True)
class ProposalShape:
    """What one drafter is asked for in one round, all of it: up to `k` tokens; `width` candidates
    for the first token (a tree: the drafter's likeliest others beside its first draft); and
    `floors`: a model drafter's chain stops before depth d + 1 where the product of its top
    probabilities so far falls below floors[d] (`specdeck.engine.drafting.proposals.DrawnChain`)."""

    k: int
    width: int = 1
    floors: tuple[float, ...] = ()


def round_label(drafted: int, copied: bool, alternatives: int = 0) -> str:
    """A round's shape as events and plans name it: "K=2", "K=2 w3" (a tree: three candidates for
    the first token, the chain under the first), "copy 3" or "none"."""
    if not drafted:
        return "none"
    if copied:
        return f"copy {drafted}"
    return f"K={drafted}" + (f" w{alternatives + 1}" if alternatives else "")
