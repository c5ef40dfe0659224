"""The hybrid drafter: suffix copies where they score high, the model drafter otherwise; exact either
way (greedy text equal to plain, sampling following the target)."""

import itertools
from dataclasses import replace

import pytest
import torch
from sampling_checks import chi_square, chi_square_quantile, exact_two_token_distribution, sample_two_tokens

from specdeck.engine import (
    DecodeConfig,
    DraftModelDrafter,
    SuffixDrafter,
    TokenEvent,
    encode_prompt,
    generate,
)
from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
from specdeck.engine.drafting.heads import FeatureHead, head_config
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.loop.clock import Clock
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.planner.autotune import RoundPlanner
from specdeck.engine.planner.costs import CostCurve
from specdeck.engine.sampling import logits_to_probs

PROMPTS = ["The quick brown fox", "def add(a, b):\n    return"]


def kept_ids(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def model_drafter(kind: str, target, draft):
    if kind == "feature-head":
        torch.manual_seed(0)
        return FeatureHeadDrafter(FeatureHead(head_config(target.model.config)).eval(), target.model)
    return DraftModelDrafter(draft.model)


@pytest.mark.parametrize("kind", ["draft-model", "feature-head"])
@pytest.mark.parametrize("schedule", ["constant", "auto"])
def test_greedy_hybrid_equals_plain(tiny_llama, kind, schedule, monkeypatch):
    """Greedy, with the earlier answers in the history, the hybrid's text equals plain decoding's, and
    its rounds took both copies and model drafts. The auto schedule plans with set costs under which
    drafting pays (a flat verify, cheap drafts, a round clock that ticks), not with what the tiny
    models cost on a busy machine."""
    monkeypatch.setattr(
        "specdeck.engine.loop.schedule.cost_curve",
        lambda model, cache_dir=None, lm=None, estimate=False: CostCurve(
            (1, 2, 4, 8, 16), (10.0, 10.2, 10.5, 11.0, 12.0)
        ),
    )
    monkeypatch.setattr("specdeck.engine.loop.schedule.draft_cost", lambda *args, **kwargs: 0.1)
    # every first draft verified: the tiny random models' likeliest token is rarely likely enough to
    # pass a floor, and a planner that learns its drafts are refused stops asking for them
    monkeypatch.setattr(RoundPlanner, "first_floor", lambda self, width: 0.0)
    ticks = itertools.count()  # each reading of the round clock moves it on by 1 ms
    monkeypatch.setattr(Clock, "read", staticmethod(lambda: next(ticks) * 1e-3))
    target, draft = tiny_llama
    history = SuffixIndex()
    copied = modelled = 0
    for prompt in PROMPTS * 2:
        ids = encode_prompt(target.tokenizer, prompt, chat=False)
        config = DecodeConfig(k=3, schedule=schedule, max_new_tokens=32)
        plain = kept_ids(generate(target, ids, config))
        hybrid = model_drafter(kind, target, draft).copying_first(SuffixDrafter(history, min_score=2.0))
        events = list(generate(target, ids, config, hybrid))
        assert kept_ids(events) == plain, prompt
        drafts = [e for e in events if isinstance(e, TokenEvent) and e.depth]
        copied += sum(e.copied for e in drafts)
        modelled += sum(not e.copied for e in drafts)
    assert copied and modelled


def test_hybrid_sampling_follows_target(tiny_llama):
    """Copies from an earlier text of the target's likeliest two tokens, else a draft model's drafts:
    over 1000 seeds the first two sampled tokens follow the target; the control, the same first
    tokens judged against the target at a hotter temperature, fails the same test."""
    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    base = DecodeConfig(k=3, temperature=0.5, top_k=40, top_p=0.9, max_new_tokens=2, schedule="constant")
    exact = exact_two_token_distribution(target, ids, base)
    history = SuffixIndex()
    history.extend(ids[-2:] + list(max(exact, key=exact.get)))  # a match of two tokens: a copy of two scores 2
    history.separate()

    def make():
        return DraftModelDrafter(draft.model).copying_first(SuffixDrafter(history, records=False, min_score=2.0))

    n = 1000
    counts, rejections = sample_two_tokens(target, ids, base, make, n)
    stat, df = chi_square(counts, exact, n)
    assert df >= 5
    assert 0.05 * n < rejections < 0.95 * n
    assert stat < chi_square_quantile(df)
    first: dict = {}
    for (t1, *_), count in counts.items():
        first[t1] = first.get(t1, 0) + count
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([ids])).logits[0, -1]
    hotter = logits_to_probs(logits, replace(base, temperature=1.2))
    stat_wrong, df_wrong = chi_square(first, dict(enumerate(hotter.tolist())), n)
    assert stat_wrong > chi_square_quantile(df_wrong)


def test_hybrid_kind_loads_the_builtin_head_or_the_named_draft():
    """`--drafter hybrid` on the built-in target takes its feature head; with --draft, that model."""
    assert PairSpec(drafter="hybrid").resolved().draft == DrafterKind.FEATURE_HEAD.builtin_model(PairSpec().target)
    assert PairSpec(drafter="hybrid", draft="some/draft").resolved().draft == "some/draft"
    assert not DrafterKind.HYBRID.copies_text and DrafterKind.HYBRID.reads_history
