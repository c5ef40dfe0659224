"""Greedy speculative decoding must reproduce plain greedy decoding token for token."""

import pytest

from specdeck.engine import DecodeConfig, DraftModelDrafter, PromptLookupDrafter, TokenEvent, encode_prompt, generate

PROMPTS = ["The quick brown fox", "def add(a, b):\n    return"]


def kept_ids(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
@pytest.mark.parametrize("drafter_kind", ["draft-model", "prompt-lookup"])
def test_greedy_speculative_equals_plain(tiny_pair, drafter_kind, schedule):
    """For K = 1..8, both drafters and both schedules, the kept tokens equal plain greedy decoding."""
    target, draft = tiny_pair
    for prompt in PROMPTS:
        ids = encode_prompt(target.tokenizer, prompt, chat=False)
        plain = kept_ids(generate(target, ids, DecodeConfig(max_new_tokens=32)))
        assert len(plain) == 32
        for k in range(1, 9):
            drafter = DraftModelDrafter(draft.model) if drafter_kind == "draft-model" else PromptLookupDrafter()
            config = DecodeConfig(k=k, schedule=schedule, max_new_tokens=32)
            assert kept_ids(generate(target, ids, config, drafter)) == plain, (prompt, k)


def test_pair_both_accepts_and_rejects(tiny_pair):
    """The test pair exercises both branches of the rule, so the exactness test means something."""
    target, draft = tiny_pair
    ids = encode_prompt(target.tokenizer, PROMPTS[0], chat=False)
    summary = list(
        generate(target, ids, DecodeConfig(k=4, schedule="constant", max_new_tokens=32), DraftModelDrafter(draft.model))
    )[-1]
    assert 0 < summary.accepted < summary.drafted


def test_confidence_cutoff_is_exact_and_drafts_less(tiny_llama):
    """A confidence threshold shortens drafts without changing greedy output."""
    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, PROMPTS[1], chat=False)
    plain = kept_ids(generate(target, ids, DecodeConfig(max_new_tokens=40)))
    full = list(
        generate(target, ids, DecodeConfig(k=6, schedule="constant", max_new_tokens=40), DraftModelDrafter(draft.model))
    )
    cut = list(
        generate(
            target,
            ids,
            DecodeConfig(k=6, schedule="constant", max_new_tokens=40, confidence_threshold=0.9),
            DraftModelDrafter(draft.model),
        )
    )
    assert kept_ids(cut) == plain
    assert cut[-1].drafted / cut[-1].rounds < full[-1].drafted / full[-1].rounds
