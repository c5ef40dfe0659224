"""Benchmark figures and files: per-prompt and per-category tables, the K sweep, report.md.

A record with several turns is timed per turn (`PromptResult.turn`); the summary then also has
rows per turn over all categories (`turn` column), so reuse of an earlier answer shows in turn 2's.

Rates are totals, not means of rates: tokens/s of a category is its decoded tokens over its
decode time, each prompt taking its median-time repeat. Speedups divide by plain decoding's
rate on the same prompts. Speculative and hf-assisted rows name their drafter (`drafter` column):
a run may compare several drafters against the same plain runs. The predicted speedup is Leviathan
et al. (2023)'s, from the measured acceptance rate, drafts per round and draft/target cost ratio
(`engine.stats`).
"""

from __future__ import annotations

import csv
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdeck.engine.bench.remote_report import LATENCY_COLUMNS, SPLIT_COLUMNS, latency_rows, split_rows
from specdeck.engine.bench.runner import BenchSettings, Method, PromptResult
from specdeck.engine.cache import machine_name
from specdeck.engine.planner.costs import CURVE_CONTEXT
from specdeck.engine.stats import RoundTotals

SUMMARY_COLUMNS = (
    "method",
    "k",
    "category",
    "turn",
    "prompts",
    "new_tokens",
    "tokens_per_s",
    "speedup_vs_plain",
    "acceptance_rate",
    "mean_accepted_length",
    "identical_to_plain",
    "prefill_ms",
    "predicted_speedup",
    "cost_ratio",
    "drafter",
)
PER_PROMPT_COLUMNS = (
    "method",
    "k",
    "category",
    "prompt",
    "turn",
    "prompt_tokens",
    "new_tokens",
    "decode_s",
    "tokens_per_s",
    "prefill_ms",
    "rounds",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "identical_to_plain",
    "mismatch",
    "repeat_tokens_per_s",
    "drafter",
)
SWEEP_COLUMNS = (
    "k",
    "speedup",
    "predicted_speedup",
    "acceptance_rate",
    "mean_accepted_length",
    "cost_ratio",
    "hf_assisted_speedup",
    "vs_hf_assisted",
    "drafter",
)


@dataclass
class Totals(RoundTotals):
    """Sums over the median runs of some prompts for one method."""

    prompts: int = 0
    decode_tokens: int = 0
    decode_s: float = 0.0
    prefill_ms: float = 0.0
    identical: bool = True

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_cell(self) -> str:
        """The acceptance rate, blank for methods that draft nothing."""
        return _num(self.acceptance_rate if self.drafted else None)


def totals(results: list[PromptResult], method: Method, category: str = "all", turn: int | None = None) -> Totals:
    """The sums over `category`'s prompts (all: every prompt), and of one `turn` of them if given."""
    t = Totals()
    for result in results:
        if category != "all" and result.prompt.category != category or turn is not None and result.turn != turn:
            continue
        run = result.median_run(method)
        t.prompts += 1
        t.new_tokens += run.new_tokens
        t.decode_tokens += run.decode_tokens
        t.decode_s += run.decode_s
        t.prefill_ms += result.median_prefill_ms(method)
        t.rounds += run.rounds
        t.drafted += run.drafted
        t.accepted += run.accepted
        t.draft_ms += run.draft_ms
        t.verify_ms += run.verify_ms
        t.identical &= method not in result.mismatch
    return t


def categories(results: list[PromptResult]) -> list[str]:
    seen = dict.fromkeys(r.prompt.category for r in results)
    return list(seen) + ["all"]


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def summary_rows(results: list[PromptResult], settings: BenchSettings, methods: list[Method]) -> list[dict]:
    """Per method: a row per category and one for all prompts; with several turns, one per turn too."""
    turns = sorted({r.turn for r in results})
    groups: list[tuple[str, int | None]] = [(category, None) for category in categories(results)]
    groups += [("all", turn) for turn in turns] if len(turns) > 1 else []
    rows = []
    for method in methods:
        for category, turn in groups:
            t = totals(results, method, category, turn)
            plain = totals(results, Method("plain"), category, turn).tokens_per_s
            rows.append(
                {
                    "method": method.name,
                    "k": method.shown_k,
                    "category": category,
                    "turn": "all" if turn is None else turn,
                    "prompts": t.prompts,
                    "new_tokens": t.new_tokens,
                    "tokens_per_s": _num(t.tokens_per_s, 2),
                    "speedup_vs_plain": _num(t.tokens_per_s / plain if plain else None),
                    "acceptance_rate": t.acceptance_cell,
                    "mean_accepted_length": _num(t.mean_accepted_length),
                    "identical_to_plain": str(t.identical).lower() if settings.decode.greedy else "",
                    "prefill_ms": _num(t.prefill_ms / t.prompts if t.prompts else None, 1),
                    "predicted_speedup": _num(t.predicted_speedup),
                    "cost_ratio": _num(t.cost_ratio, 4),
                    "drafter": method.shown_drafter,
                }
            )
    return rows


def per_prompt_rows(results: list[PromptResult], settings: BenchSettings, methods: list[Method]) -> list[dict]:
    rows = []
    for result in results:
        for method in methods:
            run = result.median_run(method)
            rows.append(
                {
                    "method": method.name,
                    "k": method.shown_k,
                    "category": result.prompt.category,
                    "prompt": result.prompt.name,
                    "turn": result.turn,
                    "prompt_tokens": result.prompt_tokens,
                    "new_tokens": run.new_tokens,
                    "decode_s": f"{run.decode_s:.4f}",
                    "tokens_per_s": _num(run.tokens_per_s, 2),
                    "prefill_ms": _num(result.median_prefill_ms(method), 1),
                    "rounds": run.rounds,
                    "drafted": run.drafted,
                    "accepted": run.accepted,
                    "acceptance_rate": _num(run.accepted / run.drafted if run.drafted else None),
                    "mean_accepted_length": _num(run.new_tokens / run.rounds if run.rounds else None),
                    "identical_to_plain": str(method not in result.mismatch).lower() if settings.decode.greedy else "",
                    "mismatch": result.mismatch.get(method, ""),
                    "repeat_tokens_per_s": " ".join(f"{r.tokens_per_s:.2f}" for r in result.runs[method]),
                    "drafter": method.shown_drafter,
                }
            )
    return rows


def sweep_rows(results: list[PromptResult], methods: list[Method]) -> list[dict]:
    """One row per drafter and K: speculative decoding against plain, and against hf-assisted with the
    same drafter and K where that ran."""
    plain = totals(results, Method("plain")).tokens_per_s
    rows = []
    for method in (m for m in methods if m.name == "speculative"):
        t = totals(results, method)
        assisted = method._replace(name="hf-assisted")
        hf = totals(results, assisted).tokens_per_s if assisted in methods else None
        rows.append(
            {
                "k": method.shown_k,
                "speedup": _num(t.tokens_per_s / plain if plain else None),
                "predicted_speedup": _num(t.predicted_speedup),
                "acceptance_rate": t.acceptance_cell,
                "mean_accepted_length": _num(t.mean_accepted_length),
                "cost_ratio": _num(t.cost_ratio, 4),
                "hf_assisted_speedup": _num(hf / plain if hf and plain else None),
                "vs_hf_assisted": _num(t.tokens_per_s / hf if hf else None),
                "drafter": method.shown_drafter,
            }
        )
    return rows


ROUND_TIME_COLUMNS = ("method", "k", "drafter", "rounds", "draft_ms", "verify_ms", "other_ms", "other_share")


def round_time_rows(results: list[PromptResult], methods: list[Method]) -> list[dict]:
    """Mean milliseconds per round in each phase of SpecDeck's loop."""
    rows = []
    for method in methods:
        if method.name not in ("plain", "speculative"):
            continue
        t = totals(results, method)
        if not t.rounds:
            continue
        round_ms = t.decode_s * 1e3 / t.rounds
        other = max(0.0, round_ms - (t.draft_ms + t.verify_ms) / t.rounds)
        rows.append(
            {
                "method": method.name,
                "k": method.shown_k,
                "drafter": method.shown_drafter,
                "rounds": t.rounds,
                "draft_ms": _num(t.draft_ms / t.rounds, 2),
                "verify_ms": _num(t.verify_ms / t.rounds, 2),
                "other_ms": _num(other, 2),
                "other_share": _num(other / round_ms if round_ms else None),
            }
        )
    return rows


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


def shape_rows(results: list[PromptResult], methods: list[Method]) -> list[dict]:
    """How often each round shape ran, per speculative method (median-time runs, all prompts)."""
    rows = []
    for method in (m for m in methods if m.name == "speculative"):
        counts: dict[str, int] = {}
        for result in results:
            for shape, rounds in result.median_run(method).shapes.items():
                counts[shape] = counts.get(shape, 0) + rounds
        total = sum(counts.values()) or 1
        shown = ", ".join(
            f"{shape} {rounds / total:.0%}" for shape, rounds in sorted(counts.items(), key=lambda item: -item[1])[:8]
        )
        rows.append({"method": method.name, "k": method.shown_k, "drafter": method.shown_drafter, "shapes": shown})
    return rows


ROUND_KIND_COLUMNS = ("method", "drafter", "kind", "rounds", "drafted", "kept_per_round", "ms_per_round", "saved_ms")


def round_kind_rows(results: list[PromptResult], methods: list[Method]) -> list[dict]:
    """What each kind of round drafted, kept and cost, per speculative method (median-time runs, all
    prompts), and the time it saved: its kept tokens at plain decoding's time per token on the same
    prompt, less its draft and verify time (negative: the kind cost more than plain steps would)."""
    plain = next((m for m in methods if m.name == "plain"), None)
    rows = []
    for method in (m for m in methods if m.name == "speculative"):
        kinds: dict[str, list[float]] = {}
        for result in results:
            run = result.median_run(method)
            step_ms = None
            if plain is not None and plain in result.runs:
                base = result.median_run(plain)
                step_ms = base.decode_s * 1e3 / base.decode_tokens if base.decode_tokens else None
            for kind, totals in run.kinds.items():
                row = kinds.setdefault(kind, [0, 0, 0, 0.0, 0.0])
                ms = totals.draft_ms + totals.verify_ms
                row[0] += totals.rounds
                row[1] += totals.drafted
                row[2] += totals.new_tokens
                row[3] += ms
                row[4] += totals.new_tokens * step_ms - ms if step_ms is not None else float("nan")
        for kind, (rounds, drafted, kept, ms, saved) in sorted(kinds.items(), key=lambda item: -item[1][0]):
            rows.append(
                {
                    "method": method.name,
                    "drafter": method.shown_drafter,
                    "kind": kind,
                    "rounds": int(rounds),
                    "drafted": int(drafted),
                    "kept_per_round": _num(kept / rounds, 2),
                    "ms_per_round": _num(ms / rounds, 1),
                    "saved_ms": _num(saved, 0) if saved == saved else "",
                }
            )
    return rows


def cost_curve_lines(curve, products: str | None = None) -> list[str]:
    """The target's measured forward cost by new tokens (`engine.costs.CostCurve`), as report
    lines, with the path its matrix products took in this run (`engine.linear.PathChoice.describe`)."""
    header = "| new tokens | " + " | ".join(map(str, curve.tokens)) + " |"
    ms = "| ms | " + " | ".join(f"{t:.1f}" for t in curve.forward_ms) + " |"
    ratio = "| x one token | " + " | ".join(f"{t / curve.forward_ms[0]:.2f}" for t in curve.forward_ms) + " |"
    busy = f" It was {curve.noisy_note}." if curve.noisy_note else ""
    return [
        f"Measured on {curve.machine}, after {CURVE_CONTEXT} cached tokens, best of 2-3 passes "
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
        "hit made the server recompute the whole context.",
        "",
        markdown_table(split_rows(results, methods), SPLIT_COLUMNS),
        "",
        "## Latency model: tokens/s against round-trip time",
        "",
        "From the measured tokens per round, drafts per round, draft time per token and request time per "
        "round: a round keeps its tokens for K draft steps, the request measured here and the added round "
        "trip; plain decoding keeps one token per request (`engine.bench.remote_report`). Speculation pays "
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
