"""Measure a draft against plain decoding on prompts from a JSONL file (Spec-Bench's format:
`category` and `turns`), with the engine's own session code: acceptance rate, mean accepted length
(tokens per target forward) and speedup in decode tokens/s, prefill excluded.

    python -m engine.distill.measure --prompts spec_bench_public.jsonl --draft smollm2-135m-draft
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from engine.config import DecodeConfig
from engine.events import SummaryEvent
from engine.session import load_pair, run_session

CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
              "qa", "summarization", "math_reasoning", "rag")


def pick_prompts(path: Path, count: int) -> list[tuple[str, str]]:
    """The first prompt of each category in turn (translation left out), `count` in all."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_category = {c: [r["turns"][0] for r in rows if r.get("category") == c] for c in CATEGORIES}
    picked: list[tuple[str, str]] = []
    depth = 0
    while len(picked) < count and depth < max(len(v) for v in by_category.values()):
        picked += [(c, items[depth]) for c, items in by_category.items() if depth < len(items)]
        depth += 1
    return picked[:count]


def measure(pair, prompts, config: DecodeConfig) -> tuple[dict, float]:
    """Speculative figures and plain tokens/s, each prompt decoded both ways back to back so that
    both see the same load on a shared machine."""
    tokens = seconds = plain_tokens = plain_seconds = rounds = drafted = accepted = 0
    for _, prompt in prompts:
        for plain in (True, False):
            summary = next(e for e in run_session(pair, prompt, config, plain=plain) if isinstance(e, SummaryEvent))
            elapsed = summary.new_tokens / summary.tokens_per_s if summary.tokens_per_s else 0.0
            if plain:
                plain_tokens += summary.new_tokens
                plain_seconds += elapsed
                continue
            tokens += summary.new_tokens
            seconds += elapsed
            rounds += summary.rounds
            drafted += summary.drafted
            accepted += summary.accepted
    figures = {"tokens_per_s": tokens / seconds, "acceptance_rate": accepted / drafted if drafted else 0.0,
               "mean_accepted_length": tokens / rounds}
    return figures, plain_tokens / plain_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--draft", default="smollm2-135m-draft")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", default="2,3,4,5")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = pick_prompts(Path(args.prompts), args.count)
    pair = load_pair(None, args.draft, "draft-model", device="cpu")
    warm = DecodeConfig(k=2, max_new_tokens=8)
    list(run_session(pair, prompts[0][1], warm, plain=True))
    list(run_session(pair, prompts[0][1], warm))
    print(f"{len(prompts)} prompts ({', '.join(sorted({c for c, _ in prompts}))}), T={args.temperature}, "
          f"{args.max_new_tokens} new tokens max, threads={torch.get_num_threads()}")
    print("| K | acceptance rate | mean accepted length | tokens/s | plain tokens/s | speedup |")
    print("|---|---|---|---|---|---|")
    for k in (int(x) for x in args.ks.split(",")):
        config = DecodeConfig(k=k, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=0)
        m, plain = measure(pair, prompts, config)
        print(f"| {k} | {m['acceptance_rate']:.3f} | {m['mean_accepted_length']:.2f} | {m['tokens_per_s']:.2f} | "
              f"{plain:.2f} | {m['tokens_per_s'] / plain:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
