"""The teacher data of a feature head: the target's hidden states over text, in shards on disk that a
background job grows (`specdeck head-data`) and `specdeck train-head --data` learns from.

A head learns from pairs (the target's states at token i, token i+1) to predict the target's next
distribution softmax(W f_{i+1}), W the output layer and f its final (normalised) state. Those labels
need only f, so a shard stores, per position, the final state and the residual streams after a few
earlier layers (`layers`: low and middle features, which an EAGLE-3 head fuses, Li et al. 2025), in
bfloat16: (positions, len(layers) + 1, hidden). Two kinds of text, interleaved:
- existing text (`specdeck.train.texts`): teacher forcing, one batched forward per shard, no generation;
- the target's own answers (every `answer_every`-th shard): batched generation, then the same forward.
Every 20th sequence of a shard is held out (never trained on). The job is resumable: the plan (the
tokenised text) is written once, and a shard on disk is never made again. `manifest.json` lists each
shard's positions per source, and every source's license.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.cache import cache_root
from specdeck.engine.cores import pin_threads
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model
from specdeck.train.corpus import instructions
from specdeck.train.lexicon import lexicon_requests
from specdeck.train.stdlib_text import code_prefixes
from specdeck.train.teacher import chat_ids, generate_scored
from specdeck.train.texts import TEXT_SOURCES, existing_exchanges, reading_requests
from specdeck.train.turns import one_turn_requests

Progress = Callable[[str], None]
HELD_OUT_EVERY = 20  # sequence j of a shard is held out when j % 20 == 0


@dataclass(frozen=True)
class ForcingConfig:
    seed: int = 0
    positions: int = 10_000_000  # the job stops when the shards hold this many
    layers: tuple[int, ...] = (3, 15)  # residual streams after this many decoder layers, kept beside the final state
    max_length: int = 1024  # tokens of an existing-text sequence, prompt included
    shard_sequences: int = 160  # existing-text sequences per shard
    batch_tokens: int = 8192  # tokens per forward
    answer_every: int = 3  # every n-th shard holds the target's own answers (0: none)
    answer_batch: int = 64  # prompts the target answers at once
    answer_tokens: int = 320
    code_prefixes: int = 1500  # function beginnings the target continues as raw code, beside the chat requests
    lexicon_requests: int = 40_000  # requests composed from WordNet's everyday nouns (`specdeck.train.lexicon`)
    reserve_gb: float = 8.0  # stop while this much disk is still free
    dtype: str = "bfloat16"
    threads: int = 0


def default_folder(target_name: str) -> Path:
    return cache_root() / "teacher-head" / target_name.replace("/", "--")


@torch.inference_mode()
def target_states(
    target: LoadedModel, sequences: list[list[int]], layers: tuple[int, ...], batch_tokens: int
) -> list[torch.Tensor]:
    """Per sequence, (L, len(layers) + 1, hidden) bfloat16: the residual stream after each of
    `layers` decoder layers, then the final norm's output. Right-padded batches of similar length
    (padding after a sequence cannot change what a causal model computes for it)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    states: list[torch.Tensor | None] = [None] * len(sequences)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(sequences[order[end]]) <= batch_tokens:
            end += 1
        batch = order[start:end]
        width = max(len(sequences[i]) for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
        hidden = target.torch_model.base_model(input_ids=ids.to(target.device), output_hidden_states=True).hidden_states
        stacked = torch.stack([hidden[t] for t in layers] + [hidden[-1]], dim=2).to(torch.bfloat16).cpu()
        for row, i in enumerate(batch):
            states[i] = stacked[row, : len(sequences[i])].clone()
        start = end
    return states  # type: ignore[return-value]


def plan_text(target: LoadedModel, folder: Path, config: ForcingConfig, progress: Progress) -> dict:
    """The tokenised existing text and the requests the target answers, made once per folder: the
    requests composed from WordNet (`specdeck.train.lexicon`) shuffled in with the others, so any
    prefix asks every kind. A plan made before them gains them, shuffled in likewise (the answers
    already made are told apart by their requests, not by their places: `specdeck.train.stream_text.own_answers`)."""
    path = folder / "plan.pt"
    if path.exists():
        plan = torch.load(path, weights_only=True)
        if "lexicon_requests" in plan:
            return plan
        progress("adding the requests composed from WordNet to the plan (once per folder)")
    else:
        progress("reading and tokenising the existing text (once per folder)")
        plan = _first_plan(target, config)
    composed = lexicon_requests(config.lexicon_requests, config.seed)
    if not composed:
        progress("WordNet (Debian's wordnet-base) is not installed: the plan has no requests composed from it")
    plan["requests"] = list(plan["requests"]) + [torch.tensor(chat_ids(target, r), dtype=torch.int32) for r in composed]
    random.Random(config.seed + 13).shuffle(plan["requests"])
    plan["lexicon_requests"] = len(composed)
    write_with(path, lambda temporary: torch.save(plan, temporary))
    return plan


def _first_plan(target: LoadedModel, config: ForcingConfig) -> dict:
    """The existing text and the requests composed from the topic lists and the documentation."""
    exchanges = existing_exchanges(config.seed)
    requests = instructions(config.seed) + reading_requests(exchanges, config.seed)
    requests += one_turn_requests(exchanges, config.seed)
    prompts = [chat_ids(target, r) for r in requests]
    # code completion is asked without a chat template: the beginning of a function to continue
    prompts += [
        target.tokenizer(text, add_special_tokens=False)["input_ids"]
        for text in code_prefixes(config.code_prefixes, config.seed)
    ]
    random.Random(config.seed + 11).shuffle(prompts)
    return {
        "sources": [e.source for e in exchanges],
        "sequences": [
            torch.tensor(chat_ids(target, e.instruction, e.answer)[: config.max_length], dtype=torch.int32)
            for e in exchanges
        ],
        "firsts": [len(chat_ids(target, e.instruction)) - 1 for e in exchanges],
        "requests": [torch.tensor(ids, dtype=torch.int32) for ids in prompts],
    }


def _shard_text(plan: dict, number: int, config: ForcingConfig, target: LoadedModel):
    """(sources, sequences, firsts) of shard `number`, or None once the existing text is used up."""
    every = config.answer_every
    if every and number % every == every - 1:
        g = number // every
        requests = plan["requests"]
        chunk = [requests[(g * config.answer_batch + j) % len(requests)].tolist() for j in range(config.answer_batch)]
        made = generate_scored(
            target, chunk, config.answer_tokens, greedy=g % 4 != 3, seed=config.seed + 7919 * g, top_k=1
        )
        return ["target-answers"] * len(made.ids), [ids.tolist() for ids in made.ids], made.first
    f = number - (number // every if every else 0)
    rows = range(f * config.shard_sequences, min((f + 1) * config.shard_sequences, len(plan["sequences"])))
    if not rows:
        return None
    return (
        [plan["sources"][r] for r in rows],
        [plan["sequences"][r].tolist() for r in rows],
        [min(plan["firsts"][r], len(plan["sequences"][r]) - 2) for r in rows],
    )


def grow(target_name: str, folder: Path, config: ForcingConfig, progress: Progress = print) -> Path:
    """Add shards to `folder` until it holds `config.positions` positions, the text runs out, or the
    disk's free space falls to `config.reserve_gb`; return the folder."""
    if config.threads:
        pin_threads(config.threads)
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    settings = {
        "target": target_name,
        "layers": list(config.layers),
        "seed": config.seed,
        "max_length": config.max_length,
        "shard_sequences": config.shard_sequences,
        "answer_every": config.answer_every,
        "answer_batch": config.answer_batch,
    }
    if manifest and manifest["settings"] != settings:
        raise SpecDeckError(
            f"{folder} was made with other settings ({manifest['settings']}): grow it with those, "
            "or choose another --out."
        )
    manifest = manifest or {"settings": settings, "sources": TEXT_SOURCES, "shards": {}}
    target = load_model(target_name, LoadOptions(device="cpu", dtype=config.dtype), progress)
    if max(config.layers, default=0) >= target.model.config.num_hidden_layers:
        raise SpecDeckError(f"--layers must be below the target's {target.model.config.num_hidden_layers} layers.")
    plan = plan_text(target, folder, config, progress)
    total = sum(s["positions"] for s in manifest["shards"].values())
    started, made, number = time.perf_counter(), 0, 0
    while total < config.positions:
        path = folder / f"shard-{number:05d}.pt"
        if path.name in manifest["shards"] and path.exists():
            number += 1
            continue
        free = shutil.disk_usage(folder).free / 2**30
        if free < config.reserve_gb:
            progress(f"stopped: {free:.1f} GB free on the disk, under the {config.reserve_gb} GB reserve")
            break
        text = _shard_text(plan, number, config, target)
        if text is None:
            progress("stopped: the existing text is used up")
            break
        sources, sequences, firsts = text
        states = target_states(target, sequences, config.layers, config.batch_tokens)
        shard = {
            "ids": [torch.tensor(s, dtype=torch.int32) for s in sequences],
            "first": firsts,
            "sources": sources,
            "states": torch.cat(states),
            "layers": list(config.layers),
        }
        write_with(path, partial(torch.save, shard))
        positions = sum(len(s) for s in sequences)
        counts: dict[str, int] = {}
        for source, s in zip(sources, sequences):
            counts[source] = counts.get(source, 0) + len(s)
        manifest["shards"][path.name] = {"positions": positions, "sequences": len(sequences), "sources": counts}
        write_with(manifest_path, lambda temporary: Path(temporary).write_text(json.dumps(manifest, indent=1)))
        total += positions
        made += positions
        rate = made / (time.perf_counter() - started)
        progress(
            f"{path.name}: {total:,} / {config.positions:,} positions ({sources[0] if len(set(sources)) == 1 else 'text'}), "
            f"{rate:.0f} positions/s, about {max(0, config.positions - total) / rate / 3600:.1f} h left"
        )
        number += 1
    return folder


@dataclass
class Store:
    """The shards of a folder, memory-mapped: sequence r's ids, where its answer starts, its source,
    and its states (L, len(layers) + 1, hidden)."""

    ids: list[torch.Tensor]
    first: list[int]
    sources: list[str]
    held_out: list[bool]
    states: list[torch.Tensor]
    layers: tuple[int, ...]


def load_store(folder: Path) -> Store:
    store = Store([], [], [], [], [], ())
    manifest_path = folder / "manifest.json"
    if not manifest_path.exists():
        raise SpecDeckError(f"{folder} holds no head data: make it with `specdeck head-data --out {folder}`.")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    store.layers = tuple(manifest["settings"]["layers"])
    for name in sorted(manifest["shards"]):
        shard = torch.load(folder / name, weights_only=True, mmap=True)
        offset = 0
        for j, (ids, first, source) in enumerate(zip(shard["ids"], shard["first"], shard["sources"])):
            store.ids.append(ids)
            store.first.append(first)
            store.sources.append(source)
            store.held_out.append(j % HELD_OUT_EVERY == 0)
            store.states.append(shard["states"][offset : offset + len(ids)])
            offset += len(ids)
    return store


__all__ = ["ForcingConfig", "Store", "default_folder", "grow", "load_store", "plan_text", "target_states"]
