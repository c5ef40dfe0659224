"""The command line under Ctrl-C, SIGTERM and a closed pipe: it stops cleanly and keeps what it did."""

from __future__ import annotations

import csv
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import build_pair

from specdeck.engine.atomic import filling_folder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tiny_root):
    return build_pair(tiny_root / "interrupt", "llama", noise=0.2)


def _specdeck(*argv: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "specdeck.cli.main", *argv], cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True
    )


def _run_argv(models, *extra: str) -> list[str]:
    target, draft = models
    return [
        "run",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--no-chat",
        "--prompt",
        "The quick brown fox",
        "--max-new-tokens",
        "480",
        *extra,
    ]


def _wait_blocked_on_output(child: subprocess.Popen) -> None:
    """Let the child fill the pipe (its ~120 kB of events outgrow the pipe's buffer) and block there."""
    wchan = Path(f"/proc/{child.pid}/wchan")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "pipe" not in (wchan.read_text() if wchan.exists() else ""):
        time.sleep(0.05)


def _read_stderr_until(child: subprocess.Popen, text: str, timeout: float = 30) -> str:
    """What the child wrote to stderr up to and including `text` (read as it comes, so that the
    test acts after the child has, whatever the machine's load)."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([child.stderr], [], [], 0.1)
        if ready:
            chunk = os.read(child.stderr.fileno(), 4096).decode(errors="replace")
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_run_stops_at_a_round_and_still_summarises(models, signum):
    """One Ctrl-C or SIGTERM ends the session at a round boundary with a `cancelled` summary event."""
    with _specdeck(*_run_argv(models, "--jsonl")) as child:
        child.stdout.readline()  # the session has started
        _wait_blocked_on_output(child)
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    events = [json.loads(line) for line in out.splitlines()]
    summary = events[-1]
    assert summary["type"] == "summary" and summary["stop_reason"] == "cancelled"
    assert 0 < summary["new_tokens"] < 480 and child.returncode == 130 and "Traceback" not in err


def test_second_ctrl_c_quits_at_once(models):
    """A second Ctrl-C does not wait for the round to end: no summary, status 130, no traceback."""
    with _specdeck(*_run_argv(models, "--jsonl")) as child:
        child.stdout.readline()
        _wait_blocked_on_output(child)
        child.send_signal(signal.SIGINT)
        noticed = _read_stderr_until(child, "press Ctrl-C again")
        assert "press Ctrl-C again" in noticed
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
        err = noticed + err
    assert child.returncode == 130 and "Traceback" not in err
    assert '"summary"' not in out


def test_closed_pipe_exits_quietly(models):
    """`specdeck run | head -c 5`: the reader leaves early and nothing is printed about it."""
    with _specdeck(*_run_argv(models)) as child:
        assert len(child.stdout.read(5)) == 5
        child.stdout.close()
        child.wait(timeout=60)
        err = child.stderr.read()
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    assert child.returncode == 141


def _four_prompts(path: Path) -> Path:
    lines = [{"question_id": i, "category": "qa", "turns": [f"The quick brown fox {i}"]} for i in range(4)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("earlier", [False, True], ids=["empty out", "out with an earlier result"])
def test_ctrl_c_in_bench_keeps_the_prompts_that_finished(models, tmp_path, earlier):
    """Ctrl-C after the first prompt: the files cover the finished prompts and say it was cancelled;
    where --out holds an earlier result, that stays as it was and these go to a new folder in it."""
    target, _ = models
    out = tmp_path / "out"
    if earlier:
        with filling_folder(out) as staging:  # as an earlier benchmark writes them
            for name in ("summary.csv", "per_prompt.csv", "k_sweep.csv", "report.md"):
                (staging / name).write_text(f"earlier {name}", encoding="utf-8")
    argv = [
        "bench",
        "--target",
        str(target),
        "--drafter",
        "prompt-lookup",
        "--prompts",
        str(_four_prompts(tmp_path / "p.jsonl")),
        "--baselines",
        "plain",
        "--repeats",
        "3",
        "--k",
        "2",
        "--max-new-tokens",
        "300",
        "--no-plots",
        "--out",
        str(out),
    ]
    with _specdeck(*argv) as child:
        for line in child.stderr:  # one progress line per run; a prompt is 3 repeats of 2 methods
            done = re.search(r"\] (\d+)/", line)
            if done and int(done.group(1)) >= 6:
                child.send_signal(signal.SIGINT)
                break
        stdout, err = child.communicate(timeout=60)
    assert child.returncode == 130 and "Traceback" not in err
    assert "Cancelled: the results cover the" in err and "of 4 prompts" in err
    partial = out
    if earlier:
        (partial,) = out.glob("cancelled-*")
        assert f"The earlier results in {out} are kept as they were; these partial ones are in {partial}" in err
        assert all(
            (out / name).read_text(encoding="utf-8") == f"earlier {name}" for name in ("summary.csv", "report.md")
        )
    with (partial / "summary.csv").open(encoding="utf-8") as handle:
        kept = int(next(r for r in csv.DictReader(handle) if r["category"] == "all")["prompts"])
    assert 1 <= kept < 4
    assert f"Cancelled after {kept} of 4 prompts" in (partial / "report.md").read_text(encoding="utf-8")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full to stand for a full disk")
@pytest.mark.parametrize("form", ["text", "jsonl"])
def test_a_full_disk_on_standard_output_is_said_in_a_line(models, form):
    """`specdeck run > file` on a full disk: one line saying what failed and what to do, no traceback."""
    extra = ("--jsonl",) if form == "jsonl" else ()
    with open("/dev/full", "w") as full, _specdeck(*_run_argv(models), *extra, stdout=full) as child:
        err = child.stderr.read()
        child.wait(timeout=120)
    assert child.returncode == 1 and "Traceback" not in err, err
    assert "could not be written" in err and "No space left" in err
