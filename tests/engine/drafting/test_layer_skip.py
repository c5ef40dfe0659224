"""The layer-skip drafter (the target's first layers draft for it): exact for greedy and sampled
decoding on each family the lean forward takes, sharing the target's weights, its layer count
measured once per model and machine, and refused where the target runs elsewhere."""

from dataclasses import replace

import pytest
import torch
from sampling_checks import chi_square, chi_square_quantile, exact_two_token_distribution, sample_two_tokens
from tiny import build_tokenizer
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from specdeck.engine import DecodeConfig, Proposal, TokenEvent, encode_prompt, generate
from specdeck.engine.drafting import layer_skip
from specdeck.engine.drafting.layer_skip import LayerSkipDrafter, choose_layers, partial_model
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.session import load_pair

SIZES = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config),
    "qwen3": (Qwen3ForCausalLM, lambda **kw: Qwen3Config(head_dim=8, **kw)),
    "mistral": (MistralForCausalLM, lambda **kw: MistralConfig(sliding_window=6, head_dim=8, **kw)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_dir(request, tiny_root):
    """A seeded tiny model of one family, 4 layers, with a byte-level BPE tokenizer, saved."""
    directory = tiny_root / f"layer-skip-{request.param}"
    tokenizer = build_tokenizer(directory)
    model_class, config_class = FAMILIES[request.param]
    torch.manual_seed(0)
    model = model_class(config_class(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, **SIZES))
    with torch.no_grad():  # sharper logits, so greedy choices are not near-ties
        model.get_output_embeddings().weight.mul_(4.0)
    model.save_pretrained(directory)
    return directory


def kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def test_greedy_text_equals_plain_text(family_dir, monkeypatch, tmp_path):
    """With the layers it chose by measurement, greedy speculative text is plain greedy text, token
    for token, and some drafts were kept."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    pair = load_pair(PairSpec(str(family_dir), drafter=DrafterKind.LAYER_SKIP, device="cpu", dtype="float32"))
    assert pair.layer_choice is not None and 1 <= pair.layer_choice.layers < 4
    assert f"first {pair.layer_choice.layers} of 4 layers, agreement" in pair.description
    ids = encode_prompt(pair.target.tokenizer, "The quick brown fox", chat=False)
    config = DecodeConfig(k=3, schedule="constant", max_new_tokens=40)
    plain = kept(generate(pair.target, ids, config))
    events = list(generate(pair.target, ids, config, pair.make_drafter()))
    assert kept(events) == plain
    assert events[-1].drafted > 0 and events[-1].accepted > 0


def test_partial_model_shares_the_targets_weights(tiny_llama):
    """The drafting model holds no weights of its own: its parameters and its lean products are
    the target's, and the target keeps all its layers."""
    target, _ = tiny_llama
    partial = partial_model(target.model, 1)
    assert partial.config.num_hidden_layers == 1 and target.model.config.num_hidden_layers == 2
    assert len(target.model.model.layers) == 2
    assert {id(p) for p in partial.parameters()} < {id(p) for p in target.model.parameters()}
    full, part = weights_of(target.model), weights_of(partial)
    assert len(part.layers) == 1 and part.layers[0] is full.layers[0] and part.output is full.output


class MisreportedLayerSkip(LayerSkipDrafter):
    """Proposes the partial model's likeliest tokens but reports the distribution it samples from as
    their q: wrong on purpose."""

    def propose(self, ids, shape):
        proposal = super().propose(ids, shape)
        return Proposal(proposal.q.argmax(-1).tolist(), proposal.q)


@pytest.mark.parametrize("honest", [True, False], ids=["partial-model-q", "control-misreported-q"])
def test_sampling_follows_target(tiny_llama, honest):
    """Over 1000 seeds the first sampled token, and the first two, follow the target exactly when q is
    the partial model's distribution; the control, the likeliest drafts judged with the sampled q,
    fails the same test on the first token."""
    target, _ = tiny_llama
    choice = choose_layers(target, layers=1)
    ids = encode_prompt(target.tokenizer, "The quick brown", chat=False)
    base = DecodeConfig(k=3, temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=2)
    exact = exact_two_token_distribution(target, ids, base)
    make = LayerSkipDrafter if honest else MisreportedLayerSkip
    n = 1000
    counts, rejections = sample_two_tokens(
        target, ids, replace(base, schedule="constant"), lambda: make(target.model, choice), n
    )
    first, first_exact = first_tokens(counts), first_tokens(exact)
    stat, df = chi_square(first, first_exact, n)
    assert df >= 5
    if honest:
        assert 0.05 * n < rejections < 0.95 * n  # both branches of the rule were taken often
        assert stat < chi_square_quantile(df)
        stat, df = chi_square(counts, exact, n)  # and the pairs of tokens
        assert stat < chi_square_quantile(df)
    else:
        assert stat > chi_square_quantile(df)


def first_tokens(counts: dict) -> dict:
    """Counts (or probabilities) of token sequences summed by their first token."""
    summed: dict = {}
    for tokens, value in counts.items():
        summed[tokens[0]] = summed.get(tokens[0], 0) + value
    return summed


def test_layer_choice_is_measured_once_and_reused(tiny_llama, monkeypatch, tmp_path):
    """The first choice measures and saves; a later one (another process, say) reads the cache and
    chooses the same layers without measuring; a count the user sets wins."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    target, _ = tiny_llama
    first = choose_layers(target)
    assert list((tmp_path / "costs").glob("layer-skip-*.json"))
    assert set(first.agreement) == set(first.cost) == {1}

    def measure_again(*args, **kwargs):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(layer_skip, "measure", measure_again)
    assert choose_layers(target) == first
    monkeypatch.undo()
    assert choose_layers(target, layers=1).chosen_by == "set"


def test_expected_speedup_weighs_agreement_against_cost():
    """Leviathan et al.'s speedup: more agreement pays, a dearer draft costs, and a draft that costs
    a whole step and never agrees loses."""
    assert layer_skip.expected_speedup(0.8, 0.3) > layer_skip.expected_speedup(0.6, 0.3)
    assert layer_skip.expected_speedup(0.8, 0.3) > layer_skip.expected_speedup(0.8, 0.5)
    assert layer_skip.expected_speedup(0.0, 1.0) < 1.0
    assert layer_skip.candidates(30) == [8, 10, 15, 20, 25]
    assert layer_skip.candidates(2) == [1]


@pytest.mark.parametrize(
    "spec, backend, where",
    [
        (PairSpec("http://127.0.0.1:9/v1", drafter=DrafterKind.LAYER_SKIP, target_model="m"), None, "on a server"),
        (PairSpec("model.gguf", drafter=DrafterKind.LAYER_SKIP), "llama.cpp", "on llama.cpp"),
    ],
)
def test_target_elsewhere_is_refused_with_what_runs_there(spec, backend, where):
    """A served target or one on llama.cpp gets one message naming the drafters that work there."""
    with pytest.raises(SpecDeckError, match=f"does not run {where}: .*does not expose.*prompt-lookup, suffix"):
        spec.resolved(backend)


def test_bench_entry_names_the_layer_count():
    """`--drafters layer-skip:3` drafts with 3 layers; anything else after the colon is refused."""
    spec = PairSpec(drafter=DrafterKind.LAYER_SKIP, draft="3").resolved()
    assert spec.draft_layers == 3 and spec.draft is None and spec.drafter_entry == "layer-skip:3"
    assert spec.arguments()[-2:] == ["--draft-layers", "3"]
    with pytest.raises(SpecDeckError, match="a number of layers"):
        PairSpec(drafter=DrafterKind.LAYER_SKIP, draft="some/model").resolved()
