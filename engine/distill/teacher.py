"""The teacher's side of distillation: the target answers instructions, then scores text.

Scoring is teacher forcing: one batched forward over a whole sequence gives the target's
next-token distribution (temperature 1) at every position, far cheaper than generating. Only the
top `top_k` log-probabilities per position are kept, in shards on disk, so the expensive forward
runs once however many epochs the draft trains for. A finished shard is never redone, so an
interrupted run resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.models import LoadedModel, encode_prompt


@dataclass
class Shard:
    """Scored sequences: `ids[i]` (L,), and for positions 0..L-2 the teacher's top-k next tokens."""

    ids: list[torch.Tensor]
    top_ids: list[torch.Tensor]  # (L-1, k) int32
    top_logp: list[torch.Tensor]  # (L-1, k) float16, log-probabilities under the target


def chat_ids(target: LoadedModel, instruction: str, answer: str | None = None) -> list[int]:
    """The instruction through the target's chat template, with `answer` as the reply if given."""
    ids = encode_prompt(target.tokenizer, instruction, chat=True)
    if answer is not None:
        ids += target.tokenizer(answer, add_special_tokens=False)["input_ids"] + sorted(target.eos_ids)[:1]
    return ids


@torch.inference_mode()
def answer(target: LoadedModel, instructions: Sequence[str], max_new_tokens: int, greedy: bool,
           seed: int) -> list[list[int]]:
    """The target's own replies (prompt + answer ids), generated in one left-padded batch."""
    prompts = [chat_ids(target, text) for text in instructions]
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else sorted(target.eos_ids)[0]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    torch.manual_seed(seed)
    out = target.model.generate(
        input_ids=input_ids.to(target.device), attention_mask=mask.to(target.device),
        max_new_tokens=max_new_tokens, do_sample=not greedy, temperature=0.7 if not greedy else None,
        top_p=None, top_k=None, pad_token_id=pad, eos_token_id=sorted(target.eos_ids),
    )
    sequences = []
    for row, ids in enumerate(prompts):
        new = out[row, width:].tolist()
        for i, token in enumerate(new):
            if token in target.eos_ids:
                new = new[: i + 1]
                break
        sequences.append(ids + new)
    return sequences


@torch.inference_mode()
def score(target: LoadedModel, sequences: Sequence[list[int]], top_k: int) -> Shard:
    """The target's top-k next-token log-probabilities at every position (right-padded batch:
    padding after a sequence cannot change what a causal model computes for it)."""
    width = max(len(s) for s in sequences)
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    logits = target.model(input_ids=input_ids.to(target.device), attention_mask=mask.to(target.device)).logits
    shard = Shard([], [], [])
    for row, ids in enumerate(sequences):
        logp = torch.log_softmax(logits[row, : len(ids) - 1].float(), dim=-1)
        values, indices = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
        shard.ids.append(torch.tensor(ids, dtype=torch.int32))
        shard.top_ids.append(indices.to(torch.int32).cpu())
        shard.top_logp.append(values.to(torch.float16).cpu())
    return shard


def save_shard(shard: Shard, path: Path) -> None:
    partial = path.with_suffix(".partial")
    torch.save({"ids": shard.ids, "top_ids": shard.top_ids, "top_logp": shard.top_logp}, partial)
    partial.replace(path)


def load_shards(folder: Path) -> Shard:
    merged = Shard([], [], [])
    for path in sorted(folder.glob("shard-*.pt")):
        data = torch.load(path, weights_only=True)
        merged.ids += data["ids"]
        merged.top_ids += data["top_ids"]
        merged.top_logp += data["top_logp"]
    return merged
