"""What a forward costs on this machine, measured once and kept: the target's cost curve (one
forward over n new tokens, for the n of `CURVE_TOKENS`, after `curve_context` cached tokens),
cached per model, device, machine and product path in SpecDeck's cache (`costs/`, under
`measurement_key`), measured again where the machine was busy or its pace has moved. The auto
schedule (`specdeck.engine.planner.autotune`) plans every round with it and with a drafter's cost
per token (`specdeck.engine.planner.draft_costs`).

Every measurement runs on the KV cache it is given, a session's own, and rolls back what it wrote
there: no second cache beside the session's. A greedy session that finds no curve measured plans
from a first estimate (`first_estimate`, a few forwards) and leaves the curve to be measured after
its text (`curve_due`, `cost_curve`), so its first token does not wait for it.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import os
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specdeck.engine.atomic import recorded_damage, write_with
from specdeck.engine.cache import machine_name
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward import gguf_blocks, graphed_steps, kernel_build, linear, row_attention, row_kernel
from specdeck.engine.forward.hf_parts import input_embedding
from specdeck.engine.forward.kvcache import CachedModel, synchronize
from specdeck.engine.forward.llama_cache import LlamaShape
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

CURVE_TOKENS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)  # new tokens a cost curve is measured at
CURVE_CONTEXT = 128  # cached tokens the curve is measured after (fewer on large models: `curve_context`)
# what the keys and values of a measurement's positions may take at most: a 1.7B model's 144 positions
# (128 cached and 16 new) are 57 MB, which a session's peak memory would carry for a short prompt
MEASURED_CACHE_BYTES = 32 << 20
# rounds after a prefill whose times the planner does not learn from: the first steps after it run
# slow, as after any pause (the machine's caches and clocks after idle time), and learned from they
# would overprice a plain step for the rest of the session
SETTLE = 5
NOISY = 0.25  # passes of a cost curve further apart than this: measured on a busy machine (said; measured again)
# a cached curve whose one-token step runs this many times faster or slower now is measured again: the
# machine's pace moved, and with it the curve's shape, which the planner takes for sizes it has not measured
DRIFT = 1.4


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds of one target forward over n new tokens, at the measured n (linear in between)."""

    tokens: tuple[int, ...]
    forward_ms: tuple[float, ...]
    machine: str = ""
    spread: float = 0.0  # how far its passes disagreed: above NOISY, the machine was busy meanwhile
    context: int = CURVE_CONTEXT  # cached tokens it was measured after

    @property
    def noisy_note(self) -> str:
        """A warning for reports and plans where the curve was measured on a busy machine, or is a
        first estimate (`first_estimate`), else ""."""
        if self.machine.startswith(ESTIMATED):
            return "a first estimate, each size timed once: the curve is measured after this session"
        if self.spread <= NOISY:
            return ""
        return (
            f"measured while the machine was busy (passes {self.spread:.0%} apart): the next session measures it again"
        )

    def __post_init__(self) -> None:
        sizes, times = self.tokens, self.forward_ms
        if not sizes or len(sizes) != len(times) or any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1:
            raise ValueError(f"a cost curve needs increasing token counts, one time each, not {sizes} and {times}")
        if not all(math.isfinite(t) and t > 0 for t in times) or not math.isfinite(self.spread):
            raise ValueError(f"a cost curve's times are positive and finite, not {times}")

    def ms(self, n: int) -> float:
        tokens, ms = self.tokens, self.forward_ms
        if n <= tokens[0] or len(tokens) == 1:
            return ms[0]
        # the segment that ends at or past n; past the last point, the last segment extrapolated
        i = min(bisect.bisect_left(tokens, n), len(tokens) - 1)
        n0, n1, t0, t1 = tokens[i - 1], tokens[i], ms[i - 1], ms[i]
        return t0 + (t1 - t0) * (n - n0) / (n1 - n0)

    def describe(self) -> str:
        return ", ".join(f"{n}: {t:.1f}" for n, t in zip(self.tokens, self.forward_ms)) + " ms"


STEPS = 4  # one-token forwards timed in a row, per pass of `measure_curve`
PRIMING_CHUNK = 16  # cached tokens a measurement's cache is filled with a forward


def measure_curve(
    model: PreTrainedModel | LlamaCppModel,
    tokens: tuple[int, ...] = CURVE_TOKENS,
    passes: int = 3,
    context: int | None = None,
    lm: CachedModel | None = None,
) -> CostCurve:
    """Time the model's forward over each number of new tokens after `context` cached ones, on `lm`
    (emptied after; by default a KV cache of its own): every size once per pass (after a warm-up
    pass), the best of the passes kept, so a burst of other work on the machine spoils one pass,
    not one size. Two passes that agree are enough (a sampled session's first token may wait for
    them); up to `passes` run where they do not. The curve records how far the passes disagreed
    (the largest relative spread of any size): a noisy machine at the time. `context`: by default
    `curve_context`."""
    context = curve_context(model) if context is None else context
    with _primed(model, context, max(*tokens, SETTLE + STEPS), lm) as (lm, ids):
        runs = _passes(lm, ids, tokens, context, passes)
    best = [min(r[i] for r in runs) for i in range(len(tokens))]
    return CostCurve(tuple(tokens), tuple(round(b, 3) for b in best), _machine(lm), round(_spread(runs), 3), context)


def curve_context(model: torch.nn.Module | LlamaCppModel) -> int:
    """Cached tokens the model's curve is measured after: `CURVE_CONTEXT`, halved (to 16 at least)
    while the keys and values of those and the largest forward's tokens would take more than
    `MEASURED_CACHE_BYTES` in the lean forward's cache, so that measuring adds no more to a
    session's memory than its first cache takes
    (`specdeck.engine.forward.llama_forward.first_capacity`)."""
    config = getattr(model, "config", None)
    try:
        shape = LlamaShape.of(config)
        per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * 4  # float32 at most on the CPU
    except (AttributeError, TypeError, ZeroDivisionError):
        return CURVE_CONTEXT
    context = CURVE_CONTEXT
    while context > 16 and (context + max(CURVE_TOKENS)) * per_position > MEASURED_CACHE_BYTES:
        context //= 2
    return context


def _passes(lm: CachedModel, ids: list[int], tokens: tuple[int, ...], context: int, passes: int) -> list[list[float]]:
    """`measure_curve`'s passes over the sizes `tokens`, after a warm-up pass, on `lm` primed with `context` ids."""

    def one_pass(warm_up: bool) -> list[float]:
        times = []
        for n in tokens:
            # one token: the last STEPS of SETTLE + STEPS steps in a row, as plain decoding runs them
            # (the steps right after a larger forward run slow); more: the second of two alike
            starts = range(1 if warm_up else SETTLE + STEPS) if n == 1 else range(1 if warm_up else 2)
            measured = []
            for j in starts:
                lm.crop(context + j)
                measured.append(forward_ms(lm, ids[context + j : context + j + n]))
            times.append(min(measured[SETTLE:]) if n == 1 and not warm_up else measured[-1])
        return times

    one_pass(warm_up=True)  # every shape once: first runs allocate and fault pages in
    runs = [one_pass(warm_up=False), one_pass(warm_up=False)]
    while len(runs) < passes and _spread(runs) > NOISY / 2:
        runs.append(one_pass(warm_up=False))
    return runs


def _machine(lm: CachedModel) -> str:
    """What a curve measured on `lm` ran on, in words."""
    device = lm.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else machine_name()
    return f"{name}, {torch.get_num_threads()} threads"


ESTIMATE_TOKENS = (1, 2, 4, 8, 16)  # new tokens a first estimate times, once each
ESTIMATE_CONTEXT = 32  # cached tokens it times them after
ESTIMATED = "first estimate"  # how a first estimate's `machine` begins


def first_estimate(model: PreTrainedModel | LlamaCppModel, lm: CachedModel | None = None) -> CostCurve:
    """A cost curve for a session that does not wait for the measured one: one forward over each of
    `ESTIMATE_TOKENS` after `ESTIMATE_CONTEXT` cached tokens and a step to settle, on `lm` (emptied
    after), about as long as a dozen steps where the curve takes a hundred and more. Each size timed
    once, it is rough where the machine is busy; a greedy session corrects it by what its own
    verifies take (`RoundPlanner.record`), and the measured curve replaces it after the session."""
    context = ESTIMATE_CONTEXT
    with _primed(model, context, 1 + max(ESTIMATE_TOKENS), lm) as (lm, ids):
        forward_ms(lm, ids[context : context + 1])  # the first step after a forward over many runs slow
        times = []
        for n in ESTIMATE_TOKENS:
            lm.crop(context + 1)
            times.append(forward_ms(lm, ids[context + 1 : context + 1 + n]))
    # a larger forward measured faster than a smaller one was held up by other work: the smaller's time stands
    times = [max(times[: i + 1]) for i in range(len(times))]
    return CostCurve(ESTIMATE_TOKENS, tuple(round(t, 3) for t in times), f"{ESTIMATED}, {_machine(lm)}", 0.0, context)


def _spread(runs: list[list[float]]) -> float:
    """How far passes disagree: the largest, over sizes, of a size's median pass over its best."""
    return max(sorted(r[i] for r in runs)[len(runs) // 2] / min(r[i] for r in runs) - 1.0 for i in range(len(runs[0])))


def pace_of(
    model: PreTrainedModel | LlamaCppModel,
    curve: CostCurve,
    context: int | None = None,
    lm: CachedModel | None = None,
) -> float:
    """This machine's one-token step now over `curve`'s: the best of STEPS steps in a row after
    `context` cached tokens and SETTLE steps more, as `measure_curve` times them (a few tens of ms),
    on `lm` (emptied after); `context`: by default the curve's."""
    context = curve.context if context is None else context
    with _primed(model, context, SETTLE + STEPS, lm) as (lm, ids):
        times = [forward_ms(lm, ids[context + j : context + j + 1]) for j in range(SETTLE + STEPS)]
    return min(times[SETTLE:]) / curve.ms(1)


@contextmanager
def _primed(
    model: PreTrainedModel | LlamaCppModel, context: int, more: int, lm: CachedModel | None
) -> Iterator[tuple[CachedModel, list[int]]]:
    """`lm` (empty: a session's, before its prompt) or a KV cache of the model's own, holding `context`
    tokens, and the ids to time after them (`more` of them follow the cached ones); emptied after,
    so that a session's cache holds nothing of the measurement."""
    if lm is None:
        lm = CachedModel(model)
    elif len(lm):
        raise ValueError(f"costs are measured on an empty KV cache, not one holding {len(lm)} tokens")
    vocab = model.vocab_width if isinstance(model, LlamaCppModel) else input_embedding(model).num_embeddings
    ids = [(7 * i + 3) % vocab for i in range(context + more)]
    lm.reserve(row_attention.span(context + more))  # grown now, empty: no copy of what it holds
    try:
        # a chunk at a time, as a session's verifies fill a cache: one forward over all `context`
        # tokens holds every layer's activations for all of them at once (55 MB on a 1.7B model)
        for start in range(0, context, PRIMING_CHUNK):
            lm.forward(ids[start : min(start + PRIMING_CHUNK, context)], last_only=True)
        yield lm, ids
    finally:
        lm.reset()


def forward_ms(lm: CachedModel, ids: list[int]) -> float:
    """Milliseconds of one forward over `ids` after what `lm` holds (device work included)."""
    synchronize(lm.device)
    started = time.perf_counter()
    lm.forward(ids)
    synchronize(lm.device)
    return (time.perf_counter() - started) * 1e3


_CURVES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _head_dim(module: torch.nn.Module) -> int:
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    return getattr(config, "head_dim", None) or (getattr(config, "hidden_size", 0) // heads if heads else 0)


def measurement_key(module: torch.nn.Module | LlamaCppModel, what: str) -> str:
    """What a measurement of `module` on this machine is saved under: its config, dtype, device, product
    path, torch, threads and CPU; measured again where any of them changes."""
    if isinstance(module, LlamaCppModel):  # its config names the file and the library version
        runs_on, path = [module.backend], ""
    else:
        weights = [p.detach() for p in module.parameters()]
        runs_on = [str(weights[0].dtype), str(weights[0].device)]
        matrices = [w for w in weights if w.dim() == 2]
        # a part on blocks (a feature head's layer) runs on the row kernel: no float32 path is timed
        on_blocks = next((part for part in module.modules() if gguf_blocks.blocks_key(part)), module)
        path = gguf_blocks.prefer_kernel(on_blocks, lambda: linear.choose_path(matrices)).path
        if graphed_steps.fixed_shape_on(weights[0].device):  # CUDA graphs: another cost entirely
            path += " fixed-shape"
        else:  # curves measured before verifies attended in one call per span (`row_attention`) are left
            path += f" row attention {row_attention.SPAN}"
            if row_kernel.attention_unavailable(weights[0].dtype, weights[0].device, _head_dim(module)) is None:
                path += " on the row kernel"
            if path.startswith("kernel"):  # on blocks: the module's, or a part's (a feature head's layer)
                path += next((key for part in module.modules() if (key := gguf_blocks.blocks_key(part))), "")
                path += f", {kernel_build.identity()}"
            if path.startswith("kernel") and os.environ.get("SPECDECK_FUSED_LAYERS", "1").strip() != "0":
                path += ", layers fused"  # `specdeck.engine.forward.fused_layers`, where the model allows
    config = getattr(module, "config", None)
    parts = [
        what,
        config.to_json_string(use_diff=False) if config is not None else repr(module),
        *runs_on,
        torch.__version__,
        str(torch.get_num_threads()),
        machine_name(),
        path,
        repr(CURVE_TOKENS),
        str(curve_context(module)),
        f"one-token steps {STEPS} in a row after {SETTLE}, more tokens the last of three",  # how `measure_curve` times: curves timed otherwise are left
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def cached_measurement(path: Path | None, measure, what: str):
    """A measurement read from `path` where it is the one written there (its recorded size and
    digest), else made by `measure()` and saved there (JSON)."""
    if path is not None and path.is_file():
        damage = recorded_damage(path)
        try:
            if damage is None:
                return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            damage = str(error)
        log.warning("the %s in %s is damaged (%s): measuring it again", what, path, damage)
    value = measure()
    _save(path, value, what)
    return value


def _save(path: Path | None, value, what: str) -> None:
    """Write a measurement to `path` as JSON (nowhere without one); a failure is logged, not raised."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(value).encode("utf-8")
        write_with(path, lambda temporary: temporary.write_bytes(text), record=True)
    except (OSError, SpecDeckError) as error:
        log.warning("could not save the %s to %s (%s)", what, path, error)


def cost_curve(
    model: PreTrainedModel | LlamaCppModel,
    cache_dir: Path | None = None,
    lm: CachedModel | None = None,
    estimate: bool = False,
) -> CostCurve:
    """The model's cost curve on this machine: from memory, from `cache_dir`, or measured on `lm`
    (empty: a session's cache before its prompt; by default one of its own) and saved, so that later
    sessions plan alike: the auto schedule's choices, and so sampled text for a seed, repeat on this
    machine. A curve read back is checked against this machine's pace, and measured again where it
    moved. With `estimate`, nothing waits for a measurement: the curve saved in `cache_dir` where
    it is steady (its pace not checked yet), else a `first_estimate`; `curve_due` then says that a
    call without it is still to come."""
    if model in _CURVES:
        return _CURVES[model]
    path = cache_dir / f"curve-{measurement_key(model, 'curve')}.json" if cache_dir else None
    if estimate:
        saved = _read_curve(path)
        return saved if saved is not None and saved.spread <= NOISY else first_estimate(model, lm)
    cached = path is not None and path.is_file()
    raw = cached_measurement(path, lambda: asdict(measure_curve(model, lm=lm)), "cost curve")
    try:
        curve = _as_curve(raw)
    except (KeyError, TypeError, ValueError) as error:  # a record that read back but says nonsense
        log.warning("the cost curve in %s cannot be used (%s): measuring it again", path, error)
        curve = measure_curve(model, lm=lm)
        _save(path, asdict(curve), "cost curve")
    if curve.spread > NOISY:  # measured on a busy machine: measure again, keep the steadier of the two
        again = measure_curve(model, lm=lm)
        if again.spread < curve.spread:
            curve = again
            _save(path, asdict(curve), "cost curve")
    elif cached and not 1 / DRIFT <= (pace := pace_of(model, curve, lm=lm)) <= DRIFT:
        again = measure_curve(model, lm=lm)
        if again.spread <= NOISY:
            log.info("the machine runs at %.2fx the cached cost curve's times: measured it again", pace)
            curve = again
            _save(path, asdict(curve), "cost curve")
    _CURVES[model] = curve
    return curve


def curve_due(model: PreTrainedModel | LlamaCppModel) -> bool:
    """Whether the model's cost curve is still to be measured or checked in this process (`cost_curve`):
    a session that planned from an estimate leaves it to be measured after its text."""
    return model not in _CURVES


def _as_curve(raw) -> CostCurve:
    """The curve a saved record describes (KeyError, TypeError or ValueError where it is not one)."""
    return CostCurve(
        tuple(raw["tokens"]),
        tuple(raw["forward_ms"]),
        raw.get("machine", ""),
        float(raw.get("spread", 0.0)),
        int(raw.get("context", CURVE_CONTEXT)),
    )


def _read_curve(path: Path | None) -> CostCurve | None:
    """The curve saved at `path` where it reads back whole and makes sense, else None (nothing said:
    `cost_curve` says it where it measures again)."""
    if path is None or not path.is_file() or recorded_damage(path) is not None:
        return None
    try:
        return _as_curve(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, KeyError, TypeError, ValueError):
        return None
