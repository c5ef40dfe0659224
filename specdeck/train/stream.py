"""Train a feature head with the target's states computed per batch, never stored.

`specdeck.train.forcing` stores the target's states (3.5 kB a position) to train on them later; at
ten million positions that is 35 GB. Here each step runs the target over its batch first (one
forward without gradients: the residual streams after `feature_layers` layers and the final state),
then trains the head on those states (`specdeck.train.head_objective.head_loss`), so what a run
keeps is small: the tokenised text, the head, the optimiser and the step.

The text, made once per output folder and resumable:
- `plan.pt`: given text (`specdeck.train.texts`, each passage framed as a chat answer) and the
  requests the target answers, tokenised (`specdeck.train.forcing`'s plan);
- `answers.pt`: the target's own answers to those requests, generated in batches (three of four
  greedy, the fourth sampled), each batch saved as it lands.
Own answers are what the head drafts on, so each appears `own_repeat` times per epoch beside the
given text. One sequence in 20 is held out, by kind: own answers by their place in `answers.pt`
(`held_out_own`), the rest by its content, which survives a plan made on a machine with other text
and answers added before the second turns.

The batch order is a function of (seed, step), so the position in the text is the step: a
checkpoint (model, optimiser, step) resumes to the weights of an uninterrupted run. A checkpoint
follows every evaluation and at least every `checkpoint_minutes`; `curve.json` (beside the head
too) records positions seen against held-out agreement by depth.
"""

from __future__ import annotations

import copy
import json
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from specdeck.engine.atomic import write_with
from specdeck.engine.cores import pin_threads
from specdeck.engine.drafting.heads import FeatureHead, fingerprint, save_head
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.lean_weights import embedding_weight, output_weight
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model
from specdeck.train.forcing import HELD_OUT_EVERY, ForcingConfig, plan_text
from specdeck.train.head import HeadConfig, build_head, frequent_tokens, grouped_batches
from specdeck.train.head_card import model_card
from specdeck.train.head_objective import copyable_pairs, head_loss, reach
from specdeck.train.loop import HeldOut, train_loop
from specdeck.train.teacher import Shard, chat_ids, generate_scored
from specdeck.train.texts import TEXT_SOURCES
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


__all__ = ["StreamConfig", "batch_states", "train_streaming"]
