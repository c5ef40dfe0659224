"""How far copying can go on this machine: `python -m specdeck.bench.copy_bound --prompts FILE`.

For each prompt (first turns), the target's plain greedy text is written once; then, at every
position of it, a copying drafter (suffix or prompt lookup) proposes up to 15 tokens as it would
there, and the tokens the target would accept are counted: the first drafts that equal the text.
Two figures come of it:

- acceptance by the copy's source (this request's own text, earlier texts) and its match length:
  how often a copy's first draft passes, and how many of its drafts pass on average;
- the bound: the speedup over plain decoding of a planner that knew in advance how many drafts of
  each copy pass, verified exactly those and stepped plainly where none did, priced with the
  target's measured cost curve (`specdeck.engine.planner.costs.cost_curve`). No planner that learns acceptance as
  it goes can beat it; where it is near 1.0x, copying cannot pay on this machine.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from specdeck.bench.methods import match_bucket
from specdeck.bench.prompts import read_prompts
from specdeck.engine.cache import costs_cache
from specdeck.engine.config import DecodeConfig
from specdeck.engine.cores import pin_threads
from specdeck.engine.events import TokenEvent
from specdeck.engine.loading.models import encode_prompt
from specdeck.engine.loop.decoding import generate
from specdeck.engine.pair import PairSpec
from specdeck.engine.planner.costs import CostCurve, cost_curve
from specdeck.engine.planner.round_shape import ProposalShape
from specdeck.engine.session import load_pair

LONGEST = 15  # drafts a copy may propose


def fastest_ms(curve: CostCurve, accepted: list[int]) -> float:
    """Milliseconds to write the text with each copy verified exactly as far as it passes (a plain
    step where nothing passes): accepted[t] drafts pass at position t, and a round that verifies n
    drafts keeps n + 1 tokens for a forward over n + 1."""
    best = [0.0] * (len(accepted) + 1)
    for t in range(len(accepted) - 1, -1, -1):
        best[t] = curve.ms(1) + best[t + 1]
        for n in range(1, min(accepted[t], len(accepted) - t - 1) + 1):
            best[t] = min(best[t], curve.ms(n + 1) + best[t + n + 1])
    return best[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdeck.bench.copy_bound", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="spec-bench", help="as `specdeck bench --prompts`")
    parser.add_argument("--categories", help="comma-separated categories to keep")
    parser.add_argument("--limit", type=int, help="at most N prompts per category")
    parser.add_argument("--drafter", choices=("suffix", "prompt-lookup"), default="suffix")
    parser.add_argument("--target", default=PairSpec().target)
    parser.add_argument("--backend", choices=("auto", "torch", "llama.cpp"), default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, help="CPU threads (default: at each session, the cores other programs leave free)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        pin_threads(args.threads)
    prompts = read_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
    pair = load_pair(PairSpec(args.target, drafter=args.drafter, backend=args.backend))
    curve = cost_curve(pair.local_target.model, costs_cache())
    config = DecodeConfig(max_new_tokens=args.max_new_tokens)
    tokenizer = pair.target.tokenizer
    judged: dict[tuple[str, tuple[int, str]], list[int]] = defaultdict(list)  # (source, match bucket) -> drafts passed
    plain_ms: dict[str, float] = defaultdict(float)
    bound_ms: dict[str, float] = defaultdict(float)
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt.text, chat=prompt.chat)
        text = [e.token_id for e in generate(pair.target, ids, config) if isinstance(e, TokenEvent)]
        drafter = pair.make_drafter()
        assert drafter is not None
        drafter.begin(ids, config, pair.target.vocab_width, torch.Generator())
        accepted = []
        for t in range(len(text)):
            proposal = drafter.propose(ids + text[:t], ProposalShape(LONGEST))
            passed = 0
            while (
                passed < len(proposal.tokens) and t + passed < len(text) and proposal.tokens[passed] == text[t + passed]
            ):
                passed += 1
            accepted.append(passed)
            if proposal.tokens:
                source = "own text" if proposal.source == "prompt" else "earlier texts"
                judged[source, match_bucket(proposal.match_length)].append(passed)
        plain_ms[prompt.category] += curve.ms(1) * len(text)
        bound_ms[prompt.category] += fastest_ms(curve, accepted)
        print(
            f"{prompt.category} {prompt.name}: {len(text)} tokens, bound {plain_ms[prompt.category] / bound_ms[prompt.category]:.2f}x so far"
        )
    print(f"\ncost curve ({curve.machine}): {curve.describe()}")
    print(f"{args.drafter} copies by source and match length: copies, first draft passed, drafts passed on average")
    for (source, bucket), passes in sorted(judged.items()):
        print(
            f"  {source:13} match {bucket[1]:>5}: {len(passes):5d}  {sum(p > 0 for p in passes) / len(passes):.2f}"
            f"  {sum(passes) / len(passes):.2f}"
        )
    print("bound (copies verified exactly as far as they pass), by category:")
    for category in plain_ms:
        print(f"  {category}: {plain_ms[category] / bound_ms[category]:.2f}x")
    print(f"  all: {sum(plain_ms.values()) / sum(bound_ms.values()):.2f}x")


if __name__ == "__main__":
    main()
