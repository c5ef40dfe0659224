"""Suffix drafting (SuffixDecoding, Oliaro et al. 2024; vLLM's `suffix` method): drafts copied from
text already written, which the hybrid copies before a model drafter.

- `SuffixDrafter` finds the longest suffix of the kept tokens that occurred earlier, in this
  request's own text (prompt and answer so far) and in the earlier texts its scope allows
  (`DecodeConfig.suffix_scope`: the target's own texts, `specdeck.train.target_texts`, and this
  session's answers; past sessions' from the cache folder), and
  drafts what followed it: in the request's own text, its latest occurrence's continuation (as
  prompt lookup copies: text that repeats itself, such as an answer retelling an earlier one, most
  often repeats its latest passage); in earlier texts, the most frequent continuation. A draft is at
  most max_spec_factor (2) x the match's length (short matches, which the target's own texts give
  often, are right less often, and each draft widens the verify), stopping where the path's share of what followed falls
  below `min_share`. Where nothing matched (a token new to the text), it offers the request's most
  frequent token. The other first tokens (the match's other continuations, the other texts' drafts)
  come along as branches, which a tree round verifies beside the path for little more than a plain
  step costs. q is one-hot on each draft, so the rejection rule accepts a draft with probability
  p(draft) and sampling stays exact.
- The hybrid is a model drafter (feature head or draft model) whose copier
  (`Drafter.copying_first`) is a suffix drafter that drafts only when its path's score (the tokens
  its frequencies expect to be right) reaches `min_score` (`HYBRID_MIN_SCORE`); the paper's hybrid
  with EAGLE. The decoding loop tries the copier first and asks the model where it has nothing, as
  it does with prompt lookup before other drafters (`specdeck.engine.loop.drafting_step`).

`python -m specdeck.bench.suffix_round` times a round of it with 100,000 tokens of earlier texts.
"""

from __future__ import annotations

import torch

from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.past_sessions import PastSessions
from specdeck.engine.drafting.proposals import Proposal, one_hot
from specdeck.engine.drafting.suffix import ROOT, Match, SuffixIndex
from specdeck.engine.planner.round_shape import ProposalShape

HYBRID_MIN_SCORE = 2.0  # a copy the text's frequencies expect to keep at least two tokens of


class SuffixDrafter(Drafter):
    """Drafts from earlier text: this request's, `texts` (the target's own answers to composed
    requests) and `history` (the answers written since SpecDeck started), both under scopes
    `session` and `all`, and `past` (past sessions', scope `all`). A request's text
    joins `history`, and under scope `all` the store of `past`, when it ends, unless `records` is
    False (a benchmark keeps a prompt's runs out of its own history)."""

    name = "suffix"
    copies_text = True

    def __init__(
        self,
        history: SuffixIndex | None = None,
        past: PastSessions | None = None,
        records: bool = True,
        texts: SuffixIndex | None = None,
        max_spec_factor: float = 2.0,
        min_share: float = 0.1,
        min_score: float = 0.0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.history = history
        self.past = past
        self.records = records
        self.texts = texts
        self.max_spec_factor = max_spec_factor
        self.min_share = min_share
        self.min_score = min_score
        self.device = torch.device(device)

    def begin(self, prompt_ids, config, vocab_width, generator) -> None:
        super().begin(prompt_ids, config, vocab_width, generator)
        self._own = SuffixIndex()
        self._own.extend(prompt_ids)
        self._counts: dict[int, int] = {}  # the request's tokens, how often each
        self._frequent: int | None = None  # the most frequent, the latest of equally frequent ones
        self._count(prompt_ids)
        earlier = []
        if config.suffix_scope != "prompt" and self.history is not None:
            earlier.append(("session", self.history))
        if config.suffix_scope != "prompt" and self.texts is not None:
            earlier.append(("texts", self.texts))
        if config.suffix_scope == "all" and self.past is not None:
            earlier.append(("past", self.past.index()))
        # earlier texts do not change during a request, so their matches stream along with the kept tokens
        self._earlier = [(source, index, index.stream(prompt_ids)) for source, index in earlier]

    def propose(self, ids: list[int], shape: ProposalShape) -> Proposal:
        k = shape.k
        kept = ids[self._own.tokens :]
        self._own.extend(kept)
        self._count(kept)
        self._earlier = [(source, index, index.stream(kept, match)) for source, index, match in self._earlier]
        own = self._own.earlier()
        candidates = [("prompt", self._own, own)]
        candidates += [(source, index, index.continued(match)) for source, index, match in self._earlier]
        candidates.sort(key=lambda candidate: -candidate[2].length)  # stable: the request's own first on a tie
        # the longest match whose walk drafts: the chain. The other candidates are walked only where
        # a tree round asks for branches (most rounds verify no copy at all, and a round's look-ups
        # are a share of a llama.cpp step)
        chosen: tuple[str, SuffixIndex, Match, list[int], list[bool]] | None = None
        rest = len(candidates)
        for position, (source, index, match) in enumerate(candidates):
            walked = self._walk(index, match, k)
            if walked is None:
                break
            if walked[0]:
                chosen, rest = (source, index, match, *walked), position + 1
                break
        if chosen is None and not self.min_score and k and self._frequent is not None:
            # nothing matched: the request's most frequent token, its next most frequent as branches,
            # which a tree round verifies beside it for little more than a plain step costs
            chosen = ("prompt", self._own, ROOT, [self._frequent], [True])
        if chosen is None:
            return self._empty(self.device)
        source, index, match, tokens, doubted = chosen

        def branches() -> list[int]:
            # the match's other frequent continuations, the other texts' first drafts, then the
            # other tokens that followed the match in this request
            others = self._branches(index, match)
            for _, other, at in candidates[rest:]:
                walked = self._walk(other, at, k)
                if walked is None:
                    break
                others += walked[0][:1]
            others += [token for token, _ in self._own.ranked(own.state)[0]]
            return [token for token in dict.fromkeys(others) if token != tokens[0]]

        return one_hot(
            tokens,
            self.vocab_width,
            self.device,
            source=source,
            match_length=match.length,
            doubted=tuple(doubted),
            branches=branches,
        )

    def _count(self, tokens: list[int]) -> None:
        for token in tokens:
            self._counts[token] = count = self._counts.get(token, 0) + 1
            if count >= self._counts.get(self._frequent, 0):  # type: ignore[arg-type]
                self._frequent = token

    def _walk(self, index: SuffixIndex, match: Match, k: int) -> tuple[list[int], list[bool]] | None:
        """The draft after `match` (empty: none that scores `min_score`) and which of its tokens were
        doubted (`SuffixIndex.scored_walk`), or None where the match is too short to draft from (so
        is every later candidate's, in order of length). In this request's own text, what followed
        the match's latest occurrence (as prompt lookup copies: where the text repeats, it most
        often repeats its latest passage); in earlier texts, the most frequent continuation."""
        longest = min(k, int(self.max_spec_factor * match.length))
        if longest <= 0:
            return None
        tokens, score, doubted = index.scored_walk(match, longest, self.min_share, recent=index is self._own)
        return (tokens, doubted) if score >= self.min_score else ([], [])

    def _branches(self, index: SuffixIndex, match: Match) -> list[int]:
        """The match's frequent continuations (at least `min_share` of what followed it), most frequent first."""
        top, total = index.ranked(match.state)
        return [token for token, count in top if count >= self.min_share * total]

    def end(self, ids: list[int]) -> None:
        if not self.records or self.config.suffix_scope == "prompt":
            return
        if self.history is not None:
            self.history.extend(ids)
            self.history.separate()
        if self.config.suffix_scope == "all" and self.past is not None:
            self.past.save(ids)
