"""A profile of a token's time: where a round of the default pair spends it, beside plain decoding.

Each round is split four ways: the drafter's time, the target's forward, the verdict and the cache's
bookkeeping after it (the rest of `verify_ms`), and the host work outside both (the schedule, the
events). The forward is timed between two device synchronisations, so the split shows what a step
would cost if nothing overlapped: the host work beside the forward is what a GPU waits on. Then
torch's profiler lists the operators of one session by their own time. Warm-up sessions (a CUDA
graph's capture, the planner's first costs) come first and are left out of every figure.

`python -m specdeck.bench.token_profile --device cuda --dtype bfloat16 --out profile.txt`
(`make gpu-check` runs it as a step; on a CPU it measures the host work of a round here).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import RoundEvent, SummaryEvent
from specdeck.engine.forward.kvcache import synchronize
from specdeck.engine.loop.target_forward import TargetForward
from specdeck.engine.pair import ModelPair, PairSpec
from specdeck.engine.session import DEFAULT_PROMPT, load_pair, run_session


@dataclass
class RoundSplit:
    """A session's rounds, their milliseconds by part (one entry a round), and its kept tokens."""

    draft_ms: list[float] = field(default_factory=list)
    forward_ms: list[float] = field(default_factory=list)
    verdict_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    tokens: int = 0

    @property
    def round_ms(self) -> list[float]:
        return [sum(parts) for parts in zip(self.draft_ms, self.forward_ms, self.verdict_ms, self.host_ms)]

    def describe(self, name: str) -> str:
        rounds = len(self.draft_ms)
        if not rounds:
            return f"{name}: no rounds"
        per_token = sum(self.round_ms) / max(self.tokens, 1)
        parts = ", ".join(
            f"{label} {statistics.median(values):.3f}"
            for label, values in (
                ("draft", self.draft_ms),
                ("forward", self.forward_ms),
                ("verdict and cache", self.verdict_ms),
                ("host outside", self.host_ms),
            )
        )
        return (
            f"{name}: {rounds} rounds, {self.tokens} tokens ({self.tokens / rounds:.2f} a round), "
            f"{per_token:.3f} ms a token; median ms a round: {parts}"
        )


@contextmanager
def timed_forwards(device: torch.device) -> Iterator[list[float]]:
    """Milliseconds of every target forward in the block, each between two synchronisations."""
    times: list[float] = []
    forward = TargetForward.forward

    def timed(self, newest, draft):
        synchronize(device)
        started = time.perf_counter()
        logits = forward(self, newest, draft)
        synchronize(device)
        times.append((time.perf_counter() - started) * 1e3)
        return logits

    TargetForward.forward = timed  # type: ignore[method-assign]
    try:
        yield times
    finally:
        TargetForward.forward = forward  # type: ignore[method-assign]


def split_session(pair: ModelPair, config: DecodeConfig, plain: bool, prompt: str = DEFAULT_PROMPT) -> RoundSplit:
    """One session's rounds, split into their parts."""
    split = RoundSplit()
    device = pair.target.device
    with timed_forwards(device) as forwards:
        last_elapsed, last_tokens = None, 0
        for event in run_session(pair, prompt, config, plain=plain):
            if isinstance(event, RoundEvent):
                forward = forwards[-1]
                wall = (event.elapsed_s - last_elapsed) * 1e3 if last_elapsed is not None else None
                kept, last_tokens = event.new_tokens - last_tokens, event.new_tokens
                last_elapsed = event.elapsed_s
                if wall is None:  # the first round's start is not in the events: left out
                    continue
                split.draft_ms.append(event.draft_ms)
                split.forward_ms.append(forward)
                split.verdict_ms.append(max(event.verify_ms - forward, 0.0))
                split.host_ms.append(max(wall - event.draft_ms - event.verify_ms, 0.0))
                split.tokens += kept
            elif isinstance(event, SummaryEvent):
                break
    return split


def operator_table(pair: ModelPair, config: DecodeConfig, rows: int = 25) -> str:
    """torch's profiler over one speculative session: the operators by their own time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    on_cuda = pair.target.device.type == "cuda"
    if on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in run_session(pair, DEFAULT_PROMPT, config):
            pass
    sort = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
    return profiler.key_averages().table(sort_by=sort, row_limit=rows)


def profile(
    spec: PairSpec, tokens: int, warm_ups: int = 1, operators: bool = True, prompt: str = DEFAULT_PROMPT
) -> str:
    """The report: plain and speculative rounds split, then the operator table."""
    pair = load_pair(spec, progress=lambda line: print(line, flush=True))
    config = DecodeConfig(max_new_tokens=tokens)
    for _ in range(warm_ups):
        for plain in (True, False):
            split_session(pair, config, plain, prompt)
    lines = [
        f"{pair.target.name} on {pair.target.device} ({spec.dtype}), drafter {pair.drafter_kind}, {tokens} new tokens, greedy",
        split_session(pair, config, True, prompt).describe("plain"),
        split_session(pair, config, False, prompt).describe("speculative"),
    ]
    if operators:
        lines += ["", "Operators of one speculative session, by their own time:", operator_table(pair, config)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="token_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="")
    parser.add_argument("--drafter", default=None, help="the drafter kind (default: the default pair's)")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--warm-ups", type=int, default=1)
    parser.add_argument("--no-operators", action="store_true", help="the rounds' split only")
    parser.add_argument("--out", required=True, help="the report's file")
    args = parser.parse_args(argv)
    spec = PairSpec(args.target, args.draft, args.drafter, device=args.device, dtype=args.dtype)
    try:
        report = profile(spec, args.max_new_tokens, args.warm_ups, not args.no_operators, args.prompt)
    except SpecDeckError as error:
        print(error, file=sys.stderr)
        return 2
    Path(args.out).write_text(report)
    print(report, end="")
    return 0


__all__ = ["RoundSplit", "main", "profile", "split_session", "timed_forwards"]

if __name__ == "__main__":
    sys.exit(main())
