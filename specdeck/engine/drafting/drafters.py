"""Drafters: whatever proposes the tokens the target verifies.

A drafter sees every kept token and proposes up to k more (`propose(ids, shape)`: the round's
`ProposalShape` carries all it is asked), with the distribution q each was drawn from. The decoding
loop needs nothing else, so new drafters (a trained head, an early exit) slot in by implementing
`Drafter` (what they hand the loop: `specdeck.engine.drafting.proposals`).
- `specdeck.engine.drafting.draft_model.DraftModelDrafter`: a smaller model of the same vocabulary, with
  its own KV cache.
- `specdeck.engine.drafting.head_drafter.FeatureHeadDrafter`: a head of a decoder layer or two on the
  target's own last hidden state (EAGLE, `specdeck.engine.drafting.heads`); the decoding loop hands it the
  target's states for every kept token.
- `PromptLookupDrafter`: n-gram matching over the prompt and the text so far (Saxena 2023,
  transformers' `prompt_lookup_num_tokens`); no model, and q is one-hot on each proposed token.
- `SuffixDrafter` (`specdeck.engine.drafting.suffix_drafting`): the most frequent continuation after the
  longest earlier match, in this request's text and in earlier ones (SuffixDecoding, Oliaro et al.
  2024); no model either, or, in the hybrid, copies before a model drafter (`copying_first`).
- `specdeck.engine.drafting.cross_vocab.CrossVocabularyDrafter`: a draft model with a tokenizer of its own.

Prompt lookup lives here beside the interface: it is what copies from the text before any
other drafter (`Drafter.copier`) unless the drafter was given another (`Drafter.copying_first`).
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.proposals import Proposal, one_hot
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel
from specdeck.engine.planner.acceptance import MATCH_CAP
from specdeck.engine.planner.round_shape import ProposalShape


class Drafter(ABC):
    name: str
    needs_states = False  # True: the loop calls `observe` with the target's last hidden states
    feature_layers: tuple[int, ...] = ()  # and the residual streams after these many target layers
    module: torch.nn.Module | LlamaCppModel | None = None  # the model that drafts (what its measured cost is cached by)
    context_length: int | None = None  # positions a model drafter was trained on (`specdeck.engine.context`)
    copies_text = False  # True: it drafts by copying from the text, so nothing copies before it
    copy_first: Drafter | None = None  # what copies before it in prompt lookup's place (`copying_first`)

    def begin(
        self, prompt_ids: list[int], config: DecodeConfig, vocab_width: int, generator: torch.Generator | None
    ) -> None:
        """A new session: remember its settings (and prefill, for model drafters)."""
        self.config = config
        self.vocab_width = vocab_width
        self.generator = generator

    @abstractmethod
    def propose(self, ids: list[int], shape: ProposalShape) -> Proposal:
        """Up to shape.k tokens to follow `ids` (every kept token, prompt included), as `shape` asks
        (a model drafter's chain also stops at its floors, and offers shape.width - 1 alternatives)."""

    def observe(self, states: torch.Tensor) -> None:  # noqa: B027 (a hook: most drafters need no states)
        """The target's last hidden states (n, hidden) for the next n kept tokens, in order, each
        computed with every earlier kept token in context (only when `needs_states`); with
        `feature_layers`, (n, len(feature_layers) + 1, hidden): those layers' residual streams, then
        the last hidden state. The first call after `begin`, at prefill, hands the prompt's: every
        prompt token's but the last's."""

    def skip(self, count: int) -> None:  # noqa: B027 (a hook: most drafters need no states)
        """The next `count` kept tokens come without the target's states: their forward computed
        none, since the round did not draft from them (only when `needs_states`)."""

    def end(self, ids: list[int]) -> None:  # noqa: B027 (a hook: most drafters keep nothing)
        """The session ended with `ids` kept (prompt included)."""

    def copier(self, device: torch.device) -> Drafter:
        """What copies from the text before this drafter, where the text repeats (`DecodeConfig.lookup`):
        `copy_first` where it was given one, else prompt lookup from two repeated tokens on."""
        return self.copy_first if self.copy_first is not None else PromptLookupDrafter(device=device, min_ngram=2)

    def copying_first(self, copier: Drafter) -> Drafter:
        """This drafter, with `copier` copying from the text before it in prompt lookup's place (the
        hybrid: a suffix drafter before a model drafter). The loop runs the copier first
        (`specdeck.engine.loop.drafting_step`), as it runs prompt lookup before any other drafter."""
        self.copy_first = copier
        return self

    def _empty(self, device: torch.device) -> Proposal:
        return Proposal.none(self.vocab_width, device)


class PromptLookupDrafter(Drafter):
    """Copy what followed the latest earlier occurrence of the last n tokens (n = max_ngram..min_ngram).

    Each n-gram's starts are indexed as the text grows (a session's kept tokens only ever grow), so a
    round's lookup reads a few dictionary entries instead of scanning the whole text: it is asked
    every round, also the rounds that end up plain steps."""

    name = "prompt lookup"
    copies_text = True

    def __init__(self, max_ngram: int = 3, device: torch.device | str = "cpu", min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.device = torch.device(device)
        self._text: list[int] = []  # the text indexed so far
        self._starts: list[dict[tuple[int, ...], list[int]]] = []  # by n - 1: n-gram -> its starts, ascending

    def begin(self, prompt_ids, config, vocab_width, generator) -> None:
        super().begin(prompt_ids, config, vocab_width, generator)
        self._starts, self._text = [], []  # a new text: indexed afresh at the first lookup

    def _index(self, ids: list[int]) -> None:
        """Index every n-gram of `ids` that ends before its last token: from where the text indexed
        before left off where `ids` goes on from it (within a session the kept tokens only grow: the
        last token indexed is checked, not the whole text again every round), else from the start."""
        done = len(self._text)
        if not self._starts or done > len(ids) or (done and ids[done - 1] != self._text[-1]):
            self._starts = [{} for _ in range(self.max_ngram)]
            self._text, done = [], 0
        for n, starts in enumerate(self._starts, start=1):
            for i in range(max(0, done - n), len(ids) - n):  # the new starts i, i + n <= len(ids) - 1
                starts.setdefault(tuple(ids[i : i + n]), []).append(i)
        self._text.extend(ids[done:])

    def _match(self, ids: list[int], k: int) -> tuple[list[int], int]:
        """What followed the latest earlier occurrence of the text's last n tokens, and where it was
        found: the index after that occurrence (0: none). The latest that still has k tokens after
        it, else the earliest (the longest copy there is)."""
        self._index(ids)
        length = len(ids)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            hits = self._starts[n - 1].get(tuple(ids[length - n :]))
            if hits:
                full = bisect.bisect_right(hits, length - n - k)  # starts i with i + n + k <= length
                start = (hits[full - 1] if full else hits[0]) + n
                return ids[start : start + k], start
        return [], 0

    def propose(self, ids: list[int], shape: ProposalShape) -> Proposal:
        tokens, start = self._match(ids, shape.k)
        if not tokens:
            return self._empty(self.device)
        match = 0  # how far the occurrence matches the text's end, past the n-gram that found it
        while match < start and match < MATCH_CAP and ids[start - 1 - match] == ids[-1 - match]:
            match += 1
        return one_hot(tokens, self.vocab_width, self.device, source="prompt", match_length=match)
