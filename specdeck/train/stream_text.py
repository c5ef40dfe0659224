"""The text a feature head trains on while the target computes its states per batch
(`specdeck.train.stream`), made once per output folder and resumable:
- `plan.pt`: given text (`specdeck.train.texts`, each passage framed as a chat answer) and the
  requests the target answers, tokenised (`specdeck.train.forcing`'s plan);
- `answers.pt`: the target's own answers to those requests, generated in batches (three of four
  greedy, the fourth sampled), each batch saved as it lands; then second turns, a follow-up on an
  own answer, answered too.
Own answers are what the head drafts on, so each appears `own_repeat` times per epoch beside the
given text. One sequence in 20 is held out, by kind: own answers by their place in `answers.pt`
(`held_out_own`), the rest by its content, which survives a plan made on a machine with other text
and answers added before the second turns.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.loading.models import LoadedModel
from specdeck.train.forcing import HELD_OUT_EVERY, ForcingConfig, plan_text
from specdeck.train.head import HeadConfig
from specdeck.train.teacher import Shard, chat_ids, generate_scored
from specdeck.train.turns import FOLLOW_UPS, second_turn_suffix

Progress = Callable[[str], None]
OWN = "target-answers"


@dataclass(frozen=True)
class StreamConfig:
    head: HeadConfig = field(default_factory=lambda: HeadConfig(feature_layers=(3, 15), unroll=3, feature_weight=0.0))
    device: str = "auto"
    dtype: str = "auto"  # the target's, while it computes states and answers
    answers: int = 4096  # own answers made before training starts
    answer_tokens: int = 320
    answer_batch: int = 64
    answer_group: int = 0  # requests generated together within a batch, alike in length (0: the whole batch)
    answer_minutes: float = 0.0  # stop making answers after this long (the rest on a later run); 0: no limit
    second_turns: int = 0  # then this many second turns: a follow-up on an own answer, answered too
    own_repeat: int = 2  # times each own answer appears per epoch
    copy_weight: float = 1.0  # the loss's weight on pairs prompt lookup could copy (the others: 1)
    max_length: int = 1024  # tokens of a given-text sequence, prompt included
    minutes: float = 0.0  # stop after this long (saved, resumable); 0: run to head.steps
    checkpoint_minutes: float = 5.0
    text_only: bool = False  # make the text (the plan, own answers, second turns) and stop before training
    text_from: int = 0  # the batch of the text's order that step 0 trains on (a head's earlier run took those before)


# Own answer k is held out when k % 20 == 12: the answers the first runs held out as rows (27,568
# given sequences came before them then), so that no answer those runs trained on is measured.
OWN_HELD_OUT_PLACE = 12


def held_out_by_content(ids: torch.Tensor) -> bool:
    """Whether a sequence is held out by a checksum of its tokens, one in 20."""
    return zlib.crc32(ids.to(torch.int32).numpy().tobytes()) % HELD_OUT_EVERY == 0


def held_out_own(answers: int, second_turns: list[torch.Tensor]) -> list[bool]:
    """Which own sequences are held out: the answers by their place, the second turns after them
    by their content (their places move as answers are added)."""
    return [k % HELD_OUT_EVERY == OWN_HELD_OUT_PLACE for k in range(answers)] + [
        held_out_by_content(ids) for ids in second_turns
    ]


@dataclass
class Text:
    """Sequences (given text first, then own answers), where each answer starts, and each source."""

    ids: list[torch.Tensor]
    first: list[int]
    sources: list[str]
    held: list[bool]  # held out, never trained on

    def rows(self, held_out: bool, own: bool) -> list[int]:
        return [r for r in range(len(self.ids)) if self.held[r] == held_out and (self.sources[r] == OWN) == own]


def own_answers(
    target: LoadedModel, folder: Path, plan: dict, config: StreamConfig, progress: Progress
) -> tuple[Shard, list[bool]]:
    """The target's answers to the plan's requests, `config.answers` of them (or those made within
    `config.answer_minutes`), kept in `answers.pt` after every batch; a rerun makes only the batches
    still missing. Each batch asks the requests answered least often so far: each once before any twice.
    Returned with the second turns after them, and which of all are held out."""
    path = folder / "answers.pt"
    made: dict[str, Any] = (
        torch.load(path, weights_only=True) if path.exists() else {"ids": [], "first": [], "batches": 0}
    )
    requests = [tuple(ids.tolist()) for ids in plan["requests"]]
    # an answer begins with its request: those already answered are told by their text, whatever the
    # plan's order was when they were made
    times = Counter(tuple(ids[: first + 1].tolist()) for ids, first in zip(made["ids"], made["first"]))
    batches = -(-config.answers // config.answer_batch)
    started, first_batch = time.perf_counter(), made["batches"]
    for g in range(made["batches"], batches):
        # the requests answered least often so far, in the plan's order (a sorted list keeps it for ties)
        asked = sorted(requests, key=times.__getitem__)[: config.answer_batch]
        times.update(asked)
        chunk = [list(r) for r in asked]
        shard = answer_in_groups(target, chunk, config, greedy=g % 4 != 3, seed=config.head.seed + 7919 * g)
        made["ids"] += shard.ids
        made["first"] += shard.first
        made["batches"] = g + 1
        write_with(path, partial(torch.save, made))
        rate = (time.perf_counter() - started) / (g + 1 - first_batch)
        progress(
            f"own answers: batch {g + 1}/{batches}, {len(made['ids'])} answers, "
            f"{sum(len(i) for i in made['ids']):,} tokens, about {rate * (batches - g - 1) / 60:.1f} min left"
        )
        if config.answer_minutes and time.perf_counter() - started >= config.answer_minutes * 60 and g + 1 < batches:
            progress(f"own answers: stopped after {config.answer_minutes:g} min as asked; a later run makes the rest")
            break
    else:
        second_turns(target, made, config, started, progress, save=partial(write_with, path, partial(torch.save, made)))
    second = made.get("second", {"ids": [], "first": []})
    shard = Shard(made["ids"] + second["ids"], [], [], made["first"] + second["first"])
    return shard, held_out_own(len(made["ids"]), second["ids"])


def answer_in_groups(
    target: LoadedModel, prompts: list[list[int]], config: StreamConfig, greedy: bool, seed: int
) -> Shard:
    """The target's answers to `prompts`, generated `config.answer_group` at a time, shortest prompts
    first (0: all at once). A batch is left-padded to its longest prompt and runs until its longest
    answer ends, so on a CPU, where every padded position costs, groups alike in length waste less."""
    group = config.answer_group or len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    shard = Shard([], [], [], [])
    for start in range(0, len(order), group):
        rows = [prompts[i] for i in order[start : start + group]]
        part = generate_scored(target, rows, config.answer_tokens, greedy=greedy, seed=seed + start, top_k=1)
        shard.ids.extend(part.ids)
        shard.first.extend(part.first)
    return shard


def second_turns(
    target: LoadedModel, made: dict, config: StreamConfig, started: float, progress: Progress, save: Callable[[], Any]
) -> None:
    """Up to `config.second_turns` second turns, in batches kept in `made["second"]` (`save` after
    each): an own answer that ended, a follow-up (`specdeck.train.turns.FOLLOW_UPS`) and the
    target's reply to it, which is what the head learns from (the first answer is learnt on its
    own)."""
    done = made.setdefault("second", {"ids": [], "first": [], "batches": 0})
    if not config.second_turns:
        return
    # the follow-up after each end token that closes an assistant turn (some tokenizers also count
    # their turn opening as an end token, which closes none)
    suffixes = {}
    for eos in sorted(target.eos_ids):
        asked = [second_turn_suffix(target.tokenizer, f, eos) for f in FOLLOW_UPS]
        if all(a is not None for a in asked):
            suffixes[eos] = asked
    if not suffixes:
        progress("second turns: the target's chat template does not continue a conversation here; none made")
        return
    opening = chat_ids(target, "?")[0]  # a conversation's first token; raw code completions have none
    ended = [ids.tolist() for ids in made["ids"] if int(ids[-1]) in suffixes and int(ids[0]) == opening]
    batches = -(-min(config.second_turns, len(ended)) // config.answer_batch)
    if done["batches"] >= batches:
        return
    random.Random(config.head.seed + 29).shuffle(ended)
    for g in range(done["batches"], batches):
        first_turns = ended[g * config.answer_batch : (g + 1) * config.answer_batch]
        chunk = [
            ids + suffixes[ids[-1]][(g * config.answer_batch + j) % len(FOLLOW_UPS)]
            for j, ids in enumerate(first_turns)
        ]
        shard = answer_in_groups(target, chunk, config, greedy=g % 4 != 3, seed=config.head.seed + 7927 * g)
        done["ids"] += shard.ids
        done["first"] += shard.first
        done["batches"] = g + 1
        save()
        progress(f"second turns: batch {g + 1}/{batches}, {len(done['ids'])} replies")
        if config.answer_minutes and time.perf_counter() - started >= config.answer_minutes * 60 and g + 1 < batches:
            progress(f"second turns: stopped after {config.answer_minutes:g} min as asked; a later run makes the rest")
            break


def stream_text(target: LoadedModel, folder: Path, config: StreamConfig, progress: Progress) -> Text:
    forcing = ForcingConfig(seed=config.head.seed, max_length=config.max_length)
    plan = plan_text(target, folder, forcing, progress)
    answers, held = (
        own_answers(target, folder, plan, config, progress) if config.answers else (Shard([], [], [], []), [])
    )
    return Text(
        list(plan["sequences"]) + answers.ids,
        [min(f, len(s) - 2) for f, s in zip(plan["firsts"], plan["sequences"])] + answers.first,
        list(plan["sources"]) + [OWN] * len(answers.ids),
        [held_out_by_content(ids) for ids in plan["sequences"]] + held,
    )
