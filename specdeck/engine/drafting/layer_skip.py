"""Self-speculative decoding by early exit: the target drafts with its own first L decoder layers,
then its final norm and output layer (Draft & Verify, Zhang et al. 2024; LayerSkip, Elhoushi et
al. 2024), and verifies with all of them.

The partial model (`partial_model`) is the target with its layer list cut to the first L: the same
parameter objects, and on the lean forward the same fused or packed products
(`specdeck.engine.forward.lean_weights.share_first_layers`), so no weight is copied. It drafts as a draft model does
(`DraftModelDrafter`), with a KV cache of its own for its L layers; the full target verifies, so
greedy text is plain text, and since q is the partial model's own distribution the rejection rule
keeps sampled text on the target's distribution.

Which L (`choose_layers`): on a bundled calibration text, for a few candidates, the share of
positions where the partial model's argmax is the full target's (the agreement a) and a one-token
step's cost over the full target's (c). Each candidate is worth its best expected speedup over K,
(1 - a^(K+1)) / ((1 - a)(K c + 1)) (Leviathan et al. 2023, eq. 1 and thm 3.8); the measurements
are cached per model and machine beside the cost curves.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import torch
from transformers import PreTrainedModel

from specdeck.engine.cache import costs_cache
from specdeck.engine.drafting.draft_model import DraftModelDrafter
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.lean_weights import share_first_layers
from specdeck.engine.forward.llama_families import supports
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel
from specdeck.engine.loading.models import LoadedModel, Progress
from specdeck.engine.planner.costs import cached_measurement, forward_ms, measurement_key
from specdeck.engine.resources import resource_path
from specdeck.engine.stats import predicted_speedup

SHARES = (1 / 4, 1 / 3, 1 / 2, 2 / 3, 5 / 6)  # candidate L as shares of the target's layers
CALIBRATION_TOKENS = 192  # positions the agreement is counted over
LONGEST_DRAFT = 8  # K up to which each candidate's speedup is weighed
TIMED_STEPS = 5  # one-token steps timed per model and turn, after two left out (warm-up)
TIMED_ROUNDS = 3  # turns of timing the full target and each candidate
TIMED_AFTER = 64  # cached positions the timed steps follow

_PARTIAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {L: partial model}


@dataclass(frozen=True)
class LayerChoice:
    """The layers a target drafts with, and what was measured of the candidates."""

    layers: int  # the first `layers` decoder layers draft
    total: int  # the target's decoder layers
    agreement: dict[int, float] = field(default_factory=dict)  # L -> share of argmaxes equal to the target's
    cost: dict[int, float] = field(default_factory=dict)  # L -> a partial step's time over a full step's
    chosen_by: str = "measured"  # "measured", or "set" where the user named L

    def describe(self) -> str:
        """'first 8 of 30 layers, agreement 0.62'."""
        agreement = self.agreement.get(self.layers)
        measured = f", agreement {agreement:.2f}" if agreement is not None else ""
        return f"first {self.layers} of {self.total} layers{measured}"

    def table(self) -> str:
        """Each candidate's agreement, cost and expected speedup: 'L=8: a 0.62, c 0.28, 1.31x; ...'."""
        return "; ".join(
            f"L={layers}: a {self.agreement[layers]:.2f}"
            + (
                f", c {self.cost[layers]:.2f}, {expected_speedup(self.agreement[layers], self.cost[layers]):.2f}x"
                if layers in self.cost
                else ""
            )
            for layers in sorted(self.agreement)
        )


def expected_speedup(agreement: float, cost: float, longest: int = LONGEST_DRAFT) -> float:
    """The best over K = 1..longest of (1 - a^(K+1)) / ((1 - a)(K c + 1)): tokens kept per round
    over a round's cost in target steps, drafts independent and the verify priced as one step."""
    return max(predicted_speedup(agreement, k, cost) for k in range(1, longest + 1))


def candidates(total: int) -> list[int]:
    """L at each of `SHARES` of `total` layers, each once, at least 1 and below `total`."""
    return sorted({min(total - 1, max(1, round(total * share))) for share in SHARES if total > 1})


def refuse_backend(target: LoadedModel | object) -> None:
    """Refuse a target run outside torch in this process (llama.cpp, a server), whose layers the
    partial model cannot share (the session refuses them first, `specdeck.engine.drafting.registry`)."""
    where = "on a server" if not isinstance(target, LoadedModel) else "on llama.cpp"
    if not isinstance(target, LoadedModel) or isinstance(target.model, LlamaCppModel):
        raise SpecDeckError(
            f"The layer-skip drafter drafts with the target's own first layers, which a target {where} "
            "does not expose: load it with --backend torch."
        )


def partial_model(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """`model` with only its first `layers` decoder layers, sharing every weight (made once per L)."""
    total = model.config.num_hidden_layers
    if not 1 <= layers < total:
        raise SpecDeckError(
            f"The layer-skip drafter drafts with 1 to {total - 1} of this target's layers (got {layers})."
        )
    made = _PARTIAL.setdefault(model, {})
    if layers not in made:
        made[layers] = _first_layers(model, layers)
    partial = made[layers]
    if supports(model):  # again each time: the target's products may have been laid out anew
        share_first_layers(partial, model, layers)
    return partial


def _first_layers(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A shallow copy of `model` whose decoder holds `model`'s first `layers` layers (the same
    modules) and whose config says so; the two share every parameter."""
    base: Any = model.base_model  # a Hugging Face decoder, read by its submodules' names
    name = next((n for n in ("layers", "h") if isinstance(getattr(base, n, None), torch.nn.ModuleList)), None)
    if name is None:
        raise SpecDeckError(f"The layer-skip drafter cannot find {type(model).__name__}'s list of decoder layers.")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if hasattr(config, "n_layer"):  # GPT-2's name for it
        config.n_layer = layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types[:layers])
    cut = copy.copy(base)  # a new module dict, so the target keeps all of its layers
    cut.__dict__["_modules"] = {**base._modules, name: getattr(base, name)[:layers]}
    cut.__dict__["config"] = config
    if base is model:
        return cut
    partial = copy.copy(model)
    partial.__dict__["_modules"] = {key: cut if module is base else module for key, module in model._modules.items()}
    partial.__dict__["config"] = config
    return partial


class LayerSkipDrafter(DraftModelDrafter):
    """The target's first L layers as a draft model (the loop, the cache and q are a draft model's)."""

    def __init__(self, target: PreTrainedModel, choice: LayerChoice) -> None:
        super().__init__(partial_model(target, choice.layers), name=f"layer skip ({choice.describe()})")


def calibration_ids(tokenizer) -> list[int]:
    """The first `CALIBRATION_TOKENS` tokens of the bundled prompt presets, one after another."""
    text = "\n\n".join(path.read_text(encoding="utf-8") for path in sorted(resource_path("presets").glob("*.txt")))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"][:CALIBRATION_TOKENS])


@torch.inference_mode()
def _argmaxes(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    return CachedModel(model).forward(ids).argmax(-1)


@torch.inference_mode()
def _step_ms(lm: CachedModel, ids: list[int]) -> float:
    """The fastest of `TIMED_STEPS` one-token steps after `TIMED_AFTER` cached positions, two left out
    first (milliseconds): the fastest, since another process only ever slows a step."""
    times = []
    for i in range(TIMED_STEPS + 2):
        times.append(forward_ms(lm, [ids[TIMED_AFTER + i % 8]]))
        lm.crop(TIMED_AFTER)
    return min(times[2:])


def measure(model: PreTrainedModel, ids: list[int], layer_counts: list[int], timed: bool = True) -> dict:
    """{"agreement": {L: a}, "cost": {L: c}} for each L of `layer_counts` on the text `ids`. The full
    and partial steps are timed in turns, `TIMED_ROUNDS` times, and c is the median of each turn's
    ratio: a busy spell of the machine then slows both sides of a ratio alike."""
    full = _argmaxes(model, ids)
    agreement = {
        layers: float((_argmaxes(partial_model(model, layers), ids) == full).float().mean()) for layers in layer_counts
    }
    if not timed:
        return {"agreement": agreement, "cost": {}}
    models = {layers: CachedModel(partial_model(model, layers)) for layers in layer_counts}
    whole = CachedModel(model)
    for lm in (whole, *models.values()):
        lm.forward(ids[:TIMED_AFTER], last_only=True)
    ratios: dict[int, list[float]] = {layers: [] for layers in layer_counts}
    for _ in range(TIMED_ROUNDS):
        step = _step_ms(whole, ids)
        for layers, lm in models.items():
            ratios[layers].append(_step_ms(lm, ids) / step)
    return {"agreement": agreement, "cost": {layers: median(each) for layers, each in ratios.items()}}


def choose_layers(target: LoadedModel, layers: int | None = None, progress: Progress | None = None) -> LayerChoice:
    """The layers `target` drafts with: `layers` where given (its agreement measured), else the
    candidate with the best `expected_speedup`, from measurements cached per model and machine."""
    refuse_backend(target)
    model = target.torch_model
    total = model.config.num_hidden_layers
    if total < 2:
        raise SpecDeckError(f"{target.name} has one decoder layer: there is no part of it to draft with.")
    ids = calibration_ids(target.tokenizer)
    if len(ids) <= TIMED_AFTER + 8:
        raise SpecDeckError(f"The calibration text is {len(ids)} tokens in {target.name}'s tokenizer: too short.")
    if layers is not None:
        partial_model(model, layers)  # checks the count
        raw = measure(model, ids, [layers], timed=False)
        return LayerChoice(layers, total, raw["agreement"], chosen_by="set")
    counts = candidates(total)
    path = costs_cache() / f"layer-skip-{measurement_key(model, 'layer skip')}.json"
    if progress and not path.is_file():
        progress(f"Measuring how well {target.name}'s first layers agree with all {total}")
    raw = cached_measurement(path, lambda: measure(model, ids, counts), "layer-skip measurement")
    agreement = {int(key): float(value) for key, value in raw["agreement"].items()}
    cost = {int(key): float(value) for key, value in raw["cost"].items()}
    best = max(agreement, key=lambda count: (expected_speedup(agreement[count], cost[count]), -count))
    return LayerChoice(best, total, agreement, cost)
