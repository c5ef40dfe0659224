"""The `specdeck bench` subcommand: arguments, a terminal progress bar, and the files it writes.

`--drafters draft-model,feature-head` times several drafters of one target in one run: the target
loads once, each drafter's model once, and all of them alternate with the same plain runs."""

from __future__ import annotations

import argparse
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import DecodeConfig
from engine.errors import SpecDeckError

if TYPE_CHECKING:
    from engine.session import ModelPair


def add_bench_command(commands) -> None:
    """Register `bench` on the `specdeck` subparsers."""
    from engine.cli import add_model_arguments

    bench = commands.add_parser("bench", help="measure tokens/s of plain, speculative and Hugging Face decoding")
    add_model_arguments(bench)
    bench.add_argument("--drafters", default=None,
                       help="several drafters in one run instead of --drafter/--draft: comma-separated kinds, "
                            "each optionally kind:MODEL, e.g. draft-model,feature-head:path/to/head,prompt-lookup,suffix")
    bench.add_argument("--prompts", default=None,
                       help="Spec-Bench jsonl, HumanEval jsonl, or one prompt per line (default: the bundled sample)")
    bench.add_argument("--categories", default=None, help="comma-separated categories to keep")
    bench.add_argument("--limit", type=int, default=None, help="at most N prompts per category")
    bench.add_argument("--k", default="auto",
                       help="draft tokens per round, auto (chosen each round from measured costs), "
                            "or a sweep: auto,1,2,4")
    bench.add_argument("--lookup", default=str(DecodeConfig.lookup),
                       help="tokens prompt lookup may copy per round before the drafter (0: off), or a sweep: 0,2")
    bench.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (texts are then checked)")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=3, help="timed runs per prompt and method (median kept)")
    bench.add_argument("--baselines", default="plain,hf,hf-assisted",
                       help="any of plain, hf, hf-assisted, llama.cpp (llama-cpp-python's own generation of a .gguf target)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--out", required=True, help="folder for summary.csv, per_prompt.csv, report.md and plots")
    bench.set_defaults(handler=cmd_bench)


def parse_ks(text: str) -> tuple[int, ...]:
    """'4', 'auto' or a sweep 'auto,1,2,4' as draft lengths (`AUTO_K` for auto), in the order given,
    without repeats."""
    from engine.bench.runner import AUTO_K

    ks: list[int] = []
    for part in (part.strip().lower() for part in text.split(",")):
        if part == "auto":
            ks.append(AUTO_K)
        elif part:
            ks += _parse_sweep(part, 1, "K takes whole numbers or auto, e.g. 4, auto or a sweep auto,1,2,4",
                               "K takes positive draft lengths or auto, e.g. 4, auto or a sweep auto,1,2")
    if not ks:
        raise SpecDeckError(f"K takes whole numbers or auto, e.g. 4, auto or a sweep auto,1,2,4 (got {text!r}).")
    return tuple(dict.fromkeys(ks))


def parse_lookups(text: str) -> tuple[int, ...]:
    """'2' or a sweep '0,2' as lookup lengths (0: off), in the order given, without repeats."""
    return _parse_sweep(text, 0, "--lookup takes whole numbers, e.g. 2 or a sweep 0,2",
                        "--lookup takes tokens to copy per round, 0 for off, e.g. 0,2")


def _parse_sweep(text: str, lowest: int, not_numbers: str, too_small: str) -> tuple[int, ...]:
    """Comma-separated whole numbers of at least `lowest`, in order, without repeats; the messages
    say what is wrong otherwise."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise SpecDeckError(f"{not_numbers} (got {text!r}).") from error
    if not values or min(values) < lowest:
        raise SpecDeckError(f"{too_small} (got {text!r}).")
    return tuple(dict.fromkeys(values))


def parse_drafters(text: str, where: str = "--drafters") -> list[tuple[str, str | None]]:
    """'draft-model,feature-head:path/to/head' as (drafter kind, model or None) entries, in order;
    `where` names the option in error messages."""
    from engine.drafters import COPYING_KINDS, DRAFTER_KINDS

    entries = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        kind, _, model = (piece.strip() for piece in entry.partition(":"))
        if kind not in DRAFTER_KINDS:
            raise SpecDeckError(f"Unknown drafter {kind!r} in {where}: choose from {', '.join(DRAFTER_KINDS)}, "
                                "each optionally as kind:MODEL.")
        if kind in COPYING_KINDS and model:
            what = "Prompt lookup" if kind == "prompt-lookup" else "The suffix drafter"
            raise SpecDeckError(f"{what} needs no model: write {kind} alone in {where} (got {entry!r}).")
        entries.append((kind, model or None))
    if not entries:
        raise SpecDeckError(f"{where} names no drafter: e.g. draft-model,feature-head.")
    return entries


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
    from engine.session import load_pairs

    ks = parse_ks(args.k)
    lookups = parse_lookups(args.lookup)
    if args.drafters and (args.drafter or args.draft):
        raise SpecDeckError("Choose drafters with --drafters or with --drafter/--draft, not both.")
    drafters = parse_drafters(args.drafters) if args.drafters else [(args.drafter, args.draft)]
    settings = BenchSettings(
        ks=ks, lookups=lookups, baselines=tuple(b.strip() for b in args.baselines.split(",") if b.strip()),
        repeats=args.repeats,
        decode=DecodeConfig(k=next((k for k in ks if k), DecodeConfig.k), lookup=lookups[0], temperature=args.temperature, seed=args.seed,
                            max_new_tokens=args.max_new_tokens),
    )
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    prompts_path = Path(args.prompts) if args.prompts else sample_prompts()
    prompts = read_prompts(prompts_path, categories, args.limit)
    if args.threads is not None:
        if args.threads < 1:
            raise SpecDeckError(f"--threads must be at least 1 (got {args.threads}).")
        torch.set_num_threads(args.threads)
    out = check_results_folder(Path(args.out))
    transformers.logging.set_verbosity_error()  # its assisted-generation notices would break the progress bar
    progress = lambda stage: print(f"[{stage}]", file=sys.stderr, flush=True)  # noqa: E731
    pairs = load_pairs(args.target, drafters, args.device, args.dtype, args.trust_remote_code, progress=progress,
                       backend=args.backend)
    command = ("specdeck bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["bench"]
               else "specdeck bench")
    context = report_context(pairs, prompts_path, command)
    from engine.interrupt import cancel_on_signals, to_stderr

    with cancel_on_signals(to_stderr) as cancel:  # Ctrl-C keeps the prompts that finished
        summary = run_and_write(pairs, prompts, settings, out, context, plots=not args.no_plots,
                                progress=ProgressBar(), cancel=cancel)
    if not summary:
        print(f"Cancelled before any prompt finished: nothing written, {out} left as it was.", file=sys.stderr)
        return 130
    overview = [r for r in summary if r["category"] == "all"]
    from engine.bench.report import markdown_table

    print(markdown_table(overview, ("method", "k", "drafter", "new_tokens", "tokens_per_s", "speedup_vs_plain",
                                    "acceptance_rate", "mean_accepted_length", "identical_to_plain")))
    print(f"\nWrote {out}/: {', '.join(sorted(path.name for path in out.iterdir()))}.")
    if int(overview[0]["prompts"]) < len(prompts):
        print(f"Cancelled: the results cover the {overview[0]['prompts']} of {len(prompts)} prompts that finished.",
              file=sys.stderr)
        return 130
    return 0


RESULT_FILES = ("summary.csv", "per_prompt.csv", "k_sweep.csv", "report.md", "speedup_by_category.png",
                "k_sweep.png")


def check_results_folder(out: Path) -> Path:
    """Refuse an `--out` that cannot be written, or one holding files a benchmark did not write
    (the new results replace the folder whole), before any model loads."""
    from engine.atomic import check_writable_folder, remove_abandoned

    check_writable_folder(out)
    remove_abandoned(out.parent, lambda line: print(f"[{line}]", file=sys.stderr), name=out.name)
    foreign = sorted(path.name for path in out.iterdir() if path.name not in RESULT_FILES) if out.is_dir() else []
    if foreign:
        raise SpecDeckError(f"{out} holds files a benchmark did not write ({', '.join(foreign[:3])}"
                            f"{', ...' if len(foreign) > 3 else ''}): the results replace that folder whole, "
                            "so choose a new or empty --out.")
    return out


def report_context(pairs: Sequence[ModelPair], prompts_path: str | Path, command: str) -> dict[str, str]:
    """What report.md says produced the figures: the command, the target, the device and the prompts
    (the drafters it names from the methods that ran)."""
    target = pairs[0].target
    return {
        "command": command, "target": target.name,
        "device": str(target.device), "dtype": str(target.dtype).removeprefix("torch."), "backend": target.backend,
        "prompts": str(prompts_path),
    }


def run_and_write(pairs: Sequence[ModelPair], prompts, settings, out: Path, context: dict[str, str],
                  plots: bool = True, progress=None, cancel: threading.Event | None = None) -> list[dict]:
    """Run the benchmark of `pairs` (one per drafter, sharing one target) and write every output file
    into `out`, which is built aside and swapped in whole (an earlier `out` stays intact until then);
    return the summary rows. Cancelled (`cancel` set), the files cover the prompts that finished
    and report.md says so; with none finished nothing is written and no rows are returned."""
    from engine.atomic import building_folder
    from engine.bench import plots as plotting
    from engine.bench.methods import HF_DRAFTERS, HF_METHODS
    from engine.bench.report import (PER_PROMPT_COLUMNS, SUMMARY_COLUMNS, SWEEP_COLUMNS, per_prompt_rows,
                                     summary_rows, sweep_rows, write_csv, write_report)
    from engine.bench.runner import run_bench

    hf = [b for b in settings.baselines if b in HF_METHODS]
    if hf and pairs[0].target.backend != "torch":
        settings = replace(settings, baselines=tuple(b for b in settings.baselines if b not in HF_METHODS))
        context = {**context, "note": f"{' and '.join(hf)} left out: Hugging Face generate() runs torch models, "
                                      f"and the target runs on {pairs[0].target.backend}."}
    without_hf = [pair.drafter_description for pair in pairs if pair.drafter_kind not in HF_DRAFTERS]
    if without_hf and "hf-assisted" in settings.baselines:
        # Hugging Face has no drafter that reads the target's hidden state, nor a suffix drafter
        context = {**context, "note": f"hf-assisted left out for {', '.join(without_hf)}: "
                                      "Hugging Face generate() has no such drafter."}
    from engine.autotune import cost_curve
    from engine.cache import costs_cache

    context = {**context, "cost_curve": cost_curve(pairs[0].target.model, costs_cache())}
    results = run_bench(pairs, prompts, settings, progress, cancel)
    if not results:
        return []
    if len(results) < len(prompts):
        cancelled = f"Cancelled after {len(results)} of {len(prompts)} prompts: the figures cover those only."
        context = {**context, "note": "\n- ".join(filter(None, (context.get("note"), cancelled)))}
    methods = settings.methods(pairs)
    summary = summary_rows(results, settings, methods)
    sweep = sweep_rows(results, methods)
    with building_folder(out) as staging:
        write_csv(staging / "summary.csv", SUMMARY_COLUMNS, summary)
        write_csv(staging / "per_prompt.csv", PER_PROMPT_COLUMNS, per_prompt_rows(results, settings, methods))
        write_csv(staging / "k_sweep.csv", SWEEP_COLUMNS, sweep)
        drawn = []
        if plots:
            plotting.plot_speedup_by_category(summary, staging / "speedup_by_category.png")
            drawn.append("speedup_by_category.png")
            if len(settings.ks) > 1:
                plotting.plot_k_sweep(sweep, staging / "k_sweep.png")
                drawn.append("k_sweep.png")
        write_report(staging / "report.md", results, settings, methods, context, summary, sweep, drawn)
    return summary
