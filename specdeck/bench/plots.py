"""PNG plots of a benchmark, drawn with matplotlib's Agg backend (no display, no Qt).

- speedup per category, one bar per method (and drafter), plain decoding at 1.0;
- with several K: measured speedup and Leviathan et al. (2023)'s prediction against K, and the
  acceptance rate against K, one line of each per drafter.
"""

from __future__ import annotations

from pathlib import Path

from specdeck.engine.errors import SpecDeckError


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise SpecDeckError(
            "Plots need matplotlib, which SpecDeck depends on: reinstall SpecDeck, or pass --no-plots."
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(row: dict) -> str:
    text = f"{row['method']} K={row['k']}" if row["k"] else row["method"]
    return f"{text} ({row['drafter']})" if row["drafter"] else text


def plot_speedup_by_category(summary: list[dict], path: Path) -> None:
    plt = _pyplot()
    cats = list(dict.fromkeys(r["category"] for r in summary))
    methods = list(dict.fromkeys(_label(r) for r in summary if r["method"] != "plain"))
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cats) + 2), 4.0), dpi=100)
    for i, method in enumerate(methods):
        values = [
            next(
                (float(r["speedup_vs_plain"] or 0) for r in summary if _label(r) == method and r["category"] == c), 0.0
            )
            for c in cats
        ]
        ax.bar([x + (i - (len(methods) - 1) / 2) * width for x in range(len(cats))], values, width, label=method)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--", label="plain decoding")
    ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right")
    ax.set_ylabel("speedup over SpecDeck plain (tokens/s)")
    ax.set_title("Speedup per category")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not over them
    fig.savefig(path, bbox_inches="tight")  # the saved image grows to hold the legend
    plt.close(fig)


def _series(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) if r[key] else float("nan") for r in rows]


def plot_k_sweep(sweep: list[dict], path: Path) -> None:
    plt = _pyplot()
    drafters = list(dict.fromkeys(r["drafter"] for r in sweep))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 4.0), dpi=100)
    for i, drafter in enumerate(drafters):
        colour = f"C{i % 10}"  # one colour per drafter
        name = f", {drafter}" if len(drafters) > 1 else ""
        for row in (r for r in sweep if r["drafter"] == drafter and r["k"] == "auto" and r["speedup"]):
            left.axhline(float(row["speedup"]), color=colour, linestyle="-.", label=f"K auto, measured{name}")
        rows = [r for r in sweep if r["drafter"] == drafter and r["k"] != "auto"]
        ks = [int(r["k"]) for r in rows]
        left.plot(ks, _series(rows, "speedup"), marker="o", color=colour, label=f"measured{name}")
        left.plot(
            ks,
            _series(rows, "predicted_speedup"),
            marker="s",
            linestyle="--",
            color=colour,
            label=f"predicted (Leviathan et al.){name}",
        )
        if any(r["hf_assisted_speedup"] for r in rows):
            left.plot(
                ks,
                _series(rows, "hf_assisted_speedup"),
                marker="^",
                linestyle=":",
                color=colour,
                label=f"hf-assisted, measured{name}",
            )
        right.plot(ks, _series(rows, "acceptance_rate"), marker="o", color=colour, label=drafter)
    left.axhline(1.0, color="grey", linewidth=1)
    left.set_xlabel("K (drafts per round)")
    left.set_ylabel("speedup over plain decoding")
    left.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below, not over the lines
    right.set_ylim(0, 1)
    right.set_xlabel("K (drafts per round)")
    right.set_ylabel("acceptance rate")
    if len(drafters) > 1:
        right.legend(fontsize="small")
    for ax in (left, right):
        ax.set_xticks(sorted({int(r["k"]) for r in sweep if r["k"] != "auto"}))
        ax.grid(alpha=0.3)
    fig.subplots_adjust(wspace=0.25)
    fig.savefig(path, bbox_inches="tight")  # the saved image grows to hold the legend
    plt.close(fig)
