"""The benchmark's tables: the rows of summary.csv, per_prompt.csv and k_sweep.csv, and of report.md's
tables of round times, shapes and kinds, each from the prompts' median-time runs.

A record with several turns is timed per turn (`PromptResult.turn`); the summary then also has
rows per turn over all categories (`turn` column), so reuse of an earlier answer shows in turn 2's.

Rates are totals, not means of rates: tokens/s of a category is its decoded tokens over its
decode time, each prompt taking its median-time repeat. Speedups divide by plain decoding's
rate on the same prompts. Speculative and hf-assisted rows name their drafter (`drafter` column):
a run may compare several drafters against the same plain runs. The predicted speedup is Leviathan
et al. (2023)'s, from the measured acceptance rate, drafts per round and draft/target cost ratio
(`specdeck.engine.stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdeck.bench.settings import BenchSettings, Method
from specdeck.engine.stats import RoundTotals

if TYPE_CHECKING:
    from specdeck.bench.runner import PromptResult

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
