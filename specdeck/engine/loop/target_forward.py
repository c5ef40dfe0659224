"""The target's forward in a round: over its KV cache here (`TargetForward`), or on a server
(`RemoteForward`, one request a round), with the cache's invariant kept after every round and the
target's hidden states handed to a drafter that reads them (a feature head)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.loading.models import LoadedModel
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.remote.remote_continuation import PLAIN_CHUNK
from specdeck.engine.remote.remote_scoring import ServerTime
from specdeck.engine.remote.remote_target import RemoteTarget

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specdeck.engine.forward.llamacpp_backend import LlamaCppModel

log = logging.getLogger(__name__)


class TargetForward:
    """The target over its KV cache (`specdeck.engine.forward.kvcache`), whose invariant holds between rounds: the
    cache holds every kept token but the newest, which opens the next round's forward.

    A drafter that drafts from the target's last hidden states (`Drafter.needs_states`, a feature
    head) is handed the states of every kept token, in order, from the forwards that computed them.
    Where states cost the target extra (`CachedModel.states_cost`: on llama.cpp), a plain step (a
    round with no drafts, where the planner found drafting does not pay) computes none: the token it
    keeps reaches the drafter as a gap (`Drafter.skip`), which changes its drafts, never the text."""

    server_time: ServerTime | None = None  # a local forward has no request
    continued = False  # its rows follow the drafts, never a continuation of its own

    def __init__(self, model: PreTrainedModel | LlamaCppModel, drafter: Drafter | None) -> None:
        self.lm = CachedModel(model, taps=drafter.feature_layers if drafter is not None else ())
        if drafter is not None:
            _say_if_inexact(self.lm)
        self.supports_trees = self.lm.supports_trees
        self.reader = drafter if drafter is not None and drafter.needs_states else None
        self._cached = 0
        self._hidden: torch.Tensor | None = None

    def admit(self, newest: int, draft: DraftTree) -> DraftTree:
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

    def forward(self, newest: int, draft: DraftTree) -> torch.Tensor:
        """Logits for each input of the round's tree (`DraftTree.forward_inputs`) after the cached tokens, in one
        forward: with tree attention where alternatives stand beside the chain."""
        self._cached = len(self.lm)
        self._hidden = None
        if draft.alternatives:
            self._hidden = self.lm.forward_tree(*draft.forward_inputs(newest))
        elif self.reader and (draft.tokens or not self.lm.states_cost):
            self._hidden = self.lm.forward_hidden([newest] + draft.tokens)
        else:
            return self.lm.forward([newest] + draft.tokens)
        return self.lm.logits(self._hidden)

    def keep(self, path: list[int], kept: list[int]) -> None:
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
    a round near K + 1 tokens of work there (`ServerTime.cache_hit`). Where the server answers with
    its own continuation (`continued`), the round asks for K + 1 tokens, or for a chunk of up to
    `PLAIN_CHUNK` without drafts, never more than the session may still keep, and keeps them all."""

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
        self.continued = False  # whether the last round's rows are the server's continuation
        self._left = 0  # tokens the session may still keep
        self._newest = 0

    def prefill(self, prompt_ids: list[int], new_tokens: int) -> None:
        self.held = list(prompt_ids[:-1])
        self._left = new_tokens

    def admit(self, newest: int, draft: DraftTree) -> DraftTree:
        """The draft cut to what the server can read back as the same tokens (`RemoteTarget.admit`)."""
        tokens = self.target.admit(self.held + [newest], draft.tokens)
        if len(tokens) == len(draft.tokens):
            return draft
        proposal, n = draft.proposal, len(tokens)
        pieces = proposal.pieces[:n] if proposal.pieces is not None else None
        return DraftTree(replace(proposal, tokens=tokens, dists=proposal.q[:n], pieces=pieces), copied=draft.copied)

    def forward(self, newest: int, draft: DraftTree) -> torch.Tensor:
        ids = self.held + [newest]
        self._newest = newest
        self.continued = self.target.continues(ids, draft.tokens)
        length = len(draft.tokens) + 1 if draft.tokens or not self.continued else min(PLAIN_CHUNK, self._left)
        logits, self.server_time = self.target.score(ids, draft.tokens, length)
        return logits

    def keep(self, path: list[int], kept: list[int]) -> None:
        """Hold the newest kept token and every token the round `kept` but the last."""
        self.held += [self._newest] + kept[:-1]
        self._left -= len(kept)


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
