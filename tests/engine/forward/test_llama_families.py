"""The lean forward reproduces Hugging Face's logits for every family it takes (Llama, Qwen2/2.5,
Qwen3, Mistral), on either product path, through prefill, steps, a verify chunk, a crop and a tree."""

import pytest
import torch
from tiny import PACKED_PATHS
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

from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.forward.llama_families import supports
from specdeck.engine.forward.llama_forward import LlamaForward

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)
FAMILIES = {
    "llama-biased": (LlamaForCausalLM, LlamaConfig(attention_bias=True, mlp_bias=True, **SIZES)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**SIZES)),
    "qwen2-windowed": (
        Qwen2ForCausalLM,
        Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=1, **SIZES),
    ),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(head_dim=8, **SIZES)),
    "mistral": (MistralForCausalLM, MistralConfig(sliding_window=5, head_dim=8, **SIZES)),
}
PATHS = ["dense", *PACKED_PATHS]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    monkeypatch.setenv("SPECDECK_LINEAR", request.param)
    return request.param


def build(family: str) -> torch.nn.Module:
    cls, config = FAMILIES[family]
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # random biases: Hugging Face initialises them to zero
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.2)
    return model


def reference(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Hugging Face's logits for every position of `ids`, computed from scratch."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids], device=next(model.parameters()).device)).logits[0]


def feed_and_compare(model: torch.nn.Module, fast: LlamaForward, chunks: list[list[int] | None]) -> None:
    """Feed `fast` each chunk of token ids in turn (None: crop the last 4 tokens) and check every
    forward's logits against Hugging Face's over the same tokens from scratch (to 1e-4)."""
    device, kept = next(model.parameters()).device, []
    for tokens in chunks:
        if tokens is None:
            fast.crop(len(kept) - 4)
            del kept[-4:]
            continue
        with torch.inference_mode():
            got = fast.logits(torch.tensor(tokens, device=device), last_only=False)
        kept += tokens
        torch.testing.assert_close(got, reference(model, kept)[-len(tokens) :], rtol=1e-4, atol=1e-4)
        assert len(fast) == len(kept)


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_forward_matches_hugging_face(family, path):
    """Prefill, steps, a verify chunk, a crop and a re-feed, past the sliding window where there is
    one: every forward's logits are Hugging Face's for the same tokens (to 1e-4)."""
    model = build(family)
    assert supports(model) and isinstance(CachedModel(model).backend, LlamaForward)
    fast = LlamaForward(model, capacity=4)
    assert fast.row_exact == (path != "dense")
    # a prefill longer than the window, steps, a verify chunk growing the cache, a crop, a re-feed
    feed_and_compare(
        model, fast, [[3, 9, 27, 17, 51, 25, 11, 33], [7], [21], [63], [5, 6, 7, 8, 9, 10], None, [40, 41], [42]]
    )


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_tree_nodes_match_hugging_face_along_their_paths(family, path):
    """A token tree after a cache longer than the window: each node's logits are Hugging Face's for
    the cached tokens followed by that node's own path."""
    model = build(family)
    fast = LlamaForward(model)
    cached = list(range(10, 22))
    ids, parents = [40, 41, 42, 43, 44], [-1, 0, 1, 0, 3]
    with torch.inference_mode():
        fast.hidden(torch.tensor(cached))
        tree = fast.output_layer(fast.hidden_tree(torch.tensor(ids), parents))
    for node, path_ in enumerate([[0], [0, 1], [0, 1, 2], [0, 3], [0, 3, 4]]):
        expected = reference(model, cached + [ids[i] for i in path_])[-1]
        torch.testing.assert_close(tree[node], expected, rtol=1e-4, atol=1e-4)


def test_unknown_attention_kinds_fall_back_to_hugging_face():
    """A layer kind the lean forward does not reproduce leaves the model on Hugging Face's forward."""
    _, config = FAMILIES["qwen2"]
    odd = Qwen2Config(**{**SIZES, "layer_types": ["full_attention", "chunked_attention", "full_attention"]})
    assert not supports(Qwen2ForCausalLM(odd))
    assert supports(Qwen2ForCausalLM(config))
