"""`specdeck distill-head`: a feature head trained with the target's states computed per batch, a
run that resumes to the weights of an uninterrupted one, checkpoints never read half written, a
learning curve, and drafts that keep decoding exact."""

from __future__ import annotations

import fnmatch
import json
import shutil

import pytest
import torch
from tiny import ON_CPU, build_pair

from specdeck.cli.main import main
from specdeck.engine.config import DecodeConfig
from specdeck.engine.events import TokenEvent
from specdeck.engine.loading.models import load_model
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pair, run_session
from specdeck.train import RUN_STATE, forcing, loop, stream, stream_text
from specdeck.train.stream import batch_states, steps_to_fill
from specdeck.train.stream_text import StreamConfig, held_out_own
from specdeck.train.texts import Exchange

EXCHANGES = [
    Exchange(
        "python-docs", f"Explain item {i}.", f"Item {i} reads the file and returns a list of lines. " * (4 + i % 5)
    )
    for i in range(40)
]
SMALL = [
    "--device", "cpu", "--dtype", "float32", "--feature-layers", "1", "--answers", "14", "--answer-batch", "7",
    "--answer-tokens", "12", "--output-vocab", "150", "--batch", "4", "--eval-every", "3", "--unroll", "2",
    "--threads", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    target, _ = build_pair(root, "llama")
    return root, target


COMPOSED = [f"Tell me about thing {i}." for i in range(5)]


def few_composed(limit: int, seed: int) -> list[str]:
    return COMPOSED  # tens of thousands from WordNet: a few stand in


@pytest.fixture
def few_passages(monkeypatch):
    monkeypatch.setattr(forcing, "existing_exchanges", lambda seed: EXCHANGES)  # the free text on disk is large
    monkeypatch.setattr(forcing, "lexicon_requests", few_composed)


def distill(target, out, *extra: str) -> int:
    return main(["distill-head", "--target", str(target), "--out", str(out), *SMALL, *extra])


@pytest.fixture(scope="module")
def straight(text):
    root, target = text
    out = root / "straight"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(forcing, "existing_exchanges", lambda seed: EXCHANGES)
        patch.setattr(forcing, "lexicon_requests", few_composed)
        assert distill(target, out, "--steps", "7") == 0
    return out


def test_a_run_writes_only_the_names_its_folder_guard_knows(straight):
    """Every name `distill-head` leaves in --out is in `specdeck.train.RUN_STATE`."""
    names = [path.name for path in straight.iterdir() if not path.name.startswith(".")]
    assert names and all(any(fnmatch.fnmatchcase(name, p) for p in RUN_STATE) for name in names), names


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(text, straight, few_passages, tmp_path):
    """Stopped after step 4 and resumed to 7 (the own answers and text reused from the folder):
    the same weights and the same learning curve as one run of 7 steps."""
    _, target = text
    out = tmp_path / "resumed"
    assert distill(target, out, "--steps", "7", "--until", "4") == 0
    answers = (out / "answers.pt").stat().st_mtime_ns
    assert distill(target, out, "--steps", "7", "--resume") == 0
    assert (out / "answers.pt").stat().st_mtime_ns == answers
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    resumed = json.loads((out / "curve.json").read_text())  # with the point where it stopped, step 4
    assert [point for point in resumed if point["step"] != 4] == json.loads((straight / "curve.json").read_text())


def test_text_made_apart_trains_the_same_head(text, straight, few_passages, tmp_path):
    """`--text-only` makes the plan and the own answers and trains nothing; a run on that folder
    makes no answer again and ends with the weights of a run that made its text itself."""
    _, target = text
    out = tmp_path / "apart"
    assert distill(target, out, "--text-only", "--steps", "0") == 0
    assert (out / "plan.pt").exists() and (out / "answers.pt").exists()
    assert not (out / "checkpoint.pt").exists() and not (out / "head").exists()
    answers = (out / "answers.pt").stat().st_mtime_ns
    assert distill(target, out, "--steps", "7") == 0
    assert (out / "answers.pt").stat().st_mtime_ns == answers
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_a_run_from_a_later_batch_trains_on_the_text_the_first_steps_left(text, few_passages, tmp_path, monkeypatch):
    """`--text-from 3`: its steps take the batches a run from the start takes after its third, and
    its curve counts only the positions it trained on."""
    _, target = text
    trained: dict[str, list[list[list[int]]]] = {}
    states = stream.batch_states

    def recording(run: str):
        def batch_states(target, sequences, layers):
            if torch.is_grad_enabled():  # a training step's batch, not a held-out one
                trained.setdefault(run, []).append([s.tolist() for s in sequences])
            return states(target, sequences, layers)

        return batch_states

    monkeypatch.setattr(stream, "batch_states", recording("whole"))
    assert distill(target, tmp_path / "whole", "--steps", "7") == 0
    monkeypatch.setattr(stream, "batch_states", recording("later"))
    assert distill(target, tmp_path / "later", "--steps", "4", "--text-from", "3") == 0
    assert len(trained["whole"]) == 7 and trained["later"] == trained["whole"][3:]
    whole = {p["step"]: p["positions"] for p in json.loads((tmp_path / "whole" / "curve.json").read_text())}
    later = json.loads((tmp_path / "later" / "curve.json").read_text())
    assert later[-1]["step"] == 4 and later[-1]["positions"] == whole[7] - whole[3] > 0


def test_a_plan_with_a_passage_fewer_holds_out_the_same_other_sequences(text, tmp_path, monkeypatch):
    """Given text made on a machine that lacks one passage: every other sequence is held out or
    trained on as before, and so is every own answer (no held-out sequence of one machine's run
    trains on another's)."""
    _, target_path = text
    target = load_model(str(target_path))
    monkeypatch.setattr(forcing, "lexicon_requests", few_composed)
    config = StreamConfig(answers=14, answer_batch=7, answer_tokens=12)

    def held_out(exchanges, folder):
        monkeypatch.setattr(forcing, "existing_exchanges", lambda seed: exchanges)
        made = stream_text.stream_text(target, folder, config, lambda said: None)
        rows = made.rows(True, False) + made.rows(True, True)
        return {tuple(made.ids[r].tolist()) for r in rows}, made

    many = [Exchange("wordnet", f"Define word {i}.", f"Word {i} means a thing of kind {i % 7}.") for i in range(400)]
    (tmp_path / "all").mkdir()
    (tmp_path / "fewer").mkdir()
    everything, made = held_out(many, tmp_path / "all")
    shutil.copy(tmp_path / "all" / "answers.pt", tmp_path / "fewer" / "answers.pt")
    fewer, _ = held_out(many[1:], tmp_path / "fewer")
    dropped = tuple(made.ids[0].tolist())
    assert fewer == everything - {dropped}
    assert len(made.rows(True, False)) >= 10 and len(made.rows(True, True)) == 1  # 400 passages, 14 answers


def test_answers_added_before_the_second_turns_move_none_of_them_in_or_out():
    """Second turns follow all the answers in the text, so answers made later move their places:
    the held-out ones stay held out (and the answers made before keep theirs)."""
    turns = [torch.arange(i, i + 30, dtype=torch.int32) for i in range(200)]
    before, after = held_out_own(100, turns), held_out_own(612, turns)
    assert before[100:] == after[612:] and before[:100] == after[:100]
    assert 0 < sum(before[100:]) < 30 and sum(before[:100]) == 5


def test_learning_curve_counts_positions_and_measures_both_kinds(straight):
    curve = json.loads((straight / "curve.json").read_text())
    assert [point["step"] for point in curve] == [3, 6, 7]
    positions = [point["positions"] for point in curve]
    assert positions == sorted(positions) and positions[-1] > 0
    for point in curve:
        kinds = ("own answers", "given text", "own answers, not copyable", "given text, not copyable")
        assert all(len(point[kind]) == 2 for kind in kinds)  # one figure per depth
        assert all(0.0 <= a <= 1.0 for kind in kinds for a in point[kind])
    assert json.loads((straight / "head" / "curve.json").read_text())[-1]["step"] <= 7


def test_a_checkpoint_killed_while_written_is_never_loaded(text, straight, few_passages, tmp_path, monkeypatch):
    """A write that dies half way leaves the checkpoint before it whole: the resumed run starts
    from that one, as if the write had never begun."""
    _, target = text
    out = tmp_path / "killed"
    assert distill(target, out, "--steps", "7", "--until", "3") == 0
    before = (out / "checkpoint.pt").read_bytes()
    real_save = torch.save

    def dies_half_way(state, path, *args, **kwargs):
        real_save(state, path, *args, **kwargs)
        with open(path, "r+b") as file:
            file.truncate(len(before) // 2)
        raise KeyboardInterrupt  # killed before the file was put in place

    monkeypatch.setattr(loop.torch, "save", dies_half_way)
    assert distill(target, out, "--steps", "7", "--resume", "--until", "6") == 130  # as after Ctrl+C
    monkeypatch.setattr(loop.torch, "save", real_save)
    assert (out / "checkpoint.pt").read_bytes() == before
    assert distill(target, out, "--steps", "7", "--resume") == 0
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_distilled_head_keeps_greedy_decoding_exact(text, straight):
    """The head that fuses a lower layer drafts, and greedy output equals plain decoding for K = 1..4."""
    _, target = text
    pair = load_pair(PairSpec(str(target), str(straight / "head"), None, device="cpu"))
    assert pair.drafter_kind == "feature-head"

    def kept(events):
        return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]

    prompt = "The quick brown fox"
    plain = kept(run_session(pair, prompt, DecodeConfig(max_new_tokens=40), chat=False, plain=True))
    for k in range(1, 5):
        config = DecodeConfig(k=k, schedule="constant", max_new_tokens=40)
        assert kept(run_session(pair, prompt, config, chat=False)) == plain, k


def test_states_per_batch_are_the_targets(text):
    """A padded batch gives each sequence the states the target computes for it alone."""
    _, folder = text
    target = load_model(str(folder), ON_CPU)
    sequences = [torch.tensor([5, 9, 13, 2, 7]), torch.tensor([4, 8])]
    states, ids = batch_states(target, sequences, (1,))
    assert states.shape[:3] == (2, 5, 2) and ids.shape == (2, 5)
    for row, s in enumerate(sequences):
        with torch.no_grad():
            hidden = target.torch_model.model(s[None], output_hidden_states=True).hidden_states
        expected = torch.stack([hidden[1][0], hidden[-1][0]], dim=1)
        torch.testing.assert_close(states[row, : len(s)], expected, rtol=1e-5, atol=1e-5)


def test_bad_settings_are_refused_with_what_to_do(text, few_passages, tmp_path, capsys):
    _, target = text
    assert distill(target, tmp_path / "a", "--feature-layers", "9") == 2
    assert "between 1 and" in capsys.readouterr().err
    assert distill(target, tmp_path / "b", "--own-repeat", "0") == 2
    assert "at least 1" in capsys.readouterr().err
    assert distill(target, tmp_path / "d", "--steps", "0") == 2
    assert "--minutes" in capsys.readouterr().err
    assert distill(target, tmp_path / "e", "--copy-weight", "2") == 2
    assert "--copy-weight" in capsys.readouterr().err
    assert distill(target, tmp_path / "c", "--steps", "2") == 0
    assert distill(target, tmp_path / "c", "--steps", "2") == 2
    assert "pass --resume" in capsys.readouterr().err


def test_second_turns_follow_the_targets_own_finished_answers(text, tmp_path):
    """A second turn is an own answer that ended, the chat template's next user turn asking a
    follow-up, and the target's reply, which is where its training starts; answers cut off by the
    length limit and raw code completions get none, every batch is kept, and a rerun makes no more."""
    from specdeck.train.stream_text import StreamConfig, second_turns
    from specdeck.train.teacher import chat_ids
    from specdeck.train.turns import FOLLOW_UPS, second_turn_suffix

    _, path = text
    target = load_model(str(path), ON_CPU)
    eos = sorted(target.eos_ids)[0]
    target.tokenizer.chat_template = (  # the tiny tokenizer has none: a plain one that ends a turn with EOS
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    assert second_turn_suffix(target.tokenizer, FOLLOW_UPS[0], eos) is not None
    asked_first = chat_ids(target, "Name a fruit.")
    finished = [torch.tensor(asked_first + [8 + i, eos], dtype=torch.int32) for i in range(5)]
    cut_off = torch.tensor(asked_first + [9], dtype=torch.int32)
    raw_code = torch.tensor([5, 6, 7, eos], dtype=torch.int32)  # a code completion: no conversation to go on
    made = {"ids": [*finished, cut_off, raw_code], "first": [len(asked_first) - 1] * 6 + [1], "batches": 2}
    saved: list[int] = []
    config = StreamConfig(second_turns=10, answer_batch=2, answer_tokens=6)

    def save() -> None:
        saved.append(made["second"]["batches"])

    second_turns(target, made, config, 0.0, print, save)
    replies = made["second"]
    assert saved == [1, 2, 3] and replies["batches"] == 3 and len(replies["ids"]) == 5
    firsts = {tuple(ids.tolist()) for ids in finished}
    for ids, first in zip(replies["ids"], replies["first"]):
        ids = ids.tolist()
        opening = next(f for f in firsts if tuple(ids[: len(f)]) == f)  # an own answer that ended
        asked = [second_turn_suffix(target.tokenizer, f, eos) for f in FOLLOW_UPS]
        assert any(ids[len(opening) : first + 1] == a for a in asked)  # then a follow-up, then the reply
        assert first + 1 < len(ids)
    second_turns(target, made, config, 0.0, print, save)
    assert saved == [1, 2, 3], "a rerun made more"


def test_second_turns_follow_the_end_token_that_closes_the_turn(text):
    """Where the target counts several end tokens (a GGUF tokenizer may count its turn opening too),
    a finished answer's follow-up comes after the one that closes the assistant's turn."""
    from specdeck.train.stream_text import StreamConfig, second_turns
    from specdeck.train.teacher import chat_ids

    _, path = text
    target = load_model(str(path), ON_CPU)
    closer = target.tokenizer.convert_tokens_to_ids("|")
    target.tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}|\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    target.model.generation_config.eos_token_id = [target.tokenizer.eos_token_id, closer]
    assert min(target.eos_ids) != closer, "the closing token should not be the first end token"
    asked = chat_ids(target, "Name a fruit.")
    made = {
        "ids": [torch.tensor(asked + [8 + i, closer], dtype=torch.int32) for i in range(3)],
        "first": [len(asked) - 1] * 3,
        "batches": 1,
    }
    second_turns(target, made, StreamConfig(second_turns=3, answer_batch=4, answer_tokens=4), 0.0, print, lambda: None)
    assert len(made["second"]["ids"]) == 3


def test_the_chat_templates_second_turn_is_a_user_turn_then_the_assistants():
    from specdeck.engine.loading.models import load_tokenizer
    from specdeck.train.turns import second_turn_suffix

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    suffix = second_turn_suffix(tokenizer, "Make it shorter.", eos)
    assert tokenizer.decode(suffix) == "\n<|im_start|>user\nMake it shorter.<|im_end|>\n<|im_start|>assistant\n"


def test_answers_in_groups_alike_in_length_answer_every_request(text):
    """Requests generated a few at a time, grouped by length: each answer follows its own request,
    every request that got an answer is among those asked, and the groups do not depend on the
    order the requests came in."""
    from specdeck.train.stream_text import StreamConfig, answer_in_groups

    _, path = text
    target = load_model(str(path), ON_CPU)
    prompts = [[5 + i] * (3 + 4 * i) for i in range(5)]
    config = StreamConfig(answer_group=2, answer_tokens=6)
    shard = answer_in_groups(target, prompts, config, greedy=True, seed=0)
    assert 0 < len(shard.ids) <= len(prompts)
    asked = {tuple(p) for p in prompts}
    for ids, first in zip(shard.ids, shard.first):
        assert tuple(ids[: first + 1].tolist()) in asked and first + 1 < len(ids)
    again = answer_in_groups(target, prompts[::-1], config, greedy=True, seed=0)
    assert [ids.tolist() for ids in again.ids] == [ids.tolist() for ids in shard.ids]


def test_the_plan_asks_for_code_completions_without_a_chat_template(text, straight):
    """Beside the chat requests the target continues beginnings of standard-library functions as
    raw code, as code completion is asked."""
    from specdeck.train.stdlib_text import code_prefixes

    _, path = text
    tokenizer = load_model(str(path), ON_CPU).tokenizer
    asked = {tuple(ids.tolist()) for ids in torch.load(straight / "plan.pt", weights_only=True)["requests"]}
    code = [
        tokenizer(t, add_special_tokens=False)["input_ids"]
        for t in code_prefixes(forcing.ForcingConfig().code_prefixes)
    ]
    assert len(code) > 100 and all(tuple(ids) in asked for ids in code)


def test_a_plan_made_before_the_composed_requests_gains_them_mixed_in(text, straight, few_passages, tmp_path):
    """The requests composed from WordNet are shuffled in with the others, in a new plan and in one
    made before them."""
    from specdeck.train.teacher import chat_ids

    _, path = text
    target = load_model(str(path), ON_CPU)
    plan = torch.load(straight / "plan.pt", weights_only=True)
    composed = [chat_ids(target, r) for r in COMPOSED]
    requests = [ids.tolist() for ids in plan["requests"]]
    assert all(ids in requests for ids in composed) and plan["lexicon_requests"] == len(COMPOSED)
    assert requests[-len(COMPOSED) :] != composed, "a new plan mixes them in"
    older = [ids for ids in requests if ids not in composed]
    before = {key: value for key, value in plan.items() if key != "lexicon_requests"}
    torch.save(before | {"requests": [torch.tensor(ids, dtype=torch.int32) for ids in older]}, tmp_path / "plan.pt")
    assert distill(path, tmp_path, "--text-only") == 0
    extended = [ids.tolist() for ids in torch.load(tmp_path / "plan.pt", weights_only=True)["requests"]]
    assert sorted(extended) == sorted(older + composed) and extended[-len(COMPOSED) :] != composed


def test_new_answers_ask_requests_no_answer_has_asked(text, straight, few_passages, tmp_path):
    """The next answers ask requests not answered yet, whatever the places of those answered in the
    plan: answers made under another order keep counting."""
    _, path = text
    plan = torch.load(straight / "plan.pt", weights_only=True)
    kept = torch.load(straight / "answers.pt", weights_only=True)
    answered = [ids[: first + 1].tolist() for ids, first in zip(kept["ids"], kept["first"])]
    rest = [ids.tolist() for ids in plan["requests"] if ids.tolist() not in answered]
    moved = rest[:14] + answered + rest[14:]  # where the next two batches of 7 would ask by place
    torch.save(plan | {"requests": [torch.tensor(ids, dtype=torch.int32) for ids in moved]}, tmp_path / "plan.pt")
    shutil.copy(straight / "answers.pt", tmp_path / "answers.pt")  # two batches of 7
    assert distill(path, tmp_path, "--text-only", "--answers", "28") == 0  # two batches more
    made = torch.load(tmp_path / "answers.pt", weights_only=True)
    asked = [tuple(ids[: first + 1].tolist()) for ids, first in zip(made["ids"], made["first"])]
    assert [ids.tolist() for ids in made["ids"][:14]] == [ids.tolist() for ids in kept["ids"]]
    assert len(asked) == len(set(asked)) == 28


def test_minutes_are_filled_by_the_epoch_s_batches_not_the_timed_ones():
    # batches grouped by length: the few timed ones short, the epoch's mean four times longer
    epoch = [1000] * 6 + [5000] * 18
    timed = epoch[:6]
    seconds_a_token = 0.002
    steps = steps_to_fill(10, [t * seconds_a_token for t in timed], timed, epoch)
    mean_step = seconds_a_token * sum(epoch) / len(epoch)
    assert steps * mean_step == pytest.approx(0.9 * 600, rel=0.01)
    assert steps < steps_to_fill(10, [t * seconds_a_token for t in timed], timed, timed) / 3


def test_a_run_sized_by_minutes_keeps_its_steps_when_resumed(text, few_passages, tmp_path, capsys):
    _, target = text
    out = tmp_path / "timed"
    assert distill(target, out, "--steps", "0", "--minutes", "0.05", "--until", "2") == 0
    said = capsys.readouterr().err
    assert "steps fill 0.05 minutes" in said
    steps = int(said.split(" steps fill")[0].split()[-1])
    assert torch.load(out / "checkpoint.pt", weights_only=True)["config"]["steps"] == steps
    assert distill(target, out, "--steps", "0", "--minutes", "0.05", "--resume", "--until", "3") == 0
    assert "steps fill" not in capsys.readouterr().err
