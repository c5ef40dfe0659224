"""The `specdeck bench` subcommand: arguments, a terminal progress bar, and the files it writes."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from engine.config import DecodeConfig
from engine.errors import SpecDeckError


def add_bench_command(commands) -> None:
    """Register `bench` on the `specdeck` subparsers."""
    from engine.cli import add_model_arguments

    bench = commands.add_parser("bench", help="measure tokens/s of plain, speculative and Hugging Face decoding")
    add_model_arguments(bench)
    bench.add_argument("--prompts", default=None,
                       help="Spec-Bench jsonl, HumanEval jsonl, or one prompt per line (default: the bundled sample)")
    bench.add_argument("--categories", default=None, help="comma-separated categories to keep")
    bench.add_argument("--limit", type=int, default=None, help="at most N prompts per category")
    bench.add_argument("--k", default=str(DecodeConfig.k), help="draft tokens per round, or a sweep: 1,2,3,4,6,8")
    bench.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (texts are then checked)")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=3, help="timed runs per prompt and method (median kept)")
    bench.add_argument("--baselines", default="plain,hf,hf-assisted", help="any of plain, hf, hf-assisted")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--out", required=True, help="folder for summary.csv, per_prompt.csv, report.md and plots")
    bench.set_defaults(handler=cmd_bench)


def parse_ks(text: str) -> tuple[int, ...]:
    """'4' or a sweep '1,2,4' as draft lengths, in the order given, without repeats."""
    try:
        ks = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise SpecDeckError(f"K takes whole numbers, e.g. 4 or a sweep 1,2,3,4,6,8 (got {text!r}).") from error
    if not ks or min(ks) < 1:
        raise SpecDeckError(f"K takes positive draft lengths, e.g. 4 or a sweep 1,2,4 (got {text!r}).")
    return tuple(dict.fromkeys(ks))


class ProgressBar:
    """One self-rewriting line on stderr: bar, count, elapsed time and what runs now."""

    def __init__(self, stream=sys.stderr, width: int = 28) -> None:
        self.stream = stream
        self.width = width
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int, label: str) -> None:
        filled = self.width * done // max(total, 1)
        elapsed = time.perf_counter() - self.started
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {elapsed:5.0f}s {label}"
        end = "\n" if label == "done" else ""
        if self.stream.isatty():
            self.stream.write("\r" + line[:120].ljust(120) + end)
        else:  # a log file: one line per run
            self.stream.write(line + "\n")
        self.stream.flush()


def cmd_bench(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from engine.bench.prompts import read_prompts, sample_prompts
    from engine.bench.runner import BenchSettings
    from engine.session import load_pair

    ks = parse_ks(args.k)
    settings = BenchSettings(
        ks=ks, baselines=tuple(b.strip() for b in args.baselines.split(",") if b.strip()), repeats=args.repeats,
        decode=DecodeConfig(k=ks[0], temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens),
    )
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    prompts_path = Path(args.prompts) if args.prompts else sample_prompts()
    prompts = read_prompts(prompts_path, categories, args.limit)
    if args.threads is not None:
        if args.threads < 1:
            raise SpecDeckError(f"--threads must be at least 1 (got {args.threads}).")
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecDeckError(f"Cannot create the output folder {out}: {error.strerror}.") from error
    transformers.logging.set_verbosity_error()  # its assisted-generation notices would break the progress bar
    progress = lambda stage: print(f"[{stage}]", file=sys.stderr, flush=True)  # noqa: E731
    pair = load_pair(args.target, args.draft, args.drafter, args.device, args.dtype, args.trust_remote_code,
                     progress=progress)
    command = ("specdeck bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["bench"]
               else "specdeck bench")
    context = report_context(pair, prompts_path, command)
    summary = run_and_write(pair, prompts, settings, out, context, plots=not args.no_plots, progress=ProgressBar())
    overview = [r for r in summary if r["category"] == "all"]
    from engine.bench.report import markdown_table

    print(markdown_table(overview, ("method", "k", "new_tokens", "tokens_per_s", "speedup_vs_plain",
                                    "acceptance_rate", "mean_accepted_length", "identical_to_plain")))
    print(f"\nWrote {out}/summary.csv, per_prompt.csv, k_sweep.csv, report.md and plots.")
    return 0


def report_context(pair, prompts_path: str | Path, command: str) -> dict[str, str]:
    """What report.md says produced the figures: the command, the models, the device and the prompts."""
    return {
        "command": command, "target": pair.target.name,
        "drafter": pair.drafter_description,
        "device": str(pair.target.device), "dtype": str(pair.target.dtype).removeprefix("torch."),
        "prompts": str(prompts_path),
    }


def run_and_write(pair, prompts, settings, out: Path, context: dict[str, str], plots: bool = True,
                  progress=None) -> list[dict]:
    """Run the benchmark and write every output file into `out`; return the summary rows."""
    from engine.bench import plots as plotting
    from engine.bench.report import (PER_PROMPT_COLUMNS, SUMMARY_COLUMNS, SWEEP_COLUMNS, per_prompt_rows,
                                     summary_rows, sweep_rows, write_csv, write_report)
    from engine.bench.runner import run_bench

    out.mkdir(parents=True, exist_ok=True)
    if pair.drafter_kind == "feature-head" and "hf-assisted" in settings.baselines:
        # Hugging Face has no drafter that reads the target's hidden state: nothing to compare with
        settings = replace(settings, baselines=tuple(b for b in settings.baselines if b != "hf-assisted"))
        context = {**context, "note": "hf-assisted left out: Hugging Face generate() has no feature-head drafter."}
    results = run_bench(pair, prompts, settings, progress)
    summary = summary_rows(results, settings)
    sweep = sweep_rows(results, settings)
    write_csv(out / "summary.csv", SUMMARY_COLUMNS, summary)
    write_csv(out / "per_prompt.csv", PER_PROMPT_COLUMNS, per_prompt_rows(results, settings))
    write_csv(out / "k_sweep.csv", SWEEP_COLUMNS, sweep)
    drawn = []
    if plots:
        plotting.plot_speedup_by_category(summary, out / "speedup_by_category.png")
        drawn.append("speedup_by_category.png")
        if len(settings.ks) > 1:
            plotting.plot_k_sweep(sweep, out / "k_sweep.png")
            drawn.append("k_sweep.png")
    write_report(out / "report.md", results, settings, context, summary, sweep, drawn)
    return summary
