"""The suffix drafter: greedy text equal to plain text, drafts from an earlier answer in the same
session, and a benchmark that never lets a prompt draft from its own runs."""

import pytest

from specdeck.bench.prompts import BenchPrompt
from specdeck.bench.runner import BenchSettings, Method, run_bench
from specdeck.engine import DecodeConfig, SuffixDrafter, TokenEvent, encode_prompt, generate
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.pair import DrafterKind, ModelPair
from specdeck.engine.planner.round_shape import ProposalShape

PROMPTS = ["The quick brown fox", "def add(a, b):\n    return"]


def kept_ids(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


@pytest.mark.parametrize("schedule", ["constant", "auto"])
def test_greedy_suffix_equals_plain(tiny_pair, schedule):
    """Greedy, for several K, with an empty history and with the earlier answers in it, the kept
    tokens equal plain decoding's."""
    target, _ = tiny_pair
    history = SuffixIndex()
    drafted = 0
    for prompt in PROMPTS:
        ids = encode_prompt(target.tokenizer, prompt, chat=False)
        plain = kept_ids(generate(target, ids, DecodeConfig(max_new_tokens=32)))
        for k in (1, 3, 8):
            events = list(
                generate(target, ids, DecodeConfig(k=k, schedule=schedule, max_new_tokens=32), SuffixDrafter(history))
            )
            assert kept_ids(events) == plain, (prompt, k)
            drafted += events[-1].drafted
    assert drafted > 0


@pytest.mark.parametrize("scope", ["session", "prompt"])
def test_repeated_prompt_drafts_from_the_earlier_answer(tiny_pair, scope):
    """Asked the same prompt twice, a session-scope drafter accepts more drafts the second time (it
    drafts from the first answer); a prompt-scope one drafts the same both times."""
    target, _ = tiny_pair
    history = SuffixIndex()
    ids = encode_prompt(target.tokenizer, PROMPTS[0], chat=False)
    config = DecodeConfig(k=6, schedule="constant", max_new_tokens=40, suffix_scope=scope)
    first, second = (list(generate(target, ids, config, SuffixDrafter(history)))[-1] for _ in range(2))
    assert first.text == second.text
    if scope == "session":
        assert second.accepted > first.accepted
        assert second.accepted >= 30
    else:
        assert (second.drafted, second.accepted) == (first.drafted, first.accepted)
        assert len(history) == 0


def test_pair_history_feeds_later_sessions_only(tiny_pair):
    """A pair's suffix drafters share its history; one given another history neither reads nor
    extends the pair's."""
    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    ids = encode_prompt(target.tokenizer, PROMPTS[1], chat=False)
    config = DecodeConfig(k=6, schedule="constant", max_new_tokens=24)
    list(generate(target, ids, config, pair.make_drafter()))
    indexed = len(pair.history)
    assert indexed == len(ids) + 24 + 1  # the prompt, the answer and a separator
    aside = list(generate(target, ids, config, pair.make_drafter(SuffixIndex())))[-1]
    again = list(generate(target, ids, config, pair.make_drafter()))[-1]
    assert len(pair.history) == 2 * indexed
    assert again.accepted > aside.accepted


def test_bench_never_drafts_a_prompt_from_its_own_runs(tiny_pair):
    """Every repeat of a prompt drafts alike (its own runs stay out of the history); the same text
    asked again as a later prompt drafts from the earlier prompt's answer."""
    target, _ = tiny_pair
    pair = ModelPair(target, drafter_kind=DrafterKind.SUFFIX)
    prompts = [BenchPrompt(str(i), "qa", PROMPTS[0], chat=False) for i in (1, 2)]
    settings = BenchSettings(ks=(4,), baselines=("plain",), repeats=2, decode=DecodeConfig(max_new_tokens=32))
    results = run_bench([pair], prompts, settings)
    method = Method("speculative", 4, "suffix")
    first, again = ([run.accepted for run in result.runs[method]] for result in results)
    assert first[0] == first[1]
    assert min(again) > max(first)
    assert all(
        run.token_ids == results[0].runs[Method("plain")][0].token_ids for r in results for run in r.runs[method]
    )
    assert len(pair.history) == 0


def proposed(prompt: list[int], k: int, min_score: float = 0.0):
    """What a suffix drafter with no earlier texts proposes after `prompt`."""
    drafter = SuffixDrafter(min_score=min_score)
    drafter.begin(prompt, DecodeConfig(suffix_scope="prompt"), 16, None)
    return drafter.propose(prompt, ProposalShape(k))


def test_own_text_drafts_what_followed_the_latest_occurrence():
    """Where the request's text repeats a passage, the draft continues its latest occurrence (what
    an answer repeating an earlier one writes next), even where an older continuation is more frequent."""
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5, 6, 7, 9, 1, 2]
    proposal = proposed(prompt, 4)
    assert proposal.tokens == [5, 6, 7, 9]
    assert 3 in proposal.others()  # the more frequent continuation, verified beside it in a tree


def test_unmatched_text_drafts_its_most_frequent_tokens_alone():
    """Where the newest token never occurred before, a suffix drafter offers the request's most
    frequent token with the next ones as branches; a hybrid's copier (a score to reach) offers nothing,
    so its model drafts."""
    prompt = [3, 1, 3, 2, 3, 1, 8]
    proposal = proposed(prompt, 4)
    assert proposal.tokens == [3]
    assert proposal.others()[:1] == [1]
    assert proposed(prompt, 4, min_score=2.0).tokens == []
