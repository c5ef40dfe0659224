"""The suffix automaton agrees with a brute-force matcher on random token texts: the longest matched
suffix, the counts of what follows it, and the most frequent path after it.

Same hypothesis profile as test_decoding_properties.py: SPECDECK_HYPOTHESIS=long runs many more examples.
"""

import os
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeck.engine.drafting.suffix import SuffixIndex

LONG = os.environ.get("SPECDECK_HYPOTHESIS") == "long"
PROFILE = settings(
    max_examples=1000 if LONG else 150,
    deadline=None,
    derandomize=not LONG,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# a few distinct token ids, so that texts repeat themselves; None ends a text (a separator)
texts = st.lists(st.one_of(st.integers(0, 3), st.just(None)), max_size=80)
queries = st.lists(st.integers(0, 4), max_size=12)


def indexed(items) -> tuple[SuffixIndex, list[int]]:
    """The index of `items` and its text as brute force sees it (each separator its own negative id)."""
    index, text = SuffixIndex(), []
    for item in items:
        if item is None:
            index.separate()
            text.append(-1 - len(text))
        else:
            index.extend([item])
            text.append(item)
    return index, text


def followers(text: list[int], string: list[int]) -> Counter:
    """How often each token follows an occurrence of `string` in `text`."""
    n = len(string)
    return Counter(text[i + n] for i in range(len(text) - n) if text[i : i + n] == string and text[i + n] >= 0)


def last_seen(text: list[int], string: list[int]) -> int:
    """Where the latest occurrence of `string` in `text` starts."""
    return max(i for i in range(len(text) - len(string) + 1) if text[i : i + len(string)] == string)


def occurrences_followed(text: list[int], string: list[int]) -> int:
    """Occurrences of `string` with any token after them (a separator included)."""
    return sum(1 for i in range(len(text) - len(string)) if text[i : i + len(string)] == string)


def brute_match(text: list[int], query: list[int]) -> tuple[int, Counter]:
    """The longest suffix of `query` followed by a token somewhere in `text`, and its followers."""
    for n in range(len(query), 0, -1):
        after = followers(text, query[len(query) - n :])
        if after:
            return n, after
    return 0, followers(text, [])


@PROFILE
@given(items=texts, query=queries)
def test_match_agrees_with_brute_force(items, query):
    """Longest match length and continuation counts equal brute force's."""
    index, text = indexed(items)
    match = index.match(query)
    length, after = brute_match(text, query)
    assert match.length == length
    assert index.continuations(match) == dict(after)


@PROFILE
@given(items=texts, more=st.lists(st.integers(0, 3), max_size=20))
def test_earlier_is_the_text_matched_against_itself(items, more):
    """The text's longest suffix seen earlier, kept up to date as tokens are appended one by one."""
    index, text = indexed(items)
    for token in more:
        index.extend([token])
        text.append(token)
        match = index.earlier()
        length, after = brute_match(text, text)
        assert (match.length, index.continuations(match)) == (length, dict(after))


@PROFILE
@given(items=texts, query=queries, floor=st.sampled_from([0.0, 0.1, 0.5]))
def test_walk_follows_the_most_frequent_continuation(items, query, floor):
    """Each walked token is a most frequent follower of the string so far; the walk stops only at
    max_tokens, a string with no followers, or where the path's share falls below the floor."""
    index, text = indexed(items)
    match = index.match(query)
    path = index.walk(match, 6, floor)
    string = query[len(query) - match.length :]
    share = 1.0
    for token in path:
        after = followers(text, string)
        assert after[token] == max(after.values())
        tied = [t for t, c in after.items() if c == after[token]]  # of these, the latest to follow
        assert last_seen(text, string + [token]) == max(last_seen(text, string + [t]) for t in tied)
        share *= after[token] / occurrences_followed(text, string)
        assert share >= floor
        string = string + [token]
    after = followers(text, string)
    if len(path) < 6 and after:
        assert share * max(after.values()) / occurrences_followed(text, string) < floor


@PROFILE
@given(items=texts, query=queries, recent=st.booleans())
def test_a_walked_token_is_doubted_where_its_string_also_went_on_otherwise(items, query, recent):
    """The walk marks a token doubted exactly where an occurrence of the string before it was
    followed by another token or ended a text: what the planner judges such copies by."""
    index, text = indexed(items)
    match = index.match(query)
    path, _, doubted = index.scored_walk(match, 6, recent=recent)
    assert len(doubted) == len(path)
    string = query[len(query) - match.length :]
    for token, doubt in zip(path, doubted):
        assert doubt == (followers(text, string)[token] < occurrences_followed(text, string))
        string = string + [token]


@PROFILE
@given(items=texts, query=queries)
def test_recent_walk_follows_the_latest_occurrence(items, query):
    """Walking `recent`, each token is the one that followed the string so far where it occurred last."""
    index, text = indexed(items)
    match = index.match(query)
    string = query[len(query) - match.length :]
    for token in index.walk(match, 6, recent=True):
        after = followers(text, string)
        assert last_seen(text, string + [token]) == max(last_seen(text, string + [t]) for t in after)
        string = string + [token]


def test_streaming_equals_matching_from_scratch():
    """`step` over a query, one token at a time, finds what `match` finds for every prefix."""
    index, _ = indexed([0, 1, 2, 0, 1, 3, None, 1, 2, 0, 1, 2, 2])
    query = [1, 2, 0, 1, 2, 2, 4, 0, 1]
    streamed = index.match([])
    for i, token in enumerate(query):
        streamed = index.step(streamed, token)
        assert index.continued(streamed) == index.match(query[: i + 1])
