"""Train a feature head (`engine.heads`) for a target.

Three stages, each resumable from what it left in the output folder:
1. text: the target writes its own answers (the same teacher shards as `train-draft`, which a
   head can share with a draft: `--teacher DIR`); or, with `--data DIR`, the shards of
   `specdeck head-data` (`engine.distill.forcing`), which hold the states of stage 2 already;
2. features: one batched forward of the target over every sequence stores its last hidden state
   at every position (`features/`). The labels need nothing else: the target's next-token
   distribution at position i is its output layer applied to f_i;
3. head: for each pair (f_i, token i+1) the head predicts f_{i+1}. Loss: cross-entropy from the
   target's distribution softmax(W f_{i+1}) to the head's softmax(W f^_{i+1}) over the output
   tokens, plus (`feature_weight`) a smooth-L1 pull of f^ towards f (EAGLE). Drafting feeds
   predicted states back in, so training runs `unroll` passes as drafting would ("training-time
   test", EAGLE-3, Li et al. 2025): pass s reads at pair j the state pass s-1 predicted at j-1 and
   attends to the real pairs up to j-s+1 and to its own earlier passes' pairs after them, exactly
   the cache a depth-s draft sees; noise on the input states makes it robust to the rest of the gap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.cores import pin_threads
from specdeck.engine.distill.corpus import SOURCES
from specdeck.engine.distill.forcing import Store, load_store
from specdeck.engine.distill.loop import HeldOut, split_rows, train_loop
from specdeck.engine.distill.teacher import Shard, load_shards
from specdeck.engine.distill.teacher_shards import build_teacher_data
from specdeck.engine.distill.texts import TEXT_SOURCES
from specdeck.engine.distill.train import TrainConfig
from specdeck.engine.drafting.heads import FeatureHead, fingerprint, head_config, save_head
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.hf_parts import input_embedding, output_projection
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model

Progress = Callable[[str], None]


@dataclass(frozen=True)
class HeadConfig:
    seed: int = 0
    feature_dtype: str = "bfloat16"  # the target's dtype while it computes the states
    feature_batch_tokens: int = 8192
    output_vocab: int = 8192  # tokens the head may propose: the most frequent under the target
    intermediate: int = 0  # the head's MLP width (0: the target's)
    init_from_target: bool = True  # start the decoder layer as a copy of the target's last layer
    feature_layers: tuple[int, ...] = ()  # fuse the residual streams after these many target layers (--data only)
    init_from: str = ""  # start from this head's weights (a folder or a built-in name); new fusion weights start at 0
    unroll: int = 2  # passes per step; pass n > 1 reads the states pass n-1 predicted
    noise: float = 0.05  # Gaussian noise on input states, relative to their RMS
    feature_weight: float = 0.5
    steps: int = 600
    batch_sequences: int = 16
    lr: float = 1e-3
    warmup: int = 30
    eval_every: int = 50
    eval_sequences: int = 800  # held-out sequences measured (the first ones), so evaluation stays quick as data grows
    bfloat16: bool = True
    threads: int = 0


@torch.inference_mode()
def extract_features(
    target: LoadedModel, data: Shard, folder: Path, batch_tokens: int, progress: Progress
) -> list[torch.Tensor]:
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
                raise SpecDeckError(
                    f"The hidden states in {folder} belong to other teacher text (sequence {r} "
                    "differs): delete that folder, or train into a new --out."
                )
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
            hidden = target.torch_model.base_model(input_ids=ids.to(target.device)).last_hidden_state
            saved["states"] += [
                hidden[j, : len(data.ids[r])].to(torch.bfloat16).cpu().clone() for j, r in enumerate(batch)
            ]
            start = end
        path = folder / f"part-{number:05d}.pt"
        write_with(path, partial(torch.save, saved))
        for r, states in zip(rows, saved["states"]):
            features[r] = states
        done += sum(len(data.ids[r]) for r in rows)
        elapsed = time.perf_counter() - started
        progress(
            f"features {number + 1 - len(existing)}/{len(parts)} new parts, {done / elapsed:.0f} tokens/s, "
            f"{elapsed:.0f} s"
        )
    return features  # type: ignore[return-value]


def frequent_tokens(data: Shard, rows: list[int], size: int, vocab: int, always: set[int]) -> torch.Tensor:
    """The `size` tokens the target writes most often in `rows` (plus `always`, e.g. EOS)."""
    counts = torch.zeros(vocab)
    for r in rows:
        counts.index_add_(0, data.ids[r].long(), torch.ones(len(data.ids[r])))
    ids = set(counts.topk(min(size, vocab)).indices.tolist()) | always
    return torch.tensor(sorted(ids), dtype=torch.long)


def build_head(target: LoadedModel, config: HeadConfig) -> FeatureHead:
    """A new head: its decoder layer a copy of the target's last (`init_from_target`), its input map
    passing the target's state through; or, with `init_from`, another head's weights. The weights
    on lower layers of a fusing head start at zero, so it starts as the head it grew from."""
    torch.manual_seed(config.seed)
    source = target.model.config
    head = FeatureHead(head_config(source, config.intermediate or None, config.feature_layers)).float()
    width = source.hidden_size
    with torch.no_grad():
        if config.feature_layers:
            head.fuse_fc.weight.zero_()
            head.fuse_fc.weight[:, -width:] = torch.eye(width)
        if config.init_from:
            from specdeck.engine.drafting.heads import load_feature_head_weights

            missing = load_feature_head_weights(head, config.init_from)
            if any(not name.startswith("fuse_fc") for name in missing):
                raise SpecDeckError(f"{config.init_from} is a head of another shape (it lacks {missing[:3]}).")
            return head
        body: Any = target.torch_model.base_model
        if config.init_from_target and not config.intermediate:
            head.body.layers[0].load_state_dict(body.layers[-1].state_dict())
        head.body.norm.weight.copy_(body.norm.weight)
        head.fc.weight.mul_(0.5)
        head.fc.weight[:, :width] += torch.eye(width)  # start by passing the state through
    return head


def collate_pairs(
    data: Shard,
    features: list[torch.Tensor],
    rows: list[int],
    embedding: torch.Tensor,
    columns: list[int] | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded states (B, W, h), next-token embeddings for pairs (B, W-1, h), and the mask of the
    pairs that count: those in the answer. Pair i predicts the state after token i+1, which decides
    token i+2; the head drafts from the token after the target's first answer token on, so pairs
    before `first` (the prompt, which the head only reads) are left out of the loss. Features of
    several layers (L, m, h) give states (B, W, m, h); `columns` picks some of them (an int: one,
    as (B, W, h))."""
    width = max(len(data.ids[r]) for r in rows)
    hidden = embedding.shape[1]
    picked = [features[r] if columns is None else features[r][:, columns] for r in rows]
    states = torch.zeros(len(rows), width, *picked[0].shape[1:-1], hidden)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for j, r in enumerate(rows):
        n = len(data.ids[r])
        states[j, :n] = picked[j].float()
        ids[j, :n] = data.ids[r].long()
        mask[j, data.first[r] : n - 1] = True
    return states, embedding[ids[:, 1:]], mask


def _pass_mask(width: int, s: int) -> torch.Tensor:
    """Which keys query j of pass s (0-based) attends to, over the keys of passes 0..s side by side:
    the real pairs up to j - s, then pass r's pair at j - s + r for r = 1..s (the drafts a depth-(s+1)
    draft follows in the cache)."""
    blocks = [torch.ones(width, width, dtype=torch.bool).tril(-s)]
    blocks += [torch.ones(width, width, dtype=torch.bool).tril(r - s).triu(r - s) for r in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


def unrolled(head: FeatureHead, inputs: torch.Tensor, embeds: torch.Tensor, passes: int) -> list[torch.Tensor]:
    """Predicted states (B, W, h) of each pass: pass 0 reads the real input states `inputs`, pass s
    the states pass s-1 predicted one pair earlier, each attending as `_pass_mask` says."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    body: Any = head.body  # a Hugging Face LlamaModel, read by its submodules' names
    layer, config = body.layers[0], head.config
    attention = layer.self_attn
    batch, width, _ = inputs.shape
    dim = config.head_dim or config.hidden_size // config.num_attention_heads
    keys, values, outputs = [], [], []
    states = inputs
    cos = sin = None
    for s in range(passes):
        x = head.mix(states, embeds)
        if cos is None:
            cos, sin = body.rotary_emb(x, torch.arange(width, device=x.device)[None])
        h = layer.input_layernorm(x)
        q = attention.q_proj(h).view(batch, width, -1, dim).transpose(1, 2)
        k = attention.k_proj(h).view(batch, width, -1, dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys.append(k)
        values.append(attention.v_proj(h).view(batch, width, -1, dim).transpose(1, 2))
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            torch.cat(keys, dim=2),
            torch.cat(values, dim=2),
            attn_mask=_pass_mask(width, s).to(x.device),
            scale=dim**-0.5,
            enable_gqa=True,
        )
        x = x + attention.o_proj(out.transpose(1, 2).reshape(batch, width, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        predicted = body.norm(x)
        outputs.append(predicted)
        # the next pass reads, at pair j, the state this pass predicted at pair j-1
        states = torch.cat([inputs[:, :1], predicted[:, :-1].to(inputs.dtype)], dim=1)
    return outputs


def head_loss(
    head: FeatureHead, states, embeds, mask, weight: torch.Tensor, config: HeadConfig, noise_seed: int | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss over every pass, and per pass whether the head's argmax equals the target's at each
    pair that pass can draft. `states` are the target's, (B, W, h) or (B, W, m, h) with the final
    state last. With `noise_seed` (training) the input states get noise drawn from that seed."""
    final = states[..., -1, :] if states.dim() == 4 else states
    truth = final[:, 1:]
    device = states.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bfloat16):
        inputs = head.fuse(states[:, :-1])
    inputs = inputs.float()
    if noise_seed is not None and config.noise:
        generator = torch.Generator(device).manual_seed(noise_seed)
        noise = torch.randn(inputs.shape, generator=generator, device=device)
        inputs = inputs + noise * config.noise * inputs.pow(2).mean().sqrt()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bfloat16):
        predictions = unrolled(head, inputs, embeds, config.unroll)
    total, agreements = torch.zeros((), device=device), []
    for step, predicted in enumerate(predictions):
        reach = mask.clone()
        reach[:, :step] = False  # pair j's depth-(step+1) draft follows the real pairs up to j - step
        with torch.no_grad():
            p = torch.softmax(torch.nn.functional.linear(truth[reach], weight), dim=-1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bfloat16):
            logits = torch.nn.functional.linear(predicted[reach], weight)
        logq = torch.log_softmax(logits.float(), dim=-1)
        loss = -(p * logq).sum(-1).mean()
        if config.feature_weight:
            loss = loss + config.feature_weight * torch.nn.functional.smooth_l1_loss(
                predicted[reach].float(), truth[reach]
            )
        total = total + loss / (step + 1)
        agreements.append((logits.argmax(-1) == p.argmax(-1)).float().detach())
    return total, agreements


def model_card(
    target_name: str,
    config: HeadConfig,
    head: FeatureHead,
    positions: int,
    sequences: int,
    step: int,
    agree: list[float],
    output_ids: torch.Tensor | None,
    sources: dict[str, str],
    states: str = "computed once",
) -> str:
    listed = "\n".join(f"- {name}: {text}" for name, text in sources.items())
    params = sum(p.numel() for n, p in head.named_parameters() if not n.startswith("body.embed_tokens"))
    vocab = f"{len(output_ids)} tokens (`output_tokens.json`)" if output_ids is not None else "the whole vocabulary"
    shape = head.config
    layers = " and ".join(map(str, head.feature_layers))
    fused = (
        f"the residual streams after the target's first {layers} layers (each scaled to unit RMS) and its last "
        "hidden state, mixed by one linear map, "
        if head.feature_layers
        else "the target's last hidden state "
    )
    grown = (
        f"\nIt started from the weights of `{config.init_from}` (its own card lists what it learnt from), the "
        "fusion weights on lower layers from zero.\n"
        if config.init_from
        else ""
    )
    return f"""# Feature head for {target_name}

An EAGLE-style drafter (Li et al. 2024, 2025) for {target_name} in speculative decoding: from
{fused}and the next token's embedding it predicts the target's next hidden state, and the target's
own output layer turns that into draft tokens. It uses the target's embedding and output layer, so
it only works with {target_name}.

## Architecture
{f"A linear map from {len(head.feature_layers) + 1} x {shape.hidden_size} to {shape.hidden_size} (the fusion), then a" if head.feature_layers else "A"} linear map from 2 x {shape.hidden_size} to {shape.hidden_size}, one Llama decoder layer ({shape.num_attention_heads}
heads, {shape.num_key_value_heads} key/value heads, MLP {shape.intermediate_size}) with its own KV cache,
and a final RMSNorm; {params / 1e6:.1f}M parameters. It proposes only from {vocab}, the target's most
frequent tokens in the training text; q = 0 elsewhere keeps rejection sampling exact.

## Training
{sequences} sequences, {positions} positions seen, from the sources below, with the target's hidden
states {states}. Loss per pair: cross-entropy to the target's next-token distribution over
the output tokens{f" plus {config.feature_weight} x smooth-L1 to its next hidden state" if config.feature_weight else ""},
over {config.unroll} passes run as drafting runs them (each later pass reads the states the
previous one predicted and attends as a deeper draft would). {step} steps of {config.batch_sequences}
sequences, AdamW, lr {config.lr}, seed {config.seed}. Top-1 agreement with the target at the answer
positions of held-out sequences (every 20th, never trained on), by draft depth: {", ".join(f"{a:.3f}" for a in agree)}.
{grown}
Settings: `{json.dumps(asdict(config))}`

## Data
{listed}
No benchmark prompts were used.
"""


@torch.no_grad()
def evaluate(head, data, features, rows, embedding, weight, config, columns=None) -> list[float]:
    """Top-1 agreement with the target over `rows`, by draft depth (one figure per pass)."""
    head.eval()
    totals: list[list[torch.Tensor]] = [[] for _ in range(config.unroll)]
    for i in range(0, len(rows), config.batch_sequences):
        _, agreements = head_loss(
            head,
            *collate_pairs(data, features, rows[i : i + config.batch_sequences], embedding, columns),
            weight,
            config,
        )
        for pass_no, agree in enumerate(agreements):
            totals[pass_no].append(agree)
    head.train()
    return [torch.cat(t).mean().item() for t in totals]


def grouped_batches(lengths: list[int], batch: int, seed: int, epoch: int) -> list[list[int]]:
    """An epoch's batches (indices into `lengths`): a seeded shuffle, sorted by length within runs
    of 32 batches so that a batch pads little, then the batches shuffled again."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    batches = []
    for start in range(0, len(order) - batch + 1, 32 * batch):
        run = sorted(order[start : start + 32 * batch], key=lambda i: lengths[i])
        batches += [run[i : i + batch] for i in range(0, len(run) - batch + 1, batch)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


@dataclass
class HeadText:
    """What a head learns from: sequences, the target's states over them, which sequences train and
    which measure, and the sources named in the model card."""

    data: Shard
    features: list[torch.Tensor]
    training: list[int]
    held_out: dict[str, list[int]]  # measured sequences by kind; the first kind picks the exported head
    columns: list[int] | int | None
    sources: dict[str, str]


def _store_text(store: Store, config: HeadConfig) -> HeadText:
    missing = [n for n in config.feature_layers if n not in store.layers]
    if missing:
        raise SpecDeckError(
            f"The head data holds layers {list(store.layers)}, not {missing}: train on those, "
            "or grow new data with --layers."
        )
    final = len(store.layers)
    columns = [store.layers.index(n) for n in config.feature_layers] + [final] if config.feature_layers else final
    held = [r for r, h in enumerate(store.held_out) if h]
    own = [r for r in held if store.sources[r] == "target-answers"]
    given = [r for r in held if store.sources[r] != "target-answers"]
    half = config.eval_sequences // 2
    kinds = {"own answers": own[:half], "given text": given[:half]}
    return HeadText(
        Shard(store.ids, [], [], store.first),
        store.states,
        [r for r, h in enumerate(store.held_out) if not h],
        {kind: rows for kind, rows in kinds.items() if rows},
        columns,
        {name: TEXT_SOURCES[name] for name in sorted(set(store.sources))},
    )


def train_head(
    target_name: str,
    out: Path,
    config: HeadConfig,
    text: TrainConfig | None = None,
    teacher: Path | None = None,
    resume: bool = False,
    progress: Progress = print,
    until: int | None = None,
    data: Path | None = None,
) -> Path:
    """Train into `out`; return the exported head's folder (`out/head`): the checkpoint with the
    best held-out agreement of the first pass so far.

    The text is the shards of `specdeck head-data` in `data` when given, else the teacher shards in
    `teacher` (default `out/teacher`), made first as `text` says when given (shards already there
    are kept)."""
    if config.threads:
        pin_threads(config.threads)
    out.mkdir(parents=True, exist_ok=True)
    target = load_model(target_name, LoadOptions(device="cpu", dtype=config.feature_dtype), progress)
    if data is not None:
        source = _store_text(load_store(data), config)
    else:
        if config.feature_layers:
            raise SpecDeckError("A head that fuses lower layers learns from `specdeck head-data` shards: pass --data.")
        teacher = teacher or out / "teacher"
        shards = build_teacher_data(target, teacher, text, progress) if text else load_shards(teacher)
        if not shards.ids:
            raise SpecDeckError(
                f"No teacher text in {teacher}: ask for some with --answers/--passages/--code, "
                "or point --teacher at the shards of an earlier train-draft run."
            )
        features = extract_features(target, shards, out / "features", config.feature_batch_tokens, progress)
        held, training = split_rows(len(shards.ids))
        source = HeadText(shards, features, training, {"held out": held[: config.eval_sequences]}, None, SOURCES)
    target.torch_model.float()
    embedding = input_embedding(target.torch_model).weight.detach()
    vocab = output_projection(target.torch_model).weight.shape[0]
    text_ids, training = source.data, source.training
    count = len(text_ids.ids)
    output_ids = None
    if 0 < config.output_vocab < vocab:
        output_ids = frequent_tokens(text_ids, training, config.output_vocab, vocab, set(target.eos_ids))
    full_weight = output_projection(target.torch_model).weight.detach()
    weight = full_weight[output_ids] if output_ids is not None else full_weight
    head = build_head(target, config)
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0, betas=(0.9, 0.95))
    lengths = [len(text_ids.ids[r]) for r in training]
    positions = sum(len(ids) - 1 for ids in text_ids.ids)

    def batch_loss(rows: list[int], step: int) -> tuple[torch.Tensor, str]:
        loss, agreements = head_loss(
            head,
            *collate_pairs(text_ids, source.features, rows, embedding, source.columns),
            weight,
            config,
            noise_seed=config.seed * 1_000_003 + step,
        )
        return loss, "by depth " + " / ".join(f"{a.mean().item():.3f}" for a in agreements)

    def measure(step: int) -> HeldOut:
        """Held-out agreement by depth, printed per kind; the first kind's picks the exported head."""
        figures = {
            kind: evaluate(head, text_ids, source.features, rows, embedding, weight, config, source.columns)
            for kind, rows in source.held_out.items()
        }
        for kind, figure in figures.items():
            by_depth = " / ".join(f"{a:.3f}" for a in figure)
            progress(f"held-out top-1 agreement by depth at step {step}, {kind}: {by_depth}")
        first = next(iter(figures.values()))
        return HeldOut(first[0], tuple(first))

    def export(step: int, held: HeldOut) -> None:
        card = model_card(
            target_name, config, head, positions, count, step, list(held.figures), output_ids, source.sources
        )
        save_head(head, out / "head", vocab, target_name, fingerprint(full_weight), output_ids, card)

    train_loop(
        head,
        optimizer,
        config,
        training,
        count,
        out / "checkpoint.pt",
        epoch_batches=lambda epoch: grouped_batches(lengths, config.batch_sequences, config.seed, epoch),
        batch_loss=batch_loss,
        evaluate=measure,
        export=export,
        floor=0.05,
        resume=resume,
        progress=progress,
        until=until,
        evaluate_first=bool(config.init_from),
    )
    return out / "head"
