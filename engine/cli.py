"""The `specdeck` command: `run` (terminal), `gui` (the window), `bench`, `train-draft`, `train-head`,
`cache`.

Bare `specdeck` opens the window. Every user error ends in one clear line and exit status 2, never
a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from engine.config import SCHEDULES, DecodeConfig
from engine.errors import SpecDeckError
from engine.interrupt import cancel_on_signals, to_stderr
from engine.quiet import silence_libraries

_COLOURS = {"accepted": "\033[32m", "rejected": "\033[9;31m", "resampled": "\033[33m", "bonus": "\033[34m", "plain": ""}
_UNDERLINE = "\033[4m"  # drafts copied by prompt lookup
_RESET = "\033[0m"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from engine.backends import BACKENDS
    from engine.drafters import DRAFTER_KINDS
    from engine.models import DEFAULT_TARGET

    parser.add_argument("--target", default=None, help=f"target model: alias, Hugging Face id, folder or .gguf (default {DEFAULT_TARGET})")
    parser.add_argument("--draft", default=None,
                        help="draft model (same vocabulary as the target) or feature head (trained for the target)")
    parser.add_argument("--drafter", choices=DRAFTER_KINDS, default=None,
                        help="what proposes tokens (default: what --draft names, else the default pair's)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="what runs a .gguf model: llama.cpp (its quantized weights as they are) or torch "
                             "(dequantized); auto: llama.cpp where installed and faster on this machine")
    parser.add_argument("--trust-remote-code", action="store_true", help="run model code from the model's files")


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, default=DecodeConfig.k,
                        help="draft tokens per round (constant schedule; where the heuristic one starts)")
    parser.add_argument("--schedule", choices=SCHEDULES, default=DecodeConfig.schedule,
                        help="auto: each round's K (0..--max-k) and copy length chosen from this machine's "
                             "measured costs and the session's acceptance")
    parser.add_argument("--max-k", type=int, default=DecodeConfig.max_k, help="the longest draft the schedule may choose")
    parser.add_argument("--confidence", type=float, default=0.0, help="stop drafting below this top probability")
    parser.add_argument("--lookup", type=int, default=DecodeConfig.lookup,
                        help="where the text repeats, copy up to this many tokens by prompt lookup before asking "
                             "the drafter (0: off)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--no-chat", action="store_true", help="raw completion: no chat template")
    parser.add_argument("--truncate-prompt", action="store_true",
                        help="a prompt too long for the model's context: keep its last part instead of refusing it")


def decode_config(args):
    return DecodeConfig(k=args.k, schedule=args.schedule, max_k=args.max_k, confidence_threshold=args.confidence, lookup=args.lookup,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                        max_new_tokens=args.max_new_tokens, stop_strings=tuple(args.stop),
                        truncate_prompt=args.truncate_prompt)


def _read_prompt(args) -> str:
    if args.prompt_file:
        return read_prompt_file(Path(args.prompt_file))
    return args.prompt


def read_prompt_file(path: Path) -> str:
    """A prompt file's text: UTF-8, with or without a byte-order mark, or a `SpecDeckError` that
    names the file and where its text stops being UTF-8."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except OSError as error:
        raise SpecDeckError(f"Cannot read the prompt file {path}: {error.strerror}.") from error
    except UnicodeDecodeError as error:
        raise SpecDeckError(
            f"The prompt file {path} is not UTF-8 text: byte 0x{error.object[error.start]:02x} at offset "
            f"{error.start} is not valid UTF-8. Save the file as UTF-8 (most editors offer it under "
            "'Save as' or 'Encoding') and try again."
        ) from error


def _cmd_run(args) -> int:
    from engine.context import prompt_cut_notice
    from engine.events import RoundEvent, SessionStarted, SummaryEvent, TokenEvent, event_to_dict
    from engine.session import DEFAULT_PROMPT, load_pair, run_session

    config = decode_config(args)  # validate before the slow part
    prompt = _read_prompt(args) if (args.prompt is not None or args.prompt_file) else DEFAULT_PROMPT
    if not prompt.strip():
        raise SpecDeckError("The prompt is empty: type something for the model to continue or answer.")
    progress = None if args.jsonl else (lambda stage: print(f"[{stage}]", file=sys.stderr, flush=True))
    pair = load_pair(args.target, args.draft, args.drafter, args.device, args.dtype, args.trust_remote_code,
                     plain=args.plain, progress=progress, backend=args.backend)
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    summary = None
    with cancel_on_signals(to_stderr) as cancel:  # Ctrl-C ends the session at the next round, like Stop
        for event in run_session(pair, prompt, config, chat=not args.no_chat, plain=args.plain, cancel=cancel):
            if args.jsonl:
                print(json.dumps(event_to_dict(event), ensure_ascii=False), flush=isinstance(event, RoundEvent))
            elif isinstance(event, SessionStarted) and event.prompt_tokens_dropped:
                print(f"[{prompt_cut_notice(event.prompt_tokens, event.prompt_tokens_dropped)}]", file=sys.stderr,
                      flush=True)
            elif isinstance(event, TokenEvent):
                if event.state.value == "rejected" and not colour:
                    continue
                start = (_COLOURS[event.state.value] + (_UNDERLINE if event.copied else "")) if colour else ""
                print(f"{start}{event.text}{_RESET if start else ''}", end="", flush=True)
            if isinstance(event, SummaryEvent):
                summary = event
    if summary is not None and not args.jsonl:
        print("\n")
        print(format_summary(summary, pair.description))
    return 130 if cancel.is_set() else 0


def format_summary(s, description: str) -> str:
    lines = [
        f"pair                  {description}",
        f"new tokens            {s.new_tokens} in {s.rounds} rounds ({s.stop_reason})",
        f"tokens/s              {s.tokens_per_s:.1f} (prefill {s.prefill_ms:.0f} ms excluded)",
        f"acceptance rate       {s.acceptance_rate:.3f} ({s.accepted}/{s.drafted} drafts)",
        *([f"copied drafts         {s.copied_accepted}/{s.copied_drafted} accepted (prompt lookup)"]
          if s.copied_drafted else []),
        f"mean accepted length  {s.mean_accepted_length:.2f} tokens per target forward",
        f"target forwards/token {s.target_forwards_per_token:.3f}",
    ]
    if s.accepted_by_position:
        lines.append("acceptance by position " + " ".join(f"{a:.2f}" for a in s.accepted_by_position))
    if s.predicted_speedup is not None:
        lines.append(f"predicted speedup     {s.predicted_speedup:.2f}x (Leviathan et al. 2023, from a, K and draft cost)")
    if s.plan:
        lines.append("auto schedule         " + "\n                      ".join(s.plan.split("; ")))
    return "\n".join(lines)


def _cmd_cache(args) -> int:
    from engine import cache

    cache.heal(lambda line: print(f"[{line}]", file=sys.stderr))
    if not args.clear:
        print(cache.describe(cache.entries()))
        return 0
    removed, kept = cache.clear()
    print(f"Removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} "
          f"({cache.format_size(sum(e.size for e in removed))}) from {cache.gguf_cache()}.")
    for entry in kept:
        print(f"Kept {entry.path.name}: {entry.state}.")
    print(f"Removed {cache.clear_costs()} measured cost files from {cache.costs_cache()} (measured again when next needed).")
    return 0


def _cmd_gui(args) -> int:
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY") \
            and os.environ.get("QT_QPA_PLATFORM") != "offscreen" and sys.platform.startswith("linux"):
        if args.demo:
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
        else:
            print("No display found: running the default pair in the terminal instead "
                  "(`specdeck run`; set QT_QPA_PLATFORM=offscreen to force the window).", file=sys.stderr)
            return main(["run"])
    try:
        from app.main import run_gui, xcb_problem
    except ImportError as error:
        raise SpecDeckError(f"The window needs PySide6, pyqtgraph and qasync ({error}): reinstall SpecDeck with its dependencies.") from error
    problem = xcb_problem()
    if problem and args.demo:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    elif problem:
        print(f"{problem}\nMeanwhile, running the default pair in the terminal instead (`specdeck run`).",
              file=sys.stderr)
        return main(["run"])
    return run_gui(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeck", description="A playground for speculative decoding.")
    commands = parser.add_subparsers(dest="command")

    run = commands.add_parser("run", help="generate in the terminal, token states in colour")
    add_model_arguments(run)
    run.add_argument("--plain", action="store_true", help="plain decoding, no drafter")
    add_decode_arguments(run)
    source = run.add_mutually_exclusive_group()
    source.add_argument("--prompt", default=None)
    source.add_argument("--prompt-file", default=None)
    run.add_argument("--jsonl", action="store_true", help="one JSON object per event on stdout")
    run.set_defaults(handler=_cmd_run)

    gui = commands.add_parser("gui", help="open the window")
    gui.add_argument("--demo", action="store_true", help="load the default pair and run a compare session")
    gui.add_argument("--screenshot", default=None, help="with --demo: save a PNG of the window and exit")
    gui.add_argument("--export-csv", default=None, help="with --demo: save the session's CSV")
    gui.add_argument("--preset", default=None, help="with --demo: the prompt preset to run (default chat)")
    gui.set_defaults(handler=_cmd_gui)

    cache = commands.add_parser("cache", help="list the converted models SpecDeck keeps, and their sizes")
    cache.add_argument("--clear", action="store_true", help="delete them (they are converted again when needed)")
    cache.set_defaults(handler=_cmd_cache)

    from engine.bench.command import add_bench_command
    from engine.distill.command import add_train_draft_command, add_train_head_command

    add_bench_command(commands)
    add_train_draft_command(commands)
    add_train_head_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    silence_libraries()  # SpecDeck reports its own progress; the libraries keep quiet
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["gui"])
    try:
        return args.handler(args)
    except SpecDeckError as error:
        print(f"specdeck: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `specdeck run | head`: the reader left; say nothing more
        _silence_stdout()
        return 141  # 128 + SIGPIPE, as a command killed by the broken pipe would report


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's final flush does not raise again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
