"""Prompt lookup first (`DecodeConfig.lookup`): where the text repeats, rounds copy tokens instead of
asking the drafter, and decoding stays exact, greedy and sampled."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from sampling_checks import chi_square, chi_square_quantile

from specdeck.engine import DecodeConfig, DraftModelDrafter, RoundEvent, TokenEvent, TokenState, encode_prompt, generate
from specdeck.engine.drafting.drafters import PromptLookupDrafter
from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
from specdeck.engine.drafting.heads import FeatureHead, head_config
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.sampling import logits_to_probs

REPEATING = "one two three four five one two three four five one two three"


def _kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def _make(kind, target, draft):
    if kind == "draft-model":
        return DraftModelDrafter(draft.model)
    torch.manual_seed(0)
    return FeatureHeadDrafter(FeatureHead(head_config(target.model.config)).eval(), target.model)


def _counting(drafter):
    """The drafter, counting how often the loop asks it for a proposal."""
    drafter.asked = 0
    propose = drafter.propose

    def counted(ids, shape):
        drafter.asked += 1
        return propose(ids, shape)

    drafter.propose = counted
    return drafter


@pytest.mark.parametrize("kind", ["draft-model", "feature-head"])
def test_copied_rounds_keep_greedy_exact_and_skip_the_drafter(tiny_llama, kind):
    """On text that repeats, greedy output equals plain decoding for every K and lookup length, and
    some rounds were copies: the drafter was asked less often than there were rounds. A feature
    head, whose cache follows the target's states, keeps working across the rounds it sat out. The
    copied rounds and tokens are marked as such, and the drafter still drafted in the others."""
    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, REPEATING, chat=False)
    plain = _kept(generate(target, ids, DecodeConfig(max_new_tokens=40)))
    for lookup in (1, 3):
        for k in (1, 3):
            drafter = _counting(_make(kind, target, draft))
            events = list(
                generate(target, ids, DecodeConfig(k=k, schedule="constant", lookup=lookup, max_new_tokens=40), drafter)
            )
            assert _kept(events) == plain, (lookup, k)
            summary = events[-1]
            copied = {e.round for e in events if isinstance(e, RoundEvent) and e.copied}
            assert copied and drafter.asked + len(copied) <= summary.rounds, (lookup, k)
            copies = [e for e in events if isinstance(e, TokenEvent) and e.copied]
            assert copies and {e.round for e in copies} <= copied
            assert summary.copied_drafted == len(copies)
            assert summary.copied_accepted == sum(e.state is TokenState.ACCEPTED for e in copies)
            assert summary.drafted > sum(e.drafted for e in events if isinstance(e, RoundEvent) and e.copied)
            assert events[0].drafter.endswith("+ prompt lookup")


def test_without_repeats_the_drafter_drafts_every_round(tiny_llama):
    """Lookup only steps in where two tokens repeat: on a prompt without repeats the first round is
    the drafter's, like without lookup."""
    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    assert len(set(zip(ids, ids[1:]))) == len(ids) - 1
    drafter = _counting(DraftModelDrafter(draft.model))
    list(generate(target, ids, DecodeConfig(k=2, schedule="constant", lookup=2, max_new_tokens=2), drafter))
    assert drafter.asked == 1


def test_copied_token_keeps_sampling_exact(tiny_llama):
    """Over 1000 seeds the first sampled token follows the target when the first round copies a token
    (q one-hot on it): the prompt ends with two tokens seen before, followed then by the token
    the target likes most there, so copies are both accepted and rejected often."""
    target, draft = tiny_llama
    base = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    config = DecodeConfig(k=1, schedule="constant", lookup=1, temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=2)

    def chance(token: int) -> float:  # the target's probability of the copy that prompt lookup makes
        with torch.inference_mode():
            logits = target.model(input_ids=torch.tensor([base + [token] + base[-2:]])).logits[0, -1]
        return float(logits_to_probs(logits, config)[token])

    copy = max(range(target.vocab_width), key=chance)
    assert chance(copy) > 0.07
    ids = base + [copy] + base[-2:]
    assert PromptLookupDrafter(min_ngram=2)._match(ids, 1)[0] == [copy]
    with torch.inference_mode():
        p = logits_to_probs(target.model(input_ids=torch.tensor([ids])).logits[0, -1], config)
    exact = {t: float(p[t]) for t in p.nonzero().flatten().tolist()}
    n = 1000
    counts: dict = {}
    rejections = 0
    for seed in range(n):
        events = list(generate(target, ids, replace(config, seed=seed), DraftModelDrafter(draft.model)))
        first = _kept(events)[0]
        rejections += any(isinstance(e, TokenEvent) and e.state.value == "rejected" for e in events)
        counts[first] = counts.get(first, 0) + 1
    assert 0.05 * n < rejections < 0.95 * n
    stat, df = chi_square(counts, exact, n)
    assert df >= 5
    assert stat < chi_square_quantile(df)


def test_negative_lookup_is_refused():
    with pytest.raises(SpecDeckError, match="Lookup must be 0"):
        DecodeConfig(lookup=-1)
