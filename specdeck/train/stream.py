"""Train a feature head with the target's states computed per batch, never stored.

`specdeck.train.forcing` stores the target's states (3.5 kB a position) to train on them later; at
ten million positions that is 35 GB. Here each step runs the target over its batch first (one
forward without gradients: the residual streams after `feature_layers` layers and the final state),
then trains the head on those states (`specdeck.train.head_objective.head_loss`), so what a run
keeps is small: the tokenised text, the head, the optimiser and the step.

The text it trains on, and which of it is held out: `specdeck.train.stream_text`.

The batch order is a function of (seed, step), so the position in the text is the step: a
checkpoint (model, optimiser, step) resumes to the weights of an uninterrupted run. A checkpoint
follows every evaluation and at least every `checkpoint_minutes`; `curve.json` (beside the head
too) records positions seen against held-out agreement by depth.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.cores import pin_threads
from specdeck.engine.drafting.heads import FeatureHead, fingerprint, save_head
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.lean_weights import embedding_weight, output_weight
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model
from specdeck.train.head import build_head, frequent_tokens, grouped_batches
from specdeck.train.head_card import model_card
from specdeck.train.head_objective import copyable_pairs, head_loss, reach
from specdeck.train.loop import HeldOut, train_loop
from specdeck.train.stream_text import Progress, StreamConfig, stream_text
from specdeck.train.teacher import Shard
from specdeck.train.texts import TEXT_SOURCES


@torch.no_grad()
def batch_states(
    target: LoadedModel, sequences: list[torch.Tensor], layers: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's states over a right-padded batch, (B, W, len(layers) + 1, hidden) in float32
    (the residual stream after each of `layers` decoder layers, then the final state; or
    (B, W, hidden) without layers), and the padded ids (B, W). Padding after a sequence cannot
    change what a causal model computes for it."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = s.long()
    ids = ids.to(target.device)
    out = target.torch_model.base_model(input_ids=ids, output_hidden_states=bool(layers))
    if not layers:
        return out.last_hidden_state.float(), ids
    hidden = out.hidden_states
    return torch.stack([hidden[t] for t in layers] + [hidden[-1]], dim=2).float(), ids


def steps_to_fill(minutes: float, seconds: list[float], tokens: list[int], epoch_tokens: list[int]) -> int:
    """Steps of an epoch's batches (`epoch_tokens`, padded tokens each) that fill 90% of `minutes`,
    from timed batches of `tokens`: the time a token costs, not a timed batch's, since batches are
    grouped by length and a few of them say little of the epoch's mean."""
    per_token = sum(seconds) / max(sum(tokens), 1)
    per_step = per_token * sum(epoch_tokens) / max(len(epoch_tokens), 1)
    return max(1, int(minutes * 60 * 0.9 / per_step))


def _steps_for(
    config: StreamConfig,
    checkpoint: Path,
    resume: bool,
    head: FeatureHead,
    batches: list[list[int]],
    training: list[int],
    padded: Callable[[list[int]], int],
    loss_of: Callable[[FeatureHead, list[int], int], tuple[torch.Tensor, str]],
    progress: Progress,
) -> int:
    """The steps that fill `config.minutes` (`--steps 0`): a resumed run keeps its checkpoint's,
    a new one times a few steps of a throwaway copy of the head first."""
    if resume and checkpoint.exists():
        return int(torch.load(checkpoint, weights_only=True, map_location="cpu")["config"]["steps"])
    if not config.minutes:
        raise SpecDeckError("--steps 0 sizes the run to --minutes: give --minutes too, or a number of steps.")
    trial = copy.deepcopy(head)
    optimizer = torch.optim.AdamW(trial.parameters(), lr=0.0)
    timed = []
    for i in range(min(8, len(batches))):
        started = time.perf_counter()
        loss, _ = loss_of(trial, [training[r] for r in batches[i]], i)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        timed.append(time.perf_counter() - started)
    skip = 2 if len(timed) > 2 else 0  # the first steps warm up
    tokens = [padded(batch) for batch in batches]
    steps = steps_to_fill(config.minutes, timed[skip:], tokens[skip : len(timed)], tokens)
    progress(f"{config.minutes * 60 * 0.9 / steps:.1f} s a step: {steps} steps fill {config.minutes:g} minutes")
    return steps


def train_streaming(
    target_name: str,
    out: Path,
    config: StreamConfig,
    resume: bool = False,
    progress: Progress = print,
    until: int | None = None,
) -> Path:
    """Train into `out`; return the exported head's folder (`out/head`), the checkpoint that agreed
    most with the target on held-out own answers, their pairs weighed as the loss weighs them
    (`config.text_only`: make the text, return `out`)."""
    head_config = config.head
    if head_config.threads:
        pin_threads(head_config.threads)
    out.mkdir(parents=True, exist_ok=True)
    target = load_model(target_name, LoadOptions(device=config.device, dtype=config.dtype), progress)
    layers = head_config.feature_layers
    depth = target.model.config.num_hidden_layers
    if any(not 1 <= n < depth for n in layers):
        raise SpecDeckError(f"--feature-layers must lie between 1 and {depth - 1}, the target's layers but its last.")
    text = stream_text(target, out, config, progress)
    if config.text_only:
        own = text.rows(False, True) + text.rows(True, True)
        progress(f"text made: {len(text.ids) - len(own)} given sequences, {len(own)} own answers; no training asked")
        return out
    training = text.rows(held_out=False, own=False) + text.rows(held_out=False, own=True) * config.own_repeat
    half = head_config.eval_sequences // 2
    held_out = {"own answers": text.rows(True, True)[:half], "given text": text.rows(True, False)[:half]}
    held_out = {kind: rows for kind, rows in held_out.items() if rows}
    if not held_out or len(training) < head_config.batch_sequences:
        raise SpecDeckError(
            f"Too little text to train on ({len(text.ids)} sequences): install the sources "
            "(python3.11-doc, wordnet-base) or ask for more --answers."
        )
    device = target.device
    model = target.torch_model
    embedding = embedding_weight(model).float()
    full_weight = output_weight(model)
    vocab = full_weight.shape[0]
    output_ids = None
    if 0 < head_config.output_vocab < vocab:
        output_ids = frequent_tokens(
            Shard(text.ids, [], [], text.first), training, head_config.output_vocab, vocab, set(target.eos_ids)
        )
    weight = (full_weight[output_ids.to(device)] if output_ids is not None else full_weight).float()
    head = build_head(target, head_config).to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=head_config.lr, weight_decay=0.0, betas=(0.9, 0.95))
    lengths = [len(text.ids[r]) for r in training]

    def epoch_batches(epoch: int) -> list[list[int]]:
        return grouped_batches(lengths, head_config.batch_sequences, head_config.seed, epoch)

    per_epoch = [sum(lengths[i] - 1 for i in batch) for batch in epoch_batches(0)]
    epoch_positions: dict[int, list[int]] = {0: per_epoch}

    def positions_seen(step: int) -> int:
        """Positions this run has trained on by `step` (the batch order is known ahead)."""
        return batches_positions(step + config.text_from) - batches_positions(config.text_from)

    def batches_positions(step: int) -> int:
        total, epoch = 0, 0
        while step > 0:
            if epoch not in epoch_positions:
                epoch_positions[epoch] = [sum(lengths[i] - 1 for i in b) for b in epoch_batches(epoch)]
            taken = min(step, len(epoch_positions[epoch]))
            total += sum(epoch_positions[epoch][:taken])
            step -= taken
            epoch += 1
        return total

    def pairs(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's states, next-token embeddings, the pairs in answers, and which of them prompt
        lookup could copy."""
        states, ids = batch_states(target, [text.ids[r] for r in rows], layers)
        mask = torch.zeros(len(rows), ids.shape[1] - 1, dtype=torch.bool)
        for j, r in enumerate(rows):
            mask[j, text.first[r] : len(text.ids[r]) - 1] = True
        return states, embedding[ids[:, 1:]], mask.to(device), copyable_pairs(ids)

    def loss_of(module: FeatureHead, rows: list[int], step: int) -> tuple[torch.Tensor, str]:
        states, embeds, mask, copyable = pairs(rows)
        loss, agreements = head_loss(
            module,
            states,
            embeds,
            mask,
            weight,
            head_config,
            noise_seed=head_config.seed * 1_000_003 + step,
            copyable=copyable,
            copy_weight=config.copy_weight,
        )
        return loss, "by depth " + " / ".join(f"{a.mean().item():.3f}" for a in agreements)

    curve_path = out / "curve.json"
    curve = json.loads(curve_path.read_text(encoding="utf-8")) if resume and curve_path.exists() else []

    @torch.no_grad()
    def measure(step: int) -> HeldOut:
        head.eval()
        figures: dict[str, list[float]] = {}
        chosen_by: float | None = None
        for kind, rows in held_out.items():
            totals: list[list[torch.Tensor]] = [[] for _ in range(head_config.unroll)]
            uncopied: list[list[torch.Tensor]] = [[] for _ in range(head_config.unroll)]
            for i in range(0, len(rows), head_config.batch_sequences):
                states, embeds, mask, copyable = pairs(rows[i : i + head_config.batch_sequences])
                _, agreements = head_loss(head, states, embeds, mask, weight, head_config)
                for depth_no, agree in enumerate(agreements):
                    totals[depth_no].append(agree)
                    uncopied[depth_no].append(agree[~copyable[reach(mask, depth_no)]])
            figures[kind] = [torch.cat(t).mean().item() for t in totals]
            # what the head adds beside prompt lookup: the pairs lookup could not copy
            figures[f"{kind}, not copyable"] = [torch.cat(t).mean().item() for t in uncopied]
            if chosen_by is None:  # the first kind's first depth, weighed as the loss weighs its pairs
                agree, other = torch.cat(totals[0]), torch.cat(uncopied[0])
                copied_sum, copied_count = agree.sum() - other.sum(), len(agree) - len(other)
                weighed = other.sum() + config.copy_weight * copied_sum
                chosen_by = (weighed / max(len(other) + config.copy_weight * copied_count, 1e-6)).item()
            progress(
                f"held-out top-1 agreement by depth at step {step}, {kind}: "
                + " / ".join(f"{a:.3f}" for a in figures[kind])
                + " (where lookup could not copy: "
                + " / ".join(f"{a:.3f}" for a in figures[f"{kind}, not copyable"])
                + ")"
            )
        head.train()
        curve[:] = [point for point in curve if point["step"] < step]
        curve.append({"step": step, "positions": positions_seen(step), **figures})
        write_with(curve_path, lambda temporary: Path(temporary).write_text(json.dumps(curve, indent=1)))
        # the exported head is the one that agrees most where its training weighed most
        return HeldOut(chosen_by or 0.0, tuple(next(iter(figures.values()))))

    sources = {name: TEXT_SOURCES[name] for name in sorted(set(text.sources))}

    def export(step: int, held: HeldOut) -> None:
        card = model_card(
            target_name,
            head_config,
            head,
            positions_seen(step),
            len(text.ids),
            step,
            list(held.figures),
            output_ids,
            sources,
            states="computed for each batch as it trained",
        )
        save_head(head, out / "head", vocab, target_name, fingerprint(full_weight), output_ids, card)
        write_with(
            out / "head" / "curve.json", lambda temporary: Path(temporary).write_text(json.dumps(curve, indent=1))
        )
        write_with(
            out / "head" / "training.json",
            lambda temporary: Path(temporary).write_text(json.dumps({"settings": asdict(config)}, indent=1)),
        )

    checkpoint = out / "checkpoint.pt"
    if not head_config.steps:
        steps = _steps_for(
            config,
            checkpoint,
            resume,
            head,
            epoch_batches(0),
            training,
            lambda batch: len(batch) * max(lengths[i] for i in batch),
            loss_of,
            progress,
        )
        head_config = replace(head_config, steps=steps)
    progress(
        f"training on {len(text.ids)} sequences ({sum(len(i) for i in text.ids):,} tokens; "
        f"{len(text.rows(False, True))} own answers x {config.own_repeat}), {sum(per_epoch):,} positions an epoch"
    )
    train_loop(
        head,
        optimizer,
        head_config,
        training,
        len(text.ids),
        checkpoint,
        epoch_batches=epoch_batches,
        batch_loss=partial(loss_of, head),
        evaluate=measure,
        export=export,
        floor=0.05,
        resume=resume,
        progress=progress,
        until=until,
        evaluate_first=bool(head_config.init_from),
        seconds=config.minutes * 60,
        checkpoint_seconds=config.checkpoint_minutes * 60,
        text_from=config.text_from,
    )
    return out / "head"


__all__ = ["batch_states", "train_streaming"]
