"""`specdeck train-draft`: a resumable, seeded distillation whose draft keeps decoding exact."""

from __future__ import annotations

import pytest
import torch
from tiny import build_pair

from specdeck.cli.main import main
from specdeck.engine.config import DecodeConfig
from specdeck.engine.events import SummaryEvent, TokenEvent, TokenState
from specdeck.engine.loading.models import LoadOptions, load_model
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pair, run_session
from specdeck.train.teacher import load_shards
from specdeck.train.teacher_shards import build_teacher_data
from specdeck.train.train import TrainConfig

TINY = [
    "--hidden",
    "32",
    "--layers",
    "1",
    "--intermediate",
    "64",
    "--answers",
    "3",
    "--passages",
    "1",
    "--code",
    "2",
    "--answer-tokens",
    "12",
    "--generation-batch",
    "2",
    "--documents",
    "4",
    "--output-vocab",
    "200",
    "--batch",
    "2",
    "--max-length",
    "48",
    "--threads",
    "1",
]


DRAFTED = (TokenState.ACCEPTED, TokenState.REJECTED, TokenState.DISCARDED)


def _kept_text(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenEvent) and e.state.kept)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("distil")
    target, _ = build_pair(root, "llama")
    out = root / "run"
    assert main(["train-draft", "--target", str(target), "--out", str(out), "--steps", "4", *TINY]) == 0
    return target, out


def test_trained_draft_keeps_greedy_output_exact(tiny_run):
    """A draft distilled for a few steps loads as a draft and leaves greedy output unchanged."""
    target, out = tiny_run
    pair = load_pair(PairSpec(str(target), str(out / "draft"), "draft-model", device="cpu"))
    config = DecodeConfig(k=3, schedule="constant", max_new_tokens=24)
    plain = list(run_session(pair, "The quick brown fox", config, plain=True))
    speculative = list(run_session(pair, "The quick brown fox", config))
    assert _kept_text(speculative) == _kept_text(plain)
    assert any(isinstance(e, SummaryEvent) and e.drafted > 0 for e in speculative)


def test_trained_draft_proposes_only_its_output_tokens(tiny_run):
    """A draft trained with a reduced output vocabulary ships the list, and proposes nothing else."""
    target, out = tiny_run
    pair = load_pair(PairSpec(str(target), str(out / "draft"), "draft-model", device="cpu"))
    allowed = set(pair.draft_model.output_ids.tolist())
    assert 0 < len(allowed) < pair.target.vocab_width
    events = list(
        run_session(
            pair, "def add(a, b):", DecodeConfig(k=4, schedule="constant", max_new_tokens=24, temperature=1.0, seed=3)
        )
    )
    drafted = [e.token_id for e in events if isinstance(e, TokenEvent) and e.state in DRAFTED]
    assert drafted and set(drafted) <= allowed


def test_resumed_training_matches_an_uninterrupted_run(tiny_run, tmp_path):
    """Stopping after 2 steps and resuming to 4 gives the same weights as 4 steps in one go."""
    target, straight = tiny_run
    out = tmp_path / "resumed"
    (out / "teacher").mkdir(parents=True)
    for shard in (straight / "teacher").glob("shard-*.pt"):  # the teacher stage is resumable too
        (out / "teacher" / shard.name).write_bytes(shard.read_bytes())
    assert main(["train-draft", "--target", str(target), "--out", str(out), "--steps", "4", "--until", "2", *TINY]) == 0
    assert main(["train-draft", "--target", str(target), "--out", str(out), "--steps", "4", "--resume", *TINY]) == 0
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_existing_run_is_not_overwritten(tiny_run, capsys):
    """Training into a folder that holds a checkpoint asks for --resume instead of starting over."""
    target, out = tiny_run
    assert main(["train-draft", "--target", str(target), "--out", str(out), "--steps", "4", *TINY]) == 2
    assert "--resume" in capsys.readouterr().err


def test_articles_are_written_then_read_back(tmp_path):
    """With --articles the target writes articles, then answers a request about each: every reading
    prompt holds an article it wrote, both steps are scored as its own text, and a second call
    (resuming) adds nothing."""
    target_dir, _ = build_pair(tmp_path, "llama")
    target = load_model(str(target_dir), LoadOptions(device="cpu"))
    config = TrainConfig(articles=3, generation_batch=2, answer_tokens=40, min_article_chars=30)
    data = build_teacher_data(target, tmp_path / "teacher", config, progress=lambda line: None)
    names = sorted(p.name for p in (tmp_path / "teacher").glob("shard-*.pt"))
    assert names == [
        "shard-articles-00000-1-write.pt",
        "shard-articles-00000-2-read.pt",
        "shard-articles-00001-1-write.pt",
        "shard-articles-00001-2-read.pt",
    ]
    decode = target.tokenizer.decode
    for number in range(2):
        written = torch.load(tmp_path / "teacher" / names[2 * number], weights_only=True)
        read = torch.load(tmp_path / "teacher" / names[2 * number + 1], weights_only=True)
        articles = [
            decode(ids[first + 1 :].tolist(), skip_special_tokens=True)
            for ids, first in zip(written["ids"], written["first"])
        ]
        articles = [a.strip() for a in articles if len(a) >= config.min_article_chars]
        prompts = [decode(ids[: first + 1].tolist()) for ids, first in zip(read["ids"], read["first"])]
        assert len(prompts) == len(articles) > 0
        assert all(any(a in prompt for a in articles) for prompt in prompts)
        for part in (written, read):
            assert all(
                len(top) == len(ids) - 1 - first for ids, top, first in zip(part["ids"], part["top_ids"], part["first"])
            )
    again = build_teacher_data(target, tmp_path / "teacher", config, progress=lambda line: None)
    assert sorted(p.name for p in (tmp_path / "teacher").glob("*")) == names
    assert all(torch.equal(a, b) for a, b in zip(again.ids, data.ids)) and len(again.ids) == len(data.ids)
    assert len(load_shards(tmp_path / "teacher").ids) == len(data.ids)
