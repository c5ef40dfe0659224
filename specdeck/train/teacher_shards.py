"""The teacher shards every trainer reads (`train-draft`, `train-head`, `train-cross-draft`): which
requests the target answers (composed instructions, documentation passages, code beginnings,
articles it writes and then reads) and which given text it scores, in what order, one shard per
batch (`specdeck.train.teacher`). A shard already on disk is never redone, so an interrupted run
resumes where it stopped.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specdeck.engine.forward.hf_parts import decode
from specdeck.engine.loading.models import LoadedModel
from specdeck.train.articles import article_instructions, reading_instruction
from specdeck.train.corpus import instructions
from specdeck.train.stdlib_text import code_prefixes, passage_instructions, stdlib_documents
from specdeck.train.teacher import Shard, chat_ids, generate_scored, load_shards, save_shard, score

if TYPE_CHECKING:
    from specdeck.train.train import TrainConfig

Progress = Callable[[str], None]


def _generation_jobs(target: LoadedModel, config: TrainConfig) -> list[list[list[int]]]:
    """Every prompt the target continues, as token ids, in batches of similar length (less padding)
    whose order mixes all kinds, so that any prefix of the jobs is a fair sample."""
    prompts = [chat_ids(target, text) for text in instructions(config.seed)[: config.answers]]
    prompts += [chat_ids(target, text) for text in passage_instructions(config.passages, config.seed)]
    prompts += [
        target.tokenizer(text, add_special_tokens=False)["input_ids"]
        for text in code_prefixes(config.code, config.seed)
    ]
    prompts = [p[-config.max_length :] for p in prompts]
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(config.seed)).tolist()
    batch, window = config.generation_batch, 4 * config.generation_batch
    jobs = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(prompts[i]))
        jobs += [[prompts[i] for i in chunk[j : j + batch]] for j in range(0, len(chunk), batch)]
    return jobs


def build_teacher_data(target: LoadedModel, folder: Path, config: TrainConfig, progress: Progress) -> Shard:
    """Generate and score the training text with the target, one shard per batch; skip shards
    already written."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, list]] = [("answers", job) for job in _generation_jobs(target, config)]
    documents = [
        chat_ids(target, question, text)[: config.max_length]
        for question, text in stdlib_documents(config.documents, config.seed)
    ]
    jobs += [
        ("documents", documents[i : i + config.batch_sequences])
        for i in range(0, len(documents), config.batch_sequences)
    ]
    started, made = time.perf_counter(), 0
    if config.teacher_shards:
        jobs = jobs[: config.teacher_shards]
    missing = [i for i in range(len(jobs)) if not (folder / f"shard-{i:05d}.pt").exists()]
    progress(f"teacher: the target writes {len(missing)} of {len(jobs)} shards")
    for index, (kind, items) in enumerate(jobs):
        path = folder / f"shard-{index:05d}.pt"
        if path.exists():
            continue
        if kind == "answers":
            shard = generate_scored(
                target,
                items,
                config.answer_tokens,
                greedy=index % config.sampled_every != 0,
                seed=config.seed + index,
                top_k=config.top_k,
            )
        else:
            shard = score(target, items, config.top_k)
        save_shard(shard, path)
        made += sum(len(t) for t in shard.top_ids)
        elapsed = time.perf_counter() - started
        done = missing.index(index) + 1
        progress(
            f"teacher {index + 1}/{len(jobs)} shards ({kind}), {made} target tokens, "
            f"{made / elapsed:.0f} tokens/s, {elapsed:.0f} s, "
            f"about {elapsed / done * (len(missing) - done) / 60:.0f} min left"
        )
    _article_shards(target, folder, config, progress)
    return load_shards(folder)


def _article_shards(target: LoadedModel, folder: Path, config: TrainConfig, progress: Progress) -> None:
    """Articles in two steps per batch: the target writes them (sampled, for variety), then answers a
    request to summarise, extract from or question each one (`reading_instruction`). Their shards
    are named after the others (`shard-articles-NNNNN-1-write.pt`, `...-2-read.pt`), so they sort
    after them and a later batch sorts after an earlier one."""
    requests = article_instructions(config.articles, config.seed)
    batch = config.generation_batch
    started = time.perf_counter()
    for number, start in enumerate(range(0, len(requests), batch)):
        chunk = requests[start : start + batch]
        write = folder / f"shard-articles-{number:05d}-1-write.pt"
        read = folder / f"shard-articles-{number:05d}-2-read.pt"
        if read.exists():
            continue
        requests_ids = [chat_ids(target, text) for _, text in chunk]
        if write.exists():
            written = Shard(**torch.load(write, weights_only=True))
        else:
            written = generate_scored(
                target,
                requests_ids,
                config.answer_tokens,
                greedy=False,
                seed=config.seed + 7919 * (number + 1),
                top_k=config.top_k,
            )
            save_shard(written, write)
        topics = {tuple(ids): topic for ids, (topic, _) in zip(requests_ids, chunk)}
        rng = random.Random(config.seed * 1009 + number)
        prompts = []
        for ids, first in zip(written.ids, written.first):
            # at most max_length tokens of article, so a long one cannot push the request out of the prompt
            article = decode(target.tokenizer, ids[first + 1 :][: config.max_length].tolist(), skip_special_tokens=True)
            if len(article) >= config.min_article_chars:
                topic = topics.get(tuple(ids[: first + 1].tolist()), "it")
                prompts.append(chat_ids(target, reading_instruction(topic, article, rng)))
        if prompts:
            save_shard(
                generate_scored(
                    target,
                    prompts,
                    config.answer_tokens,
                    greedy=number % config.sampled_every != 0,
                    seed=config.seed + 7919 * (number + 1) + 1,
                    top_k=config.top_k,
                ),
                read,
            )
        progress(
            f"articles {min(start + batch, len(requests))}/{len(requests)} written and read, "
            f"{time.perf_counter() - started:.0f} s"
        )
