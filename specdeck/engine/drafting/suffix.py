"""A suffix automaton over token ids: what suffix drafting looks up each round.

The automaton of a text (Blumer et al. 1985; the online construction of Crochemore & Hancart) has
one state per class of substrings that end at the same set of positions (`endpos`), at most 2n
states, and takes amortised O(1) work per appended token. Suffix drafting (SuffixDecoding, Oliaro
et al. 2024) asks two things of it:

- the longest suffix of a query (the tokens kept so far) that occurs in the text followed by a
  token, found by streaming the query through the automaton, one transition or suffix link per step;
- that suffix's continuations with their counts: for every token c, how often the suffix is
  followed by c. All strings of a state share their end positions, so the count of s + c is
  |endpos| of the state the c-transition leads to, kept in `_count`, and where s + c last ended is
  max(endpos) of that state, kept in `_latest` (which continuation followed s most recently).

`_count` and `_latest` are kept exact as tokens arrive: each new position adds one to the count of
every state on the suffix-link path of the new state, and is the latest end of each. That path is
as long as the number of distinct end-position classes among the text's repeated suffixes: a few
for prose, longer for text that repeats itself many times (n for one token repeated n times).

Texts of several sessions go into one automaton separated by `separate()`: each separator is a
token id of its own (negative), so no match runs across it.

`python -m specdeck.engine.drafting.suffix --bench` times a drafting round's look-ups on this machine.
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from typing import NamedTuple

RANKED = 8  # continuations `ranked` keeps per state: a walk's next token and a tree's branches


class Match(NamedTuple):
    """A state of the automaton and how many tokens of the query it matched (0: none)."""

    state: int
    length: int


ROOT = Match(0, 0)


class SuffixIndex:
    """The suffix automaton of a growing token sequence (`extend`), several texts apart (`separate`)."""

    def __init__(self) -> None:
        self._next: list[dict[int, int]] = [{}]  # transitions of each state
        self._link: list[int] = [-1]  # suffix link: the state of the longest suffix in another class
        self._len: list[int] = [0]  # length of the longest string of each state
        self._count: list[int] = [0]  # |endpos|: how often each state's strings occur
        self._latest: list[int] = [-1]  # max(endpos): where each state's strings last ended
        self._last = 0  # the state of the whole text
        self._separators = 0
        self.tokens = 0  # tokens appended, separators included
        # `ranked`'s answers since the last append, by (state, recent)
        self._ranked: dict[tuple[int, bool], tuple[list[tuple[int, int]], int]] = {}

    def __len__(self) -> int:
        return self.tokens

    def extend(self, tokens) -> None:
        """Append tokens to the text."""
        for token in tokens:
            self._append(token)

    def separate(self) -> None:
        """End the current text: no match will span this point."""
        self._separators += 1
        self._append(-self._separators)

    def _append(self, token: int) -> None:
        if self._ranked:
            self._ranked = {}
        nxt, link, length, count = self._next, self._link, self._len, self._count
        cur = len(nxt)
        nxt.append({})
        length.append(length[self._last] + 1)
        link.append(0)
        count.append(0)
        latest = self._latest
        latest.append(0)
        p = self._last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # q holds longer strings too: split off the ones that now also end here
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                length.append(length[p] + 1)
                link.append(link[q])
                count.append(count[q])  # the same end positions as q, until the new one is added below
                latest.append(latest[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self._last = cur
        position = self.tokens
        self.tokens += 1
        state = cur
        while state > 0:  # the new end position: one more occurrence of every suffix of the text
            count[state] += 1
            latest[state] = position
            state = link[state]

    def step(self, match: Match, token: int) -> Match:
        """The longest suffix of (matched query + token) that occurs in the text. Valid only while
        the text is unchanged: appending may split the state a match points at."""
        nxt, link, length = self._next, self._link, self._len
        state, matched = match
        while state != -1 and token not in nxt[state]:
            state = link[state]
        if state == -1:
            return ROOT
        return Match(nxt[state][token], min(matched, length[state]) + 1)

    def stream(self, query, match: Match = ROOT) -> Match:
        """`step` over every token of `query`, from `match`."""
        for token in query:
            match = self.step(match, token)
        return match

    def match(self, query) -> Match:
        """The longest suffix of `query` that occurs in the text followed by a token."""
        return self.continued(self.stream(query))

    def continued(self, match: Match) -> Match:
        """`match` cut back to its longest suffix that is followed by a token somewhere: a string
        seen only at the end of a text (before a separator or at the very end) has none, but a
        state up its suffix links has (its strings also end elsewhere)."""
        nxt, link, length = self._next, self._link, self._len
        state, matched = match
        while matched and not any(token >= 0 for token in nxt[state]):
            state = link[state]
            matched = length[state]
        return Match(state, matched)

    def earlier(self) -> Match:
        """The longest suffix of the text itself that occurred earlier in it (with what followed)."""
        state = self._link[self._last] if self._last else 0
        return self.continued(Match(state, self._len[state]))

    def continuations(self, match: Match) -> dict[int, int]:
        """Every token that follows the matched string in the text, with how often it does."""
        count = self._count
        return {token: count[state] for token, state in self._next[match.state].items() if token >= 0}

    def ranked(self, state: int, recent: bool = False) -> tuple[list[tuple[int, int]], int]:
        """A state's continuations (token, count), at most `RANKED`: the most frequent first, the
        latest to occur first among equally frequent ones (`recent`: the latest first, whatever
        their counts); and how often its strings occur followed by anything (a separator included).
        Remembered until the text grows: a state near the root of a long text has thousands of
        continuations, and an unchanged history is asked about the same states round after round."""
        known = self._ranked.get((state, recent))
        if known is None:
            count, latest, options = self._count, self._latest, self._next[state]
            total = sum(count[child] for child in options.values())

            def order(option: tuple[int, int]) -> tuple[int, int]:
                child = option[1]
                return (latest[child], count[child]) if recent else (count[child], latest[child])

            followers = [(token, child) for token, child in options.items() if token >= 0]
            # a sort of a state's few continuations (most have one to three) costs less than a heap
            # of them; both keep equal keys in the order given
            if len(followers) > 4 * RANKED:
                top = heapq.nlargest(RANKED, followers, key=order)
            else:
                top = sorted(followers, key=order, reverse=True)[:RANKED]
            known = self._ranked[(state, recent)] = ([(token, count[child]) for token, child in top], total)
        return known

    def walk(self, match: Match, max_tokens: int, floor: float = 0.0, recent: bool = False) -> list[int]:
        """The most frequent (`recent`: the latest) continuation path after `match`, up to
        `max_tokens` long, stopping where the path's share (the product of each step's share of its
        continuations) < floor."""
        return self.scored_walk(match, max_tokens, floor, recent)[0]

    def scored_walk(
        self, match: Match, max_tokens: int, floor: float = 0.0, recent: bool = False
    ) -> tuple[list[int], float, list[bool]]:
        """`walk`'s path, its score (the sum of its prefixes' shares: the number of its tokens the
        text's own frequencies expect to be right, SuffixDecoding's score), and for each of its
        tokens whether it was doubted: whether the string before it also went on otherwise in the text."""
        state, share, score = match.state, 1.0, 0.0
        path: list[int] = []
        doubted: list[bool] = []
        while len(path) < max_tokens:
            top, total = self.ranked(state, recent)
            if not top:
                break
            best, best_count = top[0]
            share *= best_count / total
            if share < floor:
                break
            path.append(best)
            doubted.append(best_count < total)
            score += share
            state = self._next[state][best]
        return path, score, doubted


def repetitive_text(tokens: int, vocab: int, seed: int) -> list[int]:
    """Random phrases of 4-32 tokens, three in ten of them copied from earlier in the text: what the
    benchmarks index."""
    rng = random.Random(seed)
    text: list[int] = []
    while len(text) < tokens:
        if len(text) > 64 and rng.random() < 0.3:
            start = rng.randrange(len(text) - 32)
            text.extend(text[start : start + rng.randint(4, 32)])
        else:
            text.extend(rng.randrange(vocab) for _ in range(rng.randint(4, 32)))
    return text[:tokens]


def _bench(tokens: int, queries: int, vocab: int, seed: int) -> None:
    """Index text with repeats (phrases copied from earlier), then time matching plus one walk."""
    text = repetitive_text(tokens, vocab, seed)
    index = SuffixIndex()
    started = time.perf_counter()
    index.extend(text)
    build_s = time.perf_counter() - started
    match = index.match(text[:16])
    started = time.perf_counter()
    for i in range(queries):  # a round: step over the kept tokens (about 3), then walk 8
        for token in text[16 + 3 * i : 19 + 3 * i]:
            match = index.step(match, token)
        index.walk(index.continued(match), 8, 0.1)
    per_round = (time.perf_counter() - started) / queries
    started = time.perf_counter()
    for _ in range(queries):
        index.walk(index.earlier(), 8, 0.1)
    per_walk = (time.perf_counter() - started) / queries
    print(
        f"{tokens} tokens indexed in {build_s:.2f} s ({build_s / tokens * 1e6:.1f} us/token), {len(index._len)} states"
    )
    print(
        f"a round (step 3 tokens, walk 8): {per_round * 1e6:.1f} us; walk from the text's own end: {per_walk * 1e6:.1f} us"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m specdeck.engine.drafting.suffix", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--bench", action="store_true", help="time indexing and a drafting round's look-ups")
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.bench:
        parser.print_help()
        return
    _bench(args.tokens, args.queries, args.vocab, args.seed)


if __name__ == "__main__":
    main()
