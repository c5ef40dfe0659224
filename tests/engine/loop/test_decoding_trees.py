"""Sampling with token trees stays exact: where the first draft is refused, its alternatives are
tried in turn against the residual (`specdeck.engine.loop.verification.verify`), and the kept tokens follow the
target's distribution. Chi-square as in `test_decoding_sampling`, with a wrong rule as the control."""

import json
from dataclasses import replace

import pytest
import torch
from sampling_checks import chi_square, chi_square_quantile, exact_two_token_distribution

from specdeck.engine import DecodeConfig, RoundEvent, TokenEvent, encode_prompt, generate
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.events import TokenState, event_to_dict
from specdeck.engine.export import SessionRecord
from specdeck.engine.loop.draft_tree import DraftTree
from specdeck.engine.loop.schedule import Schedule
from specdeck.engine.loop.verification import verify
from specdeck.engine.planner.costs import CostCurve
from specdeck.engine.planner.round_shape import Shape
from specdeck.engine.sampling import logits_to_probs, sample

SAMPLED = DecodeConfig(temperature=0.8, top_k=40, top_p=0.9, lookup=0, schedule="constant")


@pytest.fixture(autouse=True)
def _tree_capable_layers(monkeypatch):
    """Sessions here verify trees, which run on the eager layers: where this machine's timing puts the
    tiny model's products on the row kernel, its layers would otherwise fuse and draft chains only."""
    monkeypatch.setenv("SPECDECK_FUSED_LAYERS", "0")


def unzeroed_chances(r: torch.Tensor, alternatives: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A wrong rule: each alternative accepted with r(a), the refused ones never set to 0."""
    return r[torch.tensor(alternatives)], r


class DecoyDrafter(Drafter):
    """Drafts a decoy, the token the target finds least likely, nine times in ten (q = 0.9 on it and
    0.1 p elsewhere): the first draft is mostly refused, and the tree's alternatives, the drafter's
    next likeliest tokens, are the target's likeliest, so they decide the token often."""

    name = "decoy"

    def __init__(self, model) -> None:
        self.model = model

    @torch.inference_mode()
    def propose(self, ids, shape):
        tokens: list[int] = []
        dists = []
        for _ in range(shape.k):
            logits = self.model(input_ids=torch.tensor([ids + tokens])).logits[0, -1]
            q = 0.1 * logits_to_probs(logits, self.config)
            q[int(logits.argmin())] += 0.9
            dists.append(q)
            tokens.append(int(sample(q, self.generator, greedy=False)))
        return Proposal(tokens, torch.stack(dists))


def test_candidates_are_distinct_and_ranked_in_the_order_a_tree_tries_them():
    """A tree's candidates for the first token (the first draft, then its alternatives) never repeat,
    for a model draft drawn below the top and for a copy with branches; each ranks where it stands,
    which is what the planner counts to judge wider trees."""
    q = torch.tensor([[0.30, 0.10, 0.25, 0.0, 0.35]])
    model = Proposal([1], q)
    copy = Proposal([2], torch.nn.functional.one_hot(torch.tensor([2]), 5).float(), source="prompt", branches=[4, 0])
    for proposal in (model, copy):
        candidates = proposal.tokens[:1] + proposal.alternatives(4)
        assert len(set(candidates)) == len(candidates)
        assert [proposal.rank(t) for t in candidates] == list(range(len(candidates)))
    assert model.alternatives(4) == [4, 0, 2] and model.rank(3) == 5  # no probability: never a candidate


def test_alternatives_tried_against_the_residual_give_p():
    """A first draft from q, then three fixed alternatives each accepted with the residual's share,
    refused ones zeroed: the first token follows p over 6000 draws; never zeroing them does not."""
    p = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.08, 0.07])
    q = torch.tensor([0.05, 0.10, 0.05, 0.40, 0.30, 0.10])
    logits = torch.log(torch.stack([p] * 5))  # the first draft's row, the bonus row, the alternatives' rows
    config = DecodeConfig(temperature=1.0)
    n = 6000
    for wrong in (False, True):
        gen = torch.Generator().manual_seed(0)
        counts: dict = {}
        taken = 0
        with pytest.MonkeyPatch.context() as patch:
            if wrong:
                patch.setattr("specdeck.engine.loop.verification.alternative_chances", unzeroed_chances)
            for _ in range(n):
                first = int(torch.multinomial(q, 1, generator=gen))
                alternatives = [t for t in (0, 1, 2, 5) if t != first][:3]
                verdict = verify(DraftTree(Proposal([first], q[None]), alternatives=alternatives), logits, config, gen)
                taken += verdict.kept[0] in alternatives
                counts[verdict.kept[0]] = counts.get(verdict.kept[0], 0) + 1
        stat, df = chi_square(counts, dict(enumerate(p.tolist())), n)
        assert taken > 0.2 * n  # the alternatives decide the token often
        assert (stat > chi_square_quantile(df)) == wrong


def _first_two(target, ids, config: DecodeConfig, n: int) -> tuple[dict, int]:
    """The kept tokens of n width-4 tree sessions with seeds 0..n-1, counted, and how many sessions
    kept an alternative to the first draft (a first draft rejected, then a draft accepted at depth 1)."""
    counts: dict = {}
    taken = 0
    for seed in range(n):
        events = list(generate(target, ids, replace(config, seed=seed), DecoyDrafter(target.model)))
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        kept = tuple(e.token_id for e in tokens if e.state.kept)
        first = [e.state for e in tokens if e.round == 1 and e.depth == 1]
        taken += TokenState.REJECTED in first and TokenState.ACCEPTED in first
        counts[kept] = counts.get(kept, 0) + 1
    return counts, taken


@pytest.mark.parametrize("rule", ["residual", "control-unzeroed"])
def test_sampled_tree_follows_target(tiny_llama, monkeypatch, rule):
    """Every round a tree of a first draft and three alternatives: over 1000 seeds the first token,
    and the first two (the second, after an accepted alternative, drawn from the alternative's own
    row), follow the target exactly; the control, refused alternatives never zeroed, fails."""
    target, _ = tiny_llama
    monkeypatch.setattr(Schedule, "plan", lambda self: Shape(0, 1, 4))
    if rule != "residual":
        monkeypatch.setattr("specdeck.engine.loop.verification.alternative_chances", unzeroed_chances)
    ids = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    config = replace(SAMPLED, max_new_tokens=2)
    exact = exact_two_token_distribution(target, ids, config)
    exact_first: dict = {}
    for (t1, *_), prob in exact.items():
        exact_first[t1] = exact_first.get(t1, 0.0) + prob
    n = 1000
    counts, taken = _first_two(target, ids, config, n)
    first: dict = {}
    for (t1, *_), count in counts.items():
        first[t1] = first.get(t1, 0) + count
    assert 0.1 * n < taken < 0.9 * n  # the alternatives decided the first token often
    stat_first, df_first = chi_square(first, exact_first, n)
    assert df_first >= 5
    if rule == "residual":
        stat, df = chi_square(counts, exact, n)
        assert df >= 5
        assert stat < chi_square_quantile(df)
        assert stat_first < chi_square_quantile(df_first)
    else:
        assert stat_first > chi_square_quantile(df_first)


def test_sampled_tree_events_tell_each_candidate_once(tiny_llama, monkeypatch):
    """In a sampled tree round every candidate for the first token is shown once, at the round's first
    position and before the token kept there: where the first draft passed, the alternatives
    discarded (never tried); where it was refused, the alternatives tried and refused rejected with
    the chance the rule gave them against the residual (the token CSV's acceptance probability),
    the one accepted with its chance, those after it discarded. The session file's lines agree."""
    target, _ = tiny_llama
    monkeypatch.setattr(Schedule, "plan", lambda self: Shape(0, 2, 4))
    ids = encode_prompt(target.tokenizer, "Once upon a time", chat=False)
    record = SessionRecord(1, "speculative")
    for event in generate(target, ids, replace(SAMPLED, max_new_tokens=60, seed=5), DecoyDrafter(target.model)):
        record.add(event)
    A, R, D = TokenState.ACCEPTED, TokenState.REJECTED, TokenState.DISCARDED
    outcomes = {
        (D, D, D, A): "first draft passed",
        (R, D, D, A): "first alternative",  # the kept token comes after the drafts refused in its place
        (R, R, D, A): "second alternative",
        (R, R, R, A): "third alternative",
        (R, R, R, R): "none",
    }
    seen = set()
    for r in (r for r in record.rounds if " w" in r.shape):
        tokens = [e for e in record.tokens if e.round == r.round]
        first = [e for e in tokens if e.depth == 1]
        states = tuple(e.state for e in first)
        assert states in outcomes and {e.pos for e in first} == {tokens[0].pos}, r.shape
        seen.add(outcomes[states])
        if states[0] is R:  # the first draft refused: d_1 with min(1, p/q), every alternative tried with its chance
            alternatives = [e for e in first[1:] if e.state is not D]
            assert first[0].chance is None and all(e.chance is not None for e in alternatives)
            assert all(e.acceptance_probability == e.chance for e in alternatives)
        else:
            assert all(e.chance is None and e.acceptance_probability is None for e in first[:3])
        if states == (R, R, R, R):  # the target's token then drawn from what the refused ones left
            assert next(e for e in tokens if e.state.kept).state is TokenState.RESAMPLED
    assert seen == set(outcomes.values()), seen
    for e in record.tokens:  # the session file's line for each token
        line = json.loads(json.dumps(event_to_dict(e)))
        assert line["state"] == e.state.value and line["chance"] == e.chance


def test_sampled_sessions_plan_trees_that_keep_alternatives_and_repeat_for_a_seed(tiny_llama, monkeypatch):
    """Under the auto schedule with a verify that costs the same for any size, sampled sessions verify
    trees, keep an alternative to the first draft in some rounds, and give the same text for a seed."""
    monkeypatch.setattr(
        "specdeck.engine.loop.schedule.cost_curve",
        lambda model, cache_dir=None, lm=None, estimate=False: CostCurve((1, 16), (10.0, 10.0)),
    )
    monkeypatch.setattr("specdeck.engine.loop.schedule.draft_cost", lambda *args, **kwargs: 0.1)
    target, _ = tiny_llama
    ids = encode_prompt(target.tokenizer, "Once upon a time", chat=False)
    config = DecodeConfig(temperature=1.0, max_new_tokens=48, lookup=0)

    def session(seed: int) -> list:
        return list(generate(target, ids, replace(config, seed=seed), DecoyDrafter(target.model)))

    trees = taken = 0
    for seed in range(4):
        events = session(seed)
        rounds = {e.round: e.shape for e in events if isinstance(e, RoundEvent)}
        trees += sum(" w" in shape for shape in rounds.values())
        for number in rounds:
            first = [e.state for e in events if isinstance(e, TokenEvent) and e.round == number and e.depth == 1]
            taken += TokenState.REJECTED in first and TokenState.ACCEPTED in first
    assert trees > 0 and taken > 0
    assert session(7)[-1].text == session(7)[-1].text
