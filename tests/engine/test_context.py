"""Prompts and answers that reach the end of the model's context (the tiny models know 512 positions)."""

import pytest

from specdeck.engine import DecodeConfig, DraftModelDrafter, SummaryEvent, TokenEvent, encode_prompt, generate
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import SessionStarted

CONTEXT = 512


def prompt_of(target, length: int) -> list[int]:
    ids = encode_prompt(target.tokenizer, "def add(a, b):\n    return a + b\n\n" * 200, chat=False)
    assert len(ids) >= length
    return ids[:length]


def kept_ids(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def test_prompt_longer_than_the_context_is_refused_with_both_sizes(tiny_pair):
    """A prompt that leaves no room for an answer is refused before anything runs, naming both sizes."""
    target, draft = tiny_pair
    for drafter in (None, DraftModelDrafter(draft.model)):
        with pytest.raises(SpecDeckError, match=f"prompt 600 tokens, context {CONTEXT}"):
            next(generate(target, prompt_of(target, 600), DecodeConfig(), drafter))


def test_truncated_prompt_keeps_its_last_part_and_says_so(tiny_pair):
    """With truncate_prompt the session decodes the prompt's end, as if only that had been given."""
    target, draft = tiny_pair
    ids = prompt_of(target, 600)
    config = DecodeConfig(k=3, schedule="constant", max_new_tokens=20, truncate_prompt=True)
    events = list(generate(target, ids, config, DraftModelDrafter(draft.model)))
    start = events[0]
    assert isinstance(start, SessionStarted)
    assert start.prompt_tokens + start.prompt_tokens_dropped == 600
    assert start.prompt_tokens == CONTEXT - 20
    plain = list(generate(target, ids[-start.prompt_tokens :], DecodeConfig(max_new_tokens=20)))
    assert kept_ids(events) == kept_ids(plain)


def test_answer_stops_at_the_end_of_the_context(tiny_pair):
    """An answer that would run past the context stops there, stop reason "context", and stays exact."""
    target, draft = tiny_pair
    ids = prompt_of(target, CONTEXT - 12)
    config = DecodeConfig(k=4, schedule="constant", max_new_tokens=40, lookup=0)
    plain = list(generate(target, ids, config))
    spec = list(generate(target, ids, config, DraftModelDrafter(draft.model)))
    for events in (plain, spec):
        summary = events[-1]
        assert isinstance(summary, SummaryEvent)
        assert (summary.stop_reason, summary.new_tokens) == ("context", 12)
    assert kept_ids(spec) == kept_ids(plain)


def test_draft_with_a_shorter_context_bounds_the_session(tiny_pair):
    """A draft model that knows fewer positions than the target sets the session's context."""
    target, draft = tiny_pair
    drafter = DraftModelDrafter(draft.model)
    drafter.context_length = 300
    with pytest.raises(SpecDeckError, match="prompt 400 tokens, context 300"):
        next(generate(target, prompt_of(target, 400), DecodeConfig(), drafter))
