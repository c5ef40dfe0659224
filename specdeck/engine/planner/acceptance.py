"""How often drafts are accepted, as the auto schedule (`specdeck.engine.planner.autotune`) estimates it while a
session runs: a model drafter's acceptance by draft depth (`DepthAcceptance`), and a copied draft's
by where it was copied from, how long its match is and whether the text went on otherwise after it
(`CopyAcceptance`); older rounds weigh less (`DECAY`), and each estimate starts from a prior.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

DECAY = 0.97  # weight of a round's evidence after each later round (about 30 rounds of memory; a copy
# estimate's: about 30 of its own judged drafts, `CopyAcceptance.record`)
PRIOR = 2.0  # pseudo-rounds behind each acceptance estimate


@dataclass
class DepthAcceptance:
    """Decayed counts of drafts tried and accepted at each depth (1-based) of a round."""

    tried: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        self.tried = [t * DECAY for t in self.tried]
        self.accepted = [a * DECAY for a in self.accepted]
        reached = min(accepted + 1, drafted)  # depth d was judged only if every draft before it passed
        while len(self.tried) < reached:
            self.tried.append(0.0)
            self.accepted.append(0.0)
        for d in range(reached):
            self.tried[d] += 1.0
            self.accepted[d] += d < accepted

    def rate(self, depth: int) -> float:
        """a_depth: a Beta estimate whose prior mean is the depth above's estimate (0.5 at depth 1)."""
        return self.rates(depth)[-1]

    def rates(self, depths: int) -> list[float]:
        """a_1 .. a_depths."""
        rates, prior = [], 0.5
        for i in range(depths):
            tried, accepted = (self.tried[i], self.accepted[i]) if i < len(self.tried) else (0.0, 0.0)
            prior = (accepted + PRIOR * prior) / (tried + PRIOR)
            rates.append(prior)
        return rates

    def expected_tokens(self, k: int) -> float:
        """E(K) = 1 + sum over j <= K of a_1 ... a_j."""
        return self.expected(k)[k]

    def expected(self, k: int) -> list[float]:
        """E(0) .. E(k), from one pass over the depths."""
        totals, reach = [1.0], 1.0
        for rate in self.rates(k):
            reach *= rate
            totals.append(totals[-1] + reach)
        return totals


MATCH_CAP = 32  # copies of matches this long or longer share one estimate


def _doubted_at(doubted: Sequence[bool], depth: int) -> bool:
    """Whether a copy's draft at `depth` was doubted (not, where the copier did not say)."""
    return depth < len(doubted) and doubted[depth]


@dataclass
class CopyAcceptance:
    """Decayed counts of copied drafts judged and accepted, by where the copy came from (this
    request's own text, or earlier texts), by how long its match was when each draft was judged,
    by whether the draft was a copy's first (fresh) or one that went on after drafts that passed,
    and by whether it was doubted: whether the string before it also went on otherwise in the text
    it was copied from (`SuffixIndex.scored_walk`).

    A copy that follows a match of m tokens, once its first d - 1 drafts passed, follows a match of
    m + d - 1, so every depth of every copy tells about one match length, and a long copy of a
    long match is judged on evidence of its own (in code, a signature repeated token for token)
    rather than on the short matches most copies follow. A first draft and a later one at the
    same length are counted apart: a copy's later drafts go on along the occurrence its match
    chose, where a copy found afresh after the longer match copies its latest occurrence. Doubted
    drafts are counted apart too: after short matches they pass far less often than drafts not
    doubted, and merged, neither kind was judged right.

    A length's prior mean starts at the rule of succession, (m + 1) / (m + 2) (a match that held for
    m tokens holds for one more that often; 0.5 where the match length is unknown or the draft
    doubted), moved by what drafts of the same kind after other match lengths did, the nearer
    lengths weighing more: most short matches in prose are common phrases that the target does not
    go on with, and a length judged once or twice is judged mostly by its neighbours, longer
    ones included."""

    # (own, fresh, m, doubted) -> [accepted, tried]
    counts: dict[tuple[bool, bool, int, bool], list[float]] = field(default_factory=dict)
    _nearby: dict[tuple[bool, bool, int, bool], tuple[float, float]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def rate(self, own: bool, match: int, fresh: bool = True, doubted: bool = False) -> float:
        """The chance that a draft at match length `match` passes: a copy's first (`fresh`) or a
        later one, `doubted` or not."""
        match = min(match, MATCH_CAP)
        prior = (match + 1) / (match + 2) if match and not doubted else 0.5
        if match:
            near_accepted, near_tried = self.nearby(own, match, fresh, doubted)
            prior = (near_accepted + PRIOR * prior) / (near_tried + PRIOR)
        accepted, tried = self.counts.get((own, fresh, match, doubted), (0.0, 0.0))
        return (accepted + PRIOR * prior) / (tried + PRIOR)

    def nearby(self, own: bool, match: int, fresh: bool = True, doubted: bool = False) -> tuple[float, float]:
        """(accepted, tried) of drafts of the same source and kind after the other match lengths j,
        each weighted (min(j, match) / max(j, match))^2: the nearer a length, the more it tells."""
        key = (own, fresh, match, doubted)
        if key not in self._nearby:
            accepted = tried = 0.0
            for j in range(1, MATCH_CAP + 1):
                counts = self.counts.get((own, fresh, j, doubted))
                if counts is not None and j != match:
                    weight = (min(j, match) / max(j, match)) ** 2
                    accepted, tried = accepted + weight * counts[0], tried + weight * counts[1]
            self._nearby[key] = (accepted, tried)
        return self._nearby[key]

    def expected_tokens(self, own: bool, match: int, n: int, doubted: Sequence[bool] = ()) -> float:
        """Tokens a round keeps verifying the first n drafts of a copy after a match of `match`."""
        return self.expected(own, match, n, doubted)[n]

    def expected(self, own: bool, match: int, n: int, doubted: Sequence[bool] = ()) -> list[float]:
        """Tokens a round keeps verifying the first 0 .. n drafts of the copy, from one pass
        (`doubted`: for each draft, whether it was; none where not given)."""
        totals, reach = [1.0], 1.0
        for depth in range(n):
            reach *= self.rate(own, match + depth if match else 0, depth == 0, _doubted_at(doubted, depth))
            totals.append(totals[-1] + reach)
        return totals

    def record(self, own: bool, match: int, drafted: int, accepted: int, doubted: Sequence[bool] = ()) -> None:
        """Count a copy's judged drafts. An estimate forgets by its own drafts (DECAY per draft
        judged at its source, kind and length), not by other copies' rounds: in prose a request
        copies its own text far more often than earlier texts, and evidence that short matches in
        earlier texts fail, forgotten over the request's own copies, had the planner verify them
        again (from the prior) and lose once more."""
        self._nearby.clear()
        for depth in range(min(accepted + 1, drafted)):  # depth d + 1 was judged if the d before it passed
            key = (own, depth == 0, min(match + depth, MATCH_CAP) if match else 0, _doubted_at(doubted, depth))
            counts = self.counts.setdefault(key, [0.0, 0.0])
            counts[0] = counts[0] * DECAY + (depth < accepted)
            counts[1] = counts[1] * DECAY + 1.0

    def scaled(self, weight: float) -> CopyAcceptance:
        """These counts carried as at most `weight` judged drafts per estimate."""
        return CopyAcceptance(
            {key: [a * min(1.0, weight / t), t * min(1.0, weight / t)] for key, (a, t) in self.counts.items() if t}
        )

    def describe(self) -> str:
        """First drafts of copies of this request's own text not doubted: how often they passed, by match length."""
        own = sorted(
            (m, a / t)
            for (mine, fresh, m, doubt), (a, t) in self.counts.items()
            if mine and fresh and not doubt and t >= 1.0
        )
        return ", ".join(f"{m}: {rate:.2f}" for m, rate in own)
