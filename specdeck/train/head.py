"""Train a feature head (`specdeck.engine.drafting.heads`) for a target.

Three stages, each resumable from what it left in the output folder:
1. text: the target writes its own answers (the same teacher shards as `train-draft`, which a
   head can share with a draft: `--teacher DIR`); or, with `--data DIR`, the shards of
   `specdeck head-data` (`specdeck.train.forcing`), which hold the states of stage 2 already;
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

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.cores import pin_threads
from specdeck.engine.drafting.heads import FeatureHead, fingerprint, head_config, save_head
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.hf_parts import output_projection
from specdeck.engine.forward.lean_weights import embedding_weight, output_weight
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model
from specdeck.train.corpus import SOURCES
from specdeck.train.forcing import Store, load_store
from specdeck.train.head_card import model_card
from specdeck.train.head_objective import collate_pairs, evaluate, head_loss
from specdeck.train.loop import HeldOut, split_rows, train_loop
from specdeck.train.teacher import Shard, load_shards
from specdeck.train.teacher_shards import build_teacher_data
from specdeck.train.texts import TEXT_SOURCES
from specdeck.train.train import TrainConfig

Progress = Callable[[str], None]


@dataclass(frozen=True)
class HeadConfig:
    seed: int = 0
    feature_dtype: str = "bfloat16"  # the target's dtype while it computes the states
    feature_batch_tokens: int = 8192
    output_vocab: int = 8192  # tokens the head may propose: the most frequent under the target
    intermediate: int = 0  # the head's MLP width (0: the target's)
    layers: int = 1  # the head's decoder layers
    init_from_target: bool = True  # start the decoder layers as copies of the target's last ones
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
    """A new head: its decoder layers copies of the target's last (`init_from_target`), its input
    map passing the target's state through; or, with `init_from`, another head's weights. What the
    head it grows from lacks starts as a pass-through: the weights on lower layers of a fusing head
    at zero, and a further decoder layer with its output maps at zero (it adds nothing to the
    residual stream), so the grown head starts as the head it grew from."""
    if config.layers < 1:
        raise SpecDeckError("--head-layers must be at least 1.")
    torch.manual_seed(config.seed)
    source = target.model.config
    head = FeatureHead(head_config(source, config.intermediate or None, config.feature_layers, config.layers)).float()
    width = source.hidden_size
    with torch.no_grad():
        if config.feature_layers:
            head.fuse_fc.weight.zero_()
            head.fuse_fc.weight[:, -width:] = torch.eye(width)
        if config.init_from:
            from specdeck.engine.drafting.heads import load_feature_head_weights

            missing = load_feature_head_weights(head, config.init_from)
            grown = {int(name.split(".")[2]) for name in missing if name.startswith("body.layers.")}
            if any(not name.startswith(("fuse_fc", "body.layers.")) for name in missing) or (grown and min(grown) == 0):
                raise SpecDeckError(f"{config.init_from} is a head of another shape (it lacks {missing[:3]}).")
            for number in grown:
                layer: Any = head.body.layers[number]
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            return head
        body: Any = target.torch_model.base_model
        if config.init_from_target and not config.intermediate:
            for mine, theirs in zip(head.body.layers, body.layers[-config.layers :]):
                mine.load_state_dict(theirs.state_dict())
        head.body.norm.weight.copy_(body.norm.weight)
        head.fc.weight.mul_(0.5)
        head.fc.weight[:, :width] += torch.eye(width)  # start by passing the state through
    return head


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
    embedding = embedding_weight(target.torch_model)
    vocab = output_projection(target.torch_model).weight.shape[0]
    text_ids, training = source.data, source.training
    count = len(text_ids.ids)
    output_ids = None
    if 0 < config.output_vocab < vocab:
        output_ids = frequent_tokens(text_ids, training, config.output_vocab, vocab, set(target.eos_ids))
    full_weight = output_weight(target.torch_model)
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
