"""Each round's shape (`Schedule`): how much the round drafts or copies, and how much of a copy it
verifies. `auto` asks the planner (`specdeck.engine.planner.autotune.RoundPlanner`: the shape that keeps the
most tokens per ms, from the costs measured on this machine and the session's acceptance);
`constant` drafts K every round; `heuristic` moves K after each round. A greedy session that finds
no cost curve measured plans from a first estimate and measures the curve after its text, on its
own KV cache (`Schedule.settle`)."""

from __future__ import annotations

import weakref

from specdeck.engine.cache import costs_cache
from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.loading.models import LoadedModel
from specdeck.engine.loop.clock import Clock
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.planner.autotune import MAX_WIDTH, RoundPlanner
from specdeck.engine.planner.costs import cost_curve, curve_due
from specdeck.engine.planner.description import describe_planner
from specdeck.engine.planner.draft_costs import draft_cost
from specdeck.engine.planner.round_shape import Shape
from specdeck.engine.remote.remote_target import RemoteTarget

# each drafter's latest greedy planner, by the drafter's model (else the target's) and the drafting's name
_PLANNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Schedule:
    """Each round's shape. `auto`: the planner's; `constant`: K drafts every round; `heuristic`: K + 2
    after a round whose drafts all passed, K - 1 after one with a refusal, within [1, max_k]. A round
    that copies from the text copies up to `copy_length` tokens."""

    def __init__(
        self,
        config: DecodeConfig,
        copy_length: int,
        planner: RoundPlanner | None,
        unsettled: tuple[LoadedModel, CachedModel] | None = None,
    ) -> None:
        self.config = config
        self.planner = planner
        self.fixed = Shape(copy_length, config.k)
        self.unsettled = unsettled  # the target and the session's cache, where its cost curve is still due

    def settle(self) -> None:
        """Measure the target's cost curve (or check a saved one against the machine's pace) where
        this session planned without doing so: after its text, on its KV cache, emptied first (its
        tokens are not needed any more), so that the first token did not wait for it and no second
        cache is made for it. Later sessions plan from it."""
        if self.unsettled is not None:
            target, lm = self.unsettled
            self.unsettled = None
            lm.reset()
            cost_curve(target.model, costs_cache(), lm)

    def plan(self) -> Shape:
        return self.planner.plan() if self.planner else self.fixed

    @property
    def judges_copies(self) -> bool:
        """Whether a copy is verified only as far as it pays (`copy_length`): under the auto schedule."""
        return self.planner is not None

    def copy_length(self, proposal: Proposal, beside_plan: bool = True) -> int:
        """How many drafts of a copy the round verifies: the planner's choice, by the copy's source
        and match length, against the planned round (without `beside_plan`, against a plain step);
        all of them without the auto schedule."""
        if self.planner is None or not proposal.tokens:
            return len(proposal.tokens)
        own = proposal.source == "prompt"
        return self.planner.copy_length(own, proposal.match_length, len(proposal.tokens), beside_plan, proposal.doubted)

    def record(self, shape: Shape, draft: DraftTree, accepted: int, clock: Clock, first: int) -> None:
        """What the round planned and what came of it: `accepted` of the chain's drafts passed, and
        `first` is the round's first kept token."""
        n, copied = len(draft.tokens), draft.copied
        if self.planner:
            # where the first kept token stood among the drafter's candidates (0: its first draft).
            # Greedy: the target's argmax. Sampled: after a refused first draft it follows the residual,
            # so it is among the first w candidates exactly as often as a tree of width w would accept
            # an alternative (`specdeck.engine.loop.verification.verify`).
            rank = draft.proposal.rank(first) if n and not copied else None
            self.planner.record(
                shape,
                copied,
                n,
                accepted,
                clock.draft_ms,
                clock.verify_ms,
                clock.round_ms(),
                rank,
                len(draft.alternatives),
                (draft.proposal.source == "prompt", draft.proposal.match_length, draft.proposal.doubted)
                if draft.proposal.source
                else None,
            )
        elif self.config.schedule == "heuristic" and n and not copied:
            k = min(shape.k + 2, self.config.max_k) if accepted == n else max(1, shape.k - 1)
            self.fixed = Shape(self.fixed.copy, k)

    def describe(self) -> str:
        return describe_planner(self.planner) if self.planner else ""


def session_schedule(
    target: LoadedModel | RemoteTarget,
    drafter: Drafter | None,
    config: DecodeConfig,
    name: str,
    copy_length: int,
    trees: bool,
    lm: CachedModel | None,
) -> Schedule:
    """The schedule of a session whose drafting is called `name` and copies up to `copy_length`
    tokens a round, with the auto schedule's planner (none under the others, and for plain
    decoding): each round's shape chosen from the costs measured on this machine (cached) and the
    session's acceptance, with alternatives to the first draft (a tree) where `trees` can run.
    Greedy sessions also adapt the costs to what their rounds take (their text cannot change with
    the shape), and where the target's cost curve is not measured yet start from a first estimate
    (the curve is measured after the session, `Schedule.settle`); sampled ones plan from the cached
    costs alone, measured first where they are not, so a seed gives the same text on this machine.
    `lm`: the session's KV cache of the target, empty, which measurements use and roll back."""
    if drafter is None or config.schedule != "auto" or isinstance(target, RemoteTarget):
        return Schedule(config, copy_length, None)  # (a served target's costs are not measured here)
    costs = costs_cache()
    per_token = draft_cost(drafter, target.vocab_width, target.model.config.hidden_size, costs)
    estimate = config.greedy and lm is not None and curve_due(target.model)
    planner = RoundPlanner(
        cost_curve(target.model, costs, lm, estimate),
        per_token,
        config.max_k,
        copy_length,
        adapt=config.greedy,
        max_width=MAX_WIDTH if trees else 1,
    )
    if config.greedy:  # greedy text cannot depend on it; a seed's would
        # a model drafter's by its model; a drafter that only copies (its acceptance is the target's
        # agreement with the text) by the target's, one per kind of drafter
        owner = drafter.module if drafter.module is not None else target.model
        planners = _PLANNERS.setdefault(owner, {})
        earlier = planners.get(name)
        if earlier is not None:
            planner.carry_over(earlier)
        planners[name] = planner
    return Schedule(config, copy_length, planner, (target, lm) if estimate and lm is not None else None)
