"""The benchmark as a service: run it on loaded pairs and write every result file (summary.csv,
per_prompt.csv, k_sweep.csv, report.md, the plots) into one folder. `specdeck bench` and the
window's Benchmark tab both call `run_and_write`.

The files are written into the folder, each whole (`specdeck.engine.atomic.filling_folder`): the folder may
be a mount point. A cancelled benchmark never writes over an earlier one's results: its partial
results go to a new folder inside."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specdeck.bench import plots as plotting
from specdeck.bench.methods import HF_METHODS
from specdeck.bench.prompts import BenchPrompt
from specdeck.bench.report import write_csv, write_report
from specdeck.bench.runner import BenchSettings, Progress, run_bench
from specdeck.bench.tables import (
    PER_PROMPT_COLUMNS,
    SUMMARY_COLUMNS,
    SWEEP_COLUMNS,
    per_prompt_rows,
    summary_rows,
    sweep_rows,
)
from specdeck.engine.atomic import check_own_folder, check_writable_folder, filling_folder, remove_abandoned
from specdeck.engine.cache import costs_cache
from specdeck.engine.forward.kvcache import products_path
from specdeck.engine.pair import ModelPair
from specdeck.engine.planner.costs import cost_curve

RESULT_FILES = (
    "summary.csv",
    "per_prompt.csv",
    "k_sweep.csv",
    "report.md",
    "speedup_by_category.png",
    "k_sweep.png",
    "quiet-and-busy.md",  # `specdeck bench --busy N`, beside its run's folder busy-N/
)


def check_results_folder(out: Path, notice: Callable[[str], None], overwrite: bool = False) -> Path:
    """Refuse an `--out` in which files cannot be made, or which holds files SpecDeck did not write
    (unless `overwrite`), before any model loads; `notice` hears of the remains of an earlier,
    interrupted benchmark being removed."""
    check_own_folder(out, overwrite)
    check_writable_folder(out)
    remove_abandoned(out, notice)
    try:
        remove_abandoned(out.parent, notice, name=out.name)  # whole-folder swaps of earlier versions
    except OSError:
        pass  # a parent that cannot be listed holds none of ours
    return out


@dataclass(frozen=True)
class Written:
    """What `run_and_write` wrote: the summary rows, the folder and the files' names in it."""

    summary: list[dict]
    folder: Path
    files: list[str]


def _folder_for(out: Path, cancelled: bool) -> Path:
    """`out`, or for a cancelled benchmark where `out` holds an earlier one's results, a new folder
    inside it: partial figures never replace complete ones."""
    if not cancelled or not any((out / name).exists() for name in RESULT_FILES):
        return out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, number = out / f"cancelled-{stamp}", 1
    while folder.exists():
        number += 1
        folder = out / f"cancelled-{stamp}-{number}"
    return folder


def report_context(pairs: Sequence[ModelPair], prompts_path: str | Path, command: str) -> dict[str, str]:
    """What report.md says produced the figures: the command, the target, the device and the prompts
    (the drafters it names from the methods that ran)."""
    target = pairs[0].target
    context = {
        "command": command,
        "target": target.name,
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "backend": target.backend,
        "prompts": str(prompts_path),
    }
    crossing = [
        f"{pair.drafter_description}: {pair.vocabulary.describe()}"
        for pair in pairs
        if pair.vocabulary is not None and not pair.vocabulary.same
    ]
    if crossing:  # counts are the target's tokens; the pair's case says how the draft's relate to them
        context["note"] = "; ".join(crossing)
    return context


def run_and_write(
    pairs: Sequence[ModelPair],
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    out: Path,
    context: dict[str, Any],
    plots: bool = True,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    overwrite: bool = False,
) -> Written:
    """Run the benchmark of `pairs` (one per drafter, sharing one target) and write every output file
    into `out`, each file whole, the earlier results' files replaced only once all new ones are
    complete; `overwrite`: even where `out` holds files SpecDeck did not write. Cancelled (`cancel` set), the files cover the prompts that finished and report.md
    says so, in a new folder inside `out` where `out` holds earlier results; with none finished
    nothing is written and no rows are returned."""
    hf = [b for b in settings.baselines if b in HF_METHODS]
    if hf and pairs[0].target.backend != "torch":
        settings = replace(settings, baselines=tuple(b for b in settings.baselines if b not in HF_METHODS))
        left_out = (
            f"{' and '.join(hf)} left out: Hugging Face generate() runs torch models, and the target runs "
            f"on {pairs[0].target.backend}."
        )
        context = {**context, "note": "\n- ".join(filter(None, (context.get("note"), left_out)))}
    without_hf = [pair.drafter_description for pair in pairs if not pair.hugging_face_runs]
    if pairs[0].remote:  # (Hugging Face's baselines were left out above: the target runs on a server)
        settings.check_remote()
        context = {**context, "remote": "yes"}
    elif without_hf and "hf-assisted" in settings.baselines:
        # Hugging Face has no drafter that reads the target's hidden state, nor a suffix drafter, and
        # takes two vocabularies of one size for one tokenizer
        left_out = (
            f"hf-assisted left out for {', '.join(without_hf)}: Hugging Face generate() has no such "
            "drafter (or, for a draft with its own tokenizer, not one with as many tokens as the target's)."
        )
        context = {**context, "note": "\n- ".join(filter(None, (context.get("note"), left_out)))}
    if not pairs[0].remote:
        model = pairs[0].local_target.model
        context = {**context, "cost_curve": cost_curve(model, costs_cache()), "products": products_path(model)}
    results = run_bench(pairs, prompts, settings, progress, cancel)
    if not results:
        return Written([], out, [])
    asked = sum(len(prompt.turns) for prompt in prompts)
    if len(results) < asked:
        cancelled = f"Cancelled after {len(results)} of {asked} prompts (turns): the figures cover those only."
        context = {**context, "note": "\n- ".join(filter(None, (context.get("note"), cancelled)))}
    folder = _folder_for(out, len(results) < asked)
    methods = settings.methods(pairs)
    summary = summary_rows(results, settings, methods)
    sweep = sweep_rows(results, methods)
    with filling_folder(folder, replaces=RESULT_FILES, overwrite=overwrite) as staging:
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
        files = sorted(path.name for path in staging.iterdir())
    return Written(summary, folder, files)
