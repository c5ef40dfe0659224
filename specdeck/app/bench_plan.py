"""What a benchmark from the window will do, said before it runs: the timed runs its settings
make, an estimate of their time, each ticked baseline that will not run and why, and the
`specdeck bench` command that runs the same benchmark from a terminal.

Qt-free: the Benchmark tab (`specdeck.app.bench_tab`) reads its options and hands them here, so what the
settings mean is counted from the settings and the pairs alone, as the harness counts them.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

from specdeck.bench.prompts import BenchPrompt
from specdeck.bench.settings import BenchSettings
from specdeck.bench.sweep import format_ks, format_lookups
from specdeck.engine.pair_spec import PairSpec


def describe_plan(
    settings: BenchSettings, prompts: list[BenchPrompt], specs: list[PairSpec], tokens_per_s: float | None = None
) -> str:
    """What the harness will do with `settings` on `prompts` for the resolved pairs `specs` (the
    loaded one first): the timed runs, an estimate of their time from a measured rate (if one is
    known), and each ticked baseline that will not run, with why; one line each, in HTML."""
    stand_ins = [
        SimpleNamespace(
            drafter_kind=spec.drafter,
            drafter_description=spec.drafter.describe(spec.draft),
            hugging_face_runs=spec.drafter.hugging_face_runs and not spec.remote,
            copies_text=spec.drafter.copies_text,
            reads_history=spec.drafter.reads_history,
            remote=spec.remote,
        )
        for spec in specs
    ]  # what `BenchSettings.methods` reads of a loaded pair (before its vocabularies are known)
    methods = settings.methods(stand_ins)
    turns = sum(len(p.turns) for p in prompts)  # a later turn is a run of its own, as the harness counts
    runs = turns * settings.repeats * len(methods)
    asked = f"{len(prompts)} prompts" + (f" ({turns} turns)" if turns != len(prompts) else "")
    lines = [
        f"{runs} timed runs: {asked} x {settings.repeats} repeats x {len(methods)} methods, "
        f"up to {settings.decode.max_new_tokens} new tokens each"
    ]
    if tokens_per_s:
        minutes = runs * settings.decode.max_new_tokens / tokens_per_s / 60
        lines.append(
            f"about {minutes:.0f} min at the {tokens_per_s:.0f} tokens/s this pair's last session "
            "measured (warm-up and loading not counted)"
            if minutes >= 1
            else "under a minute"
        )
    if "hf-assisted" in settings.baselines and not any(m.name == "hf-assisted" for m in methods):
        why = (
            "it needs a fixed K (auto chooses K per round)"
            if any(spec.drafter.hugging_face_runs for spec in specs)
            else "Hugging Face has no " + " or ".join(dict.fromkeys(spec.drafter.label for spec in specs)) + " drafter"
        )
        lines.append(f"<b>hf-assisted is skipped</b>: {why}")
    return "<br>".join(lines)


def bench_command_line(
    models: PairSpec,
    others: list[PairSpec],
    prompts_path: Path | None,
    categories: list[str],
    limit: int,
    settings: BenchSettings,
) -> str:
    """The `specdeck bench` command for the pair `models`, the other drafters `others` timed beside
    it, a prompt file (None: the bundled sample), the categories kept (none: all), a limit per
    category (0: none) and `settings`."""
    if others:
        parts = [
            "specdeck",
            "bench",
            *models.model_arguments(),
            "--drafters",
            ",".join(spec.drafter_entry for spec in (models, *others)),
        ]
    else:
        parts = ["specdeck", "bench", *models.arguments()]
    if prompts_path:
        parts += ["--prompts", str(prompts_path)]
    if categories:
        parts += ["--categories", ",".join(categories)]
    if limit:
        parts += ["--limit", str(limit)]
    parts += [
        "--k",
        format_ks(settings.ks),
        "--lookup",
        format_lookups(settings.lookups),
        "--temperature",
        f"{settings.decode.temperature:g}",
        "--max-new-tokens",
        str(settings.decode.max_new_tokens),
        "--repeats",
        str(settings.repeats),
        "--baselines",
        ",".join(settings.baselines),
        "--out",
        ".",
    ]
    return " ".join(shlex.quote(part) for part in parts)
