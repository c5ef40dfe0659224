"""`specdeck head-agreement`: how often feature heads' first drafts match their target's greedy
answers to a prompt set, and how often where prompt lookup has nothing to copy, on the terminal."""

from __future__ import annotations

from collections import defaultdict

from specdeck.cli.distill import report
from specdeck.engine.errors import SpecDeckError

COLUMNS = ("agreement", "not copyable", "copyable", "copyable share", "covered")


def add_head_agreement_command(commands) -> None:
    parser = commands.add_parser(
        "head-agreement",
        help="how often feature heads' first drafts match the target's greedy answers, apart where "
        "prompt lookup could copy (teacher-forced: no decoding, no timing)",
    )
    parser.add_argument("--heads", required=True, help="comma-separated feature heads (built-in names or folders)")
    parser.add_argument("--target", default=None, help="target model (default: the built-in target)")
    parser.add_argument("--prompts", default="spec-bench", help="as `specdeck bench --prompts` (first turns)")
    parser.add_argument("--categories", help="comma-separated categories to keep")
    parser.add_argument("--limit", type=int, help="at most N prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="longest greedy answer scored")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: default)")
    parser.set_defaults(handler=run_head_agreement)


def run_head_agreement(args) -> int:
    from specdeck.bench.prompts import read_prompts
    from specdeck.engine.cores import pin_threads
    from specdeck.engine.drafting.heads import load_feature_head
    from specdeck.engine.loading.models import LoadOptions, encode_conversation, load_model
    from specdeck.engine.pair import PairSpec
    from specdeck.train.agreement import Tally, greedy_answer, head_tally

    if args.max_new_tokens < 1 or args.threads < 0:
        raise SpecDeckError("--max-new-tokens must be at least 1 and --threads at least 0.")
    names = [name.strip() for name in args.heads.split(",") if name.strip()]
    if not names:
        raise SpecDeckError("--heads names no head: give one or more, comma-separated.")
    if args.threads:
        pin_threads(args.threads)
    prompts = read_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
    target = load_model(args.target or PairSpec().target, LoadOptions(device="cpu", dtype="float32"), report)
    heads = [load_feature_head(name, target, report) for name in names]
    tallies: dict[str, dict[str, Tally]] = {name: defaultdict(Tally) for name in names}
    for number, prompt in enumerate(prompts, start=1):
        ids, first = greedy_answer(
            target, encode_conversation(target.tokenizer, [prompt.text], [], prompt.chat), args.max_new_tokens
        )
        for name, loaded in zip(names, heads):
            tallies[name][prompt.category].add(head_tally(target, loaded, ids, first))
        report(f"[{number}/{len(prompts)}] {prompt.category} {prompt.name}: {len(ids) - first - 1} answer tokens")
    print("| head | category | tokens | " + " | ".join(COLUMNS) + " |")
    print("|---" * (3 + len(COLUMNS)) + "|")
    for name in names:
        overall = Tally()
        for category, tally in tallies[name].items():
            overall.add(tally)
            print(_row(name, category, tally))
        print(_row(name, "all", overall))
    return 0


def _row(name: str, category: str, tally) -> str:
    rates = tally.rates()
    return f"| {name} | {category} | {tally.tokens} | " + " | ".join(f"{rates[c]:.3f}" for c in COLUMNS) + " |"


__all__ = ["add_head_agreement_command", "run_head_agreement"]
