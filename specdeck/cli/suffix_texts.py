"""`specdeck suffix-texts`: write a target's own answers to composed requests, which suffix drafting
copies from before any session has run, on the terminal."""

from __future__ import annotations

from pathlib import Path

from specdeck.cli.distill import report
from specdeck.engine.atomic import check_writable_folder
from specdeck.engine.errors import SpecDeckError


def add_suffix_texts_command(commands) -> None:
    from specdeck.train.target_texts import TextsConfig

    defaults = TextsConfig()
    parser = commands.add_parser(
        "suffix-texts",
        help="write a target's own answers to composed requests, which suffix drafting copies from",
    )
    parser.add_argument("--target", default=None, help="target model (default: the built-in target)")
    parser.add_argument(
        "--tokens", type=int, default=defaults.tokens, help="stop when the answers hold this many tokens"
    )
    parser.add_argument(
        "--answer-tokens", type=int, default=defaults.answer_tokens, help="longest answer the target writes"
    )
    parser.add_argument(
        "--backend", default=defaults.backend, choices=("auto", "torch", "llama.cpp"), help="what runs a .gguf target"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder of the texts file (default: SpecDeck's cache, where the suffix drafter reads it); rerun to resume",
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: default)")
    parser.set_defaults(handler=run_suffix_texts)


def run_suffix_texts(args) -> int:
    from specdeck.engine.drafting.past_sessions import target_texts_folder
    from specdeck.engine.loading.models import load_tokenizer
    from specdeck.engine.loading.registry import DEFAULT_TARGET
    from specdeck.train.target_texts import TextsConfig, default_folder, grow, write_texts

    if min(args.tokens, args.answer_tokens) < 1 or args.threads < 0:
        raise SpecDeckError("--tokens and --answer-tokens must be at least 1, --threads at least 0.")
    name = args.target or DEFAULT_TARGET
    config = TextsConfig(
        tokens=args.tokens, answer_tokens=args.answer_tokens, backend=args.backend, threads=args.threads
    )
    out = check_writable_folder(Path(args.out).expanduser() if args.out else target_texts_folder())
    answers = grow(name, default_folder(name), config, progress=report)
    path = write_texts(answers, load_tokenizer(name), out)
    print(f"{sum(map(len, answers)):,} tokens of {len(answers)} answers in {path}")
    return 0


__all__ = ["add_suffix_texts_command"]
