"""Benchmark prompt files, recognised from their fields.

- Spec-Bench jsonl (Xia et al. 2024): `turns` are the prompts of one conversation, `category` its
  category; sent through the chat template, each later turn after the answers to the earlier ones.
- HumanEval jsonl (Chen et al. 2021): `prompt` is a function signature and docstring, completed raw
  (no chat template), category `humaneval`.
- Anything else: one prompt per non-empty line, category `text`, through the chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdeck.engine.bounded import read_file
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.resources import resource_path


@dataclass(frozen=True)
class BenchPrompt:
    name: str  # where it came from: question_id, task_id or line number
    category: str
    text: str  # the first turn
    chat: bool  # False: raw completion, no chat template
    later_turns: tuple[str, ...] = ()  # asked in the same conversation, after the answers to the earlier ones

    @property
    def turns(self) -> tuple[str, ...]:
        return (self.text, *self.later_turns)


BUNDLED = {"spec-bench": "spec_bench_sample.jsonl", "humaneval": "humaneval_sample.jsonl", "refine": "refine.jsonl"}


def sample_prompts() -> Path:
    """The bundled Spec-Bench sample: a few prompts per category, so `bench` runs anywhere."""
    return resource_path("bench", BUNDLED["spec-bench"])


def prompts_path(name: str) -> Path:
    """A prompt file by path, or a bundled set by name (spec-bench, humaneval, refine)."""
    return resource_path("bench", BUNDLED[name]) if name in BUNDLED else Path(name)


def _kind(value: object) -> str:
    """A JSON value's kind as a user reads it: 'a dict', 'a number', 'an empty list'."""
    if isinstance(value, dict):
        return "a dict"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    return "an empty string" if value == "" else "a string"


def _from_record(record: dict, path: Path, line_no: int) -> BenchPrompt:
    """The prompt of one JSON line; errors name the file, the line and the field."""
    where = f"{path}, line {line_no}"
    if "turns" in record:
        turns = record["turns"]
        if not (isinstance(turns, list) and turns):
            raise SpecDeckError(
                f"{where}: field `turns` must be a list of prompt texts (Spec-Bench), got {_kind(turns)}."
            )
        for number, turn in enumerate(turns, start=1):
            if not (isinstance(turn, str) and turn.strip()):
                raise SpecDeckError(
                    f"{where}: field `turns` must be a list of prompt texts (Spec-Bench), "
                    f"got a list whose {'first turn' if number == 1 else f'turn {number}'} is {_kind(turn)}."
                )
        return BenchPrompt(
            str(record.get("question_id", line_no)),
            str(record.get("category", "spec-bench")),
            turns[0],
            chat=True,
            later_turns=tuple(turns[1:]),
        )
    if "prompt" in record:
        prompt = record["prompt"]
        if not (isinstance(prompt, str) and prompt.strip()):
            raise SpecDeckError(f"{where}: field `prompt` must be the prompt's text (HumanEval), got {_kind(prompt)}.")
        return BenchPrompt(str(record.get("task_id", line_no)), "humaneval", prompt, chat=False)
    raise SpecDeckError(
        f"{where} is a JSON record without `turns` (Spec-Bench) or `prompt` (HumanEval): "
        f"it has {', '.join(sorted(record)) or 'no fields'}."
    )


MOST_PROMPT_BYTES = 64 * 2**20  # a prompt file is read whole: a larger one is a mistake, not prompts


def read_prompt_text(path: Path) -> str:
    """A prompt file's text: UTF-8, with or without a byte-order mark (as Windows editors write), or
    a `SpecDeckError` that names the file and what is wrong: unreadable, too large to be prompts
    (`MOST_PROMPT_BYTES`, checked before reading and while reading), or where its text stops being UTF-8."""
    try:
        size = path.stat().st_size
        if size > MOST_PROMPT_BYTES:
            raise SpecDeckError(
                f"The prompt file {path} is {size / 2**20:.0f} MiB: SpecDeck reads prompt files of up to "
                f"{MOST_PROMPT_BYTES // 2**20} MiB whole. Pick the file you meant, or split it."
            )
        return read_file(path, MOST_PROMPT_BYTES, "The prompt file").decode("utf-8-sig")
    except OSError as error:
        raise SpecDeckError(f"Cannot read the prompt file {path}: {error.strerror}.") from error
    except UnicodeDecodeError as error:
        raise SpecDeckError(
            f"The prompt file {path} is not UTF-8 text: byte 0x{error.object[error.start]:02x} at offset "
            f"{error.start} is not valid UTF-8. Save the file as UTF-8 (most editors offer it under "
            "'Save as' or 'Encoding') and try again."
        ) from error


def read_prompts(path: str | Path, categories: list[str] | None = None, limit: int | None = None) -> list[BenchPrompt]:
    """The prompts of a file (or of a bundled set, by name), in file order; with `limit`, at most
    that many per category."""
    path = prompts_path(str(path))
    lines = read_prompt_text(path).splitlines()
    prompts: list[BenchPrompt] = []
    records = next((line.lstrip().startswith("{") for line in lines if line.strip()), False)
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if records and not line.lstrip().startswith("{"):
            # a JSON lines file's stray line (a note, a half-pasted record) would be timed as a prompt
            raise SpecDeckError(
                f"{path}, line {line_no}: not a JSON record, while the file's first prompt is one. "
                "Keep a prompt file either JSON lines or one plain prompt per line."
            )
        if records:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise SpecDeckError(f"{path}, line {line_no}: not valid JSON ({error.msg}).") from error
            if not isinstance(record, dict):
                raise SpecDeckError(f"{path}, line {line_no}: expected one JSON object per line.")
            prompts.append(_from_record(record, path, line_no))
        else:
            prompts.append(BenchPrompt(f"line {line_no}", "text", line.strip(), chat=True))
    found = sorted({p.category for p in prompts})
    if categories:
        unknown = [c for c in categories if c not in found]
        if unknown:
            raise SpecDeckError(f"No prompts of category {', '.join(unknown)} in {path}: it has {', '.join(found)}.")
        prompts = [p for p in prompts if p.category in categories]
    if limit is not None:
        if limit < 1:
            raise SpecDeckError(f"--limit must be at least 1 (got {limit}).")
        taken: dict[str, int] = {}
        kept = []
        for prompt in prompts:
            taken[prompt.category] = taken.get(prompt.category, 0) + 1
            if taken[prompt.category] <= limit:
                kept.append(prompt)
        prompts = kept
    if not prompts:
        raise SpecDeckError(f"{path} holds no prompts.")
    return prompts
