"""The benchmark's files: the CSV files, and report.md, which puts the tables (`specdeck.bench.tables`)
beside the machine, the versions and the settings that made them and says what each table means.

The figures are computed in `tables`; this module only lays them out, so a file and the window's
Benchmark tab show the same rows.
"""

from __future__ import annotations

import csv
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from specdeck.bench.remote_report import LATENCY_COLUMNS, SPLIT_COLUMNS, latency_rows, split_rows
from specdeck.bench.runner import BenchSettings, Method, PromptResult
from specdeck.bench.tables import (
    ROUND_KIND_COLUMNS,
    ROUND_TIME_COLUMNS,
    SUMMARY_COLUMNS,
    SWEEP_COLUMNS,
    categories,
    round_kind_rows,
    round_time_rows,
    shape_rows,
)
from specdeck.engine.cache import machine_name


def plan_lines(results: list[PromptResult], methods: list[Method]) -> list[str]:
    """What each auto method's planner weighed after its last session of the run (its estimates
    carry from session to session): the costs and acceptance each round's shape was chosen from."""
    lines = []
    for method in (m for m in methods if m.name == "speculative" and m.auto):
        last = next((r.runs[method][-1].plan for r in reversed(results) if r.runs.get(method)), "")
        if last:
            lines += [f"- {method.shown_drafter}:", *(f"  - {part}" for part in last.split("; ")), ""]
    if not lines:
        return []
    return ["", "## What the auto schedule weighed (after the last prompt)", "", *lines[:-1]]


def cost_curve_lines(curve, products: str | None = None) -> list[str]:
    """The target's measured forward cost by new tokens (`specdeck.engine.planner.costs.CostCurve`), as report
    lines, with the path its matrix products took in this run (`specdeck.engine.forward.linear.PathChoice.describe`)."""
    header = "| new tokens | " + " | ".join(map(str, curve.tokens)) + " |"
    ms = "| ms | " + " | ".join(f"{t:.1f}" for t in curve.forward_ms) + " |"
    ratio = "| x one token | " + " | ".join(f"{t / curve.forward_ms[0]:.2f}" for t in curve.forward_ms) + " |"
    busy = f" It was {curve.noisy_note}." if curve.noisy_note else ""
    return [
        f"Measured on {curve.machine}, after {curve.context} cached tokens, best of 2-3 passes "
        f"(the auto schedule plans with it, scaled by what each session's verifies take).{busy}",
        *([f"Matrix products in this run: {products}."] if products else []),
        "",
        header,
        "|---|" + "---|" * len(curve.tokens),
        ms,
        ratio,
    ]


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def machine_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    return f"{os.cpu_count()}-core {machine_name()}, no GPU used ({platform.system()} {platform.release()}{load})"


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def remote_lines(results: list[PromptResult], methods: list[Method]) -> list[str]:
    """report.md's section on a served target: the time split and the latency model (`remote_report`)."""
    return [
        "",
        "## Served target: where a round's time goes",
        "",
        "draft: the local drafter; network: the request's round trip less the server's own time (all of it "
        "where the server reports none); server: its own time where it reports it. A round with no prefix-cache "
        "hit made the server recompute the whole context. Where the server answered with its own greedy "
        "continuation (vLLM from 256 tokens of context on and in rounds without drafts, llama-cpp-python), a "
        "round kept all of it: the acceptance there shows how often the drafts agreed with the server's text, "
        "and the speed is the server's own generation (docs/remote.md).",
        "",
        markdown_table(split_rows(results, methods), SPLIT_COLUMNS),
        "",
        "## Latency model: tokens/s against round-trip time",
        "",
        "From the measured tokens per round, drafts per round, draft time per token and request time per "
        "round: a round keeps its tokens for K draft steps, the request measured here and the added round "
        "trip; plain decoding keeps the tokens measured per request (`specdeck.bench.remote_report`). Speculation pays "
        "where speedup > 1, and pays more the longer the round trip.",
        "",
        markdown_table(latency_rows(results, methods), LATENCY_COLUMNS),
    ]


def write_report(
    path: Path,
    results: list[PromptResult],
    settings: BenchSettings,
    methods: list[Method],
    context: dict[str, Any],
    summary: list[dict],
    sweep: list[dict],
    plots: list[str],
) -> None:
    import transformers

    device = torch.device(context["device"])
    overview = [r for r in summary if r["category"] == "all"]
    flagged = [(r.prompt, m, reason) for r in results for m, reason in r.mismatch.items()]
    drafters = list(dict.fromkeys(m.shown_drafter for m in methods if m.name == "speculative"))
    lines = [
        "# SpecDeck benchmark",
        "",
        f"Command: `{context['command']}`",
        "",
        "## Machine and versions",
        "",
        f"- machine: {machine_description(device)}",
        f"- device {device}, dtype {context['dtype']}, backend {context.get('backend', 'torch')}, "
        f"torch threads {torch.get_num_threads()}",
        f"- Python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}",
        "",
        "## Settings",
        "",
        f"- target {context['target']}, drafter{'s' if len(drafters) > 1 else ''} {'; '.join(drafters)}",
        *([f"- {context['note']}"] if context.get("note") else []),
        f"- prompts: {len(results)} from {context['prompts']} ({', '.join(categories(results)[:-1])})"
        + (
            ", each record's turns asked as one conversation (a later turn after the plain answers to the earlier)"
            if any(r.turn > 1 for r in results)
            else ""
        ),
        *(
            [
                "- repeat: the speculative method regenerating each prompt with only that prompt and its plain answer "
                "as history (what a re-run in the window gains; not a speedup of new text)"
            ]
            if any(m.name == "repeat" for m in methods)
            else []
        ),
        f"- K {', '.join(m.shown_k for m in methods if m.name == 'speculative' and m.shown_k) or 'none'}; temperature {settings.decode.temperature}; "
        f"max new tokens {settings.decode.max_new_tokens}; repeats {settings.repeats} (median-time repeat kept)",
        "- order: methods rotate by one place per prompt and repeat; one untimed warm-up per method",
        "- SpecDeck times prefill and decoding apart; Hugging Face's prefill is a 1-new-token generate(), "
        "and its rate is (new tokens - 1) / (total - prefill)",
        *(
            [
                "- llama.cpp: llama-cpp-python's own generate() on the target's GGUF file with its default settings and "
                "the same threads; its prefill (the prompt but its last token) is timed apart, as SpecDeck's is"
            ]
            if any(m.name == "llama.cpp" for m in methods)
            else []
        ),
        "",
        "## All prompts",
        "",
        markdown_table(overview, SUMMARY_COLUMNS),
        "",
        "## Per category",
        "",
        markdown_table(summary, SUMMARY_COLUMNS),
        "",
        "## K sweep",
        "",
        markdown_table(sweep, SWEEP_COLUMNS),
        "",
        "## Where a round's time goes (SpecDeck, all prompts)",
        "",
        "draft: the drafter's proposal; verify: the target's forward, the acceptance test and the cache crop; "
        "other: everything else in the loop (event building, detokenisation, stop checks).",
        "",
        markdown_table(round_time_rows(results, methods), ROUND_TIME_COLUMNS),
        "",
        "## Round shapes (share of rounds)",
        "",
        "K=n: the drafter proposed n tokens; copy n: prompt lookup copied n; none: a plain step, which the "
        "auto schedule takes where drafting would not pay.",
        "",
        markdown_table(shape_rows(results, methods), ("method", "k", "drafter", "shapes")),
        *plan_lines(results, methods),
        "",
        "## What each kind of round kept and cost",
        "",
        "A copy by where it was copied from (this request's own text, or earlier texts) and how many "
        "tokens its match ran; ms per round: draft and verify; saved: the kept tokens at plain "
        "decoding's time per token on the same prompt, less that time (negative where the kind cost "
        "more than plain steps would have).",
        "",
        markdown_table(round_kind_rows(results, methods), ROUND_KIND_COLUMNS),
        *(
            [
                "",
                "## The target's forward on this machine",
                "",
                *cost_curve_lines(context["cost_curve"], context.get("products")),
            ]
            if context.get("cost_curve")
            else []
        ),
        *(remote_lines(results, methods) if context.get("remote") else []),
        "",
        "## Greedy identity with plain decoding",
        "",
    ]
    if not settings.decode.greedy:
        lines.append("Not checked: sampling runs differ from plain decoding by design.")
    elif not flagged:
        lines.append("Every method produced exactly plain decoding's tokens on every prompt.")
    else:
        lines += [f"- {p.category} {p.name}, {m.label}: {reason}" for p, m, reason in flagged]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
