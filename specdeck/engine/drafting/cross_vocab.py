"""Drafting with a model that has a tokenizer of its own: the pair meets in the text.

The draft reads the kept text in its own tokens and proposes in them; the target verifies its own
tokens in one forward, as for any drafter, so the decoding loop does not change.

Greedy (Universal Assisted Generation, transformers' `AssistedCandidateGeneratorDifferentTokenizers`):
the draft writes greedily until its text spells more than K of the target's tokens; the target's
tokens for it come from re-tokenizing the text with the last few kept tokens before it (a
look-behind window), so a token that the seam would split is seen whole, and the drafts start
exactly where the kept text ends. q is one-hot on each draft: the text chose it. The target keeps
only its own argmaxes, so the output is plain greedy decoding's whatever the draft wrote.

Sampling (Timor et al. 2025, token-level intersection; transformers' `UniversalSpeculativeDecodingGenerator`):
the draft samples only tokens that have a twin (the same string) in the target's vocabulary, from
its distribution restricted and renormalised to them, and proposes each twin; q over the target's
vocabulary is that distribution carried over to the twins. Rejection sampling with min(1, p/q)
and the residual then follows p exactly, as it does for any q the drafts are drawn from.

Between rounds the kept text goes back to the draft: its token list (and cache) is cut to the
longest prefix whose text the kept text still starts with, less a look-behind window that is
read again, and the rest of the kept text is read in the draft's tokens. Its cache keeps the
invariant of `specdeck.engine.forward.kvcache`: every token it has read but the newest.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

import torch

from specdeck.engine.context import context_length
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import DraftPiece, Proposal
from specdeck.engine.drafting.vocabulary import TokenText, VocabularyMatch
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.planner.round_shape import ProposalShape
from specdeck.engine.sampling import logits_to_probs, sample

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specdeck.engine.forward.llamacpp_backend import LlamaCppModel

LOOKBEHIND = 4  # tokens before a seam that are tokenized again with the text after it


class CrossVocabularyDrafter(Drafter):
    """A small causal LM whose tokenizer differs from the target's (`VocabularyMatch` of the pair).

    `output_ids` (ids of the draft's vocabulary) limits what it drafts, as for `DraftModelDrafter`.
    The draft's context is counted in its own tokens: near its end the drafter proposes nothing
    and the session goes on with plain steps.
    """

    def __init__(
        self,
        model: PreTrainedModel | LlamaCppModel,
        match: VocabularyMatch,
        name: str = "draft model",
        output_ids: torch.Tensor | None = None,
    ) -> None:
        if match.target_text is None or match.draft_text is None or match.twins is None:
            raise ValueError("a cross-vocabulary drafter needs the match of two different tokenizers")
        self.name = name
        self.module = model
        self._lm = CachedModel(model)
        self._positions = context_length(model)
        self._target: TokenText = match.target_text
        self._draft: TokenText = match.draft_text
        twins = match.twins.to(self._lm.device)
        allowed = twins >= 0
        if output_ids is not None:
            listed = torch.zeros_like(allowed)
            listed[output_ids.to(self._lm.device)] = True
            allowed &= listed
        self._twins = twins
        self._unshared = ~allowed
        self._shared_ids = allowed.nonzero().flatten()
        self._shared_twins = twins[self._shared_ids]

    def begin(self, prompt_ids, config, vocab_width, generator) -> None:
        super().begin(prompt_ids, config, vocab_width, generator)
        self._lm.reset()
        self._kept_ends: list[int] = []  # where the text of each of the target's kept ids ends
        self._kept_text = b""
        self._tokens: list[int] = []  # the draft's tokens: the kept text it read, then its last drafts
        self._ends: list[int] = []  # where each one's text ends
        self._read = b""  # the text `_tokens` stand for
        self._agreed = 0  # bytes of `_read` known to be kept text (all of it at the last sync)
        self._cached = 0  # of `_tokens`, those in the draft's cache
        if len(prompt_ids) > 1:
            feed = self._sync(prompt_ids)
            if len(feed) > 1 and self._fits(0):
                self._lm.forward(feed[:-1], last_only=True)
                self._cached += len(feed) - 1

    def propose(self, ids: list[int], shape: ProposalShape) -> Proposal:
        k = shape.k
        feed = self._sync(ids)
        steps = 2 * k + 2 if self.config.greedy else k  # greedy: a target token may take several of the draft's
        if not feed or not self._fits(steps):
            return self._empty(self._lm.device)
        if self.config.greedy:
            return self._draft_text(feed, k, steps)
        return self._draft_twins(feed, k)

    def _fits(self, steps: int) -> bool:
        """Whether the draft's tokens and `steps` more stay within the positions it was trained on."""
        return self._positions is None or len(self._tokens) + steps <= self._positions

    def _read_kept(self, ids: list[int]) -> None:
        """Extend the kept text with the target's tokens kept since the last call (`ids` only grows
        within a session)."""
        new = ids[len(self._kept_ends) :]
        pieces = [self._target.text([token]) for token in new] if self._kept_ends else self._target.starting(new)
        end = len(self._kept_text)
        for piece in pieces:
            end += len(piece)
            self._kept_ends.append(end)
        self._kept_text += b"".join(pieces)

    def _sync(self, ids: list[int]) -> list[int]:
        """Bring the draft's tokens to the kept text of `ids`; crop its cache to the tokens still
        valid and return those it must read next (the newest last)."""
        self._read_kept(ids)
        text = self._kept_text
        common = min(self._agreed, len(text))  # the kept text only grows: what was kept stays
        limit = min(len(self._read), len(text))
        while common < limit and self._read[common] == text[common]:
            common += 1
        keep = bisect_right(self._ends, common)  # tokens whose text the kept text still starts with
        first = max(0, keep - LOOKBEHIND)
        start = self._ends[first - 1] if first else 0
        fresh = self._draft.encode(text[start:], at_start=start == 0)
        same = 0
        while (
            first + same < keep
            and same < len(fresh)
            and fresh[same][0] == self._tokens[first + same]
            and start + fresh[same][1] == self._ends[first + same]
        ):
            same += 1
        valid = first + same
        self._tokens[valid:] = [token for token, _ in fresh[same:]]
        self._ends[valid:] = [start + end for _, end in fresh[same:]]
        self._read = text
        self._agreed = len(text)
        self._cached = max(0, min(self._cached, valid, len(self._tokens) - 1))
        self._lm.crop(self._cached)
        return self._tokens[self._cached :]

    def _step(self, feed: list[int]) -> torch.Tensor:
        """The draft's logits for the token after `feed`, which it reads into its cache."""
        logits = self._lm.forward(feed, last_only=True)[-1]
        self._cached += len(feed)
        return logits

    def _write(self, token: int) -> bytes:
        """Append a drafted token to the draft's tokens; return its text."""
        piece = self._draft.text([token])
        self._read += piece
        self._tokens.append(token)
        self._ends.append(len(self._read))
        return piece

    def _draft_text(self, feed: list[int], k: int, steps: int) -> Proposal:
        """Greedy: the draft's text, in up to k of the target's tokens (Universal Assisted Generation)."""
        written = b""
        drafted: list[tuple[int, float, int]] = []  # (draft token, its q, where its text ends in `written`)
        converted: list[tuple[int, int]] = []
        closing = None  # the target's twin of a control token (end of text) the draft wrote
        for _ in range(steps):
            q = logits_to_probs(self._step(feed), self.config)
            token = int(q.argmax())
            if drafted and self.config.confidence_threshold and float(q[token]) < self.config.confidence_threshold:
                break
            if token in self._draft.special or token >= len(self._draft):
                twin = int(self._twins[token]) if token < len(self._twins) else -1
                closing = (twin, self._piece_text(token), float(q[token])) if twin >= 0 else None
                break
            written += self._write(token)
            drafted.append((token, float(q[token]), len(written)))
            converted = self._to_target(written)
            if len(converted) > k:
                break
            feed = [token]
        tokens = [token for token, _ in converted[:k]]
        pieces = [
            self._piece(drafted, converted[i - 1][1] if i else 0, end) for i, (_, end) in enumerate(converted[:k])
        ]
        if closing is not None and len(tokens) < k and len(converted) == len(tokens):
            tokens.append(closing[0])
            pieces.append(DraftPiece((closing[1],), (closing[2],)))
        if not tokens:
            return self._empty(self._lm.device)
        q = torch.zeros(len(tokens), self.vocab_width, device=self._lm.device)
        q[torch.arange(len(tokens)), torch.tensor(tokens, device=self._lm.device)] = 1.0
        return Proposal(tokens, q, pieces=pieces, draft_tokens=len(drafted) + (closing is not None))

    def _to_target(self, written: bytes) -> list[tuple[int, int]]:
        """The target's tokens for `written` after the kept text, each with where its text ends in
        `written`: the tail of the kept text and `written` tokenized together, cut at the seam; where
        a token straddles the seam, `written` tokenized alone (the kept tokens are final)."""
        back = max(0, len(self._kept_ends) - LOOKBEHIND)
        start = self._kept_ends[back - 1] if back else 0
        seam = len(self._kept_text) - start
        fresh = self._target.encode(self._kept_text[start:] + written)
        at = next((i for i, (_, end) in enumerate(fresh) if end >= seam), len(fresh))
        if at < len(fresh) and fresh[at][1] == seam:
            tokens = [(token, end - seam) for token, end in fresh[at + 1 :]]
        elif seam == 0:
            tokens = fresh
        else:
            tokens = self._target.encode(written)
        return [(token, end) for token, end in tokens if token != self._target.unk]

    def _piece(self, drafted: list[tuple[int, float, int]], start: int, end: int) -> DraftPiece:
        """The draft's tokens whose text overlaps bytes start..end of what it wrote, with their q."""
        overlapping, begin = [], 0
        for token, q, stop in drafted:
            if begin < end and stop > start:
                overlapping.append((self._piece_text(token), q))
            begin = stop
        return DraftPiece(tuple(text for text, _ in overlapping), tuple(q for _, q in overlapping))

    def _piece_text(self, token: int) -> str:
        """A draft token's text as shown: bytes that are no whole character written as escapes."""
        return self._draft.text([token]).decode("utf-8", "backslashreplace")

    def _draft_twins(self, feed: list[int], k: int) -> Proposal:
        """Sampling: k draws from the draft's distribution over the tokens with a twin, renormalised;
        each proposes its twin, with q the same distribution over the target's vocabulary."""
        if not len(self._shared_ids):
            return self._empty(self._lm.device)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        pieces: list[DraftPiece] = []
        for _ in range(k):
            q = logits_to_probs(self._step(feed).masked_fill(self._unshared, float("-inf")), self.config)
            if tokens and self.config.confidence_threshold and float(q.max()) < self.config.confidence_threshold:
                break
            token = int(sample(q, self.generator, greedy=False))
            # the target's q: each twin gets the mass of the draft tokens it stands for
            rows.append(q.new_zeros(self.vocab_width).index_add_(0, self._shared_twins, q[self._shared_ids]))
            tokens.append(int(self._twins[token]))
            self._write(token)
            pieces.append(DraftPiece((self._piece_text(token),), (float(q[token]),)))
            feed = [token]
        return Proposal(tokens, torch.stack(rows), pieces=pieces, draft_tokens=len(tokens))
