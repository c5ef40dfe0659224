"""`specdeck train-draft` and `train-cross-draft`: distil a draft model, or train a draft with a
tokenizer of its own, for a target, on the terminal; and what every training command shares (its
loop and text options, its output folder, its progress lines)."""

from __future__ import annotations

import sys
from pathlib import Path

from specdeck.engine.atomic import claim_folder, output_path
from specdeck.engine.errors import SpecDeckError


def add_train_draft_command(commands) -> None:
    from specdeck.train.train import TrainConfig

    defaults = TrainConfig()
    shape = defaults.shape
    parser = commands.add_parser("train-draft", help="distil a small draft model from a target")
    parser.add_argument("--target", default=None, help="target model (default: the built-in target)")
    parser.add_argument("--out", required=True, help="output folder: teacher shards, checkpoint, draft/")
    _add_loop_arguments(parser, defaults)
    parser.add_argument("--hidden", type=int, default=shape.hidden)
    parser.add_argument("--layers", type=int, default=shape.layers)
    parser.add_argument("--intermediate", type=int, default=shape.intermediate)
    _add_text_arguments(parser, defaults)
    parser.add_argument(
        "--output-vocab",
        type=int,
        default=defaults.output_vocab,
        help="tokens the draft may propose: the teacher's most likely ones (0: the whole vocabulary)",
    )
    parser.add_argument(
        "--documents",
        type=int,
        default=defaults.documents,
        help="standard-library passages the target scores as given text",
    )
    parser.add_argument("--batch", type=int, default=defaults.batch_sequences, help="sequences per step")
    parser.add_argument("--max-length", type=int, default=defaults.max_length)
    parser.add_argument("--train-embedding", action="store_true", help="also train the tied embedding")
    parser.set_defaults(handler=run_train_draft)


def run_train_draft(args) -> int:
    from specdeck.engine.loading.registry import DEFAULT_TARGET
    from specdeck.train.student import DraftShape
    from specdeck.train.train import TrainConfig, train_draft

    if min(args.steps, args.batch, args.layers, args.eval_every) < 1 or args.hidden < 8:
        raise SpecDeckError("--steps, --batch, --layers and --eval-every must be at least 1, --hidden at least 8.")
    if (
        min(
            args.answers,
            args.passages,
            args.code,
            args.articles,
            args.documents,
            args.teacher_shards,
            args.output_vocab,
        )
        < 0
    ):
        raise SpecDeckError(
            "--answers, --passages, --code, --articles, --documents, --teacher-shards and "
            "--output-vocab cannot be negative."
        )
    config = TrainConfig(
        shape=DraftShape(hidden=args.hidden, layers=args.layers, intermediate=args.intermediate),
        seed=args.seed,
        answers=args.answers,
        passages=args.passages,
        code=args.code,
        articles=args.articles,
        answer_tokens=args.answer_tokens,
        generation_batch=args.generation_batch,
        teacher_shards=args.teacher_shards,
        output_vocab=args.output_vocab,
        bfloat16=not args.float32,
        documents=args.documents,
        max_length=args.max_length,
        steps=args.steps,
        batch_sequences=args.batch,
        lr=args.lr,
        train_embedding=args.train_embedding,
        threads=args.threads,
        eval_every=args.eval_every,
    )
    out = training_folder(args)
    draft = train_draft(
        args.target or DEFAULT_TARGET,
        out,
        config,
        resume=args.resume,
        progress=report,
        until=args.until,
    )
    print(f"draft saved in {draft}")
    return 0


def report(line: str) -> None:
    """A training command's progress line, on stderr as it happens."""
    print(line, file=sys.stderr, flush=True)


def training_folder(args) -> Path:
    """The run's --out folder, made and proven writable before any work; refused where it holds a
    checkpoint and --resume was not passed, or a user's files and --overwrite was not passed."""
    return output_folder(output_path(args.out), args.resume, args.overwrite)


def output_folder(out: Path, resume: bool, overwrite: bool) -> Path:
    from specdeck.train import RUN_STATE

    if (out / "checkpoint.pt").exists() and not resume:
        raise SpecDeckError(f"{out} already holds a checkpoint: pass --resume to continue it, or pick a new --out.")
    claim_folder(out, RUN_STATE, overwrite)
    if resume and not (out / "checkpoint.pt").exists():
        print(f"{out} holds no checkpoint to resume: starting a new run there", file=sys.stderr)
    return out


def _add_loop_arguments(parser, defaults) -> None:
    """How the training loop runs (shared by the three training commands)."""
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    parser.add_argument(
        "--overwrite", action="store_true", help="write the run's files into an --out that holds other files"
    )
    parser.add_argument(
        "--until",
        type=int,
        default=None,
        help="stop after this step for now (checkpointed; --resume goes on with the same schedule)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument(
        "--eval-every",
        type=int,
        default=defaults.eval_every,
        help="steps between held-out evaluations (and checkpoints)",
    )
    parser.add_argument("--float32", action="store_true", help="train in float32 instead of bfloat16 autocast")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")


def _add_text_arguments(parser, defaults) -> None:
    """What the target writes for the student to learn from (shared by both commands)."""
    parser.add_argument(
        "--answers", type=int, default=defaults.answers, help="chat instructions the target answers itself"
    )
    parser.add_argument(
        "--passages",
        type=int,
        default=defaults.passages,
        help="documentation passages the target summarises or answers questions on",
    )
    parser.add_argument(
        "--code", type=int, default=defaults.code, help="code beginnings the target continues without a chat template"
    )
    parser.add_argument(
        "--articles",
        type=int,
        default=defaults.articles,
        help="articles the target writes, then summarises, extracts from or answers questions on",
    )
    parser.add_argument(
        "--answer-tokens", type=int, default=defaults.answer_tokens, help="longest answer the target writes"
    )
    parser.add_argument(
        "--generation-batch", type=int, default=defaults.generation_batch, help="prompts the target answers at once"
    )
    parser.add_argument(
        "--teacher-shards",
        type=int,
        default=defaults.teacher_shards,
        help="stop the teacher after this many shards (0: all)",
    )


def add_train_cross_draft_command(commands) -> None:
    from specdeck.train.own_tokenizer import CrossDraftConfig

    defaults = CrossDraftConfig()
    shape = defaults.shape
    parser = commands.add_parser(
        "train-cross-draft",
        help="train a small draft with a tokenizer of its own (byte-level BPE) on the target's text",
    )
    parser.add_argument("--target", default=None, help="target model (default: the built-in target)")
    parser.add_argument(
        "--out",
        default=None,
        help="output folder: text, tokenizer, checkpoint, draft/ (default: SpecDeck's cache, cross-draft/<target>)",
    )
    parser.add_argument(
        "--teacher",
        default=None,
        help="read the target's text from these teacher shards (e.g. a train-draft run's) instead of writing it",
    )
    parser.add_argument("--vocab", type=int, default=defaults.vocab_size, help="tokens of the draft's own tokenizer")
    parser.add_argument(
        "--exchanges",
        type=int,
        default=defaults.exchanges,
        help="passages of existing text (Python documentation and standard library, WordNet) also trained on",
    )
    _add_loop_arguments(parser, defaults)
    parser.add_argument("--hidden", type=int, default=shape.hidden)
    parser.add_argument("--layers", type=int, default=shape.layers)
    parser.add_argument("--intermediate", type=int, default=shape.intermediate)
    _add_text_arguments(parser, defaults)
    parser.add_argument("--batch", type=int, default=defaults.batch_sequences, help="blocks per step")
    parser.add_argument("--max-length", type=int, default=defaults.max_length, help="tokens per block")
    parser.set_defaults(handler=run_train_cross_draft)


def run_train_cross_draft(args) -> int:
    from specdeck.engine.loading.registry import DEFAULT_TARGET
    from specdeck.train.own_tokenizer import CrossDraftConfig, default_folder, train_cross_draft
    from specdeck.train.student import DraftShape

    if min(args.steps, args.batch, args.layers, args.eval_every, args.max_length) < 1 or args.hidden < 8:
        raise SpecDeckError(
            "--steps, --batch, --layers, --eval-every and --max-length must be at least 1, --hidden at least 8."
        )
    if min(args.answers, args.passages, args.code, args.articles, args.exchanges, args.teacher_shards) < 0:
        raise SpecDeckError(
            "--answers, --passages, --code, --articles, --exchanges and --teacher-shards cannot be negative."
        )
    if args.vocab < 300:
        raise SpecDeckError(
            f"--vocab {args.vocab} is too small: a byte-level BPE needs 256 tokens for the bytes "
            "alone; give at least 300."
        )
    config = CrossDraftConfig(
        shape=DraftShape(hidden=args.hidden, layers=args.layers, intermediate=args.intermediate),
        vocab_size=args.vocab,
        seed=args.seed,
        answers=args.answers,
        passages=args.passages,
        code=args.code,
        articles=args.articles,
        answer_tokens=args.answer_tokens,
        generation_batch=args.generation_batch,
        teacher_shards=args.teacher_shards,
        exchanges=args.exchanges,
        max_length=args.max_length,
        steps=args.steps,
        batch_sequences=args.batch,
        lr=args.lr,
        eval_every=args.eval_every,
        bfloat16=not args.float32,
        threads=args.threads,
    )
    if not (config.writes or config.exchanges or args.teacher):
        raise SpecDeckError(
            "No text to train on: give --answers, --passages, --code, --articles or --exchanges, or --teacher shards."
        )
    name = args.target or DEFAULT_TARGET
    out = output_folder(
        output_path(args.out) if args.out is not None else default_folder(name), args.resume, args.overwrite
    )
    draft = train_cross_draft(
        name,
        out,
        config,
        Path(args.teacher).expanduser() if args.teacher else None,
        resume=args.resume,
        progress=report,
        until=args.until,
    )
    print(f"draft saved in {draft}: try it with `specdeck run --draft {draft}`")
    return 0


__all__ = [
    "add_train_cross_draft_command",
    "add_train_draft_command",
    "report",
    "training_folder",
]
