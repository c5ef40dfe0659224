"""Drafters: whatever proposes the tokens the target verifies.

A drafter sees every kept token and proposes up to k more, with the distribution q each was
drawn from. The decoding loop needs nothing else, so new drafters (a trained head, an early exit)
slot in by implementing `Drafter`.
- `DraftModelDrafter`: a smaller model of the same vocabulary, with its own KV cache.
- `engine.head_drafter.FeatureHeadDrafter`: a one-layer head on the target's own last hidden state
  (EAGLE, `engine.heads`); the decoding loop hands it the target's states for every kept token.
- `PromptLookupDrafter`: n-gram matching over the prompt and the text so far (Saxena 2023,
  transformers' `prompt_lookup_num_tokens`); no model, and q is one-hot on each proposed token.
- `SuffixDrafter` and `HybridDrafter` (`engine.suffix_drafting`): the most frequent continuation
  after the longest earlier match, in this request's text and in earlier ones (SuffixDecoding,
  Oliaro et al. 2024); no model either, or, in the hybrid, copies before a model drafter.
- `engine.cross_vocab.CrossVocabularyDrafter`: a draft model with a tokenizer of its own.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.context import context_length
from specdeck.engine.forward.hf_parts import input_embedding
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.lean_weights import output_weight
from specdeck.engine.forward.linear import Linear, make_linear
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel, matrices_of
from specdeck.engine.planner.acceptance import MATCH_CAP
from specdeck.engine.sampling import logits_to_probs, sample

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class DraftPiece:
    """What a draft with a tokenizer of its own wrote for one proposed token: its own tokens (as
    text) and the probability it gave each."""

    tokens: tuple[str, ...]
    q: tuple[float, ...]


@dataclass
class Proposal:
    tokens: list[int]
    # (len(tokens), vocab_width): the distribution each token was drawn from (`q`); None for drafts
    # copied from text, one-hot on each, which `q` makes when first read (a copy is judged first,
    # and many are left unverified: `engine.rounds.Drafts`). With `columns`, (len(tokens),
    # len(columns)): q over those ids alone, 0 elsewhere
    dists: torch.Tensor | None
    # drafts copied from text: where from ("prompt": this request's text; "session": an earlier
    # answer since SpecDeck started; "texts": the target's own texts; "past": a past session's), and
    # the length of the match they follow
    source: str = ""
    match_length: int = 0
    # for each copied draft, whether the string before it also went on otherwise in that text (an
    # earlier occurrence of it was followed by another token); empty where the copier does not say
    doubted: tuple[bool, ...] = ()
    # first tokens the drafter also proposes beside tokens[0], likeliest first (a suffix drafter's
    # other continuations), none of them tokens[0]; a tree round verifies them, otherwise they are
    # not used. A copier may give a function that finds them, called where they are first read
    branches: list[int] | Callable[[], list[int]] = field(default_factory=list)
    pieces: list[DraftPiece] | None = None  # per token, from a draft with a tokenizer of its own
    draft_tokens: int | None = None  # the tokens that draft wrote, in its own tokenizer
    width: int = 0  # the vocabulary's width and the device, for a copy's one-hot q or a cut q widened
    device: torch.device | None = None
    # the token ids, increasing, that the columns of `dists` stand for (a drafter's cut output layer,
    # a sixth of the vocabulary): q is widened to every id only where it is read whole (a sampled
    # verify, a tree); a greedy round reads a few of its values (`q_of`, `rank`)
    columns: torch.Tensor | None = None

    @property
    def q(self) -> torch.Tensor:
        """(len(tokens), vocab_width): the distribution each token was drawn from."""
        if self.dists is None:
            q = torch.zeros(len(self.tokens), self.width, device=self.device)
            q[torch.arange(len(self.tokens)), torch.tensor(self.tokens, dtype=torch.long)] = 1.0
            self.dists = q
        elif self.columns is not None:
            self.dists, self.columns = _widened(self.dists, self.columns, self.width), None
        return self.dists

    @property
    def _width(self) -> int:
        """The vocabulary's width, where q is over it (a copy's or a cut q's without making its rows)."""
        return self.width if self.dists is None or self.columns is not None else self.dists.shape[-1]

    def _at(self, tokens: list[int]) -> tuple[torch.Tensor, list[bool]]:
        """The columns of `dists` that hold q of `tokens`, and whether each token has one (a cut q is 0
        for an id outside its columns, which stands at column 0 here)."""
        if self.columns is None:
            return torch.tensor(tokens, dtype=torch.long, device=self.dists.device), [True] * len(tokens)  # type: ignore[union-attr]
        wanted = torch.tensor(tokens, dtype=torch.long, device=self.columns.device)
        at = torch.searchsorted(self.columns, wanted).clamp_(max=len(self.columns) - 1)
        return at, (self.columns[at] == wanted).tolist()

    def q_of(self, tokens: list[int], row: int | None = None) -> list[float]:
        """q of `tokens[i]` in row i (in `row`, for all of them, where given): for a copy, 1 where
        the token is the copied one and 0 elsewhere, read without making its one-hot rows (a round's
        events need these few values, not the rows); for a cut q, without widening it."""
        if self.dists is None:
            copied = self.tokens[: len(tokens)] if row is None else [self.tokens[row]] * len(tokens)
            return [1.0 if token == draft else 0.0 for token, draft in zip(tokens, copied)]
        if not tokens:
            return []
        at, held = self._at(tokens)
        rows = torch.arange(len(tokens), device=self.dists.device) if row is None else row
        return [value if inside else 0.0 for value, inside in zip(self.dists[rows, at].tolist(), held)]

    def rank(self, token: int) -> int:
        """Where `token` stands among the drafter's candidates for the first token, in the order
        `alternatives` offers them: 0 for tokens[0], then a copy's branches or a model drafter's
        likeliest other tokens. A token outside a copy's branches ranks last; so does a token the
        drafter gives no probability, which it would never offer as an alternative."""
        if token == self.tokens[0]:
            return 0
        if self.source:
            branches = self.others()
            return 1 + branches.index(token) if token in branches else self._width
        q = self.dists[0]  # type: ignore[index]
        (theirs, first), (held, _) = self._at([token, self.tokens[0]])
        if not held or float(q[theirs]) <= 0:
            return self._width
        above = int((q > q[theirs]).sum())  # the first draft is drawn (sampled), so it may stand below
        return above + int(bool(q[first] <= q[theirs]))

    def others(self) -> list[int]:
        """`branches`, found now where the drafter left a function that finds them."""
        if callable(self.branches):
            self.branches = self.branches()
        return self.branches

    def head(self, n: int) -> Proposal:
        """The first n drafts of this proposal (a copy verified only as far as it pays)."""
        if n >= len(self.tokens):
            return self
        pieces = self.pieces[:n] if self.pieces is not None else None
        dists = self.dists[:n] if self.dists is not None else None
        return replace(self, tokens=self.tokens[:n], dists=dists, pieces=pieces, doubted=self.doubted[:n])

    def alternatives(self, width: int) -> list[int]:
        """Up to width - 1 other first tokens beside the first draft, likeliest first, each once and
        none the first draft: a copy's branches, a model drafter's likeliest other tokens (greedy: after
        its argmax); a tree round verifies them beside the chain."""
        if width < 2 or not self.tokens:
            return []
        if self.source:
            return self.others()[: width - 1]
        q = self.q[0]
        likely = q.topk(min(width, q.shape[0])).indices.tolist()
        return [t for t in likely if t != self.tokens[0] and float(q[t]) > 0][: width - 1]

    @classmethod
    def none(cls, vocab_width: int, device: torch.device) -> Proposal:
        """No drafts (a plain step)."""
        return cls([], torch.zeros(0, vocab_width, device=device))


class DraftChain:
    """A model drafter's tokens, drawn one after another, each with the q it was drawn from.

    Past the first draft the chain stops where the drafter is unsure: its top probability below
    `DecodeConfig.confidence_threshold` (the token is drawn before that check: the generator
    advances either way). A draft that is likely refused costs a drafter step and a wider verify for
    nothing. Under the auto schedule the chain also stops drafting (`open` turns False) once the
    chance that the next draft passes with all before it, estimated as the product of the top
    probabilities so far times the last one again (a feature head's top probability is close to
    its acceptance), falls below the round's floor for that depth (`Drafter.floors`: what one more
    draft costs in drafting and verifying, over what a kept token is worth). The first draft is
    dropped, and the round becomes a plain step, where its probability (with a tree's alternatives,
    the top `width` probabilities together) is below floors[0]: the share of a step that its wider
    verify adds, what its tokens must be expected to make up for. These rules read the drafter's
    side only, so sampled output keeps the target's distribution."""

    def __init__(
        self, config: DecodeConfig, generator: torch.Generator | None, floors: tuple[float, ...] = (), width: int = 1
    ) -> None:
        self.config = config
        self.generator = generator
        self.floors = floors
        self.width = width
        self.reach = 1.0
        self.open = True  # whether one more draft is worth its cost (see `floors`)
        self.tokens: list[int] = []
        self.dists: list[torch.Tensor] = []
        self.ids: torch.Tensor | None = None  # the ids q is over (a cut output layer), None: all

    def draw(self, q: torch.Tensor, ids: torch.Tensor | None = None, width: int = 0) -> int | None:
        """The next draft, drawn from q; None where the chain stops before it. With `ids`, q is over
        those token ids only (a drafter's cut output layer; 0 elsewhere in the `width` ids)."""
        token = int(sample(q, self.generator, self.config.greedy))
        top = float(q[token]) if self.config.greedy else float(q.max())  # greedy: the argmax is the top
        threshold = self.config.confidence_threshold
        if self.tokens and threshold and top < threshold:
            return None
        if not self.tokens and self.floors and self.floors[0] > 0.0:
            # the first draft and its alternatives (a tree's `width` candidates) are verified only
            # where they are likely enough to pass to pay for the wider verify over a plain step
            mass = float(q.topk(min(self.width, q.shape[-1])).values.sum()) if self.width > 1 else top
            if mass < self.floors[0]:
                return None
        if ids is not None:
            token = int(ids[token])
        self.ids = ids
        self.tokens.append(token)
        self.dists.append(q)
        self.reach *= top
        depth = len(self.tokens)
        self.open = depth >= len(self.floors) or self.reach * top >= self.floors[depth]
        return token

    def proposal(self, vocab_width: int, device: torch.device) -> Proposal:
        if not self.tokens:
            return Proposal.none(vocab_width, device)
        # q over a cut output layer's ids stays cut (`Proposal.columns`) until read whole
        return Proposal(self.tokens, torch.stack(self.dists), width=vocab_width, device=device, columns=self.ids)


def _widened(q: torch.Tensor, ids: torch.Tensor, width: int) -> torch.Tensor:
    """q (..., len(ids)) over the token ids `ids` as distributions over all `width` ids (0
    elsewhere); on the CPU through numpy, whose fancy assignment takes a third of torch's index_copy
    over 49,152 ids."""
    if q.device.type != "cpu" or q.dtype != torch.float32:
        return q.new_zeros(*q.shape[:-1], width).index_copy_(q.dim() - 1, ids, q)
    out = np.zeros((*q.shape[:-1], width), np.float32)
    out[..., ids.numpy()] = q.numpy()
    return torch.from_numpy(out)


def output_logits(hidden: torch.Tensor, layer: Linear, output_ids: torch.Tensor | None, width: int) -> torch.Tensor:
    """Logits over `width` token ids from an output layer cut to the rows `output_ids` (all rows if
    None): -inf, so q = 0, for every id outside them."""
    if output_ids is None:
        return layer(hidden)
    logits = hidden.new_full((width,), float("-inf"))
    logits[output_ids] = layer(hidden)
    return logits


class Drafter(ABC):
    name: str
    needs_states = False  # True: the loop calls `observe` with the target's last hidden states
    feature_layers: tuple[int, ...] = ()  # and the residual streams after these many target layers
    module: torch.nn.Module | LlamaCppModel | None = None  # the model that drafts (what its measured cost is cached by)
    context_length: int | None = None  # positions a model drafter was trained on (`engine.context`)
    copies_text = False  # True: it drafts by copying from the text, so nothing copies before it
    # this round's reach floors (`Shape.floors`): a model drafter's chain stops before depth d + 1
    # where the product of its top probabilities so far falls below floors[d]
    floors: tuple[float, ...] = ()
    width = 1  # this round's candidates for the first token (a tree), which floors[0] weighs together

    def begin(
        self, prompt_ids: list[int], config: DecodeConfig, vocab_width: int, generator: torch.Generator | None
    ) -> None:
        """A new session: remember its settings (and prefill, for model drafters)."""
        self.config = config
        self.vocab_width = vocab_width
        self.generator = generator

    @abstractmethod
    def propose(self, ids: list[int], k: int) -> Proposal:
        """Up to k tokens to follow `ids` (every kept token, prompt included)."""

    def observe(self, states: torch.Tensor) -> None:  # noqa: B027 (a hook: most drafters need no states)
        """The target's last hidden states (n, hidden) for the next n kept tokens, in order, each
        computed with every earlier kept token in context (only when `needs_states`); with
        `feature_layers`, (n, len(feature_layers) + 1, hidden): those layers' residual streams, then
        the last hidden state."""

    def skip(self, count: int) -> None:  # noqa: B027 (a hook: most drafters need no states)
        """The next `count` kept tokens come without the target's states: their forward computed
        none, since the round did not draft from them (only when `needs_states`)."""

    def end(self, ids: list[int]) -> None:  # noqa: B027 (a hook: most drafters keep nothing)
        """The session ended with `ids` kept (prompt included)."""

    def copier(self, device: torch.device) -> Drafter:
        """What copies from the text before this drafter, where the text repeats (`DecodeConfig.lookup`):
        prompt lookup from two repeated tokens on."""
        return PromptLookupDrafter(device=device, min_ngram=2)

    def _empty(self, device: torch.device) -> Proposal:
        return Proposal.none(self.vocab_width, device)


class DraftModelDrafter(Drafter):
    """A small causal LM. Its cache follows the same invariant as the target's (`engine.kvcache`).

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

    def propose(self, ids: list[int], k: int) -> Proposal:
        feed = self._sync(ids)
        chain = DraftChain(self.config, self.generator, self.floors, self.width)
        for _ in range(k):
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

    def propose(self, ids: list[int], k: int) -> Proposal:
        tokens, start = self._match(ids, k)
        if not tokens:
            return self._empty(self.device)
        match = 0  # how far the occurrence matches the text's end, past the n-gram that found it
        while match < start and match < MATCH_CAP and ids[start - 1 - match] == ids[-1 - match]:
            match += 1
        return one_hot(tokens, self.vocab_width, self.device, source="prompt", match_length=match)


def one_hot(tokens: list[int], width: int, device: torch.device, **copied) -> Proposal:
    """Drafts copied from text (`copied`: the `Proposal`'s source and match): q is one-hot on each,
    so the rejection rule accepts a draft with probability p(draft) and sampling stays exact."""
    return Proposal(tokens, None, width=width, device=device, **copied)
