"""The auto schedule: each round's draft length chosen from measured costs and acceptance."""

import hashlib
import itertools
import re

import pytest
import torch

from specdeck.engine import DecodeConfig, DraftModelDrafter, RoundEvent, TokenEvent, encode_prompt, generate
from specdeck.engine.drafting.drafters import Drafter
from specdeck.engine.drafting.proposals import Proposal
from specdeck.engine.drafting.suffix_drafting import SuffixDrafter
from specdeck.engine.forward import graphed_steps, kernel_build
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.loop.clock import Clock
from specdeck.engine.loop.drafting_step import DraftingStep
from specdeck.engine.loop.schedule import Schedule
from specdeck.engine.planner import autotune, costs
from specdeck.engine.planner.acceptance import CopyAcceptance, DepthAcceptance
from specdeck.engine.planner.autotune import RoundPlanner
from specdeck.engine.planner.costs import CostCurve
from specdeck.engine.planner.description import describe_planner
from specdeck.engine.planner.round_shape import ProposalShape, Shape

FLAT = CostCurve((1, 2, 4, 8, 16), (10.0, 10.2, 10.5, 11.0, 12.0))
STEEP = CostCurve((1, 2, 4, 8, 16), (10.0, 20.0, 40.0, 80.0, 160.0))


def _kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def _plan_after(curve: CostCurve, accepted_share: float, draft_ms: float = 0.5, rounds: int = 60) -> RoundPlanner:
    planner = RoundPlanner(curve, draft_ms, max_k=8, max_copy=0, adapt=False)
    for i in range(rounds):
        k = planner.plan().k or 1
        full = (i * accepted_share) % 1.0 + accepted_share >= 1.0  # accepted_share of the rounds pass whole
        planner.record(Shape(0, k), False, k, k if full else 0, draft_ms * k, curve.ms(k + 1), 0.0)
    return planner


def test_no_draft_when_nothing_is_accepted():
    """A drafter the target never agrees with: the planner stops drafting (but for rare probes)."""
    planner = _plan_after(FLAT, accepted_share=0.0)
    shapes = [planner.plan().k for _ in range(32)]
    assert shapes.count(0) >= 28
    assert 0 < shapes.count(1) <= 4  # a probe every few rounds keeps measuring the drafter


def test_probes_of_a_drafter_as_costly_as_a_target_step_lose_little():
    """A drafter that costs what a target step costs, on a verify that grows almost by the token (a
    quantized model on llama.cpp), accepted 40%: probing it loses at most PROBE_BUDGET of the time, but it is probed."""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 17.5, 32.5, 62.5, 122.5))
    planner = _plan_after(curve, accepted_share=0.4, draft_ms=10.0)
    shapes = [planner.plan() for _ in range(400)]
    probes = sum(shape.k == 1 for shape in shapes)
    plain_ms = 10.0 * len(shapes)
    probe_loss_ms = probes * (10.0 + 17.5 - 10.0 * planner.drafts.expected_tokens(1))
    assert all(shape.k <= 1 for shape in shapes)
    assert probes >= 1 and probe_loss_ms <= autotune.PROBE_BUDGET * plain_ms


@pytest.mark.parametrize("refused", [True, False])
def test_no_draft_where_first_drafts_are_mostly_refused(refused):
    """A drafter whose verified drafts always pass, but whose first draft falls below its floor in 9
    rounds of 10 (drafted, paid for, not verified: a plain step after a draft): the planner counts
    those rounds and stops asking it, but for probes. The control, the same drafter never refused,
    is asked every round: a K=1 round keeps 2 tokens for 14 ms against a 10 ms step."""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 12.0, 16.0, 24.0, 40.0))
    planner = RoundPlanner(curve, 2.0, max_k=1, max_copy=0, adapt=False)
    asked = late = 0
    for i in range(80):
        shape = planner.plan()
        if not shape.k:
            planner.record(shape, False, 0, 0, 0.0, 10.0, 10.0)
            continue
        no = refused and asked % 10 != 0
        asked, late = asked + 1, late + (i >= 40)
        planner.record(shape, False, 0 if no else 1, 0 if no else 1, 2.0, 10.0 if no else 12.0, 0.0)
    if refused:
        assert late <= 6
        share = re.search(r"first drafts under their floor \(not verified\): ([0-9.]+)", describe_planner(planner))
        assert share and float(share[1]) == pytest.approx(planner.refusal_share(), abs=0.01)
        assert planner.refusal_share() > 0.5
    else:
        assert late == 40 and planner.refusal_share() == 0.0


def test_long_drafts_where_verify_is_flat_and_drafts_pass():
    """Drafts that always pass and a verify that costs the same for 1 or 9 tokens: the longest K."""
    assert _plan_after(FLAT, accepted_share=1.0).plan().k == 8


def test_short_drafts_where_verify_grows_steeply():
    """The same drafter on a machine whose verify doubles per token drafts one token at most."""
    assert _plan_after(STEEP, accepted_share=1.0).plan().k <= 1


def test_expected_tokens_follow_acceptance_by_depth():
    """E(K) = 1 + a1 + a1 a2 + ...: a drafter accepted at depth 1 only keeps ~2 tokens at any K."""
    acceptance = DepthAcceptance()
    for _ in range(200):
        acceptance.record(drafted=3, accepted=1)
    assert acceptance.rate(1) > 0.95 and acceptance.rate(2) < 0.1
    assert acceptance.expected_tokens(3) == pytest.approx(2.0, abs=0.15)


@pytest.fixture
def steady_pace(monkeypatch):
    """The machine runs at the cached curves' pace (the tiny model's real steps are not what the
    curves these tests cache say)."""
    monkeypatch.setattr(costs, "pace_of", lambda model, curve, lm=None: 1.0)


def test_cost_curve_is_cached_per_model(tiny_llama, tmp_path, monkeypatch, steady_pace):
    """The curve is measured once, written to the cache, and read back by a later process."""
    target, _ = tiny_llama
    costs._CURVES.pop(target.model, None)
    measured = costs.measure_curve(target.model)
    assert measured.forward_ms[0] > 0 and len(measured.forward_ms) == len(costs.CURVE_TOKENS)
    steady = CostCurve((1, 16), (10.0, 11.0), "this machine", spread=0.05)
    monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None: steady)
    assert costs.cost_curve(target.model, tmp_path) == steady
    assert len(list(tmp_path.glob("curve-*.json"))) == 1
    costs._CURVES.pop(target.model, None)  # as a new process would start

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(costs, "measure_curve", no_measuring)
    assert costs.cost_curve(target.model, tmp_path) == steady


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text.replace("10.0", "1.0"),  # a number changed: still JSON, still a curve
        lambda text: text[: len(text) // 2],  # cut short
        lambda text: '{"tokens": [1, 16], "forward_ms": [NaN, -3.0]}',  # nonsense, its record rewritten too
    ],
)
def test_a_damaged_cached_curve_is_measured_again_with_a_notice(
    tiny_llama, tmp_path, monkeypatch, steady_pace, caplog, damage
):
    """A cost curve in the cache that is not the one written there (its recorded size and digest),
    or that says nothing a curve can (times not positive and finite), is not planned with: it is
    measured again, saying so, and the new one replaces it."""
    from specdeck.engine.atomic import record_path

    target, _ = tiny_llama
    costs._CURVES.pop(target.model, None)
    steady, again = CostCurve((1, 16), (10.0, 11.0), "this machine"), CostCurve((1, 16), (12.0, 13.0), "this machine")
    monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None: steady)
    costs.cost_curve(target.model, tmp_path)
    (path,) = tmp_path.glob("curve-*.json")
    changed = damage(path.read_text())
    path.write_text(changed)
    if "NaN" in changed:
        record_path(path).write_text(f"{path.stat().st_size} {hashlib.sha256(path.read_bytes()).hexdigest()}\n")
    costs._CURVES.pop(target.model, None)  # as a new process would start
    monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None: again)
    with caplog.at_level("WARNING"):
        assert costs.cost_curve(target.model, tmp_path) == again
    assert "measuring it again" in caplog.text
    costs._CURVES.pop(target.model, None)
    monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None: steady)
    assert costs.cost_curve(target.model, tmp_path) == again, "the new measurement was not kept"


def test_curves_with_and_without_cuda_graphs_are_cached_apart(tiny_llama, tmp_path, monkeypatch, steady_pace):
    """A curve measured with the fixed-shape steps (CUDA graphs) is not read back for the forward
    without them (SPECDECK_CUDA_GRAPHS=0), nor the other way round: their costs differ entirely."""
    target, _ = tiny_llama
    monkeypatch.setattr(graphed_steps, "FIXED_SHAPE_DEVICES", frozenset({"cpu", "cuda"}))
    for graphs, curve in (("1", CostCurve((1, 16), (4.0, 4.0))), ("0", CostCurve((1, 16), (20.0, 30.0)))):
        monkeypatch.setenv("SPECDECK_CUDA_GRAPHS", graphs)
        costs._CURVES.pop(target.model, None)
        monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None, curve=curve: curve)
        assert costs.cost_curve(target.model, tmp_path) == curve
    assert len(list(tmp_path.glob("curve-*.json"))) == 2


def test_a_curve_is_measured_again_for_another_build_of_the_row_kernel(tiny_llama, tmp_path, monkeypatch, steady_pace):
    """Where the products run on the row kernel, a curve measured on one build of it (its source,
    compiler and CPU) is not read back for another: a changed kernel changes what a forward costs."""
    target, _ = tiny_llama
    if not kernel_build.identity():
        pytest.skip("the row kernel does not build here")
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    for build, curve in (("a.so", CostCurve((1, 16), (4.0, 5.0))), ("b.so", CostCurve((1, 16), (9.0, 30.0)))):
        monkeypatch.setattr(kernel_build, "identity", lambda build=build: build)
        costs._CURVES.pop(target.model, None)
        monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None, curve=curve: curve)
        assert costs.cost_curve(target.model, tmp_path) == curve
    assert len(list(tmp_path.glob("curve-*.json"))) == 2


def test_a_curve_measured_on_a_busy_machine_is_measured_again(tiny_llama, tmp_path, monkeypatch, steady_pace):
    """A cached curve whose passes disagreed is measured again by the next process, and the steadier
    measurement replaces it; a steady cached curve is read back without measuring."""
    target, _ = tiny_llama
    busy = CostCurve((1, 16), (67.0, 112.0), "this machine", spread=7.5)
    steady = CostCurve((1, 16), (10.0, 95.0), "this machine", spread=0.05)
    noisier = CostCurve((1, 16), (30.0, 31.0), "this machine", spread=9.0)
    for measured, expected in ((busy, busy), (steady, steady)):
        costs._CURVES.pop(target.model, None)
        monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None, curve=measured: curve)
        assert costs.cost_curve(target.model, tmp_path) == expected
    costs._CURVES.pop(target.model, None)
    monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None: noisier)
    assert costs.cost_curve(target.model, tmp_path) == steady  # read back, steady: not measured again


@pytest.mark.parametrize("pace", [0.5, 1.2, 2.0])
def test_a_cached_curve_is_measured_again_where_the_machine_s_pace_moved(tiny_llama, tmp_path, monkeypatch, pace):
    """A steady cached curve is read back while a step runs at its pace (within 1.4x); where a step now
    takes half or twice its time, the machine changed (and with it the curve's shape): the next
    process measures the curve again and keeps the new one. The pace is measured on the model itself."""
    target, _ = tiny_llama
    costs._CURVES.pop(target.model, None)
    step = costs.pace_of(target.model, CostCurve((1,), (1.0,)))  # this machine's step, in ms
    assert step > 0
    cached = CostCurve((1, 16), (step / pace, 2 * step / pace), "this machine", spread=0.05)
    fresh = CostCurve((1, 16), (step, 3 * step), "this machine", spread=0.05)
    monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None: cached)
    assert costs.cost_curve(target.model, tmp_path) == cached
    costs._CURVES.pop(target.model, None)
    monkeypatch.setattr(costs, "pace_of", lambda model, curve, lm=None: step / curve.ms(1))  # steady steps here
    monkeypatch.setattr(costs, "measure_curve", lambda model, lm=None: fresh)
    expected = cached if pace == 1.2 else fresh
    assert costs.cost_curve(target.model, tmp_path) == expected
    costs._CURVES.pop(target.model, None)
    assert costs.cost_curve(target.model, tmp_path) == expected  # what the next process reads


def _forcing_drafts(monkeypatch, curve: CostCurve = FLAT, draft_ms: float = 0.1) -> None:
    """Costs under which drafting pays, whatever the tiny test models really cost. Every reading of
    the round clock moves it on by 1 ms, so that what the rounds measure (drafting, verifying any
    number of tokens, the rest of a round: 1 ms each) does not depend on what else runs."""
    ticks = itertools.count()
    monkeypatch.setattr(Clock, "read", staticmethod(lambda: next(ticks) * 1e-3))
    monkeypatch.setattr(
        "specdeck.engine.loop.schedule.cost_curve", lambda model, cache_dir=None, lm=None, estimate=False: curve
    )
    monkeypatch.setattr("specdeck.engine.loop.schedule.draft_cost", lambda drafter, *args, **kwargs: draft_ms)
    # the tiny models' drafts are all unlikely (their top probabilities are a few percent): verify them anyway
    monkeypatch.setattr(RoundPlanner, "first_floor", lambda self, width: 0.0)


def test_auto_schedule_keeps_greedy_exact(tiny_pair, monkeypatch):
    """Whatever shapes the planner picks, greedy text equals plain decoding, and each round event
    names its shape."""
    _forcing_drafts(monkeypatch)
    target, draft = tiny_pair
    for prompt in ("The quick brown fox", "def add(a, b):\n    return a + b\n\ndef add("):
        ids = encode_prompt(target.tokenizer, prompt, chat=False)
        plain = _kept(generate(target, ids, DecodeConfig(max_new_tokens=40)))
        events = list(generate(target, ids, DecodeConfig(max_new_tokens=40), DraftModelDrafter(draft.model)))
        assert _kept(events) == plain
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        assert {e.shape for e in rounds} - {"none"}
        for e in rounds:
            shape = re.fullmatch(r"none|copy (\d+)|K=(\d+)(?: w(\d+))?", e.shape)
            assert shape, e.shape
            drafts = int(shape[1] or shape[2] or 0) + int(shape[3] or 1) - 1  # alternatives count as drafts
            assert e.drafted <= drafts and (e.drafted > 0) == (e.shape != "none")
        assert "chosen per round" in events[-1].plan


class _Wrong(Drafter):
    """Always proposes a token the tiny target never emits greedily."""

    name = "wrong"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, ids, shape):
        k = shape.k
        q = torch.zeros(k, self.vocab_width)
        q[:, self.token] = 1.0
        return Proposal([self.token] * k, q)


def test_auto_schedule_stops_drafting_a_useless_drafter(tiny_llama, monkeypatch):
    """With drafts that are never accepted most rounds become plain steps, and the text is plain's,
    drafting, verifying any number of tokens and the rest of a round costing 1 ms each."""
    _forcing_drafts(monkeypatch, draft_ms=1.0)
    target, _ = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    plain = _kept(generate(target, ids, DecodeConfig(max_new_tokens=48)))
    never = next(t for t in range(target.vocab_width) if t not in plain)
    events = list(generate(target, ids, DecodeConfig(max_new_tokens=48, lookup=0), _Wrong(never)))
    assert _kept(events) == plain
    shapes = [e.shape for e in events if isinstance(e, RoundEvent)]
    assert shapes.count("none") >= 0.6 * len(shapes), events[-1].plan


def test_sampled_text_repeats_for_a_seed(tiny_llama):
    """Sampling under the auto schedule: the same seed gives the same text, another seed another."""
    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, "Once upon a time", chat=False)

    def text(seed):
        config = DecodeConfig(temperature=1.0, max_new_tokens=24, seed=seed)
        return list(generate(target, ids, config, DraftModelDrafter(draft.model)))[-1].text

    assert text(1) == text(1)
    assert text(1) != text(2)


def test_trees_keep_greedy_exact(tiny_pair, monkeypatch):
    """Where a cheap verify makes alternatives to the first draft pay, the planner verifies trees
    (on the lean Llama forward; Hugging Face's forward drafts chains), and greedy text is plain's,
    also after a prompt long enough to grow the KV cache."""
    _forcing_drafts(monkeypatch, curve=CostCurve((1, 16), (10.0, 10.0)))
    target, draft = tiny_pair
    lean = CachedModel(target.model).supports_trees
    trees = 0
    long = "Speculative decoding drafts tokens and the target model verifies them in one pass. " * 6
    for prompt in ("The quick brown fox", "Once upon a time there was", "def add(a, b):", long):
        ids = encode_prompt(target.tokenizer, prompt, chat=False)
        plain = _kept(generate(target, ids, DecodeConfig(max_new_tokens=40)))
        events = list(generate(target, ids, DecodeConfig(max_new_tokens=40, lookup=0), DraftModelDrafter(draft.model)))
        assert _kept(events) == plain
        trees += sum(" w" in e.shape for e in events if isinstance(e, RoundEvent))
        drafts = [e for e in events if isinstance(e, TokenEvent) and e.state.value in ("accepted", "rejected")]
        assert all(e.depth >= 1 for e in drafts)  # alternatives count at depth 1, beside the chain's first
        assert len(events[-1].accepted_by_position) == max((e.depth for e in drafts), default=0)
    assert (trees > 0) == lean


def test_a_new_session_starts_from_what_the_last_one_measured():
    """A planner that carries over a useless drafter's record plans no draft from its first round,
    where a fresh one still tries drafting."""
    learned = _plan_after(FLAT, accepted_share=0.0, draft_ms=2.0)
    fresh = RoundPlanner(FLAT, 2.0, max_k=8, max_copy=0, adapt=False)
    carried = RoundPlanner(FLAT, 2.0, max_k=8, max_copy=0, adapt=False)
    carried.carry_over(learned)
    assert fresh.plan().k > 0 and carried.plan().k == 0


def test_a_curve_measured_on_a_busy_machine_says_so_in_the_plan():
    """A curve whose passes disagreed is kept, and the session's plan says it was measured while the
    machine was busy and how to measure it again."""
    busy = CostCurve(FLAT.tokens, FLAT.forward_ms, spread=0.6)
    assert FLAT.noisy_note == "" and "busy" in busy.noisy_note
    assert "the next session measures it again" in describe_planner(RoundPlanner(busy, 1.0, max_k=4, max_copy=0))


@pytest.mark.parametrize("tree_cost", [1.0, 2.0])
def test_a_tree_is_planned_at_what_trees_cost(tree_cost):
    """The target's token is often the drafter's second choice, so a tree pays where it costs what a
    chain of as many tokens costs; where trees measure twice that, the planner keeps their cost apart
    from the chains' and drafts chains. Either way the chains' cost stays what chains measured."""
    planner = RoundPlanner(FLAT, 0.5, max_k=2, max_copy=0, adapt=True, max_width=3)
    for i in range(40):
        width = 3 if i % 2 else 1
        verify = FLAT.ms(1 + width) * (tree_cost if width > 1 else 1.0)
        rank = 1 if i % 4 < 2 else 0  # half the rounds the target took the drafter's second choice
        accepted = 1 if rank == 0 else 0
        planner.record(Shape(0, 1, width), False, 1, accepted, 0.5, verify, verify + 0.5, rank, width - 1)
    assert planner.verify_ms(4) == pytest.approx(FLAT.ms(4), rel=0.05)
    assert planner.verify_ms(4, tree=True) == pytest.approx(FLAT.ms(4) * tree_cost, rel=0.1)
    assert (planner.plan().width > 1) == (tree_cost == 1.0)


@pytest.mark.parametrize("hybrid", [False, True])
def test_a_chain_stops_where_its_drafts_are_unlikely_to_pass(tiny_pair, hybrid):
    """A round's floors cut a model drafter's chain where the product of its top probabilities
    falls below them: no floors, all K drafts; a floor of 1 after the first, one draft. The round's
    floors reach the model drafter past its copier (prompt lookup, or a hybrid's suffix drafter)
    where the copier finds nothing to copy."""
    target, draft = tiny_pair
    drafter: Drafter = DraftModelDrafter(draft.model)
    if hybrid:
        drafter = drafter.copying_first(SuffixDrafter(min_score=2.0))
    config = DecodeConfig(k=4)
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    lengths = []
    for floors in [(), (0.0, 1.0, 1.0, 1.0)]:
        drafting = DraftingStep(drafter, config, target.vocab_width, target.device)
        drafting.begin(ids, torch.Generator())
        shape = Shape(config.lookup, 4, 1, floors)
        round_drafts = drafting.propose(ids, shape, room=16, schedule=Schedule(config, config.lookup, None))
        assert not round_drafts.copied
        lengths.append(len(round_drafts.tokens))
    assert lengths == [4, 1]


def test_an_unlikely_first_draft_is_left_for_a_plain_step(tiny_pair):
    """A round drafts nothing where the drafter's first draft (with a tree's alternatives, its top
    `width` choices together) is less likely than the share of a step its verify adds (floors[0]);
    a floor it reaches keeps the draft, and a tree's alternatives count towards it."""
    target, draft = tiny_pair
    drafter = DraftModelDrafter(draft.model)
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    drafter.begin(ids, DecodeConfig(k=1), target.vocab_width, None)
    q = torch.softmax(drafter._next_logits(drafter._sync(ids)).float(), dim=-1)
    top, top3 = float(q.max()), float(q.topk(3).values.sum())
    drafted = []
    for floor, width in [(top * 1.01, 1), (top * 0.99, 1), (top * 1.01, 3), (top3 * 1.01, 3)]:
        drafter.begin(ids, DecodeConfig(k=1), target.vocab_width, None)
        drafted.append(len(drafter.propose(ids, ProposalShape(1, width, (floor,))).tokens))
    assert drafted == [0, 1, 1, 0]


def test_floors_rise_with_what_a_draft_costs():
    """The planner lets a chain go deeper than its planned K only where the drafts are likely to
    pass: the costlier a draft (drafting and the verify it widens), the higher the floor."""
    shapes = []
    for draft_ms in (0.5, 5.0):
        planner = _plan_after(FLAT, accepted_share=0.8, draft_ms=draft_ms)
        shapes.append(planner.plan())
    cheap, costly = shapes
    assert cheap.k >= 1 and len(cheap.floors) == cheap.k
    assert all(0.0 < f < 1.0 for f in cheap.floors)
    assert costly.floors[1] > cheap.floors[1]


LLAMA_CPU = CostCurve((1, 2, 4, 8, 16), (10.0, 18.0, 27.0, 44.0, 78.0))  # llama.cpp on 2 cores: ~a step a token


def _copy_planner(curve: CostCurve) -> RoundPlanner:
    planner = RoundPlanner(curve, 0.0, max_k=0, max_copy=15, adapt=False)
    planner.plan()
    return planner


def test_a_long_copy_is_verified_whole_where_a_short_one_is_left():
    """On a verify that costs about a step per token, a copy of the request's own text that follows
    a 20-token match (a repeated signature) is verified far (not whole: the chance that all of it
    holds shrinks as it grows), one after a 1-token match not at all."""
    planner = _copy_planner(LLAMA_CPU)
    assert planner.copy_length(own=True, match=20, available=15) >= 8
    assert planner.copy_length(own=True, match=1, available=2) == 0
    assert _copy_planner(FLAT).copy_length(own=True, match=1, available=2) == 2  # where verifying is almost free


def test_copies_that_fail_at_a_match_length_stop_there_only():
    """Copies after 3-token matches that the target never takes are left after a few rounds; copies
    after long matches, measured apart, are still verified."""
    planner = _copy_planner(LLAMA_CPU)
    before = planner.copy_length(own=True, match=3, available=6)
    for _ in range(8):
        planner.record(Shape(15, 0), True, 4, 0, 0.0, LLAMA_CPU.ms(5), 0.0, copy=(True, 3, ()))
    assert before > 0 and planner.copy_length(own=True, match=3, available=6) == 0
    assert planner.copy_length(own=True, match=24, available=15) >= 4
    assert "by match length: 3: 0.00" in describe_planner(planner)


def test_short_matches_that_fail_make_a_source_s_longer_matches_doubtful():
    """Copies from earlier texts after 1- and 2-token matches that the target never takes: a copy
    after a 4-token match from those texts is doubted as well, one from the request's own text is
    not, and a source's estimate at a length of its own outweighs the shorter lengths'."""
    acceptance = CopyAcceptance()
    fresh = acceptance.rate(False, 4)
    for match in (1, 2) * 10:
        acceptance.record(False, match, drafted=2, accepted=0)
    assert acceptance.rate(False, 4) < fresh / 2
    assert acceptance.rate(True, 4) == fresh
    assert acceptance.rate(False, 30) > 0.8  # far longer than any that failed
    for _ in range(20):
        acceptance.record(False, 4, drafted=1, accepted=1)
    assert acceptance.rate(False, 4) > 0.9


def test_failed_copies_from_earlier_texts_are_not_forgotten_over_the_request_s_own():
    """Copies from earlier texts after 4-token matches that the target refused 20 times stay
    doubted while the request goes on copying its own text (100 rounds of long copies, all
    passed): an estimate forgets by its own drafts, not by other copies' rounds."""
    planner = _copy_planner(LLAMA_CPU)
    for _ in range(20):
        planner.record(Shape(15, 0), True, 1, 0, 0.0, LLAMA_CPU.ms(2), 0.0, copy=(False, 4, ()))
    assert planner.copy_length(own=False, match=4, available=4) == 0
    for _ in range(100):
        planner.record(Shape(15, 0), True, 8, 8, 0.0, LLAMA_CPU.ms(9), 0.0, copy=(True, 20, ()))
    assert planner.copies.rate(False, 4) < 0.1
    assert planner.copy_length(own=False, match=4, available=4) == 0
    assert planner.copy_length(own=True, match=20, available=8) == 8


def test_copy_acceptance_counts_each_depth_at_its_own_match_length():
    """A copy after an m-token match whose first d drafts passed was judged at lengths m..m+d."""
    acceptance = CopyAcceptance()
    acceptance.record(True, 5, drafted=4, accepted=2)  # 5 and 6 passed, 7 refused, 8 never judged
    assert acceptance.counts == {
        (True, True, 5, False): [1.0, 1.0],
        (True, False, 6, False): [1.0, 1.0],
        (True, False, 7, False): [0.0, 1.0],
    }
    assert acceptance.rate(True, 7, fresh=False) < acceptance.rate(True, 6, fresh=False)
    assert acceptance.rate(False, 6) == 7 / 8


def test_a_copy_s_first_draft_is_judged_apart_from_later_drafts_at_its_length():
    """Later drafts refused at 5 tokens (copies after 2- and 3-token matches going on along their
    occurrence) do not stop a copy found afresh after a 5-token match, whose first drafts passed."""
    planner = _copy_planner(LLAMA_CPU)
    for _ in range(10):
        planner.record(Shape(15, 0), True, 4, 2, 0.0, LLAMA_CPU.ms(5), 0.0, copy=(True, 3, ()))
        planner.record(Shape(15, 0), True, 3, 3, 0.0, LLAMA_CPU.ms(4), 0.0, copy=(True, 5, ()))
    assert planner.copies.rate(True, 5, fresh=False) < 0.3
    assert planner.copies.rate(True, 5) > 0.8
    assert planner.copy_length(own=True, match=5, available=3) >= 1


def test_doubted_copies_are_judged_apart():
    """Copies after 2-token matches whose text also went on otherwise, all refused, stop being
    verified; copies after matches as long whose every earlier occurrence went on with the draft
    keep their own estimate, and are verified while they pass."""
    planner = _copy_planner(LLAMA_CPU)
    for _ in range(10):
        planner.record(Shape(15, 0), True, 1, 0, 0.0, LLAMA_CPU.ms(2), 0.0, copy=(True, 2, (True,)))
        planner.record(Shape(15, 0), True, 2, 2, 0.0, LLAMA_CPU.ms(3), 0.0, copy=(True, 2, (False, False)))
    assert planner.copies.rate(True, 2, doubted=True) < 0.2
    assert planner.copies.rate(True, 2) > 0.8
    assert planner.copy_length(own=True, match=2, available=2, doubted=(True, False)) == 0
    assert planner.copy_length(own=True, match=2, available=2, doubted=(False, False)) == 2


@pytest.mark.parametrize("slowed", [True, False])
def test_drafts_that_slow_the_steps_after_them_are_charged_for_it(slowed):
    """A drafter accepted 60% at K=1 (2 ms a draft, a 12 ms verify: 1.6 tokens for 14 ms, against a
    10 ms step) pays, unless the plain steps after its rounds run slower (13, 12 and 11 ms: the
    target's weights pushed out of the caches): the planner measures that against the steps after
    steps and charges it to the drafter's rounds, which then lose. The control's steps after drafts
    cost what the others do, and it keeps drafting."""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 12.0, 16.0, 24.0, 40.0))
    planner = RoundPlanner(curve, 2.0, max_k=1, max_copy=0, adapt=True)
    after = [3.0, 2.0, 1.0] if slowed else [0.0, 0.0, 0.0]
    for cycle in range(30):
        passed = cycle % 5 < 3
        planner.record(Shape(0, 1), False, 1, int(passed), 2.0, 12.0, 14.0)
        for step in range(6):  # three steps in its aftermath, then three after steps
            ms = 10.0 + (after[step] if step < 3 else 0.0)
            planner.record(Shape(0, 0), False, 0, 0, 0.0, ms, ms)
    assert planner.aftermath_ms("model") == pytest.approx(sum(after), abs=0.3)
    assert planner.clean_ms == pytest.approx(10.0, abs=0.1)
    (k, _), _ = planner.best_k()
    assert k == (0 if slowed else 1)
    if slowed:
        assert "cost to the plain steps after: model 6.0 ms" in describe_planner(planner)


def test_a_run_of_drafting_rounds_is_charged_one_aftermath():
    """The drafter above whose rounds slow the plain steps after them (6 ms in all, so a round that
    starts drafting loses) pays again once it drafts: the steps after the round before are slow
    whatever the next round does, so a round that goes on drafting is charged none of them, and
    the run of rounds pays one aftermath when it ends. Three plain steps after, it is charged again."""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 12.0, 16.0, 24.0, 40.0))
    planner = RoundPlanner(curve, 2.0, max_k=1, max_copy=0, adapt=True)
    for cycle in range(30):
        planner.record(Shape(0, 1), False, 1, int(cycle % 5 < 3), 2.0, 12.0, 14.0)
        for step in range(6):
            ms = 10.0 + ([3.0, 2.0, 1.0][step] if step < 3 else 0.0)
            planner.record(Shape(0, 0), False, 0, 0, 0.0, ms, ms)
    assert planner.best_k()[0][0] == 0
    planner.record(Shape(0, 1), False, 1, 1, 2.0, 12.0, 14.0)  # a probe, say
    assert planner.charged_aftermath_ms("model") == 0.0
    assert planner.best_k()[0][0] == 1
    for ms in (13.0, 12.0, 11.0):
        planner.record(Shape(0, 0), False, 0, 0, 0.0, ms, ms)
    assert planner.charged_aftermath_ms("model") == pytest.approx(6.0, abs=0.3)
    assert planner.best_k()[0][0] == 0


@pytest.mark.parametrize("run", [1, 5])
def test_a_run_of_drafts_starts_where_runs_last_long_enough_to_pay_its_aftermath(run):
    """The drafter above (6 ms of aftermath; 1.6 tokens for 14 ms against a 10 ms step), its rounds
    in runs of `run` drafting rounds between plain steps: starting a run after plain steps, it is
    charged its aftermath spread over the rounds runs have lasted. Runs of five pay it (1.6 tokens
    for 15.2 ms), so a run starts; rounds one at a time do not (1.6 for 20 ms)."""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 12.0, 16.0, 24.0, 40.0))
    planner = RoundPlanner(curve, 2.0, max_k=1, max_copy=0, adapt=True)
    rounds = itertools.count()
    for _ in range(30):
        for _ in range(run):
            planner.record(Shape(0, 1), False, 1, int(next(rounds) % 5 < 3), 2.0, 12.0, 14.0)
        for step in range(6):
            ms = 10.0 + ([3.0, 2.0, 1.0][step] if step < 3 else 0.0)
            planner.record(Shape(0, 0), False, 0, 0, 0.0, ms, ms)
    assert planner.aftermath_ms("model") == pytest.approx(6.0, abs=0.3)
    assert planner.run_length == pytest.approx(run, abs=0.01)
    assert planner.best_k()[0][0] == (1 if run == 5 else 0)


@pytest.mark.parametrize("where", ["aftermath", "verify", "draft"])
def test_one_round_held_up_by_something_else_does_not_stop_drafting_that_pays(where):
    """The paying drafter above (60% at K=1: 1.6 tokens for 14 ms against a 10 ms step), with one
    round held up by something else on the machine (the collector, a graph capture): 100 ms for a
    plain step after its drafts, for a verify, or for a draft. That round moves the estimates as a
    round of twice the expected time would, no further, so drafting goes on paying. (Charged at
    its full time, one such step stood as 8 ms of aftermath on an H100, and drafting stopped for
    the rest of the process.)"""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 12.0, 16.0, 24.0, 40.0))
    planner = RoundPlanner(curve, 2.0, max_k=1, max_copy=0, adapt=True)
    for cycle in range(20):
        passed = cycle % 5 < 3
        slow = cycle == 10
        verify = 100.0 if slow and where == "verify" else 12.0
        draft = 100.0 if slow and where == "draft" else 2.0
        planner.record(Shape(0, 1), False, 1, int(passed), draft, verify, draft + verify)
        for step in range(6):
            ms = 100.0 if slow and where == "aftermath" and step == 0 else 10.0
            planner.record(Shape(0, 0), False, 0, 0, 0.0, ms, ms)
    assert planner.aftermath_ms("model") < 0.5
    assert planner.clean_ms == pytest.approx(10.0, abs=0.1)
    assert planner.draft_ms_per_token < 2.5
    assert planner.verify_ms(2) < 13.5
    (k, _), _ = planner.best_k()
    assert k == 1, describe_planner(planner)


def test_the_slow_steps_after_a_prefill_teach_the_costs_nothing():
    """The first plain steps after a prefill run slow (as after any pause: 4.6, 4.3, 3.6, 3.1 and
    2.8 ms on a 2-core Xeon, 2.6 after). A session
    priced a plain step at what they took would find drafts cheaper than they are; the planner
    prices it at the steps after them."""
    curve = CostCurve((1, 2, 4, 8, 16), (2.6, 2.6, 3.1, 5.8, 11.0))
    planner = RoundPlanner(curve, 0.7, max_k=1, max_copy=0, adapt=True)
    for ms in (4.6, 4.3, 3.6, 3.1, 2.8) + (2.6,) * 5:
        planner.record(Shape(0, 0), False, 0, 0, 0.0, ms, ms)
    assert planner.plain_ms() == pytest.approx(2.6, abs=0.02)
    assert planner.verify_ms(1) == pytest.approx(2.6, abs=0.02)


def test_a_draft_cost_measured_as_none_at_load_is_learned_in_the_loop():
    """Where the cost at load came out as 0 ms a draft, the rounds' own 2 ms are learned all the
    same: a slow round is held to twice the estimate, and twice none is no bound."""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 12.0, 16.0, 24.0, 40.0))
    planner = RoundPlanner(curve, 0.0, max_k=1, max_copy=0, adapt=True)
    for _ in range(30):
        planner.record(Shape(0, 1), False, 1, 1, 2.0, 12.0, 14.0)
    assert planner.draft_ms_per_token == pytest.approx(2.0, abs=0.1)


def test_drafts_are_weighed_against_the_plain_steps_of_the_loop_not_the_curve_at_load():
    """A flat curve measured at load says a step costs 5 ms; in the decoding loop steps and verifies
    take 6 (as on an H100: 5.85 at load, 6.0-6.1 in the loop). A drafter at 1 ms a draft, accepted
    25%, keeps 1.25 tokens for 7 ms where a plain step keeps 1 for 6: it pays, and the planner
    drafts. Weighed against the curve's 5 ms it would not (1.25 / 7 < 1 / 5)."""
    curve = CostCurve((1, 2, 4, 8, 16), (5.0, 5.0, 5.0, 5.0, 5.0))
    planner = RoundPlanner(curve, 1.0, max_k=1, max_copy=0, adapt=True)
    for _ in range(10):
        planner.record(Shape(0, 0), False, 0, 0, 0.0, 6.0, 6.0)
    for i in range(40):
        planner.record(Shape(0, 1), False, 1, int(i % 4 == 0), 1.0, 6.0, 7.0)
    assert planner.plain_ms() == pytest.approx(6.0, abs=0.05)
    assert "a plain step weighed at 6.0 ms" in describe_planner(planner)
    (k, _), _ = planner.best_k()
    assert k == 1, describe_planner(planner)


@pytest.mark.parametrize("pace", [0.5, 1.0])
def test_a_plain_step_is_priced_at_the_machine_s_pace_while_every_round_drafts(pace):
    """The cached curve says a step costs 10 ms and a 2-token verify 12. The session's first plain
    step measures 10 ms (the steps after a prefill are slow); then the machine runs at `pace` of the
    curve while every round drafts one token, accepted 30% (2 ms a draft). A plain step is priced at
    that pace, though none was measured at it: at half the curve's times (5 ms a step, 7 for a
    round keeping 1.3 tokens) drafting loses and the planner stops; at the curve's own pace
    (10 ms a step against 14 for 1.3 tokens) it loses too. A drafter accepted 60% keeps paying at both."""
    curve = CostCurve((1, 2, 4, 8, 16), (10.0, 12.0, 16.0, 24.0, 40.0))
    for share, pays in ((0.3, False), (0.6, True)):
        planner = RoundPlanner(curve, 2.0, max_k=1, max_copy=0, adapt=True)
        planner.record(Shape(0, 0), False, 0, 0, 0.0, 10.0, 10.0)
        for i in range(40):
            passed = (i * share) % 1.0 + share >= 1.0
            verify = 12.0 * pace
            planner.record(Shape(0, 1), False, 1, int(passed), 2.0 * pace, verify, verify + 2.0 * pace)
        assert planner.verify_ms(1) == pytest.approx(10.0 * pace, rel=0.1)
        (k, _), _ = planner.best_k()
        assert k == (1 if pays else 0), (share, describe_planner(planner))


def test_a_session_start_carries_the_costs_the_schedule_plans_with(tiny_pair, monkeypatch):
    """Under the auto schedule the start event carries the target's cost curve and the draft's cost
    the planner weighs (the window draws them); plain decoding and a constant K carry none."""
    curve = CostCurve((1, 2, 4), (3.0, 3.3, 4.5))
    _forcing_drafts(monkeypatch, curve, draft_ms=0.7)
    target, draft = tiny_pair
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    auto = next(iter(generate(target, ids, DecodeConfig(max_new_tokens=4), DraftModelDrafter(draft.model))))
    assert (auto.curve_tokens, auto.curve_ms, auto.draft_ms) == ((1, 2, 4), (3.0, 3.3, 4.5), 0.7)
    constant = DecodeConfig(max_new_tokens=4, schedule="constant", k=2)
    for start in (
        next(iter(generate(target, ids, DecodeConfig(max_new_tokens=4)))),
        next(iter(generate(target, ids, constant, DraftModelDrafter(draft.model)))),
    ):
        assert (start.curve_tokens, start.curve_ms, start.draft_ms) == ((), (), 0.0)


def test_a_drafters_first_session_verifies_its_first_drafts_where_drafting_does_not_pay():
    """Where the costs say no draft pays (a draft dearer than a step, a verify of two tokens twice a
    step), a drafter's first session still verifies its first EXPLORE drafts, one token each and
    whatever their probability, then steps plainly; a session after it starts from its record."""
    steep = CostCurve((1, 2, 4, 8), (4.0, 8.0, 16.0, 32.0))
    planner = RoundPlanner(steep, 6.0, max_k=8, max_copy=0, adapt=False)
    shapes = []
    for _ in range(autotune.EXPLORE + 3):
        shape = planner.plan()
        shapes.append(shape)
        planner.record(shape, False, shape.k, 0, 6.0 * shape.k, steep.ms(shape.k + 1), 0.0)
    explored = shapes[: autotune.EXPLORE]
    assert all(s.k == 1 and not any(s.floors) for s in explored)
    assert all(s.k == 0 for s in shapes[autotune.EXPLORE :])
    later = RoundPlanner(steep, 6.0, max_k=8, max_copy=0, adapt=False)
    later.carry_over(planner)
    assert later.plan().k == 0
