"""Speculative sampling must follow the target's distribution exactly (Leviathan et al. 2023, thm 3.5).

Chi-square goodness of fit against the exact target distribution, at a false-alarm rate of 0.1%
(Wilson-Hilferty quantile); a control checks that the same test does reject a wrong sampler.
"""

from dataclasses import replace

import pytest
import torch
from sampling_checks import chi_square, chi_square_quantile, exact_two_token_distribution, sample_two_tokens

from specdeck.engine import (
    DecodeConfig,
    DraftModelDrafter,
    Proposal,
    SuffixDrafter,
    TokenEvent,
    encode_prompt,
    generate,
)
from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
from specdeck.engine.drafting.heads import FeatureHead, head_config
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.loop.verification import verify
from specdeck.engine.sampling import logits_to_probs


def test_rejection_rule_reproduces_target_distribution():
    """Drafts from q judged by min(1, p/q), residual norm(max(0, p - q)) on rejection: output ~ p."""
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    q = torch.tensor([0.10, 0.40, 0.05, 0.30, 0.15, 0.00])
    config = DecodeConfig(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    logits = torch.log(torch.stack([p, p]))
    n = 5000
    counts: dict = {}
    for _ in range(n):
        draft = int(torch.multinomial(q, 1, generator=gen))
        first = verify(DraftTree(Proposal([draft], q[None])), logits, config, gen).kept[0]
        counts[first] = counts.get(first, 0) + 1
    stat, df = chi_square(counts, dict(enumerate(p.tolist())), n)
    assert stat < chi_square_quantile(df)
    wrong, _ = chi_square({i: int(v * n) for i, v in enumerate(q.tolist())}, dict(enumerate(p.tolist())), n)
    assert wrong > chi_square_quantile(df)  # control: the test tells q from p


@pytest.mark.parametrize("drafter", ["draft-model", "reduced-output-vocabulary", "feature-head", "fused-feature-head"])
def test_speculative_sampling_follows_target(tiny_llama, drafter):
    """Over 1000 seeds, the first two tokens of speculative sampling follow the target exactly, also
    when the draft may only propose half the vocabulary (q = 0 on the rest), and with a feature head
    (random: the rule must not depend on the head being good), one that reads a lower layer too."""
    target, draft = tiny_llama
    output_ids = torch.arange(0, target.vocab_width, 2) if drafter != "draft-model" else None
    torch.manual_seed(0)
    layers = (1,) if drafter == "fused-feature-head" else ()
    head = FeatureHead(head_config(target.model.config, feature_layers=layers)).eval()

    def make():
        if drafter.endswith("feature-head"):
            return FeatureHeadDrafter(head, target.model, output_ids=output_ids)
        return DraftModelDrafter(draft.model, output_ids=output_ids)

    ids = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    base = DecodeConfig(k=3, temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=2)
    exact = exact_two_token_distribution(target, ids, base)
    n = 1000
    counts, rejections = sample_two_tokens(target, ids, replace(base, schedule="constant"), make, n)
    assert 0.05 * n < rejections < 0.95 * n  # both branches of the rule were taken often
    stat, df = chi_square(counts, exact, n)
    assert df >= 5
    assert stat < chi_square_quantile(df)


class MisreportedSuffixDrafter(SuffixDrafter):
    """The suffix drafter's drafts with q claimed uniform instead of one-hot: wrong on purpose."""

    def propose(self, ids, shape):
        proposal = super().propose(ids, shape)
        return Proposal(proposal.tokens, torch.full_like(proposal.q, 1 / proposal.q.shape[-1]))


@pytest.mark.parametrize("honest", [True, False], ids=["one-hot-q", "control-misreported-q"])
def test_suffix_drafter_sampling_follows_target(tiny_llama, honest):
    """Drafting the target's likeliest two tokens from an earlier session's text, with q one-hot on
    them, the first two sampled tokens follow the target exactly over 1000 seeds; the control, the
    same drafts judged with a misreported q, fails the same test."""
    target, _ = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    base = DecodeConfig(k=3, temperature=0.5, top_k=40, top_p=0.9, max_new_tokens=2)
    exact = exact_two_token_distribution(target, ids, base)
    history = SuffixIndex()
    history.extend(ids + list(max(exact, key=exact.get)))  # the prompt, then its likeliest two tokens
    history.separate()
    make = MisreportedSuffixDrafter if honest is False else SuffixDrafter
    n = 1000
    counts, rejections = sample_two_tokens(
        target, ids, replace(base, schedule="constant"), lambda: make(history, records=False), n
    )
    stat, df = chi_square(counts, exact, n)
    assert df >= 5
    if honest:
        assert 0.05 * n < rejections < 0.95 * n  # both branches of the rule were taken often
        assert stat < chi_square_quantile(df)
    else:
        assert stat > chi_square_quantile(df)


def test_seed_makes_sampling_reproducible(tiny_llama):
    """The same seed gives the same sampled text; another seed gives another."""
    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, "Once upon a time", chat=False)

    def text(seed):
        config = DecodeConfig(k=3, temperature=1.0, max_new_tokens=24, seed=seed)
        return list(generate(target, ids, config, DraftModelDrafter(draft.model)))[-1].text

    assert text(1) == text(1)
    assert text(1) != text(2)


def test_auto_schedule_sampling_follows_target(tiny_llama, monkeypatch):
    """Under the auto schedule, with costs that make drafting pay, the first two sampled tokens still
    follow the target exactly; the same counts fail against the target at another temperature (the
    control: the test can tell a near miss)."""
    from specdeck.engine.planner.costs import CostCurve

    monkeypatch.setattr(
        "specdeck.engine.loop.schedule.cost_curve",
        lambda model, cache_dir=None, lm=None, estimate=False: CostCurve((1, 16), (10.0, 10.0)),
    )
    monkeypatch.setattr("specdeck.engine.loop.schedule.draft_cost", lambda *args, **kwargs: 0.1)
    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    base = DecodeConfig(temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=2)
    exact = exact_two_token_distribution(target, ids, base)
    n = 1000
    counts: dict = {}
    drafted = 0
    for seed in range(n):
        config = DecodeConfig(temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=2, seed=seed)
        events = list(generate(target, ids, config, DraftModelDrafter(draft.model)))
        kept = tuple(e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept)
        drafted += events[-1].drafted
        counts[kept] = counts.get(kept, 0) + 1
    assert drafted == n  # every session drafted the one token two new tokens leave room for
    stat, df = chi_square(counts, exact, n)
    assert stat < chi_square_quantile(df)
    first: dict = {}
    for (t1, *_), count in counts.items():
        first[t1] = first.get(t1, 0) + count
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([ids])).logits[0, -1]
    hotter = logits_to_probs(logits, DecodeConfig(temperature=1.2, top_k=40, top_p=0.9))
    stat_wrong, df_wrong = chi_square(first, dict(enumerate(hotter.tolist())), n)
    assert stat_wrong > chi_square_quantile(df_wrong)
