"""A benchmark beside busy cores: the same runs again beside spinning processes of the benchmark's
own, as a desktop's other programs (a browser, a build) take part of the machine, and the two
runs' figures side by side."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from specdeck.bench.report import markdown_table

SPIN = "while True: pass"


@contextmanager
def spinning(count: int) -> Iterator[None]:
    """`count` processes that each keep one core busy until the block ends."""
    processes = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()


def quiet_and_busy(quiet: list[dict], busy: list[dict], count: int) -> str:
    """Markdown: each method's tok/s quiet and beside `count` busy cores, the share it kept, and its
    speedup over plain decoding under the same load (summary rows of both runs, all categories)."""
    by_method = {_method(row): row for row in busy if row["category"] == "all"}
    rows = []
    for row in quiet:
        loaded = by_method.get(_method(row))
        if row["category"] != "all" or loaded is None:
            continue
        quiet_rate, busy_rate = float(row["tokens_per_s"]), float(loaded["tokens_per_s"])
        rows.append(
            {
                "method": row["method"],
                "k": row["k"],
                "drafter": row["drafter"],
                "turn": row["turn"],
                "quiet tok/s": f"{quiet_rate:.1f}",
                "busy tok/s": f"{busy_rate:.1f}",
                "kept": f"{busy_rate / quiet_rate:.2f}" if quiet_rate else "",
                "quiet speedup": row["speedup_vs_plain"],
                "busy speedup": loaded["speedup_vs_plain"],
            }
        )
    title = f"# Quiet and beside {count} busy core{'s' if count > 1 else ''}"
    note = (
        f"The same runs, first on a quiet machine, then beside {count} spinning process"
        f"{'es' if count > 1 else ''} of the benchmark's own; each speedup is over plain decoding under "
        "the same load. Each run's own report is in its folder."
    )
    columns = ("method", "k", "drafter", "turn", "quiet tok/s", "busy tok/s", "kept", "quiet speedup", "busy speedup")
    return f"{title}\n\n{note}\n\n{markdown_table(rows, columns)}\n"


def _method(row: dict) -> tuple:
    return row["method"], row["k"], row["drafter"], row["turn"]
