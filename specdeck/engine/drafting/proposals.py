"""What a drafter hands the decoding loop: its drafts and the distribution q each was drawn from.

The loop judges each draft by q (a greedy round by a few of its values, a sampled one by the rule
min(1, p/q), Leviathan et al. 2023), so a `Proposal` carries it, made only where it is read: a
copy from text has no model behind it and its q is one-hot (`one_hot`); a cut output layer's q
stays over its own ids. A model drafter draws its drafts through a `DrawnChain`, which stops where
one more draft is unlikely to pay for itself (`DrawnChain`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.planner.round_shape import ProposalShape
from specdeck.engine.sampling import sample


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
    # and many are left unverified: `specdeck.engine.loop.drafting_step`). With `columns`, (len(tokens),
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

    def first(self, n: int) -> Proposal:
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


class DrawnChain:
    """A model drafter's tokens, drawn one after another, each with the q it was drawn from, as far
    as the round's `ProposalShape` asks.

    Past the first draft the chain stops where the drafter is unsure: its top probability below
    `DecodeConfig.confidence_threshold` (the token is drawn before that check: the generator
    advances either way). A draft that is likely refused costs a drafter step and a wider verify for
    nothing. Under the auto schedule the chain also stops drafting (`open` turns False) once the
    chance that the next draft passes with all before it, estimated as the product of the top
    probabilities so far times the last one again (a feature head's top probability is close to
    its acceptance), falls below the round's floor for that depth (`ProposalShape.floors`: what one
    more draft costs in drafting and verifying, over what a kept token is worth). The first draft is
    dropped, and the round becomes a plain step, where its probability (with a tree's alternatives,
    the top `width` probabilities together) is below floors[0]: the share of a step that its wider
    verify adds, what its tokens must be expected to make up for. These rules read the drafter's
    side only, so sampled output keeps the target's distribution."""

    def __init__(self, config: DecodeConfig, generator: torch.Generator | None, shape: ProposalShape) -> None:
        self.config = config
        self.generator = generator
        self.floors = shape.floors
        self.width = shape.width
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


def one_hot(tokens: list[int], width: int, device: torch.device, **copied) -> Proposal:
    """Drafts copied from text (`copied`: the `Proposal`'s source and match): q is one-hot on each,
    so the rejection rule accepts a draft with probability p(draft) and sampling stays exact."""
    return Proposal(tokens, None, width=width, device=device, **copied)
