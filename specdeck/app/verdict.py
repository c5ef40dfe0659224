"""What a run comes to, in one line beside its texts: a Compare's measured speedup against the
predicted one and, where they differ, why; whether greedy outputs are identical; and a run the
user stopped, said as stopped.

Qt-free and computed from the sessions' own events (`SessionModel.verdict`), never from what the
charts happen to hold. The predicted speedup is Leviathan et al. 2023, eq. 1 (`specdeck.engine.stats`);
the measured one is speculative tokens/s over plain tokens/s.

Why the two differ is said in the direction they differ. Both halves of a Compare run on the same
machine, one after the other, and the prediction was made from costs measured before them:
measured / predicted = (how much the plain steps slowed) / (how much the speculative rounds
slowed). A measured speedup above the prediction with slow plain steps is the plain half's
slowdown; one below it with slow plain steps is the rounds slowing down more than the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdeck.engine.events import SessionStarted, SummaryEvent

if TYPE_CHECKING:
    from specdeck.engine.planner.costs import CostCurve

OFF_BY = 0.2  # a measured speedup this far from the predicted one, relatively, gets a reason
SHORT_RUN = 24  # rounds under which a run is too short to judge its speed
STOPPED = "cancelled"  # `SummaryEvent.stop_reason` of a session the user stopped


def curve_of(start: SessionStarted | None) -> CostCurve | None:
    """The cost curve a session's start event carries; None where the schedule measured none."""
    if start is None or not start.curve_tokens:
        return None
    # imported here, not with this module: the planner imports torch, which the window leaves to
    # the model thread; a session that measured a curve ran there, so it is imported by now
    from specdeck.engine.planner.costs import CostCurve

    return CostCurve(tuple(start.curve_tokens), tuple(start.curve_ms))


def why_off(
    measured: float, predicted: float | None, plain_step_ms: float, curve: CostCurve | None, rounds: int
) -> str | None:
    """Why a Compare's measured speedup differs from the predicted one by more than `OFF_BY`, in a
    few words that match the direction (None where it does not differ that much)."""
    if predicted is None or predicted <= 0 or abs(measured - predicted) <= OFF_BY * predicted:
        return None
    step_ms = curve.ms(1) if curve is not None else plain_step_ms
    plain_slow = plain_step_ms > (1 + OFF_BY) * step_ms
    steps = f"plain steps took {plain_step_ms:.1f} ms against the {step_ms:.1f} ms the prediction used"
    if measured > predicted:
        if plain_slow:
            return f"{steps}: the machine was busier during the plain run, which makes the speedup look larger"
        return "copies from the text kept more than the drafter's acceptance, which the prediction counts alone"
    if rounds < SHORT_RUN:
        return f"a short run ({rounds} rounds): its first rounds' warm-up weighs on the measured speed"
    if plain_slow:
        return f"{steps}: the machine was busier than when its costs were measured, and the rounds slowed down more"
    return "the rounds cost more than the measured curve says: the machine's pace changed during the run"


@dataclass(frozen=True)
class Verdict:
    """A run's outcome. `measured` and `reason` only for a Compare whose two halves both ended;
    `identical` only for a greedy Compare (None otherwise); `stopped`: the session the user
    stopped ("speculative" or "plain"), with `stopped_tokens` kept by then."""

    backend: str
    speculative_tokens_per_s: float
    plain_tokens_per_s: float | None = None
    measured: float | None = None
    predicted: float | None = None
    reason: str | None = None
    identical: bool | None = None
    stopped: str | None = None
    stopped_tokens: int = 0
    compare: bool = False

    def html(self) -> str:
        """The line beside the texts, in Qt's rich text."""
        parts = []
        if self.stopped == "speculative":
            rest = ": plain decoding did not run" if self.compare else ""
            parts.append(f"<b>Stopped</b> after {self.stopped_tokens} tokens{rest}")
        elif self.stopped == "plain":
            parts.append(f"<b>Plain decoding stopped</b> after {self.stopped_tokens} tokens")
        if self.measured is not None and self.plain_tokens_per_s is not None:
            parts.append(
                f"{self.speculative_tokens_per_s:.1f} against {self.plain_tokens_per_s:.1f} tokens/s on "
                f"{self.backend}: measured speedup <b>{self.measured:.2f}x</b>"
            )
            if self.reason is not None and self.predicted is not None:
                parts.append(f"predicted {self.predicted:.2f}x: {self.reason}")
        if self.identical is not None:
            colour = "#1b8a2f" if self.identical else "#c62828"
            mark = "greedy outputs identical ✓" if self.identical else "greedy outputs differ ✗"
            parts.append(f"<b style='color:{colour}'>{mark}</b>")
        return " · ".join(parts)


def verdict_of(
    backend: str,
    speculative: SummaryEvent,
    plain: SummaryEvent | None,
    start: SessionStarted | None,
    greedy: bool,
    compare: bool,
) -> Verdict:
    """The verdict of a run from its sessions' summaries and the speculative session's start (the
    costs its prediction was made from, where the auto schedule measured them)."""
    stopped = "speculative" if speculative.stop_reason == STOPPED else None
    if plain is not None and plain.stop_reason == STOPPED:
        stopped = "plain"
    stopped_tokens = {"speculative": speculative.new_tokens, "plain": plain.new_tokens if plain else 0}.get(
        stopped or "", 0
    )
    measured = reason = None
    if plain is not None and plain.tokens_per_s > 0:
        measured = speculative.tokens_per_s / plain.tokens_per_s
        curve = curve_of(start)
        plain_step_ms = 1000.0 / plain.tokens_per_s  # plain decoding keeps one token a step
        reason = why_off(measured, speculative.predicted_speedup, plain_step_ms, curve, speculative.rounds)
    identical = speculative.text == plain.text if plain is not None and greedy and stopped is None else None
    return Verdict(
        backend,
        speculative.tokens_per_s,
        plain.tokens_per_s if plain is not None else None,
        measured,
        speculative.predicted_speedup,
        reason,
        identical,
        stopped,
        stopped_tokens,
        compare,
    )
