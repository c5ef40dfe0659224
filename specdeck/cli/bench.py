"""`specdeck bench`: its options, a terminal progress bar, and the table it prints; the benchmark
itself is `specdeck.bench.service.run_and_write`.

`--drafters draft-model,feature-head` times several drafters of one target in one run: the target
loads once, each drafter's model once, and all of them alternate with the same plain runs."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from specdeck.bench.settings import BASELINES, OTHER_BASELINES, BenchSettings
from specdeck.bench.sweep import format_ks, format_lookups, parse_drafters, parse_ks, parse_lookups
from specdeck.cli.options import add_model_arguments, pair_spec
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.pair_spec import DrafterKind, PairSpec


def add_bench_command(commands) -> None:
    """Register `bench` on the `specdeck` subparsers."""
    defaults = BenchSettings()
    bench = commands.add_parser("bench", help="measure tokens/s of plain, speculative and Hugging Face decoding")
    add_model_arguments(bench)
    bench.add_argument(
        "--drafters",
        default=None,
        help="several drafters in one run instead of --drafter/--draft: comma-separated kinds "
        f"({', '.join(kind.value for kind in DrafterKind)}), each optionally kind:MODEL, "
        "e.g. draft-model,feature-head:path/to/head,prompt-lookup",
    )
    bench.add_argument(
        "--prompts",
        default=None,
        help="Spec-Bench jsonl (every turn of a record asked as one conversation), HumanEval jsonl, "
        "one prompt per line, or a bundled set: spec-bench, humaneval, refine "
        "(default: spec-bench)",
    )
    bench.add_argument("--categories", default=None, help="comma-separated categories to keep")
    bench.add_argument("--limit", type=int, default=None, help="at most N prompts per category")
    bench.add_argument(
        "--k",
        default=format_ks(defaults.ks),
        help="draft tokens per round, auto (chosen each round from measured costs), "
        "or a sweep: auto,1,2,4 (default %(default)s)",
    )
    bench.add_argument(
        "--lookup",
        default=format_lookups(defaults.lookups),
        help="tokens prompt lookup may copy per round before the drafter (0: off), or a sweep: 0,2 "
        "(default %(default)s)",
    )
    bench.add_argument(
        "--temperature", type=float, default=defaults.decode.temperature, help="0 is greedy (texts are then checked)"
    )
    bench.add_argument("--max-new-tokens", type=int, default=defaults.decode.max_new_tokens)
    bench.add_argument(
        "--repeats", type=int, default=defaults.repeats, help="timed runs per prompt and method (median kept)"
    )
    bench.add_argument(
        "--baselines",
        default=",".join(defaults.baselines),
        help=f"any of {', '.join(BASELINES + OTHER_BASELINES)} (llama.cpp: llama-cpp-python's own "
        "generation of a .gguf target)",
    )
    bench.add_argument(
        "--repeat-scenario",
        action="store_true",
        help="also time suffix and hybrid drafters regenerating each prompt, with its own plain "
        "answer as history (labelled repeat; the other rows never draft from the same prompt)",
    )
    bench.add_argument("--seed", type=int, default=defaults.decode.seed)
    bench.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default: at each session, the cores other programs leave free)",
    )
    bench.add_argument(
        "--busy",
        type=int,
        default=0,
        help="then run everything again beside this many spinning processes (as a desktop's other "
        "programs), into OUT/busy-N/, with both runs side by side in OUT/quiet-and-busy.md",
    )
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--out", required=True, help="folder for summary.csv, per_prompt.csv, report.md and plots")
    bench.add_argument(
        "--overwrite",
        action="store_true",
        help="write into --out even where it holds files SpecDeck did not write (those of the same names are replaced)",
    )
    bench.set_defaults(handler=cmd_bench)


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    """The benchmark `specdeck bench`'s options describe; raises SpecDeckError."""
    return BenchSettings(
        ks=parse_ks(args.k),
        lookups=parse_lookups(args.lookup),
        baselines=tuple(b.strip() for b in args.baselines.split(",") if b.strip()),
        repeats=args.repeats,
        decode=DecodeConfig(temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens),
        repeat_scenario=args.repeat_scenario,
    )


def bench_specs(args: argparse.Namespace) -> list[PairSpec]:
    """One `PairSpec` per drafter to time: those `--drafters` lists, or the one of --drafter/--draft."""
    spec = pair_spec(args)
    if not args.drafters:
        return [spec]
    if args.drafter or args.draft:
        raise SpecDeckError("Choose drafters with --drafters or with --drafter/--draft, not both.")
    return [spec.with_drafter(kind, draft) for kind, draft in parse_drafters(args.drafters)]


class ProgressBar:
    """One self-rewriting line on stderr: bar, count, elapsed time and what runs now."""

    def __init__(self, stream=None, width: int = 28) -> None:
        self.stream = stream or sys.stderr  # looked up now: sys.stderr may have been replaced since import
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
    import transformers

    from specdeck.bench.busy import quiet_and_busy, spinning
    from specdeck.bench.prompts import prompts_path as prompts_path_named
    from specdeck.bench.prompts import read_prompts, sample_prompts
    from specdeck.bench.report import markdown_table
    from specdeck.bench.service import check_results_folder, report_context, run_and_write
    from specdeck.engine.atomic import filling_folder, output_path
    from specdeck.engine.cores import pin_threads
    from specdeck.engine.interrupt import cancel_on_signals, to_stderr
    from specdeck.engine.session import load_pairs

    settings = bench_settings(args)
    specs = bench_specs(args)
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    prompts_path = prompts_path_named(args.prompts) if args.prompts else sample_prompts()
    prompts = read_prompts(prompts_path, categories, args.limit)
    if args.threads is not None:
        pin_threads(args.threads)
    if not 0 <= args.busy < (os.cpu_count() or 1):
        raise SpecDeckError(
            f"--busy must be from 0 to {(os.cpu_count() or 1) - 1}, fewer than this machine's cores (got {args.busy})."
        )
    notice = lambda line: print(f"[{line}]", file=sys.stderr, flush=True)  # noqa: E731
    out = check_results_folder(output_path(args.out), notice, args.overwrite)
    transformers.logging.set_verbosity_error()  # its assisted-generation notices would break the progress bar
    pairs = load_pairs(specs, progress=notice)
    command = (
        "specdeck bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else "specdeck bench"
    )
    context = report_context(pairs, prompts_path, command)
    with cancel_on_signals(to_stderr) as cancel:  # Ctrl-C keeps the prompts that finished
        written = run_and_write(
            pairs,
            prompts,
            settings,
            out,
            context,
            plots=not args.no_plots,
            progress=ProgressBar(),
            cancel=cancel,
            overwrite=args.overwrite,
        )
    summary = written.summary
    if not summary:
        print(f"Cancelled before any prompt finished: nothing written, {out} left as it was.", file=sys.stderr)
        return 130
    if args.busy and not cancel.is_set():
        busy_out = out / f"busy-{args.busy}"
        busy_context = {**context, "note": f"beside {args.busy} spinning processes of the benchmark's own"}
        with spinning(args.busy), cancel_on_signals(to_stderr) as cancel:
            busy_summary = run_and_write(
                pairs, prompts, settings, busy_out, busy_context, plots=False, progress=ProgressBar(), cancel=cancel
            ).summary
        if busy_summary:
            table = quiet_and_busy(summary, busy_summary, args.busy)
            with filling_folder(out, overwrite=args.overwrite) as staging:
                (staging / "quiet-and-busy.md").write_text(table, encoding="utf-8")
            print(f"{table}\nWrote {busy_out}/ and {out / 'quiet-and-busy.md'}.\n")
        if cancel.is_set():
            print(f"Cancelled during the run beside busy cores: {busy_out} covers what finished.", file=sys.stderr)
            return 130
    overview = [r for r in summary if r["category"] == "all"]
    print(
        markdown_table(
            overview,
            (
                "method",
                "k",
                "drafter",
                "turn",
                "new_tokens",
                "tokens_per_s",
                "speedup_vs_plain",
                "acceptance_rate",
                "mean_accepted_length",
                "identical_to_plain",
            ),
        )
    )
    print(f"\nWrote {written.folder}/: {', '.join(written.files)}.")
    asked = sum(len(prompt.turns) for prompt in prompts)
    if int(overview[0]["prompts"]) < asked:
        print(
            f"Cancelled: the results cover the {overview[0]['prompts']} of {asked} prompts (turns) that finished.",
            file=sys.stderr,
        )
        if written.folder != out:
            print(
                f"The earlier results in {out} are kept as they were; these partial ones are in {written.folder}.",
                file=sys.stderr,
            )
        return 130
    return 0
