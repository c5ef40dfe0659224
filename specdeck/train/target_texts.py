"""A target's own text for suffix drafting before any session has run (`specdeck suffix-texts`).

A suffix drafter copies what followed the longest match of the last tokens in earlier text. On a
first prompt there is no earlier answer, yet a target's answers share much of their wording with
one another (openings, transitions, list markup, code idioms), so its answers to other requests
are text it is likely to write again. This module has the target answer requests SpecDeck composes
(`specdeck.train.corpus.instructions`, and requests to summarise or question passages of the
Python documentation, `specdeck.train.texts.reading_requests`; never a benchmark prompt) with plain
greedy decoding, on the backend it runs fastest on, and keeps the answers.

The work is resumable: each answer is appended to `answers.jsonl` in the work folder as it is
made, and a rerun goes on after the last one. `write_texts` turns the answers into the store
format of `specdeck.engine.drafting.past_sessions` (`<tokenizer key>.tokens`), which the suffix drafter reads from
SpecDeck's bundled resources (the built-in target's file ships there) or from the cache folder.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdeck.engine.atomic import write_bytes
from specdeck.engine.config import DecodeConfig
from specdeck.engine.cores import pin_threads
from specdeck.engine.drafting.past_sessions import encode_texts, target_texts_folder, tokenizer_key
from specdeck.engine.events import TokenEvent
from specdeck.engine.loading.models import LoadOptions, load_model
from specdeck.engine.loop.decoding import generate
from specdeck.train.corpus import instructions
from specdeck.train.teacher import chat_ids
from specdeck.train.texts import existing_exchanges, reading_requests

Progress = Callable[[str], None]
ANSWERS_FILE = "answers.jsonl"


@dataclass(frozen=True)
class TextsConfig:
    tokens: int = 200_000  # stop when the answers hold this many tokens
    answer_tokens: int = 320  # longest answer
    seed: int = 0  # the requests' order
    backend: str = "auto"
    threads: int = 0


def default_folder(target_name: str) -> Path:
    """Where a target's answers are made; `write_texts` puts the texts file one folder up, where
    the suffix drafter looks (`specdeck.engine.drafting.past_sessions.target_texts_file`)."""
    return target_texts_folder() / "work" / target_name.replace("/", "--")


def requests(seed: int = 0) -> list[str]:
    """The composed requests in a seeded order that mixes their kinds (any prefix samples all)."""
    asked = instructions(seed) + reading_requests(existing_exchanges(seed), seed)
    random.Random(seed + 11).shuffle(asked)
    return asked


def read_answers(folder: Path) -> list[dict]:
    """The answers made so far; a line cut short by a crash is left out (the rerun makes it again)."""
    path = folder / ANSWERS_FILE
    if not path.exists():
        return []
    answers = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            answers.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return answers


def grow(target_name: str, folder: Path, config: TextsConfig, progress: Progress = print) -> list[list[int]]:
    """Answer requests until the answers hold `config.tokens` tokens; return every answer's ids."""
    if config.threads:
        pin_threads(config.threads)
    folder.mkdir(parents=True, exist_ok=True)
    target = load_model(target_name, LoadOptions(device="cpu", backend=config.backend), progress)
    answers = read_answers(folder)
    path = folder / ANSWERS_FILE
    if answers:  # drop a cut line, so appends start on a line of their own
        path.write_text("".join(json.dumps(a) + "\n" for a in answers), encoding="utf-8")
    progress("composing the requests (reads the documentation passages they quote: a few minutes)")
    asked = requests(config.seed)
    total = sum(len(a["ids"]) for a in answers)
    started, made = time.perf_counter(), 0
    decode = DecodeConfig(max_new_tokens=config.answer_tokens)
    with path.open("a", encoding="utf-8") as out:
        for number in range(len(answers), len(asked)):
            if total >= config.tokens:
                break
            ids = [
                event.token_id
                for event in generate(target, chat_ids(target, asked[number]), decode)
                if isinstance(event, TokenEvent) and event.state.kept
            ]
            out.write(json.dumps({"request": number, "ids": ids}) + "\n")
            out.flush()
            total += len(ids)
            made += len(ids)
            rate = made / (time.perf_counter() - started)
            progress(
                f"answer {number + 1}: {total:,} / {config.tokens:,} tokens, {rate:.0f} tokens/s, "
                f"about {max(0, config.tokens - total) / rate / 60:.0f} min left"
            )
    return [a["ids"] for a in read_answers(folder)]


def write_texts(answers: list[list[int]], tokenizer, out: Path) -> Path:
    """The answers as a suffix drafter's built-in texts for targets with this tokenizer."""
    path = out / f"{tokenizer_key(tokenizer)}.tokens"
    out.mkdir(parents=True, exist_ok=True)
    write_bytes(path, encode_texts([ids for ids in answers if ids]))
    return path


__all__ = ["TextsConfig", "default_folder", "grow", "read_answers", "requests", "write_texts"]
