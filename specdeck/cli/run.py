"""`specdeck run`: one session in the terminal, each token coloured by what happened to it (ANSI
colours on a terminal, plain text otherwise), then the session's figures; or, with `--jsonl`, one
JSON object per event."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specdeck.cli.options import add_decode_arguments, add_model_arguments, decode_config, pair_spec
from specdeck.engine.interrupt import cancel_on_signals, to_stderr

_COLOURS = {
    "accepted": "\033[32m",
    "rejected": "\033[9;31m",
    "discarded": "\033[9;2m",
    "resampled": "\033[33m",
    "bonus": "\033[34m",
    "plain": "",
}
_UNDERLINE = "\033[4m"  # drafts copied by prompt lookup
_RESET = "\033[0m"

# Characters that JSON leaves as they are but that some line readers (Python's str.splitlines,
# JavaScript before ES2019) take for line ends: escaped, so that one event stays one line for any reader.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def add_run_command(commands) -> None:
    """Register `run` on the `specdeck` subparsers."""
    run = commands.add_parser("run", help="generate in the terminal, token states in colour")
    add_model_arguments(run)
    run.add_argument("--plain", action="store_true", help="plain decoding, no drafter")
    add_decode_arguments(run)
    source = run.add_mutually_exclusive_group()
    source.add_argument("--prompt", default=None)
    source.add_argument("--prompt-file", default=None)
    run.add_argument("--jsonl", action="store_true", help="one JSON object per event on stdout")
    run.set_defaults(handler=cmd_run)


def _prompt(args: argparse.Namespace) -> str:
    from specdeck.bench.prompts import read_prompt_text
    from specdeck.engine.config import check_prompt
    from specdeck.engine.session import DEFAULT_PROMPT

    if args.prompt_file:
        return check_prompt(read_prompt_text(Path(args.prompt_file)))
    return check_prompt(args.prompt if args.prompt is not None else DEFAULT_PROMPT)


def cmd_run(args: argparse.Namespace) -> int:
    from specdeck.engine.context import prompt_cut_notice
    from specdeck.engine.events import RoundEvent, SessionStarted, SummaryEvent, TokenEvent, event_to_dict
    from specdeck.engine.session import load_pair, run_session

    config = decode_config(args)  # validate before the slow part
    prompt = _prompt(args)
    progress = None if args.jsonl else (lambda stage: print(f"[{stage}]", file=sys.stderr, flush=True))
    pair = load_pair(pair_spec(args), plain=args.plain, progress=progress)
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    with cancel_on_signals(to_stderr) as cancel:  # Ctrl-C ends the session at the next round, like Stop
        for event in run_session(pair, prompt, config, chat=not args.no_chat, plain=args.plain, cancel=cancel):
            if args.jsonl:
                print(jsonl_line(event_to_dict(event)), flush=isinstance(event, RoundEvent))
            elif isinstance(event, SessionStarted) and event.prompt_tokens_dropped:
                print(
                    f"[{prompt_cut_notice(event.prompt_tokens, event.prompt_tokens_dropped)}]",
                    file=sys.stderr,
                    flush=True,
                )
            elif isinstance(event, TokenEvent):
                if not event.state.kept and not colour:
                    continue
                start = (_COLOURS[event.state.value] + (_UNDERLINE if event.copied else "")) if colour else ""
                print(f"{start}{event.text}{_RESET if start else ''}", end="", flush=True)
            if isinstance(event, SummaryEvent) and not args.jsonl:
                # now: the session may go on to measure this machine's costs (`generate`)
                print("\n")
                print(format_summary(event, pair.description, pair.target.runs), flush=True)
    return 130 if cancel.is_set() else 0


def jsonl_line(value: dict) -> str:
    """`value` as one line of JSON Lines: UTF-8 text as it is, every line-breaking character escaped."""
    return json.dumps(value, ensure_ascii=False).translate(_LINE_BREAKS)


def format_summary(s, description: str, runs: str = "float32") -> str:
    """The session's summary for the terminal; `runs`: what ran the target (`LoadedModel.runs`)."""
    lines = [
        f"pair                  {description}",
        f"runs on               {runs}",
        f"new tokens            {s.new_tokens} in {s.rounds} rounds ({s.stop_reason})",
        f"tokens/s              {s.tokens_per_s:.1f} (prefill {s.prefill_ms:.0f} ms excluded)",
        f"acceptance rate       {s.acceptance_rate:.3f} ({s.accepted}/{s.drafted} drafts)",
        *(
            [f"copied drafts         {s.copied_accepted}/{s.copied_drafted} accepted (prompt lookup)"]
            if s.copied_drafted
            else []
        ),
        f"mean accepted length  {s.mean_accepted_length:.2f} tokens per target forward",
        f"target forwards/token {s.target_forwards_per_token:.3f}",
    ]
    if s.accepted_by_position:
        lines.append("acceptance by position " + " ".join(f"{a:.2f}" for a in s.accepted_by_position))
    if s.predicted_speedup is not None:
        lines.append(
            f"predicted speedup     {s.predicted_speedup:.2f}x (Leviathan et al. 2023, from a, K and draft cost)"
        )
    if s.network_ms is not None:
        server = (
            f", server {s.server_ms:.0f} ms" if s.server_ms is not None else " (the server reports no time of its own)"
        )
        round_trip = s.network_ms + (s.server_ms or 0.0)
        lines.append(f"per round             round trip {round_trip:.0f} ms: network {s.network_ms:.0f} ms{server}")
        if s.recomputed_tokens is not None:
            lines.append(f"recomputed per round  {s.recomputed_tokens:.1f} prompt tokens, as the server reported")
        if s.cache_misses:
            lines.append(
                f"prefix cache          the server reported no cache hit in {s.cache_misses} of {s.rounds} rounds"
            )
    if s.plan:
        lines.append("auto schedule         " + "\n                      ".join(s.plan.split("; ")))
    return "\n".join(lines)
