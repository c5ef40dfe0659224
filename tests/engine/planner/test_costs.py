"""The target's cost curve is measured on the session's own KV cache, and a greedy session's first
token does not wait for it."""

from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
from transformers import LlamaConfig

from specdeck.engine import DecodeConfig, SummaryEvent, TokenEvent, encode_prompt, generate
from specdeck.engine.drafting.drafters import PromptLookupDrafter
from specdeck.engine.events import SessionStarted
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.planner import costs

PROMPT = "def add(a, b):\n    return a + b\n\ndef add("


@pytest.fixture
def no_costs_yet(tiny_llama, tmp_path, monkeypatch):
    """An empty cache of measured costs, as on a first launch, and nothing measured in this process."""
    target, _ = tiny_llama
    monkeypatch.setattr("specdeck.engine.loop.schedule.costs_cache", lambda: tmp_path)
    monkeypatch.delitem(costs._CURVES, target.model, raising=False)
    return tmp_path


def _kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_measuring_the_curve_makes_no_second_kv_cache(tiny_llama, no_costs_yet, monkeypatch, temperature):
    """A session that measures the target's cost curve (sampled: before its first token; greedy:
    after its text) measures it on the one KV cache it decodes on, and then knows it; greedy text
    is still the plain text."""
    target, _ = tiny_llama
    made = []
    original = CachedModel.__init__

    def counted(self, model, *args, **kwargs):
        if model is target.model:
            made.append(self)
        original(self, model, *args, **kwargs)

    monkeypatch.setattr(CachedModel, "__init__", counted)
    ids = encode_prompt(target.tokenizer, PROMPT, chat=False)
    config = DecodeConfig(max_new_tokens=12, temperature=temperature)
    events = list(generate(target, ids, config, PromptLookupDrafter()))
    assert len(made) == 1, f"{len(made)} KV caches of the target in one session"
    assert not costs.curve_due(target.model)
    assert list(no_costs_yet.glob("curve-*.json")), "the measured curve was not saved"
    if temperature == 0.0:
        made.clear()
        assert _kept(events) == _kept(generate(target, ids, DecodeConfig(max_new_tokens=12)))


def test_a_greedy_session_s_first_token_does_not_wait_for_the_curve(tiny_llama, no_costs_yet, monkeypatch):
    """With no curve measured, a greedy session plans from a first estimate, measures the curve only
    after its summary, and saves it: the next session plans from the measured curve."""
    target, _ = tiny_llama
    happened = []
    measure = costs.measure_curve

    def noted(model, *args, **kwargs):  # as on a quiet machine: a busy one's curve is measured again
        happened.append("measured")
        return replace(measure(model, *args, **kwargs), spread=0.0)

    monkeypatch.setattr(costs, "measure_curve", noted)
    # and at a steady pace: a tiny model's sub-millisecond steps beside other tests' work can drift
    # past `DRIFT`, which measures the curve again (tested in test_autotune on its own)
    monkeypatch.setattr(costs, "pace_of", lambda model, curve, lm=None: 1.0)
    ids = encode_prompt(target.tokenizer, PROMPT, chat=False)
    started = None
    for event in generate(target, ids, DecodeConfig(max_new_tokens=12), PromptLookupDrafter()):
        happened.append(type(event).__name__)
        started = event if isinstance(event, SessionStarted) else started
    assert "measured" in happened, "the curve was never measured"
    assert happened.index("TokenEvent") < happened.index("SummaryEvent") < happened.index("measured")
    assert started is not None and started.curve_tokens == costs.ESTIMATE_TOKENS
    estimate = started.curve_ms
    assert all(t > 0 for t in estimate) and list(estimate) == sorted(estimate)

    happened.clear()
    monkeypatch.delitem(costs._CURVES, target.model)  # a new process: the curve comes from the cache
    events = list(generate(target, ids, DecodeConfig(max_new_tokens=12), PromptLookupDrafter()))
    started = next(e for e in events if isinstance(e, SessionStarted))
    assert started.curve_tokens == costs.CURVE_TOKENS and "measured" not in happened
    assert isinstance(events[-1], SummaryEvent)


def test_a_measurement_leaves_the_cache_it_used_empty(tiny_llama):
    """The curve, the pace and the first estimate are measured on a given empty KV cache and leave it
    empty, so that the session's prompt goes in after nothing of theirs; a cache that holds tokens
    is refused."""
    target, _ = tiny_llama
    lm = CachedModel(target.model)
    curve = costs.measure_curve(target.model, lm=lm)
    assert len(lm) == 0
    assert costs.pace_of(target.model, curve, lm=lm) > 0 and len(lm) == 0
    assert costs.first_estimate(target.model, lm).tokens == costs.ESTIMATE_TOKENS and len(lm) == 0
    lm.forward([1, 2, 3])
    with pytest.raises(ValueError, match="empty KV cache"):
        costs.first_estimate(target.model, lm)


def test_a_large_model_s_curve_is_measured_after_fewer_tokens():
    """The keys and values a measurement writes (its cached tokens and the largest forward's) take at
    most `MEASURED_CACHE_BYTES` where the context can shrink: a 1.7B model's curve is measured after
    64 tokens (31 MB, not 57), a small model's after 128, and a saved curve says after how many."""
    large = SimpleNamespace(
        config=LlamaConfig(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=32,
        )
    )
    small = SimpleNamespace(
        config=LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    )
    assert costs.curve_context(small) == costs.CURVE_CONTEXT
    context = costs.curve_context(large)
    per_position = 2 * 24 * 32 * 64 * 4
    assert context < costs.CURVE_CONTEXT
    assert (context + max(costs.CURVE_TOKENS)) * per_position <= costs.MEASURED_CACHE_BYTES
    assert (2 * context + max(costs.CURVE_TOKENS)) * per_position > costs.MEASURED_CACHE_BYTES
    curve = costs.CostCurve((1, 16), (10.0, 11.0), "this machine", 0.05, context)
    assert costs._as_curve(asdict(curve)) == curve
