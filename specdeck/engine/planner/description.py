"""The planner's account of a session: what it chose, and the costs and acceptance it chose by, in
one paragraph for the terminal and the window. It only reads the planner, so it stands apart and the
planning rules read in one place (`specdeck.engine.planner.autotune`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdeck.engine.planner.autotune import RoundPlanner


def describe_planner(planner: RoundPlanner) -> str:
    """What was chosen and why, in one paragraph for the terminal and the window."""
    shapes = ", ".join(
        f"{label} x{count}" for label, count in sorted(planner.chosen.items(), key=lambda item: -item[1])
    )
    depth = len(planner.drafts.tried) or 1
    drafts = "/".join(f"{a:.2f}" for a in planner.drafts.rates(depth))
    lines = [
        f"chosen per round: {shapes or 'nothing yet'}",
        "target forward for 1/2/4/8 tokens: "
        + "/".join(f"{planner.verify_ms(n):.1f}" for n in (1, 2, 4, 8))
        + f" ms (the machine's cost curve at this session's pace, x{planner.scale:.2f}, corrected by"
        + " what each size measured"
        + (f"; {planner.curve.noisy_note}" if planner.curve.noisy_note else "")
        + ")",
        f"drafter acceptance by depth: {drafts}",
    ]
    lines.append(f"draft cost {planner.draft_ms_per_token:.1f} ms per token")
    lines.append(f"a plain step weighed at {planner.plain_ms():.1f} ms")
    if planner.aftermath:
        lines.append(
            "cost to the plain steps after: "
            + ", ".join(f"{kind} {planner.aftermath_ms(kind):.1f} ms" for kind in sorted(planner.aftermath))
            + f", paid once a run of drafting rounds (runs lasted {planner.run_length:.1f} rounds)"
        )
    if planner.planned_drafts:
        lines.append(f"first drafts under their floor (not verified): {planner.refusal_share():.2f}")
    if planner.ranked and planner.max_width > 1:
        shares = "/".join(f"{sum(planner.ranks[:w]) / planner.ranked:.2f}" for w in range(1, planner.max_width + 1))
        lines.append(f"target's first token among the drafter's top 1..{planner.max_width}: {shares}")
        lines.append(f"a tree's verify {planner.tree_scale:.2f}x a chain's of as many tokens")
    if planner.copies.describe():
        lines.append(
            "first drafts copied from this request's text, not doubted, accepted by match length: "
            f"{planner.copies.describe()}"
        )
    return "; ".join(lines)
