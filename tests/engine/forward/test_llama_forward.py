"""The lean Llama forward computes what Hugging Face's forward computes, so greedy text is unchanged."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdeck.engine import DecodeConfig, TokenEvent, encode_prompt, generate
from specdeck.engine.forward.kvcache import CachedModel, HFForward
from specdeck.engine.forward.llama_forward import LlamaForward


def test_logits_match_hf_through_prefill_steps_growth_and_crop(tiny_llama):
    """Prefill, single steps, a draft chunk, cache growth past its capacity, a crop and a re-feed:
    every forward's logits equal Hugging Face's forward over the same cached tokens."""
    model = tiny_llama[0].model
    fast, hf = LlamaForward(model, capacity=4), HFForward(model)
    ids = encode_prompt(tiny_llama[0].tokenizer, "The quick brown fox jumps over", chat=False)

    def feed(tokens: list[int], last_only: bool = False) -> None:
        with torch.inference_mode():
            got, expected = fast.logits(torch.tensor(tokens), last_only), hf.logits(torch.tensor(tokens), last_only)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert len(fast) == len(hf)

    feed(ids[:-1], last_only=True)
    for token in [ids[-1], 17, 42]:
        feed([token])
    feed([5, 6, 7, 8, 9, 10, 11])  # a verify chunk after cached positions, growing the cache twice
    fast.crop(len(ids) + 3)
    hf.crop(len(ids) + 3)
    feed([99, 100])
    feed([101])
    fast.reset()
    hf.reset()
    feed(ids)


def test_draft_hidden_states_match_hf(tiny_llama):
    """The final-norm hidden states a reduced-vocabulary draft reads equal Hugging Face's."""
    model = tiny_llama[1].model
    fast, hf = LlamaForward(model), HFForward(model)
    with torch.inference_mode():
        for tokens in ([3, 4, 5, 6], [7], [8, 9]):
            torch.testing.assert_close(
                fast.hidden(torch.tensor(tokens)), hf.hidden(torch.tensor(tokens)), rtol=1e-5, atol=1e-5
            )


def test_bare_model_on_input_vectors_matches_hf(tiny_llama):
    """A feature head's layer runs on vectors, not token ids: the lean forward of a bare LlamaModel
    fed `inputs_embeds` equals Hugging Face's through steps, a chunk and a crop."""
    body = tiny_llama[1].model.model
    fast, hf = LlamaForward(body), HFForward(body)
    vectors = torch.randn(9, body.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for part in (vectors[:4], vectors[4:5], vectors[5:8]):
            torch.testing.assert_close(fast.hidden_from_inputs(part), hf.hidden_from_inputs(part), rtol=1e-5, atol=1e-5)
        fast.crop(5)
        hf.crop(5)
        torch.testing.assert_close(
            fast.hidden_from_inputs(vectors[8:]), hf.hidden_from_inputs(vectors[8:]), rtol=1e-5, atol=1e-5
        )
        assert len(fast) == len(hf) == 6


def test_plain_greedy_equals_hf_generate(tiny_pair):
    """Plain greedy decoding gives Hugging Face generate()'s tokens, on the fast path for Llama and
    on Hugging Face's own forward for GPT-2."""
    target, _ = tiny_pair
    expected_backend = LlamaForward if target.model.config.model_type == "llama" else HFForward
    assert isinstance(CachedModel(target.model).backend, expected_backend)
    for prompt in ["The quick brown fox", "def add(a, b):\n    return"]:
        ids = encode_prompt(target.tokenizer, prompt, chat=False)
        ours = [e.token_id for e in generate(target, ids, DecodeConfig(max_new_tokens=40)) if isinstance(e, TokenEvent)]
        with torch.inference_mode():
            out = target.model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=40,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=target.tokenizer.eos_token_id,
            )
        assert ours == out[0, len(ids) :].tolist()[: len(ours)]


def tiny_config(**extra) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        **extra,
    )


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
            "rope_theta": 500000.0,
        },
    ],
    ids=["linear", "llama3"],
)
def test_scaled_rotary_variants_match_hf(rope):
    """Rotary variants with fixed frequencies run on the fast path with Hugging Face's logits."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(rope_parameters=rope, max_position_embeddings=64)).eval()
    fast, hf = LlamaForward(model), HFForward(model)
    with torch.inference_mode():
        for tokens in (list(range(1, 40)), [40], [41, 42, 43]):
            torch.testing.assert_close(
                fast.logits(torch.tensor(tokens), False), hf.logits(torch.tensor(tokens), False), rtol=1e-5, atol=1e-5
            )


def test_length_dependent_rotary_falls_back_to_hf():
    """Rotary scaling that changes with the sequence length is left to Hugging Face's forward."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        tiny_config(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    ).eval()
    lm = CachedModel(model)
    assert isinstance(lm.backend, HFForward)
    assert lm.forward([1, 2, 3]).shape == (3, 64)


def test_fused_layers_hand_out_the_eager_paths_taps(tiny_llama, monkeypatch):
    """A head that fuses lower layers reads the residual streams after them: the layers in one
    row kernel call hand out what the eager path does (to float32 rounding), in layer order
    whatever order the taps were asked in."""
    monkeypatch.setenv("SPECDECK_LINEAR", "kernel")
    model = LlamaForCausalLM(tiny_llama[0].model.config).eval()  # products chosen afresh, on the kernel
    fused = LlamaForward(model)
    if fused.fused is None:
        pytest.skip(f"the layers are not fused here ({fused.fused_unavailable})")
    monkeypatch.setenv("SPECDECK_FUSED_LAYERS", "0")
    eager = LlamaForward(model)
    assert eager.fused is None
    for forward in (fused, eager):
        forward.taps = (2, 1)
    with torch.inference_mode():
        for tokens in ([3, 4, 5, 6, 7], [8], [9, 10, 11]):
            got, expected = fused.hidden(torch.tensor(tokens)), eager.hidden(torch.tensor(tokens))
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert fused.tapped is not None and eager.tapped is not None
            assert fused.tapped.shape == (len(tokens), 2, model.config.hidden_size)
            torch.testing.assert_close(fused.tapped, eager.tapped, rtol=1e-5, atol=1e-5)
