"""Feature heads (EAGLE-style drafters on the target's hidden state): `specdeck train-head` makes
one that loads by itself, keeps decoding exact, and is refused with a clear message where it does
not belong."""

from __future__ import annotations

import pytest
import torch
from tiny import ON_CPU, build_pair

from specdeck.cli.main import main
from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.head_drafter import FeatureHeadDrafter
from specdeck.engine.drafting.heads import FeatureHead, fingerprint, head_config, load_head, save_head
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import SummaryEvent, TokenEvent, TokenState
from specdeck.engine.loading.models import encode_prompt, load_model
from specdeck.engine.loop.decoding import generate
from specdeck.engine.pair import PairSpec
from specdeck.engine.planner.round_shape import ProposalShape
from specdeck.engine.session import load_pair, run_session
from specdeck.train.head import HeadConfig, build_head, extract_features
from specdeck.train.head_objective import collate_pairs, unrolled
from specdeck.train.teacher import Shard, load_shards

TEXT = ["--answers", "4", "--passages", "1", "--code", "3", "--answer-tokens", "16", "--generation-batch", "4"]
TRAIN = ["--output-vocab", "150", "--batch", "2", "--eval-every", "3", "--threads", "1"]


def _kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory):
    root = tmp_path_factory.mktemp("head")
    target, _ = build_pair(root, "llama")
    out = root / "run"
    assert main(["train-head", "--target", str(target), "--out", str(out), "--steps", "6", *TEXT, *TRAIN]) == 0
    return target, out


def test_trained_head_is_picked_by_its_folder_and_keeps_greedy_exact(tiny_head):
    """`--draft <head folder>` chooses the feature-head drafter; greedy output equals plain decoding
    for K = 1..5, and the head did draft."""
    target, out = tiny_head
    pair = load_pair(PairSpec(str(target), str(out / "head"), None, device="cpu"))
    assert pair.drafter_kind == "feature-head"
    for prompt in ("The quick brown fox", "d"):  # a one-token prompt: the first round has no state yet
        plain = list(run_session(pair, prompt, DecodeConfig(max_new_tokens=40), chat=False, plain=True))
        for k in range(1, 6):
            events = list(
                run_session(pair, prompt, DecodeConfig(k=k, schedule="constant", max_new_tokens=40), chat=False)
            )
            assert _kept(events) == _kept(plain), (prompt, k)
            summary = events[-1]
            assert isinstance(summary, SummaryEvent) and summary.drafted > 0


def test_trained_head_proposes_only_its_output_tokens(tiny_head):
    target, out = tiny_head
    pair = load_pair(PairSpec(str(target), str(out / "head"), "feature-head", device="cpu"))
    allowed = set(pair.head.output_ids.tolist())
    assert 0 < len(allowed) < pair.target.vocab_width
    events = list(
        run_session(
            pair,
            "def add(a, b):",
            DecodeConfig(k=3, schedule="constant", max_new_tokens=30, temperature=1.0, seed=2),
            chat=False,
        )
    )
    drafted = {
        e.token_id
        for e in events
        if isinstance(e, TokenEvent) and e.state in (TokenState.ACCEPTED, TokenState.REJECTED, TokenState.DISCARDED)
    }
    assert drafted and drafted <= allowed


def test_loss_and_agreement_count_answer_pairs_only():
    """The head drafts answers, never prompts: pairs before a sequence's `first` position are read
    as context but left out of the loss and the held-out agreement."""
    data = Shard(
        ids=[torch.arange(10, dtype=torch.int32), torch.arange(6, dtype=torch.int32)],
        top_ids=[],
        top_logp=[],
        first=[4, 0],
    )
    features = [torch.randn(10, 8), torch.randn(6, 8)]
    states, embeds, mask = collate_pairs(data, features, [0, 1], torch.randn(16, 8))
    assert states.shape == (2, 10, 8) and embeds.shape == (2, 9, 8)
    assert mask[0].tolist() == [False] * 4 + [True] * 5
    assert mask[1].tolist() == [True] * 5 + [False] * 4


def test_hidden_states_of_grown_teacher_text_are_computed_once(tiny_head, tmp_path):
    """More teacher shards later: the states already on disk are kept and only the new sequences
    are computed, with the same result as computing all at once; states of other text are refused."""
    target_folder, out = tiny_head
    target = load_model(str(target_folder), ON_CPU)
    data = load_shards(out / "teacher")
    half = len(data.ids) // 2
    first = Shard(data.ids[:half], data.top_ids[:half], data.top_logp[:half], data.first[:half])
    extract_features(target, first, tmp_path / "grown", 64, lambda _: None)
    before = {path: path.stat().st_mtime_ns for path in (tmp_path / "grown").glob("part-*.pt")}
    grown = extract_features(target, data, tmp_path / "grown", 64, lambda _: None)
    assert {path: path.stat().st_mtime_ns for path in before} == before  # kept, not rewritten
    assert len(list((tmp_path / "grown").glob("part-*.pt"))) > len(before)
    fresh = extract_features(target, data, tmp_path / "fresh", 64, lambda _: None)
    for a, b in zip(grown, fresh):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    other = Shard(data.ids[::-1], data.top_ids[::-1], data.top_logp[::-1], data.first[::-1])
    with pytest.raises(SpecDeckError, match="belong to other teacher text"):
        extract_features(target, other, tmp_path / "grown", 64, lambda _: None)


def test_training_resumes_where_it_stopped(tiny_head, tmp_path, capsys):
    """Stopping after 3 steps and resuming to 6 gives the weights of 6 steps in one go; resuming
    with settings that make another shape of head is a clear error."""
    target, straight = tiny_head
    out = tmp_path / "resumed"
    args = [
        "train-head",
        "--target",
        str(target),
        "--out",
        str(out),
        "--teacher",
        str(straight / "teacher"),
        "--steps",
        "6",
        *TRAIN,
    ]
    assert main([*args, "--until", "3"]) == 0
    assert main([*args, "--resume", "--head-layers", "2"]) == 2
    assert "of another shape than these settings make" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_resuming_on_grown_text_exports_afresh(tiny_head, tmp_path):
    """A best agreement measured on a smaller teacher text is not compared with agreements on the
    grown one (another held-out set): resuming on more shards exports the next evaluation's head,
    however high the old figure was."""
    target, straight = tiny_head
    out = tmp_path / "grown"
    shards = sorted((straight / "teacher").glob("shard-*.pt"))
    assert len(shards) > 1
    (out / "teacher").mkdir(parents=True)
    for shard in shards[:-1]:
        (out / "teacher" / shard.name).write_bytes(shard.read_bytes())
    args = ["train-head", "--target", str(target), "--out", str(out), "--steps", "6", *TRAIN]
    assert main([*args, "--until", "3"]) == 0
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state["best_agreement"] = 1.0  # no evaluation can beat it
    torch.save(state, out / "checkpoint.pt")
    (out / "teacher" / shards[-1].name).write_bytes(shards[-1].read_bytes())
    assert main([*args, "--resume"]) == 0
    sequences = len(load_shards(out / "teacher").ids)
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["sequences"] == sequences and state["best_agreement"] < 1.0
    assert f"{sequences} sequences" in (out / "head" / "README.md").read_text(encoding="utf-8")


def test_head_for_another_target_is_refused(tiny_head, tmp_path):
    """A head only works with the target it was trained on: another width is a clear error."""
    _, out = tiny_head
    other, _ = build_pair(tmp_path, "gpt2")
    with pytest.raises(SpecDeckError, match="trained for"):
        load_pair(PairSpec(str(other), str(out / "head"), None, device="cpu"))


def test_head_as_draft_model_and_corrupt_head_are_refused(tiny_head, tmp_path):
    target, out = tiny_head
    with pytest.raises(SpecDeckError, match="feature head, not a draft model"):
        load_pair(PairSpec(str(target), str(out / "head"), "draft-model", device="cpu"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((out / "head" / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SpecDeckError, match="missing or corrupt"):
        load_pair(PairSpec(str(target), str(broken), None, device="cpu"))


def test_a_trained_heads_weights_changed_in_place_are_refused(tiny_head, tmp_path):
    """A head is saved with its weights' size and digest beside them: one with a byte changed in
    place (a file that still reads) is refused with what is wrong and what to do."""
    import shutil

    target, out = tiny_head
    copy = tmp_path / "head"
    shutil.copytree(out / "head", copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x10
    weights.write_bytes(bytes(data))
    with pytest.raises(SpecDeckError, match="are damaged .*bytes differ.* train the head again"):
        load_pair(PairSpec(str(target), str(copy), None, device="cpu"))


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_untrained_head_keeps_sampling_exact_too(tiny_llama, monkeypatch, precision):
    """The rejection rule does not depend on the head being any good: with a random head and a
    reduced output vocabulary, drafting in float32 or in bfloat16 (where the machine computes it
    faster), sampled output is reproducible per seed and differs across seeds, and greedy output is
    exact (the distribution itself is tested in test_decoding_sampling)."""
    target, _ = tiny_llama
    torch.manual_seed(0)
    head = FeatureHead(head_config(target.model.config)).eval()
    ids = encode_prompt(target.tokenizer, "Once upon a time", chat=False)
    monkeypatch.setenv("SPECDECK_DRAFT_DTYPE", precision)

    def run(config):
        drafter = FeatureHeadDrafter(head, target.model, output_ids=torch.arange(0, target.vocab_width, 2))
        assert drafter.dtype == getattr(torch, precision)
        return _kept(generate(target, ids, config, drafter))

    assert run(DecodeConfig(k=3, schedule="constant", max_new_tokens=30)) == _kept(
        generate(target, ids, DecodeConfig(max_new_tokens=30))
    )
    sampled = DecodeConfig(k=3, schedule="constant", max_new_tokens=30, temperature=1.0, seed=5)
    assert run(sampled) == run(sampled)
    assert run(sampled) != run(DecodeConfig(k=3, schedule="constant", max_new_tokens=30, temperature=1.0, seed=6))


def test_real_target_loads_through_the_same_model_path(tiny_head):
    """load_model refuses a head folder with a message instead of a transformers traceback."""
    _, out = tiny_head
    with pytest.raises(SpecDeckError):
        load_model(str(out / "head"), ON_CPU)


@pytest.mark.parametrize("layers", [1, 2])
def test_drafts_step_by_step_equal_the_head_over_the_whole_sequence(tiny_llama, layers):
    """Drafting runs the head token by token over its own KV cache, feeding back predicted states,
    and forgets those once the target's real states arrive: each draft's distribution equals the
    head's prediction computed over the whole sequence at once, as in training, for a head of one
    decoder layer or two."""
    target, _ = tiny_llama
    torch.manual_seed(0)
    head = FeatureHead(head_config(target.model.config, layers=layers)).eval()
    drafter = FeatureHeadDrafter(head, target.model)
    weight = target.model.get_output_embeddings().weight
    embed = target.model.get_input_embeddings()

    def real_states(ids):
        with torch.inference_mode():
            return target.model.model(torch.tensor([ids])).last_hidden_state[0]

    def expected_q(ids, drafts):
        states, tokens, q = real_states(ids)[:-1], list(ids[1:]), []
        with torch.inference_mode():
            for draft in drafts:
                predicted = head(states[None], embed(torch.tensor(tokens))[None])[0, -1]
                q.append(torch.softmax(weight @ predicted, dim=-1))
                states, tokens = torch.cat([states, predicted[None]]), tokens + [draft]
        return torch.stack(q)

    config = DecodeConfig(k=3, schedule="constant", temperature=1.0)
    ids = encode_prompt(target.tokenizer, "Once upon a time there", chat=False)
    drafter.begin(ids, config, target.vocab_width, torch.Generator().manual_seed(0))
    drafter.observe(real_states(ids)[:-1])
    first = drafter.propose(ids, ProposalShape(3))
    torch.testing.assert_close(first.q, expected_q(ids, first.tokens), rtol=1e-4, atol=1e-6)
    kept = ids + [first.tokens[0], (first.tokens[1] + 1) % target.vocab_width]  # one draft kept, then another token
    drafter.observe(real_states(kept)[len(ids) - 1 : len(ids) + 1])
    second = drafter.propose(kept, ProposalShape(3))
    torch.testing.assert_close(second.q, expected_q(kept, second.tokens), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("layers", [1, 2])
def test_training_passes_attend_as_drafting_does(tiny_llama, layers):
    """Training runs the head's passes side by side; pass s at pair j must compute exactly what a
    depth-(s+1) draft computes: the head over the real pairs up to j - s, then its own earlier
    predictions one by one (in every decoder layer of a deeper head)."""
    target, _ = tiny_llama
    torch.manual_seed(0)
    head = FeatureHead(head_config(target.model.config, layers=layers)).eval()
    width = target.model.config.hidden_size
    inputs, embeds = torch.randn(1, 9, width), torch.randn(1, 9, width)
    with torch.no_grad():
        passes = unrolled(head, inputs, embeds, 3)
        for s in range(3):
            for j in range(s, 9):
                states, tokens = inputs[:, : j - s + 1], embeds[:, : j - s + 1]
                for depth in range(s):  # each deeper draft reads the state the previous depth predicted
                    predicted = head(states, tokens)[:, -1:]
                    states = torch.cat([states, predicted], dim=1)
                    tokens = embeds[:, : j - s + depth + 2]
                torch.testing.assert_close(passes[s][0, j], head(states, tokens)[0, -1], rtol=1e-4, atol=1e-5)


def test_fused_head_reads_the_targets_lower_layers_and_keeps_greedy_exact(tiny_llama):
    """A head that fuses lower layers (EAGLE-3) gets, for every kept token, the residual stream
    after those layers as the target computed it: its first draft distribution equals the head
    applied to the target's own hidden states, and greedy output stays that of plain decoding."""
    target, _ = tiny_llama
    torch.manual_seed(0)
    head = FeatureHead(head_config(target.model.config, feature_layers=(1,))).eval()
    drafter = FeatureHeadDrafter(head, target.model)
    ids = encode_prompt(target.tokenizer, "Once upon a time there", chat=False)
    config = DecodeConfig(k=3, schedule="constant", temperature=1.0)
    drafter.begin(ids, config, target.vocab_width, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        hidden = target.model.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        observed = torch.stack([hidden[1][0], hidden[-1][0]], dim=1)[:-1]
        drafter.observe(observed)
        first = drafter.propose(ids, ProposalShape(1))
        embed = target.model.get_input_embeddings()(torch.tensor(ids[1:]))
        predicted = head(head.fuse(observed)[None], embed[None])[0, -1]
        expected = torch.softmax(target.model.get_output_embeddings().weight @ predicted, dim=-1)
    torch.testing.assert_close(first.q[0], expected, rtol=1e-4, atol=1e-6)
    greedy = DecodeConfig(k=3, schedule="constant", max_new_tokens=30)
    assert _kept(generate(target, ids, greedy, FeatureHeadDrafter(head, target.model))) == _kept(
        generate(target, ids, DecodeConfig(max_new_tokens=30))
    )


def test_fused_head_grown_from_a_head_starts_as_that_head(tiny_head):
    """`--init-from` a trained head with `--feature-layers`: the new fusion weights start at zero
    on the lower layers, so before any step the grown head predicts what the original predicts."""
    target_folder, out = tiny_head
    target = load_model(str(target_folder))
    grown = build_head(target, HeadConfig(feature_layers=(1,), init_from=str(out / "head"))).eval()
    original, _ = load_head(out / "head", target.model, "tiny")
    width = target.model.config.hidden_size
    observed, embeds = torch.randn(1, 6, 2, width), torch.randn(1, 6, width)
    with torch.no_grad():
        torch.testing.assert_close(
            grown(grown.fuse(observed), embeds), original(observed[:, :, -1], embeds), rtol=1e-4, atol=1e-4
        )


def test_head_grown_a_layer_deeper_starts_as_that_head_and_keeps_greedy_exact(tiny_head, tmp_path):
    """`--init-from` a trained head with `--head-layers 2`: the new layer starts adding nothing, so
    before any step the deeper head predicts what the original predicts; once its new layer is
    trained (here: random), drafting with it stays exact. A head cannot grow from a deeper one."""
    target_folder, out = tiny_head
    target = load_model(str(target_folder))
    grown = build_head(target, HeadConfig(layers=2, init_from=str(out / "head"))).eval()
    original, _ = load_head(out / "head", target.model, "tiny")
    assert len(grown.body.layers) == 2
    width = target.model.config.hidden_size
    states, embeds = torch.randn(1, 6, width), torch.randn(1, 6, width)
    with torch.no_grad():
        torch.testing.assert_close(grown(states, embeds), original(states, embeds), rtol=1e-4, atol=1e-4)
        for weight in grown.body.layers[1].parameters():
            weight.normal_(0, 0.05)
        assert not torch.allclose(grown(states, embeds), original(states, embeds), atol=1e-3)
    ids = encode_prompt(target.tokenizer, "Once upon a time", chat=False)
    greedy = DecodeConfig(k=3, schedule="constant", max_new_tokens=30)
    assert _kept(generate(target, ids, greedy, FeatureHeadDrafter(grown, target.model))) == _kept(
        generate(target, ids, DecodeConfig(max_new_tokens=30))
    )
    deeper = tmp_path / "deeper"
    save_head(grown, deeper, target.vocab_width, "tiny", fingerprint(target.model.get_output_embeddings().weight))
    with pytest.raises(SpecDeckError, match="another shape"):
        build_head(target, HeadConfig(init_from=str(deeper)))


def _random_head_on(target, text: str) -> tuple[FeatureHead, list[int], torch.Tensor]:
    """A seeded untrained head for `target`, `text`'s ids and the target's last state at each."""
    torch.manual_seed(0)
    head = FeatureHead(head_config(target.model.config)).eval()
    ids = encode_prompt(target.tokenizer, text, chat=False)
    with torch.inference_mode():
        states = target.model.model(torch.tensor([ids])).last_hidden_state[0]
    return head, ids, states


def test_states_of_several_plain_steps_reach_the_head_in_one_forward(tiny_llama, monkeypatch):
    """After rounds that drafted nothing (plain steps, each handing the head one token's states),
    the next proposal pairs them in one forward of the head's layer, not one per step, and drafts
    what the head drafts when the same states arrive at once. The prompt's states were paired
    when they came, at prefill."""
    target, _ = tiny_llama
    head, ids, states = _random_head_on(target, "Once upon a time there was")
    config = DecodeConfig(k=3, schedule="constant")

    def propose(parts: list[torch.Tensor]) -> tuple[list[int], int]:
        drafter = FeatureHeadDrafter(head, target.model)
        drafter.begin(ids[:4], config, target.vocab_width, None)
        drafter.observe(parts[0])
        forwards = []
        original = drafter._body.hidden_from_inputs
        monkeypatch.setattr(drafter._body, "hidden_from_inputs", lambda x: forwards.append(len(x)) or original(x))
        for part in parts[1:]:
            drafter.observe(part)
        proposal = drafter.propose(ids, ProposalShape(1))
        return proposal.tokens, len(forwards)

    at_once, one_forward = propose([states[:3], states[3 : len(ids) - 1]])
    step_by_step, forwards = propose([states[:3]] + [states[i : i + 1] for i in range(3, len(ids) - 1)])
    assert forwards == one_forward == 1
    assert step_by_step == at_once


def test_a_long_prompt_reaches_the_head_whole_at_prefill(tiny_llama, monkeypatch):
    """A prompt longer than CATCH_UP and PAIR_CHUNK: the head pairs every one of its states when
    they come, at prefill (as a draft model reads the prompt there), in forwards of PAIR_CHUNK rows,
    and drafts what one forward over them all drafts: it reads the whole prompt, as it trained.
    Greedy text stays the target's."""
    target, _ = tiny_llama
    head, ids, states = _random_head_on(target, "Once upon a time there was a king who had three daughters")
    assert len(ids) > 9
    config = DecodeConfig(k=3, schedule="constant")
    monkeypatch.setattr(FeatureHeadDrafter, "CATCH_UP", 2)

    def propose(chunk: int) -> tuple[list[int], list[int]]:
        monkeypatch.setattr(FeatureHeadDrafter, "PAIR_CHUNK", chunk)
        drafter = FeatureHeadDrafter(head, target.model)
        drafter.begin(ids, config, target.vocab_width, None)
        forwards: list[int] = []
        original = drafter._body.hidden_from_inputs
        monkeypatch.setattr(drafter._body, "hidden_from_inputs", lambda x: forwards.append(len(x)) or original(x))
        drafter.observe(states[: len(ids) - 1])  # the prompt's: paired now, at prefill
        paired_at_prefill = list(forwards)
        proposal = drafter.propose(ids, ProposalShape(3))
        assert forwards[len(paired_at_prefill) :] == [1] * (len(forwards) - len(paired_at_prefill))  # drafting
        return proposal.tokens, paired_at_prefill

    chunked, forwards = propose(4)
    whole, one_forward = propose(1024)
    pairs = len(ids) - 1
    catch_up = [4] * (pairs // 4) + ([pairs % 4] if pairs % 4 else [])
    assert forwards == catch_up
    assert one_forward == [pairs]
    assert chunked == whole
    plain = _kept(generate(target, ids, DecodeConfig(max_new_tokens=24, k=3, schedule="constant")))
    drafter = FeatureHeadDrafter(head, target.model)
    assert _kept(generate(target, ids, DecodeConfig(max_new_tokens=24, k=3, schedule="constant"), drafter)) == plain


def test_a_long_run_after_the_prompt_reaches_the_head_as_its_latest_few(tiny_llama, monkeypatch):
    """A stretch of plain steps or copied tokens after the prompt longer than CATCH_UP: the head's
    next proposal pairs only the latest CATCH_UP states, in one forward; the older ones stay out
    of its cache, beside the prompt's, and it still drafts."""
    target, _ = tiny_llama
    monkeypatch.setattr(FeatureHeadDrafter, "CATCH_UP", 4)
    head, ids, states = _random_head_on(target, "Once upon a time there was a king who had three daughters")
    assert len(ids) > 10
    drafter = FeatureHeadDrafter(head, target.model)
    drafter.begin(ids[:3], DecodeConfig(k=3, schedule="constant"), target.vocab_width, None)
    drafter.observe(states[:2])  # the prompt's, paired at prefill
    forwards: list[int] = []
    original = drafter._body.hidden_from_inputs
    monkeypatch.setattr(drafter._body, "hidden_from_inputs", lambda x: forwards.append(len(x)) or original(x))
    for i in range(2, len(ids) - 1):  # plain steps, one token's states each
        drafter.observe(states[i : i + 1])
    tokens = drafter.propose(ids, ProposalShape(1)).tokens
    assert forwards == [4]
    assert drafter._cached == 2 + 4 and len(tokens) == 1
