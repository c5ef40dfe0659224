"""What a decoding round works with, besides the rule that judges its drafts (`specdeck.engine.loop.decoding`).

- `Drafts`: where a round's drafts come from: the drafter's copier (prompt lookup, a hybrid's
  suffix drafter) where the text repeats itself, else the drafter; in a tree round, the other
  first tokens it found likely beside its first draft.
- `Schedule`: how much each round drafts (`DecodeConfig.schedule`; the auto planner is
  `specdeck.engine.planner.autotune.RoundPlanner`).
- `TargetForward`: the target's forwards over its KV cache, with the cache's invariant kept after
  every round, and the target's hidden states handed to a drafter that reads them (a feature head).
- `RemoteForward`: the same for a target on a server (`specdeck.engine.remote.remote_target`): one request a round.
- `Clock`: the round's draft and verify times, read after a device synchronisation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.kvcache import CachedModel, synchronize
from specdeck.engine.loading.models import LoadedModel
from specdeck.engine.planner.autotune import RoundPlanner
from specdeck.engine.planner.description import describe_planner
from specdeck.engine.planner.round_shape import Shape, round_label
from specdeck.engine.remote.remote_scoring import ServerTime
from specdeck.engine.remote.remote_target import RemoteTarget

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specdeck.engine.forward.llamacpp_backend import LlamaCppModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Draft:
    """What a round verifies: a chain of drafts (copied from earlier text by prompt lookup if
    `copied`) and, in a tree, alternatives to the chain's first token, each beside it."""

    proposal: Proposal
    copied: bool = False
    alternatives: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.proposal.tokens

    @property
    def label(self) -> str:
        return round_label(len(self.tokens), self.copied, len(self.alternatives))

    def tree(self, newest: int) -> tuple[list[int], list[int]]:
        """The target's input for this round and each input's parent (-1: the last cached token):
        the newest kept token, the chain under it, then the alternatives, children of the newest
        kept token like the chain's first draft. Row i of the forward scores what follows input i."""
        n = len(self.tokens)
        return [newest] + self.tokens + self.alternatives, list(range(-1, n)) + [0] * len(self.alternatives)


class Drafts:
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

    def begin(self, prompt_ids: list[int], generator: torch.Generator) -> None:
        for drafter in (self.drafter, self.copier):
            if drafter is not None:
                drafter.begin(prompt_ids, self.config, self.vocab_width, generator)

    def propose(
        self, ids: list[int], shape: Shape, room: int, judge: Callable[[Proposal, bool], int] | None = None
    ) -> Draft:
        """This round's drafts after the kept tokens `ids`, as `shape` plans them: copies where the
        text repeats, else the drafter's (with shape.width - 1 alternatives to its first); never more
        than `room`, what could still be kept, and none for a plain step.

        `judge` (the auto schedule's `Schedule.copy_length`) says how many drafts of a copy pay,
        once the copy is found: a copier's copy replaces the planned round only where it pays more;
        a drafter that copies is always asked (copies cost nothing to find) and its copy verified as
        far as it pays better than a plain step (at least its first draft in a tree round)."""
        if self.drafter is not None and room > 0:
            if self.copier is not None and shape.copy:
                copied = self.copier.propose(ids, min(shape.copy, room))
                n = judge(copied, True) if judge is not None and copied.tokens else len(copied.tokens)
                if n:
                    return Draft(copied.head(n), copied=True)
            if judge is not None and self.drafter.copies_text and shape.copy:
                proposal = self.drafter.propose(ids, min(shape.copy, room))
                n = judge(proposal, False) if proposal.tokens else 0
                n = max(n, min(1, len(proposal.tokens)) if shape.k and shape.width > 1 else 0)
                if n:
                    proposal = proposal.head(n)
                    return Draft(proposal, alternatives=proposal.alternatives(shape.width if shape.k else 1))
                return Draft(Proposal.none(self.vocab_width, self.device))
            if shape.k:
                self.drafter.floors, self.drafter.width = shape.floors, shape.width
                proposal = self.drafter.propose(ids, min(shape.k, room))
                return Draft(proposal, alternatives=proposal.alternatives(shape.width))
        return Draft(Proposal.none(self.vocab_width, self.device))

    def end(self, ids: list[int]) -> None:
        for drafter in (self.drafter, self.copier):
            if drafter is not None:
                drafter.end(ids)


class Schedule:
    """Each round's shape. `auto`: the planner's (`specdeck.engine.planner.autotune`); `constant`: K drafts every
    round; `heuristic`: K + 2 after a round whose drafts all passed, K - 1 after one with a refusal,
    within [1, max_k]. A round that copies from the text (`Drafts`) copies up to `copy_length` tokens."""

    def __init__(self, config: DecodeConfig, copy_length: int, planner: RoundPlanner | None) -> None:
        self.config = config
        self.planner = planner
        self.fixed = Shape(copy_length, config.k)

    def plan(self) -> Shape:
        return self.planner.plan() if self.planner else self.fixed

    @property
    def judge(self) -> Callable[[Proposal, bool], int] | None:
        """How many drafts of a copy the round verifies (`Drafts.propose`): the planner's choice, by
        the copy's source and match length; None (all of them) without the auto schedule."""
        return self.copy_length if self.planner else None

    def copy_length(self, proposal: Proposal, beside_plan: bool) -> int:
        assert self.planner is not None
        own = proposal.source == "prompt"
        return self.planner.copy_length(own, proposal.match_length, len(proposal.tokens), beside_plan, proposal.doubted)

    def record(self, shape: Shape, draft: Draft, accepted: int, clock: Clock, first: int) -> None:
        """What the round planned and what came of it: `accepted` of the chain's drafts passed, and
        `first` is the round's first kept token."""
        n, copied = len(draft.tokens), draft.copied
        if self.planner:
            # where the first kept token stood among the drafter's candidates (0: its first draft).
            # Greedy: the target's argmax. Sampled: after a refused first draft it follows the residual,
            # so it is among the first w candidates exactly as often as a tree of width w would accept
            # an alternative (`specdeck.engine.loop.decoding.verify`).
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


class TargetForward:
    """The target over its KV cache (`specdeck.engine.forward.kvcache`), whose invariant holds between rounds: the
    cache holds every kept token but the newest, which opens the next round's forward.

    A drafter that drafts from the target's last hidden states (`Drafter.needs_states`, a feature
    head) is handed the states of every kept token, in order, from the forwards that computed them.
    Where states cost the target extra (`CachedModel.states_cost`: on llama.cpp), a plain step (a
    round with no drafts, where the planner found drafting does not pay) computes none: the token it
    keeps reaches the drafter as a gap (`Drafter.skip`), which changes its drafts, never the text."""

    server_time: ServerTime | None = None  # a local forward has no request

    def __init__(self, model: PreTrainedModel | LlamaCppModel, drafter: Drafter | None) -> None:
        self.lm = CachedModel(model, taps=drafter.feature_layers if drafter is not None else ())
        if drafter is not None:
            _say_if_inexact(self.lm)
        self.supports_trees = self.lm.supports_trees
        self.reader = drafter if drafter is not None and drafter.needs_states else None
        self._cached = 0
        self._hidden: torch.Tensor | None = None

    def admit(self, newest: int, draft: Draft) -> Draft:
        """The drafts this round verifies: all of them, on a local target."""
        return draft

    def prefill(self, prompt_ids: list[int], new_tokens: int) -> None:
        """Cache every prompt token but the last, the newest kept token, in a cache sized for the
        prompt and `new_tokens` more (`CachedModel.size_for`)."""
        self.lm.size_for(len(prompt_ids) + new_tokens)
        if len(prompt_ids) <= 1:
            return
        if self.reader:
            self.reader.observe(self.lm.states(self.lm.forward_hidden(prompt_ids[:-1])))
        else:
            self.lm.forward(prompt_ids[:-1], last_only=True)

    def forward(self, newest: int, draft: Draft) -> torch.Tensor:
        """Logits for each input of the round's tree (`Draft.tree`) after the cached tokens, in one
        forward: with tree attention where alternatives stand beside the chain."""
        self._cached = len(self.lm)
        self._hidden = None
        if draft.alternatives:
            self._hidden = self.lm.forward_tree(*draft.tree(newest))
        elif self.reader and (draft.tokens or not self.lm.states_cost):
            self._hidden = self.lm.forward_hidden([newest] + draft.tokens)
        else:
            return self.lm.forward([newest] + draft.tokens)
        return self.lm.logits(self._hidden)

    def keep(self, path: list[int]) -> None:
        """Keep the last forward's inputs `path` (the newest kept token's row first, then the accepted
        drafts') in the cache after the tokens cached before it; drop the rest."""
        if path[-1] == len(path) - 1:  # a prefix of the forward: crop after it
            self.lm.crop(self._cached + len(path))
        else:  # a tree's side branch: its rows moved in after the cached tokens
            self.lm.compact(path)
        if self.reader and self._hidden is not None:
            states = self.lm.states(self._hidden)
            # a prefix of the rows as a view (a step's one row: no copy through advanced indexing)
            self.reader.observe(states[: len(path)] if path[-1] == len(path) - 1 else states[path])
        elif self.reader:
            self.reader.skip(len(path))


class RemoteForward:
    """The target's forwards on a server (`specdeck.engine.remote.remote_target`), with `TargetForward`'s methods:
    `held` plays the KV cache's part (every kept token but the newest), and each round sends it with
    the newest kept token and the drafts in one request. The server's own prefix cache is what keeps
    a round near K + 1 tokens of work there (`ServerTime.cache_hit`)."""

    supports_trees = False
    reader = None

    def __init__(self, target: RemoteTarget, drafter: Drafter | None) -> None:
        if drafter is not None and drafter.needs_states:
            raise SpecDeckError(
                "A feature head drafts from the target's hidden states, which a server does not "
                "return: choose the draft-model, prompt-lookup or suffix drafter for a remote target."
            )
        self.target = target
        self.held: list[int] = []
        self.server_time: ServerTime | None = None
        self._inputs: list[int] = []

    def prefill(self, prompt_ids: list[int], new_tokens: int) -> None:
        self.held = list(prompt_ids[:-1])

    def admit(self, newest: int, draft: Draft) -> Draft:
        """The draft cut to what the server can read back as the same tokens (`RemoteTarget.admit`)."""
        tokens = self.target.admit(self.held + [newest], draft.tokens)
        if len(tokens) == len(draft.tokens):
            return draft
        proposal, n = draft.proposal, len(tokens)
        pieces = proposal.pieces[:n] if proposal.pieces is not None else None
        return Draft(replace(proposal, tokens=tokens, dists=proposal.q[:n], pieces=pieces), copied=draft.copied)

    def forward(self, newest: int, draft: Draft) -> torch.Tensor:
        self._inputs = [newest] + draft.tokens
        logits, self.server_time = self.target.score(self.held + [newest], draft.tokens)
        return logits

    def keep(self, path: list[int]) -> None:
        self.held += [self._inputs[row] for row in path]


_TOLD: set[str] = set()  # the reasons for an inexact verify already said


def _say_if_inexact(lm: CachedModel) -> None:
    """Say once per reason where the lean forward's verify cannot give a token a plain step's bits
    (its products fell back to F.linear on the CPU): greedy texts can then part at a near-tie."""
    reason = lm.inexact_reason()
    if reason is not None and reason not in _TOLD:
        _TOLD.add(reason)
        log.warning(
            "Matrix products run on F.linear here (%s): a verify's logits may differ from a one-token "
            "step's in the last bits, so greedy speculative text can part from plain text at a near-tie.",
            reason,
        )


def target_forward(target: LoadedModel | RemoteTarget, drafter: Drafter | None) -> TargetForward | RemoteForward:
    """The target's forwards: over a local KV cache, or on the server a remote target names."""
    if isinstance(target, RemoteTarget):
        return RemoteForward(target, drafter)
    return TargetForward(target.model, drafter)


class Clock:
    """A round's times. A reading that ends device work first synchronises (`specdeck.engine.forward.kvcache`), so
    that queued kernels count where they ran; a round's start does not need to, since the last
    reading left nothing queued."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.decode_started: float | None = None
        self.round_started = self.verify_started = self.verify_ended = 0.0

    read = staticmethod(time.perf_counter)  # seconds; tests that need set costs replace it

    def now(self) -> float:
        synchronize(self.device)
        return self.read()

    def ms_since(self, started: float) -> float:
        return (self.now() - started) * 1e3

    def start_round(self) -> None:
        self.round_started = self.read()
        if self.decode_started is None:
            self.decode_started = self.round_started

    def drafted(self) -> None:
        self.verify_started = self.now()

    def verified(self) -> None:
        self.verify_ended = self.now()

    @property
    def draft_ms(self) -> float:
        return (self.verify_started - self.round_started) * 1e3

    @property
    def verify_ms(self) -> float:
        return (self.verify_ended - self.verify_started) * 1e3

    def round_ms(self) -> float:
        return (self.read() - self.round_started) * 1e3

    def decode_s(self) -> float:
        """Seconds since the first round started: decoding time so far, prefill excluded."""
        return self.read() - (self.decode_started or 0.0)
