"""Property-based tests over the engine: random valid settings and random prompts on the tiny Llama
and GPT-2 pairs. Greedy speculative text equals plain text, the event stream is consistent, and
nothing but a `SpecDeckError` escapes.

A fixed, small number of examples by default (derandomized, so CI runs are repeatable);
SPECDECK_HYPOTHESIS=long runs many more, randomly.
"""

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeck.engine import (
    DecodeConfig,
    DraftModelDrafter,
    PromptLookupDrafter,
    RoundEvent,
    SuffixDrafter,
    SummaryEvent,
    TokenEvent,
    encode_prompt,
    generate,
)
from specdeck.engine.config import SCHEDULES
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.events import SessionStarted, TokenState
from specdeck.engine.loop.detok import whole_text

LONG = os.environ.get("SPECDECK_HYPOTHESIS") == "long"
PROFILE = settings(
    max_examples=300 if LONG else 40,
    deadline=None,
    derandomize=not LONG,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

prompts = (
    st.lists(
        st.one_of(
            st.characters(codec="utf-8", exclude_categories=("Cs",)),  # any Unicode: emoji, control chars, ...
            st.sampled_from(
                [" ", "\t", "\n", "\r\n", "    ", "def f(x):\n", "{}", "fox", "🙂", "東京", "\u200b", "\x00"]
            ),
        ),
        min_size=1,
        max_size=30,
    )
    .map("".join)
    .filter(lambda text: text.strip())
)

HISTORY = SuffixIndex()  # every suffix-drafted example's text: later examples draft from earlier ones

stop_strings = st.lists(st.text(min_size=1, max_size=3), max_size=2).map(tuple)


@st.composite
def decode_configs(draw, greedy: bool) -> DecodeConfig:
    k = draw(st.integers(1, 6))
    return DecodeConfig(
        k=k,
        schedule=draw(st.sampled_from(SCHEDULES)),
        max_k=draw(st.integers(k, 8)),
        confidence_threshold=draw(st.sampled_from((0.0, 0.05, 0.3, 0.9))),
        lookup=draw(st.integers(0, 4)),
        temperature=0.0 if greedy else draw(st.floats(0.1, 2.0)),
        top_k=draw(st.integers(0, 50)),
        top_p=draw(st.floats(0.05, 1.0)),
        seed=draw(st.integers(0, 2**31 - 1)),
        max_new_tokens=draw(st.integers(1, 24)),
        stop_strings=draw(stop_strings),
    )


def drafter_for(kind: str, draft):
    return {
        "draft-model": lambda: DraftModelDrafter(draft.model),
        "prompt-lookup": PromptLookupDrafter,
        "suffix": lambda: SuffixDrafter(HISTORY),
        "plain": lambda: None,
    }[kind]()


def kept_ids(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def assert_consistent(events, config: DecodeConfig, tokenizer) -> None:
    """The stream's invariants: its shape, kept pieces joining to the text, and counts that agree."""
    assert isinstance(events[0], SessionStarted) and isinstance(events[-1], SummaryEvent)
    summary = events[-1]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    kept = [e for e in tokens if e.state.kept]
    assert "".join(e.text for e in kept) == summary.text
    assert summary.text == whole_text(tokenizer, [e.token_id for e in kept])  # less a character cut short
    assert summary.new_tokens == len(kept) <= config.max_new_tokens
    assert [e.pos for e in kept] == list(range(len(kept)))
    assert summary.rounds == len(rounds) and (not rounds or rounds[-1].new_tokens == len(kept))
    assert summary.drafted == sum(r.drafted for r in rounds)
    assert summary.accepted == sum(r.accepted for r in rounds) == sum(e.state is TokenState.ACCEPTED for e in tokens)
    refused = sum(e.state in (TokenState.REJECTED, TokenState.DISCARDED) for e in tokens)
    assert summary.drafted == summary.accepted + refused
    assert summary.discarded == sum(e.state is TokenState.DISCARDED for e in tokens) == sum(r.discarded for r in rounds)
    assert all(0.0 <= e.p <= 1.0 + 1e-6 for e in tokens)
    assert summary.stop_reason in ("max_new_tokens", "eos", "stop_string", "context")
    if summary.stop_reason == "max_new_tokens":
        assert summary.new_tokens == config.max_new_tokens


@PROFILE
@given(
    prompt=prompts, config=decode_configs(greedy=True), kind=st.sampled_from(("draft-model", "prompt-lookup", "suffix"))
)
def test_greedy_speculative_text_equals_plain_text(tiny_pair, prompt, config, kind):
    """For any greedy settings and prompt, speculative decoding keeps exactly plain decoding's tokens."""
    target, draft = tiny_pair
    ids = encode_prompt(target.tokenizer, prompt, chat=False)
    plain = list(generate(target, ids, config))
    spec = list(generate(target, ids, config, drafter_for(kind, draft)))
    assert kept_ids(spec) == kept_ids(plain)
    assert spec[-1].text == plain[-1].text and spec[-1].stop_reason == plain[-1].stop_reason
    assert_consistent(spec, config, target.tokenizer)


@PROFILE
@given(
    prompt=prompts,
    config=st.one_of(decode_configs(greedy=True), decode_configs(greedy=False)),
    kind=st.sampled_from(("draft-model", "prompt-lookup", "suffix", "plain")),
)
def test_event_stream_is_consistent_for_any_settings(tiny_pair, prompt, config, kind):
    """For any valid settings, drafter and prompt the session ends normally with a consistent stream."""
    target, draft = tiny_pair
    events = list(
        generate(target, encode_prompt(target.tokenizer, prompt, chat=False), config, drafter_for(kind, draft))
    )
    assert_consistent(events, config, target.tokenizer)


def _latest_occurrence(ids: list[int], k: int, max_ngram: int) -> tuple[list[int], int]:
    """Prompt lookup's answer by its definition, scanning the whole text: after the latest earlier
    occurrence of the last n tokens (n = max_ngram .. 1) with k tokens after it, else the earliest."""
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        hits = [i for i in range(len(ids) - n) if ids[i : i + n] == ids[len(ids) - n :]]
        if hits:
            full = [i for i in hits if i + n + k <= len(ids)]
            start = (full[-1] if full else hits[0]) + n
            return ids[start : start + k], start
    return [], 0


@PROFILE
@given(
    max_ngram=st.integers(1, 4),
    vocab=st.integers(2, 12),
    grows=st.lists(st.tuples(st.lists(st.integers(0, 11), min_size=1, max_size=4), st.integers(1, 8)), max_size=25),
    restart=st.integers(0, 30),
)
def test_prompt_lookup_indexed_as_the_text_grows_finds_what_a_scan_finds(max_ngram, vocab, grows, restart):
    """Prompt lookup indexes the text as it grows: after every round, and after a text that is not
    a continuation (a new session), it finds the copy a scan of the whole text finds."""
    drafter = PromptLookupDrafter(max_ngram=max_ngram)
    ids = [0]
    for round_no, (more, k) in enumerate(grows):
        if round_no == restart:
            ids = ids[: len(ids) // 2] + [vocab - 1]
        ids = ids + [t % vocab for t in more]
        assert drafter._match(ids, k) == _latest_occurrence(ids, k, max_ngram)
