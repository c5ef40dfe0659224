"""Train a feature head (`engine.heads`) for a target.

Three stages, each resumable from what it left in the output folder:
1. text: the target writes its own answers (the same teacher shards as `train-draft`, which a
   head can share with a draft: `--teacher DIR`);
2. features: one batched forward of the target over every sequence stores its last hidden state
   at every position (`features/`). The labels need nothing else: the target's next-token
   distribution at position i is its output layer applied to f_i;
3. head: for each pair (f_i, token i+1) the head predicts f_{i+1}. Loss: cross-entropy from the
   target's distribution softmax(W f_{i+1}) to the head's softmax(W f^_{i+1}) over the output
   tokens, plus a smooth-L1 pull of f^ towards f (EAGLE). Drafting feeds predicted states back in,
   so a second unrolled pass trains on the head's own predictions as inputs; noise on the input
   states makes it robust to the rest of the gap. The loop is the draft's (`engine.distill.loop`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.atomic import write_with
from engine.distill.corpus import SOURCES
from engine.distill.loop import HeldOut, split_rows, train_loop
from engine.distill.teacher import Shard, load_shards
from engine.distill.train import TrainConfig, build_teacher_data
from engine.errors import SpecDeckError
from engine.heads import FeatureHead, fingerprint, head_config, save_head
from engine.models import LoadedModel, LoadOptions, load_model

Progress = Callable[[str], None]


@dataclass(frozen=True)
class HeadConfig:
    seed: int = 0
    feature_dtype: str = "bfloat16"  # the target's dtype while it computes the states
    feature_batch_tokens: int = 8192
    output_vocab: int = 8192  # tokens the head may propose: the most frequent under the target
    intermediate: int = 0  # the head's MLP width (0: the target's)
    init_from_target: bool = True  # start the decoder layer as a copy of the target's last layer
    unroll: int = 2  # passes per step; pass n > 1 reads the states pass n-1 predicted
    noise: float = 0.05  # Gaussian noise on input states, relative to their RMS
    feature_weight: float = 0.5
    steps: int = 600
    batch_sequences: int = 16
    lr: float = 1e-3
    warmup: int = 30
    eval_every: int = 50
    bfloat16: bool = True
    threads: int = 0


@torch.inference_mode()
def extract_features(target: LoadedModel, data: Shard, folder: Path, batch_tokens: int,
                     progress: Progress) -> list[torch.Tensor]:
    """The target's last hidden state (bfloat16, (L, hidden)) for every sequence, computed once:
    parts of ~64k tokens already in `folder` are kept, so an interrupted run resumes and a grown
    teacher text (shards appended) only costs its new sequences."""
    folder.mkdir(parents=True, exist_ok=True)
    features: list[torch.Tensor | None] = [None] * len(data.ids)
    existing = sorted(folder.glob("part-*.pt"))
    for path in existing:
        saved = torch.load(path, weights_only=True)
        for r, states in zip(saved["rows"], saved["states"]):
            if r >= len(data.ids) or len(states) != len(data.ids[r]):
                raise SpecDeckError(f"The hidden states in {folder} belong to other teacher text (sequence {r} "
                                    "differs): delete that folder, or train into a new --out.")
            features[r] = states
    missing = sorted((i for i in range(len(data.ids)) if features[i] is None), key=lambda i: len(data.ids[i]))
    parts, part, size = [], [], 0
    for i in missing:
        part.append(i)
        size += len(data.ids[i])
        if size >= 65536:
            parts.append(part)
            part, size = [], 0
    if part:
        parts.append(part)
    started, done = time.perf_counter(), 0
    for number, rows in enumerate(parts, start=len(existing)):
        saved = {"rows": rows, "states": []}
        start = 0
        while start < len(rows):
            width = len(data.ids[rows[start]])
            end = start
            while end < len(rows) and (end - start + 1) * len(data.ids[rows[end]]) <= max(batch_tokens, width):
                end += 1
            batch = rows[start:end]
            width = max(len(data.ids[r]) for r in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            for j, r in enumerate(batch):
                ids[j, : len(data.ids[r])] = data.ids[r].long()
            hidden = target.model.base_model(input_ids=ids.to(target.device)).last_hidden_state
            saved["states"] += [hidden[j, : len(data.ids[r])].to(torch.bfloat16).cpu().clone()
                                for j, r in enumerate(batch)]
            start = end
        path = folder / f"part-{number:05d}.pt"
        write_with(path, lambda temporary: torch.save(saved, temporary))
        for r, states in zip(rows, saved["states"]):
            features[r] = states
        done += sum(len(data.ids[r]) for r in rows)
        elapsed = time.perf_counter() - started
        progress(f"features {number + 1 - len(existing)}/{len(parts)} new parts, {done / elapsed:.0f} tokens/s, "
                 f"{elapsed:.0f} s")
    return features  # type: ignore[return-value]


def frequent_tokens(data: Shard, rows: list[int], size: int, vocab: int, always: set[int]) -> torch.Tensor:
    """The `size` tokens the target writes most often in `rows` (plus `always`, e.g. EOS)."""
    counts = torch.zeros(vocab)
    for r in rows:
        counts.index_add_(0, data.ids[r].long(), torch.ones(len(data.ids[r])))
    ids = set(counts.topk(min(size, vocab)).indices.tolist()) | always
    return torch.tensor(sorted(ids), dtype=torch.long)


def build_head(target: LoadedModel, config: HeadConfig) -> FeatureHead:
    torch.manual_seed(config.seed)
    source = target.model.config
    head = FeatureHead(head_config(source, config.intermediate or None)).float()
    with torch.no_grad():
        body = target.model.base_model
        if config.init_from_target and not config.intermediate:
            head.body.layers[0].load_state_dict(body.layers[-1].state_dict())
        head.body.norm.weight.copy_(body.norm.weight)
        width = source.hidden_size
        head.fc.weight.mul_(0.5)
        head.fc.weight[:, :width] += torch.eye(width)  # start by passing the state through
    return head


def collate_pairs(data: Shard, features: list[torch.Tensor], rows: list[int], embedding: torch.Tensor):
    """Right-padded states (B, W, h), next-token embeddings for pairs (B, W-1, h), and the mask of the
    pairs that count: those in the answer. Pair i predicts the state after token i+1, which decides
    token i+2; the head drafts from the token after the target's first answer token on, so pairs
    before `first` (the prompt, which the head only reads) are left out of the loss."""
    width = max(len(data.ids[r]) for r in rows)
    hidden = embedding.shape[1]
    states = torch.zeros(len(rows), width, hidden)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for j, r in enumerate(rows):
        n = len(data.ids[r])
        states[j, :n] = features[r].float()
        ids[j, :n] = data.ids[r].long()
        mask[j, data.first[r]: n - 1] = True
    return states, embedding[ids[:, 1:]], mask


def head_loss(head: FeatureHead, states, embeds, mask, weight: torch.Tensor, config: HeadConfig,
              noise_seed: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss over every pass, and per pass whether the head's argmax equals the target's at each
    pair. With `noise_seed` (training) the input states get noise drawn from that seed."""
    truth = states[:, 1:]
    with torch.no_grad():
        p = torch.softmax(torch.nn.functional.linear(truth[mask], weight), dim=-1)
        best = p.argmax(-1)
    inputs = states[:, :-1]
    if noise_seed is not None and config.noise:
        noise = torch.randn(inputs.shape, generator=torch.Generator().manual_seed(noise_seed))
        inputs = inputs + noise * config.noise * inputs.pow(2).mean().sqrt()
    total, agreements = 0.0, []
    for step in range(config.unroll):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bfloat16):
            predicted = head(inputs, embeds)
            logits = torch.nn.functional.linear(predicted[mask], weight)
        logq = torch.log_softmax(logits.float(), dim=-1)
        ce = -(p * logq).sum(-1).mean()
        pull = torch.nn.functional.smooth_l1_loss(predicted[mask].float(), truth[mask])
        total = total + (ce + config.feature_weight * pull) / (step + 1)
        agreements.append((logits.argmax(-1) == best).float().detach())
        # the next pass reads, at pair i, the state this pass predicted at pair i-1
        inputs = torch.cat([states[:, :1], predicted[:, :-1].float()], dim=1)
    return total, agreements


def model_card(target_name: str, config: HeadConfig, head: FeatureHead, positions: int, sequences: int,
               step: int, agree: list[float], output_ids: torch.Tensor | None) -> str:
    sources = "\n".join(f"- {name}: {text}" for name, text in SOURCES.items())
    params = sum(p.numel() for n, p in head.named_parameters() if not n.startswith("body.embed_tokens"))
    vocab = f"{len(output_ids)} tokens (`output_tokens.json`)" if output_ids is not None else "the whole vocabulary"
    shape = head.config
    return f"""# Feature head for {target_name}

An EAGLE-style drafter (Li et al. 2024) for {target_name} in speculative decoding: from the
target's last hidden state and the next token's embedding it predicts the target's next hidden
state, and the target's own output layer turns that into draft tokens. It uses the target's
embedding and output layer, so it only works with {target_name}.

## Architecture
A linear map from 2 x {shape.hidden_size} to {shape.hidden_size}, one Llama decoder layer ({shape.num_attention_heads}
heads, {shape.num_key_value_heads} key/value heads, MLP {shape.intermediate_size}) with its own KV cache,
and a final RMSNorm; {params / 1e6:.1f}M parameters. It proposes only from {vocab}, the target's most
frequent tokens in the training text; q = 0 elsewhere keeps rejection sampling exact.

## Training
{sequences} sequences, {positions} positions: the target's own text from the sources below (the
teacher text of `specdeck train-draft`), with the target's hidden states computed once.
Loss per pair: cross-entropy to the target's next-token distribution over the output tokens plus
{config.feature_weight} x smooth-L1 to its next hidden state, over {config.unroll} unrolled passes (each
later pass reads the states the previous one predicted). {step} steps of {config.batch_sequences}
sequences, AdamW, lr {config.lr}, seed {config.seed}. Top-1 agreement with the target at the answer
positions of held-out sequences (every 20th, never trained on), per pass: {', '.join(f'{a:.3f}' for a in agree)}.

Settings: `{json.dumps(asdict(config))}`

## Data
{sources}
No benchmark prompts were used.
"""


@torch.no_grad()
def evaluate(head, data, features, rows, embedding, weight, config) -> list[float]:
    head.eval()
    totals: list[list[torch.Tensor]] = [[] for _ in range(config.unroll)]
    for i in range(0, len(rows), config.batch_sequences):
        _, agreements = head_loss(head, *collate_pairs(data, features, rows[i: i + config.batch_sequences], embedding),
                                  weight, config)
        for pass_no, agree in enumerate(agreements):
            totals[pass_no].append(agree)
    head.train()
    return [torch.cat(t).mean().item() for t in totals]


def train_head(target_name: str, out: Path, config: HeadConfig, text: TrainConfig | None = None,
               teacher: Path | None = None, resume: bool = False, progress: Progress = print,
               until: int | None = None) -> Path:
    """Train into `out`; return the exported head's folder (`out/head`): the checkpoint with the
    best held-out agreement of the first pass so far.

    The text is the teacher shards in `teacher` (default `out/teacher`), made first as `text`
    says when given (shards already there are kept)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    out.mkdir(parents=True, exist_ok=True)
    teacher = teacher or out / "teacher"
    target = load_model(target_name, LoadOptions(device="cpu", dtype=config.feature_dtype), progress)
    data = build_teacher_data(target, teacher, text, progress) if text else load_shards(teacher)
    if not data.ids:
        raise SpecDeckError(f"No teacher text in {teacher}: ask for some with --answers/--passages/--code, "
                            "or point --teacher at the shards of an earlier train-draft run.")
    features = extract_features(target, data, out / "features", config.feature_batch_tokens, progress)
    target.model.float()
    embedding = target.model.get_input_embeddings().weight.detach()
    vocab = target.model.get_output_embeddings().weight.shape[0]
    count = len(data.ids)
    held_out_rows, training = split_rows(count)
    output_ids = None
    if 0 < config.output_vocab < vocab:
        output_ids = frequent_tokens(data, training, config.output_vocab, vocab, set(target.eos_ids))
    full_weight = target.model.get_output_embeddings().weight.detach()
    weight = full_weight[output_ids] if output_ids is not None else full_weight
    head = build_head(target, config)
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0, betas=(0.9, 0.95))
    positions = sum(len(data.ids[r]) - 1 for r in range(count))

    def batch_loss(rows: list[int], step: int) -> tuple[torch.Tensor, str]:
        loss, agreements = head_loss(head, *collate_pairs(data, features, rows, embedding), weight, config,
                                     noise_seed=config.seed * 1_000_003 + step)
        return loss, " / ".join(f"{a.mean().item():.3f}" for a in agreements)

    def held_out() -> HeldOut:
        agree = evaluate(head, data, features, held_out_rows, embedding, weight, config)
        return HeldOut(agree[0], f"held-out top-1 agreement per pass {' / '.join(f'{a:.3f}' for a in agree)}",
                       tuple(agree))

    def export(step: int, held: HeldOut) -> None:
        card = model_card(target_name, config, head, positions, count, step, list(held.figures), output_ids)
        save_head(head, out / "head", vocab, target_name, fingerprint(full_weight), output_ids, card)

    train_loop(head, optimizer, config, training, count, out / "checkpoint.pt", batch_loss=batch_loss,
               evaluate=held_out, export=export, floor=0.05, resume=resume, progress=progress, until=until)
    return out / "head"
