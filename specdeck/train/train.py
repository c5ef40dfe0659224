"""Distil a draft from a target (Hinton et al. 2015; for drafts, Zhou et al. 2024, DistillSpec).

Two stages, both resumable from what they left in the output folder:
1. teacher: the target scores chat-formatted text (teacher forcing) and its top-k next-token
   log-probabilities are stored in shards (`specdeck.train.teacher_shards`, `specdeck.train.teacher`);
2. student: the draft minimises the cross-entropy to the target's distribution at temperature 1,
   -sum_i p_i log q_i over the stored top-k tokens (p renormalised over them), which is the
   forward KL(p || q) up to a constant. Greedy speculative decoding accepts a draft token when
   the draft's argmax equals the target's, so the held-out top-1 agreement is reported as the
   figure to watch.
Training runs the loop it shares with the feature head (`specdeck.train.loop`), which resumes
exactly where it stopped.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specdeck.engine.atomic import building_folder
from specdeck.engine.cores import pin_threads
from specdeck.engine.forward.hf_parts import input_embedding, output_projection
from specdeck.engine.loading.models import (
    OUTPUT_TOKENS_FILE,
    TOKENIZER_REFERENCE_FILE,
    LoadOptions,
    load_model,
    locate,
)
from specdeck.engine.loading.registry import BUILTIN_MODELS
from specdeck.train.corpus import SOURCES
from specdeck.train.loop import HeldOut, batches, split_rows, train_loop
from specdeck.train.student import DraftShape, build_draft
from specdeck.train.teacher import Shard
from specdeck.train.teacher_shards import build_teacher_data

Progress = Callable[[str], None]
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


@dataclass(frozen=True)
class TrainConfig:
    shape: DraftShape = field(default_factory=DraftShape)
    seed: int = 0
    answers: int = 0  # chat instructions the target answers itself
    passages: int = 0  # documentation passages the target summarises or answers questions on
    code: int = 0  # code beginnings the target continues without a chat template
    articles: int = 0  # articles the target writes, then reads back (summary, extraction, questions)
    min_article_chars: int = 200  # a shorter article (the target stopped early) is not given back to read
    answer_tokens: int = 192
    generation_batch: int = 128
    sampled_every: int = 4  # every n-th generation batch samples at temperature 0.7, the rest is greedy
    documents: int = 0  # standard-library passages the target scores as given text
    teacher_dtype: str = "bfloat16"  # the target's dtype while it writes and scores
    teacher_shards: int = 0  # stop the teacher after this many shards and train on them (0: all)
    output_vocab: int = 8192  # the tokens the draft may propose: the teacher's most likely ones (0: all)
    bfloat16: bool = True  # train under bfloat16 autocast (float32 weights and optimizer)
    max_length: int = 256
    top_k: int = 64
    steps: int = 400
    batch_sequences: int = 8
    lr: float = 2e-3
    warmup: int = 20
    train_embedding: bool = False
    eval_every: int = 25
    threads: int = 0  # 0: torch's default


def _collate(data: Shard, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded inputs, the teacher's top-k ids and probabilities, and the mask of real positions."""
    width = max(len(data.ids[r]) - 1 for r in rows)
    k = data.top_ids[rows[0]].shape[1]
    inputs = torch.zeros(len(rows), width, dtype=torch.long)
    top_ids = torch.zeros(len(rows), width, k, dtype=torch.long)
    top_p = torch.zeros(len(rows), width, k)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        n, first = len(data.ids[r]) - 1, data.first[r]
        inputs[i, :n] = data.ids[r][:n].long()
        top_ids[i, first:n] = data.top_ids[r].long()
        p = data.top_logp[r].float().exp()
        top_p[i, first:n] = p / p.sum(-1, keepdim=True)
        mask[i, first:n] = True
    return inputs, top_ids, top_p, mask


def choose_output_ids(data: Shard, rows: list[int], size: int, vocab: int, always: set[int]) -> torch.Tensor:
    """The `size` tokens with the most teacher probability over `rows` (plus `always`, e.g. EOS):
    the only tokens the draft will propose."""
    mass = torch.zeros(vocab)
    for r in rows:
        mass.index_add_(0, data.top_ids[r].flatten().long(), data.top_logp[r].float().exp().flatten())
    ids = set(mass.topk(min(size, vocab)).indices.tolist()) | always
    return torch.tensor(sorted(ids), dtype=torch.long)


def distill_loss(
    model, inputs, top_ids, top_p, mask, output_ids: torch.Tensor | None = None, bfloat16: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy to the teacher's top-k distribution, and whether the argmaxes agree, at every
    position that has a teacher distribution. The batch is right-padded, which a causal model never
    sees from earlier positions, so no attention mask is needed; the output layer, the costliest
    part of a small draft, runs on the target positions only, and only over `output_ids` when given
    (teacher mass outside them is dropped and the rest renormalised)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
        hidden = model.model(input_ids=inputs).last_hidden_state[mask]
        weight = model.lm_head.weight
        targets, p = top_ids[mask], top_p[mask]
        if output_ids is not None:
            weight = weight[output_ids]
            index = torch.full((model.lm_head.weight.shape[0],), -1, dtype=torch.long)
            index[output_ids] = torch.arange(len(output_ids))
            top1 = targets[:, 0]
            targets = index[targets]
            p = p * (targets >= 0)
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
            targets = targets.clamp_min(0)
        logits = torch.nn.functional.linear(hidden, weight)
    logq = torch.log_softmax(logits.float(), dim=-1)
    ce = -(p * logq.gather(-1, targets)).sum(-1)
    guess = logits.argmax(-1)
    if output_ids is not None:
        agree = (output_ids[guess] == top1).float()
    else:
        agree = (guess == targets[:, 0]).float()
    return ce.mean(), agree


@torch.no_grad()
def evaluate(
    model, data: Shard, rows: list[int], batch: int, output_ids: torch.Tensor | None = None, bfloat16: bool = False
) -> tuple[float, float]:
    """Mean loss and top-1 agreement with the teacher over `rows`, per position."""
    model.eval()
    losses, agrees = [], []
    for i in range(0, len(rows), batch):
        loss, agree = distill_loss(model, *_collate(data, rows[i : i + batch]), output_ids, bfloat16)
        losses.append(loss.item() * len(agree))
        agrees.append(agree)
    model.train()
    agree = torch.cat(agrees)
    return sum(losses) / max(1, len(agree)), agree.mean().item()


def export_draft(
    model,
    target_name: str,
    target_source: str,
    folder: Path,
    card: str | None = None,
    output_ids: torch.Tensor | None = None,
) -> None:
    """Save the draft in float16 safetensors with its tokenizer (a copy of the target's files, or
    a reference to a built-in target), the model card, and the tokens it proposes from
    (`output_tokens.json`) if they are a subset."""
    with building_folder(folder) as staging:  # a reader never loads half a draft
        copy.deepcopy(model).to(torch.float16).save_pretrained(staging)  # the training copy stays float32
        if output_ids is not None:
            (staging / OUTPUT_TOKENS_FILE).write_text(json.dumps({"token_ids": output_ids.tolist()}), encoding="utf-8")
        if card is not None:
            (staging / "README.md").write_text(card, encoding="utf-8")
        if target_name in BUILTIN_MODELS:  # the target ships with SpecDeck: name it rather than copy its tokenizer
            (staging / TOKENIZER_REFERENCE_FILE).write_text(json.dumps({"model": target_name}), encoding="utf-8")
            return
        for name in TOKENIZER_FILES:
            if (Path(target_source) / name).exists():
                shutil.copy(Path(target_source) / name, staging / name)


def model_card(
    target_name: str,
    config: TrainConfig,
    teacher_tokens: int,
    sequences: int,
    step: int,
    held_agree: float,
    output_ids: torch.Tensor | None,
) -> str:
    """What the draft is, what it learnt from (with licenses) and how to make it again."""
    shape = config.shape
    sources = "\n".join(f"- {name}: {text}" for name, text in SOURCES.items())
    head = f"{len(output_ids)} tokens (`{OUTPUT_TOKENS_FILE}`)" if output_ids is not None else "the full vocabulary"
    return f"""# Draft model distilled from {target_name}

A small Llama (`LlamaForCausalLM`) that proposes tokens for {target_name} in speculative decoding.
It shares the target's tokenizer and vocabulary.

## Architecture
{shape.layers} layers, hidden size {shape.hidden}, MLP {shape.intermediate}, head size {shape.head_dim},
tied input/output embedding initialised as the target's embedding projected on its {shape.hidden}
leading principal directions ({"trained" if config.train_embedding else "frozen"}). The drafter proposes only
from {head}: the target's most likely tokens in the training text; q = 0 elsewhere keeps
rejection sampling exact.

## Training
Distillation (forward KL to the target's next-token distribution at temperature 1, its top-{config.top_k}
renormalised) on {sequences} sequences holding {teacher_tokens} target positions; {step} steps of
{config.batch_sequences} sequences, AdamW, lr {config.lr}, seed {config.seed}. Top-1 agreement with the
target on held-out sequences (every 20th, never trained on): {held_agree:.3f}.

Settings: `{json.dumps(asdict(config))}`

## Data
{sources}
No benchmark prompts were used.
"""


def train_draft(
    target_name: str,
    out: Path,
    config: TrainConfig,
    resume: bool = False,
    progress: Progress = print,
    until: int | None = None,
) -> Path:
    """Run both stages into `out`; return the folder of the exported draft (`out/draft`): the
    checkpoint with the best held-out top-1 agreement so far.

    `until` stops this call after that step (a checkpoint is written there) without changing the
    learning-rate schedule, which always spans `config.steps`."""
    if config.threads:
        pin_threads(config.threads)
    out.mkdir(parents=True, exist_ok=True)
    target = load_model(target_name, LoadOptions(device="cpu", dtype=config.teacher_dtype), progress)
    data = build_teacher_data(target, out / "teacher", config, progress)
    draft = build_draft(target, config.shape, config.seed)
    input_embedding(draft).weight.requires_grad_(config.train_embedding)
    source = locate(target_name)
    count = len(data.ids)
    held_out_rows, training = split_rows(count)
    vocab = output_projection(draft).weight.shape[0]
    output_ids = None
    if 0 < config.output_vocab < vocab:
        output_ids = choose_output_ids(data, training, config.output_vocab, vocab, set(target.eos_ids))
    del target
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0, betas=(0.9, 0.98))
    teacher_tokens = sum(len(t) for t in data.top_ids)

    def batch_loss(rows: list[int], step: int) -> tuple[torch.Tensor, str]:
        loss, agree = distill_loss(draft, *_collate(data, rows), output_ids, config.bfloat16)
        return loss, f"{agree.mean().item():.3f}"

    def held_out(step: int) -> HeldOut:
        loss, agree = evaluate(draft, data, held_out_rows, config.batch_sequences, output_ids, config.bfloat16)
        progress(f"held-out loss {loss:.3f} top-1 agreement {agree:.3f}")
        return HeldOut(agree)

    def export(step: int, held: HeldOut) -> None:
        card = model_card(target_name, config, teacher_tokens, count, step, held.agreement, output_ids)
        export_draft(draft, target_name, source, out / "draft", card=card, output_ids=output_ids)

    train_loop(
        draft,
        optimizer,
        config,
        training,
        count,
        out / "checkpoint.pt",
        epoch_batches=lambda epoch: batches(len(training), config.batch_sequences, config.seed, epoch),
        batch_loss=batch_loss,
        evaluate=held_out,
        export=export,
        floor=0.1,
        resume=resume,
        progress=progress,
        until=until,
    )
    return out / "draft"
