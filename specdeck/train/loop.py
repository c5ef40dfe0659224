"""The training loop that a draft model (`specdeck.train.train`) and a feature head
(`specdeck.train.head`) both run: seeded batches, a warm-up then cosine learning rate, clipped
AdamW steps, held-out evaluations that export the best model so far, and checkpoints to resume from.

A run resumes exactly: a checkpoint holds the model, the optimiser, the step and the best held-out
agreement, and the batch order is a function of (seed, step), so stopping after step s and resuming
gives the weights of an uninterrupted run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.errors import SpecDeckError

Progress = Callable[[str], None]


class LoopConfig(Protocol):
    """The settings the loop reads from a run's config (`TrainConfig`, `HeadConfig`)."""

    @property
    def seed(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def batch_sequences(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def warmup(self) -> int: ...
    @property
    def eval_every(self) -> int: ...


@dataclass(frozen=True)
class HeldOut:
    """An evaluation on the held-out sequences: the top-1 agreement with the target that the
    exported model is chosen by, and the figures its model card quotes."""

    agreement: float
    figures: tuple[float, ...] = ()


def split_rows(count: int) -> tuple[list[int], list[int]]:
    """(held-out, training) sequence indices: every 20th sequence measures, never trains."""
    return list(range(0, count, 20)), [i for i in range(count) if i % 20]


def set_learning_rate(optimizer, lr: float, step: int, warmup: int, steps: int, floor: float) -> None:
    """Linear warm-up, then a cosine from `lr` down to `floor * lr` at `steps`."""
    scale = min(1.0, (step + 1) / warmup) * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * step / steps)))
    for group in optimizer.param_groups:
        group["lr"] = lr * scale


def resume_checkpoint(checkpoint: Path, model, optimizer, progress: Progress, sequences: int) -> tuple[int, float]:
    """Load model and optimizer state; return (step, best held-out agreement so far). The best
    agreement starts over if the teacher text has changed size since (`sequences`): it was measured
    on another held-out set, so no agreement on this one can be compared with it."""
    state = torch.load(checkpoint, weights_only=True, map_location="cpu")  # a GPU's checkpoint resumes anywhere
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:  # weights of another shape: a checkpoint of other settings
        theirs, ours = set(state["model"]), set(model.state_dict())
        differ = sorted(theirs ^ ours)[:2] or ["weights of other sizes"]
        raise SpecDeckError(
            f"The checkpoint {checkpoint} is of a model of another shape than these settings make "
            f"({', '.join(differ)}): resume with the settings it was made with, or train into a new --out."
        ) from error
    optimizer.load_state_dict(state["optimizer"])
    best = state["best_agreement"]
    if state.get("sequences") != sequences:
        best = -1.0
        progress(
            f"resumed at step {state['step']} on other teacher text ({sequences} sequences, "
            f"{state.get('sequences', 'unknown')} before): the next evaluation exports afresh"
        )
    else:
        progress(f"resumed at step {state['step']}")
    return state["step"], best


def save_checkpoint(checkpoint: Path, model, optimizer, step: int, best: float, config, sequences: int) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "best_agreement": best,
        "sequences": sequences,
        "config": asdict(config),
    }
    write_with(checkpoint, lambda temporary: torch.save(state, temporary))


def batches(count: int, batch: int, seed: int, epoch: int) -> list[list[int]]:
    """An epoch's batches of `batch` indices below `count`, in an order fixed by (seed, epoch); the
    remainder that fills no batch waits for another epoch."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(count, generator=generator).tolist()
    return [order[i : i + batch] for i in range(0, count - batch + 1, batch)]


def train_loop(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: LoopConfig,
    training: list[int],
    sequences: int,
    checkpoint: Path,
    *,
    epoch_batches: Callable[[int], list[list[int]]],
    batch_loss: Callable[[list[int], int], tuple[torch.Tensor, str]],
    evaluate: Callable[[int], HeldOut],
    export: Callable[[int, HeldOut], None],
    floor: float,
    resume: bool,
    progress: Progress,
    until: int | None,
    evaluate_first: bool = False,
    seconds: float = 0.0,
    checkpoint_seconds: float = 0.0,
    text_from: int = 0,
) -> None:
    """Train `model` on the `training` rows of `sequences` from `checkpoint` (with `resume`) to
    config.steps, or to step `until` for now (the learning-rate schedule always spans config.steps).

    epoch_batches(epoch) orders an epoch's batches (indices into `training`, a function of the
    seed and the epoch alone); batch_loss(rows, step) gives a batch's loss and its top-1 agreement
    as reported. Every config.eval_every steps and at the last, evaluate(step) measures (and
    reports) the held-out rows and, where they agree more than at any evaluation before, `export`
    saves the model as the run's result; a checkpoint follows every evaluation. With
    `evaluate_first` a run that starts at step 0 is measured before it trains (a model grown from
    another: where it starts). With `seconds` the run stops after the first step past that many
    seconds, measured and saved as at an evaluation; `checkpoint_seconds` adds a checkpoint at least
    that often between evaluations, so that a killed run loses little. Step s trains on batch
    s + `text_from` of the batch order: a run from a model that trained on the first batches of the
    same order goes on with the text it has not seen."""
    step, best = 0, -1.0
    if resume and checkpoint.exists():
        step, best = resume_checkpoint(checkpoint, model, optimizer, progress, sequences)
    per_epoch = len(epoch_batches(0))
    if per_epoch == 0:
        raise SpecDeckError(f"{len(training)} training sequences are fewer than a batch of {config.batch_sequences}.")
    if step == 0 and evaluate_first:
        evaluate(step)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    started, first = time.perf_counter(), step
    saved = started
    stop = min(config.steps, until or config.steps)
    model.train()
    while step < stop:
        epoch, index = divmod(step + text_from, per_epoch)
        rows = [training[r] for r in epoch_batches(epoch)[index]]
        set_learning_rate(optimizer, config.lr, step, config.warmup, config.steps, floor)
        loss, agreement = batch_loss(rows, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        elapsed = time.perf_counter() - started
        progress(
            f"step {step}/{config.steps} loss {loss.item():.3f} top-1 agreement {agreement} ({elapsed:.0f} s, "
            f"about {elapsed / (step - first) * (stop - step) / 60:.0f} min left)"
        )
        out_of_time = bool(seconds) and time.perf_counter() - started >= seconds
        if step % config.eval_every == 0 or step == stop or out_of_time:
            held = evaluate(step)
            if held.agreement > best:  # the exported model is the one that agrees most on unseen text
                best = held.agreement
                export(step, held)
            save_checkpoint(checkpoint, model, optimizer, step, best, config, sequences)
            saved = time.perf_counter()
        elif checkpoint_seconds and time.perf_counter() - saved >= checkpoint_seconds:
            save_checkpoint(checkpoint, model, optimizer, step, best, config, sequences)
            saved = time.perf_counter()
        if out_of_time:
            progress(f"stopped at step {step} after {seconds / 60:.0f} min, as asked: resume to go on")
            break
