"""`specdeck distill-head`: train a feature head with the target's states computed per batch."""

from __future__ import annotations

from specdeck.cli.distill import _add_loop_arguments, report, training_folder
from specdeck.cli.feature_head import add_head_layers_argument, head_settings
from specdeck.engine.errors import SpecDeckError


def add_distill_head_command(commands) -> None:
    from specdeck.train.stream_text import StreamConfig

    defaults = StreamConfig()
    head = defaults.head
    parser = commands.add_parser(
        "distill-head",
        help="train a feature head on given text and the target's own answers, its states computed per batch",
    )
    parser.add_argument("--target", default=None, help="target model (default: the built-in target)")
    parser.add_argument(
        "--out", required=True, help="output folder: plan.pt, answers.pt, checkpoint.pt, curve.json, head/"
    )
    parser.add_argument("--device", default=defaults.device, help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default=defaults.dtype, help="the target's dtype: auto, float32, bfloat16")
    parser.add_argument("--answers", type=int, default=defaults.answers, help="own answers the target writes first")
    parser.add_argument("--answer-tokens", type=int, default=defaults.answer_tokens, help="longest own answer")
    parser.add_argument(
        "--answer-batch", type=int, default=defaults.answer_batch, help="requests answered per batch, saved together"
    )
    parser.add_argument(
        "--answer-group",
        type=int,
        default=defaults.answer_group,
        help="requests generated at once within a batch, alike in length (0: the whole batch; on a CPU, 64 wastes "
        "less on padding)",
    )
    parser.add_argument(
        "--second-turns",
        type=int,
        default=defaults.second_turns,
        help="then follow this many own answers with a second request (shorter, as a list, in French...) and answer it",
    )
    parser.add_argument(
        "--answer-minutes", type=float, default=0.0, help="stop making answers after this long (0: make them all)"
    )
    parser.add_argument(
        "--own-repeat", type=int, default=defaults.own_repeat, help="times each own answer trains per epoch"
    )
    parser.add_argument(
        "--copy-weight",
        type=float,
        default=defaults.copy_weight,
        help="the loss's weight on tokens prompt lookup could copy, beside 1 on the others (below 1: "
        "train for what the head drafts beside lookup)",
    )
    parser.add_argument(
        "--feature-layers",
        default=",".join(map(str, head.feature_layers)),
        help="also read the residual streams after these many target layers (comma-separated; empty: the last state only)",
    )
    parser.add_argument("--unroll", type=int, default=head.unroll, help="passes per step, as drafting runs them")
    add_head_layers_argument(parser, head)
    parser.add_argument(
        "--feature-weight", type=float, default=head.feature_weight, help="pull towards the target's states"
    )
    parser.add_argument("--output-vocab", type=int, default=head.output_vocab, help="tokens the head may propose")
    parser.add_argument("--batch", type=int, default=head.batch_sequences, help="sequences per step")
    parser.add_argument(
        "--eval-sequences", type=int, default=head.eval_sequences, help="held-out sequences measured, half of each kind"
    )
    parser.add_argument("--init-from", default="", help="start from this head's weights (a folder or a built-in name)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="stop training after this long, saved (0: run to --steps; with --steps 0 the schedule fills it)",
    )
    parser.add_argument(
        "--checkpoint-minutes", type=float, default=defaults.checkpoint_minutes, help="longest time between checkpoints"
    )
    parser.add_argument(
        "--text-only",
        action="store_true",
        help="make the text (plan.pt, own answers, second turns) and stop: a later run trains on it, e.g. on a GPU",
    )
    parser.add_argument(
        "--text-from",
        type=int,
        default=0,
        help="start at this batch of the text's order: with --init-from a head that trained on the same text "
        "(same --seed, --batch and answers) for N steps, N goes on with the text it has not seen",
    )
    _add_loop_arguments(parser, head)
    parser.set_defaults(handler=run_distill_head)


def run_distill_head(args) -> int:
    from specdeck.engine.loading.registry import DEFAULT_TARGET
    from specdeck.train.stream import train_streaming
    from specdeck.train.stream_text import StreamConfig

    counts = (args.batch, args.unroll, args.eval_every, args.answer_batch, args.own_repeat, args.eval_sequences)
    if min(counts) < 1:
        raise SpecDeckError(
            "--batch, --unroll, --eval-every, --eval-sequences, --answer-batch and --own-repeat must be at least 1."
        )
    if args.steps < 0 or (args.steps == 0 and not args.minutes and not args.text_only):
        raise SpecDeckError("--steps must be at least 1, or 0 with --minutes to size the run to that time.")
    if min(args.answers, args.second_turns, args.output_vocab, args.minutes, args.checkpoint_minutes) < 0:
        raise SpecDeckError(
            "--answers, --second-turns, --output-vocab, --minutes and --checkpoint-minutes cannot be negative."
        )
    if args.answer_minutes < 0 or args.answer_group < 0 or args.text_from < 0:
        raise SpecDeckError("--answer-minutes, --answer-group and --text-from cannot be negative.")
    if not 0 <= args.copy_weight <= 1:
        raise SpecDeckError(f"--copy-weight is a weight from 0 to 1 (got {args.copy_weight:g}).")
    head = head_settings(args, eval_sequences=args.eval_sequences)
    config = StreamConfig(
        head=head,
        device=args.device,
        dtype=args.dtype,
        answers=args.answers,
        second_turns=args.second_turns,
        answer_tokens=args.answer_tokens,
        answer_batch=args.answer_batch,
        answer_group=args.answer_group,
        answer_minutes=args.answer_minutes,
        own_repeat=args.own_repeat,
        copy_weight=args.copy_weight,
        minutes=args.minutes,
        checkpoint_minutes=args.checkpoint_minutes,
        text_only=args.text_only,
        text_from=args.text_from,
    )
    out = training_folder(args)
    folder = train_streaming(
        args.target or DEFAULT_TARGET,
        out,
        config,
        resume=args.resume,
        progress=report,
        until=args.until,
    )
    print(f"text for training in {folder}" if args.text_only else f"feature head saved in {folder}")
    return 0


__all__ = ["add_distill_head_command", "run_distill_head"]
