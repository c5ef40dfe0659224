"""What a suffix drafter's round costs (`specdeck.engine.drafting.suffix_drafting.SuffixDrafter.propose`, q included)
with a long history of earlier texts: `python -m specdeck.bench.suffix_round` (100,000 tokens by default).

The history is random phrases, three in ten copied from earlier (`specdeck.engine.drafting.suffix.repetitive_text`),
in texts of 1,000 tokens; the request's prompt is 64 tokens of it, and each round keeps its drafts
and one token more, so the matches move through the history as a real answer's would.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdeck.engine.config import DecodeConfig
from specdeck.engine.cores import pin_threads
from specdeck.engine.drafting.suffix import SuffixIndex, repetitive_text
from specdeck.engine.drafting.suffix_drafting import SuffixDrafter
from specdeck.engine.planner.round_shape import ProposalShape


def _bench(tokens: int, rounds: int, k: int, vocab: int, seed: int) -> None:
    """Earlier texts of `tokens` tokens (sessions of 1,000) as the history; a request whose prompt is
    64 tokens of them; then `rounds` rounds, each keeping its drafts and one token more."""
    text = repetitive_text(tokens, vocab, seed)
    history = SuffixIndex()
    started = time.perf_counter()
    for at in range(0, tokens, 1000):
        history.extend(text[at : at + 1000])
        history.separate()
    indexed_s = time.perf_counter() - started
    drafter = SuffixDrafter(history, records=False)
    ids = text[tokens // 2 : tokens // 2 + 64]
    drafter.begin(ids, DecodeConfig(), vocab, None)
    wall, cpu, drafted = [], [], 0
    for _ in range(rounds):
        started, started_cpu = time.perf_counter(), time.thread_time()
        proposal = drafter.propose(ids, ProposalShape(k))
        wall.append((time.perf_counter() - started) * 1e3)
        cpu.append((time.thread_time() - started_cpu) * 1e3)
        drafted += len(proposal.tokens)
        ids = ids + proposal.tokens + [text[len(ids) % tokens]]
    print(
        f"history: {tokens} tokens indexed in {indexed_s:.2f} s; vocabulary {vocab}; K {k}; "
        f"torch threads {torch.get_num_threads()}; {drafted / rounds:.1f} tokens drafted a round"
    )
    print(f"a drafting round (SuffixDrafter.propose, q included), {rounds} rounds:")
    for name, times in (("CPU time of the drafting thread", cpu), ("wall time (also waiting for a core)", wall)):
        times.sort()
        print(
            f"  {name}: median {statistics.median(times):.3f} ms, p99 {times[int(0.99 * (len(times) - 1))]:.3f} ms, "
            f"max {times[-1]:.3f} ms"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdeck.bench.suffix_round", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000, help="tokens of earlier texts in the history")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=49_152, help="vocabulary width (SmolLM2's by default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice); building q is a torch call, which "
        "a thread pool on a busy machine can delay",
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        pin_threads(args.threads)
    _bench(args.tokens, args.rounds, args.k, args.vocab, args.seed)


if __name__ == "__main__":
    main()
