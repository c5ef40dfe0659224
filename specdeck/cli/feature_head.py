"""`specdeck train-head` and `head-data`: train a feature head for a target, and grow the data it
learns from (the target's hidden states over free text and its own answers), on the terminal."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specdeck.cli.distill import _add_loop_arguments, _add_text_arguments, report, training_folder
from specdeck.engine.atomic import claim_folder, output_path
from specdeck.engine.errors import SpecDeckError

if TYPE_CHECKING:
    from specdeck.train.head import HeadConfig


def add_train_head_command(commands) -> None:
    from specdeck.train.head import HeadConfig
    from specdeck.train.train import TrainConfig

    defaults = HeadConfig()
    parser = commands.add_parser("train-head", help="train a feature head (EAGLE-style drafter) for a target")
    parser.add_argument("--target", default=None, help="target model (default: the built-in target)")
    parser.add_argument("--out", required=True, help="output folder: teacher shards, features, checkpoint, head/")
    parser.add_argument(
        "--teacher", default=None, help="teacher shards to learn from (default OUT/teacher), e.g. a train-draft run's"
    )
    parser.add_argument(
        "--data",
        default=None,
        help="learn from the shards of `specdeck head-data` in this folder instead of teacher shards",
    )
    parser.add_argument(
        "--feature-layers",
        default="",
        help="with --data: also read the residual streams after these many target layers "
        "(comma-separated, among the data's --layers), EAGLE-3's fused features",
    )
    parser.add_argument(
        "--feature-weight",
        type=float,
        default=defaults.feature_weight,
        help="weight of the pull of predicted states towards the target's (0: none)",
    )
    parser.add_argument(
        "--init-from",
        default="",
        help="start from this head's weights (a folder or a built-in name such as smollm2-135m-head)",
    )
    _add_text_arguments(parser, TrainConfig())
    _add_loop_arguments(parser, defaults)
    parser.add_argument(
        "--output-vocab",
        type=int,
        default=defaults.output_vocab,
        help="tokens the head may propose: the target's most frequent ones (0: the whole vocabulary)",
    )
    parser.add_argument(
        "--unroll",
        type=int,
        default=defaults.unroll,
        help="passes per step; each later one reads the states the previous one predicted",
    )
    parser.add_argument("--batch", type=int, default=defaults.batch_sequences, help="sequences per step")
    add_head_layers_argument(parser, defaults)
    parser.set_defaults(handler=run_train_head)


def add_head_layers_argument(parser, defaults) -> None:
    parser.add_argument(
        "--head-layers",
        type=int,
        default=defaults.layers,
        help="the head's decoder layers (with --init-from a head of fewer, the new ones start adding nothing)",
    )


def head_settings(args, **more) -> HeadConfig:
    """A head's training settings from the options train-head and distill-head share (`more`: others)."""
    from specdeck.train.head import HeadConfig

    try:
        layers = tuple(int(n) for n in args.feature_layers.split(",") if n.strip())
    except ValueError:
        raise SpecDeckError(
            f"--feature-layers takes layer counts separated by commas, not {args.feature_layers!r}."
        ) from None
    return HeadConfig(
        seed=args.seed,
        output_vocab=args.output_vocab,
        unroll=args.unroll,
        steps=args.steps,
        batch_sequences=args.batch,
        lr=args.lr,
        eval_every=args.eval_every,
        bfloat16=not args.float32,
        threads=args.threads,
        feature_layers=layers,
        feature_weight=args.feature_weight,
        init_from=args.init_from,
        layers=args.head_layers,
        **more,
    )


def run_train_head(args) -> int:
    from specdeck.engine.loading.registry import DEFAULT_TARGET
    from specdeck.train.head import train_head
    from specdeck.train.train import TrainConfig

    if min(args.steps, args.batch, args.unroll, args.eval_every) < 1:
        raise SpecDeckError("--steps, --batch, --unroll and --eval-every must be at least 1.")
    if min(args.answers, args.passages, args.code, args.articles, args.teacher_shards, args.output_vocab) < 0:
        raise SpecDeckError(
            "--answers, --passages, --code, --articles, --teacher-shards and --output-vocab cannot be negative."
        )
    config = head_settings(args)
    text = None
    if args.answers or args.passages or args.code or args.articles:
        text = TrainConfig(
            seed=args.seed,
            answers=args.answers,
            passages=args.passages,
            code=args.code,
            articles=args.articles,
            answer_tokens=args.answer_tokens,
            generation_batch=args.generation_batch,
            teacher_shards=args.teacher_shards,
        )
    out = training_folder(args)
    head = train_head(
        args.target or DEFAULT_TARGET,
        out,
        config,
        text,
        Path(args.teacher).expanduser() if args.teacher else None,
        resume=args.resume,
        progress=report,
        until=args.until,
        data=Path(args.data).expanduser() if args.data else None,
    )
    print(f"feature head saved in {head}")
    return 0


def add_head_data_command(commands) -> None:
    from specdeck.train.forcing import ForcingConfig

    defaults = ForcingConfig()
    parser = commands.add_parser(
        "head-data",
        help="grow a feature head's teacher data: the target's hidden states over free text and its own answers",
    )
    parser.add_argument("--target", default=None, help="target model (default: the built-in target)")
    parser.add_argument(
        "--out",
        default=None,
        help="folder of the shards (default: SpecDeck's cache, teacher-head/<target>); rerun to resume",
    )
    parser.add_argument("--overwrite", action="store_true", help="grow the shards in an --out that holds other files")
    parser.add_argument(
        "--positions", type=int, default=defaults.positions, help="stop when the shards hold this many target positions"
    )
    parser.add_argument(
        "--layers",
        default=",".join(map(str, defaults.layers)),
        help="also keep the residual stream after these many decoder layers (comma-separated)",
    )
    parser.add_argument(
        "--answer-every",
        type=int,
        default=defaults.answer_every,
        help="every n-th shard is the target's own generated answers (0: existing text only)",
    )
    parser.add_argument("--answer-batch", type=int, default=defaults.answer_batch, help="prompts answered at once")
    parser.add_argument(
        "--answer-tokens", type=int, default=defaults.answer_tokens, help="longest answer the target writes"
    )
    parser.add_argument(
        "--shard-sequences", type=int, default=defaults.shard_sequences, help="existing-text sequences per shard"
    )
    parser.add_argument(
        "--reserve-gb", type=float, default=defaults.reserve_gb, help="stop while this much disk is still free"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.set_defaults(handler=run_head_data)


def run_head_data(args) -> int:
    from specdeck.engine.loading.registry import DEFAULT_TARGET
    from specdeck.train.forcing import ForcingConfig, default_folder, grow

    try:
        layers = tuple(int(n) for n in args.layers.split(",") if n.strip())
    except ValueError:
        raise SpecDeckError(
            f"--layers takes layer counts separated by commas, e.g. 3,15, not {args.layers!r}."
        ) from None
    if (
        min(args.positions, args.answer_batch, args.answer_tokens, args.shard_sequences, min(layers, default=1)) < 1
        or args.answer_every < 0
    ):
        raise SpecDeckError(
            "--positions, --answer-batch, --answer-tokens, --shard-sequences and every --layers entry "
            "must be at least 1, --answer-every at least 0."
        )
    name = args.target or DEFAULT_TARGET
    config = ForcingConfig(
        positions=args.positions,
        layers=layers,
        answer_every=args.answer_every,
        answer_batch=args.answer_batch,
        answer_tokens=args.answer_tokens,
        shard_sequences=args.shard_sequences,
        reserve_gb=args.reserve_gb,
        threads=args.threads,
    )
    from specdeck.train import STORE_STATE

    out = output_path(args.out) if args.out is not None else default_folder(name)
    claim_folder(out, STORE_STATE, args.overwrite)
    grow(name, out, config, progress=report)
    print(f"head data in {out}")
    return 0


__all__ = ["add_head_data_command", "add_head_layers_argument", "add_train_head_command", "head_settings"]
