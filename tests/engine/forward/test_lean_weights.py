"""The lean forward's fused and packed weights replace the model's own copy: a model on the lean
forward holds about its own bytes, and its parameters keep their values for every other reader."""

import pytest
import torch
from tiny import PACKED_PATHS
from transformers import LlamaConfig, LlamaForCausalLM

from specdeck.engine.forward.lean_weights import output_weight, weights_of
from specdeck.engine.forward.linear import DenseLinear, PackedLinear
from specdeck.engine.forward.llama_forward import LlamaForward
from specdeck.engine.forward.row_kernel import KernelLinear

PATHS = ["dense", *PACKED_PATHS]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    monkeypatch.setenv("SPECDECK_LINEAR", request.param)
    return request.param


def tiny_llama(tied: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).eval()


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of every distinct storage the model's parameters and its lean weights hold."""
    seen: dict[int, int] = {}

    def add(tensor: torch.Tensor | None) -> None:
        if tensor is None:
            return
        if tensor.is_mkldnn:  # opaque layout: its logical size
            seen[id(tensor)] = tensor.numel() * tensor.element_size()
        else:
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()

    for param in model.parameters():
        add(param)
    weights = weights_of(model)
    products = [p for layer in weights.layers for p in (layer.qkv, layer.out, layer.gate_up, layer.down)]
    for product in products + [weights.head]:
        add(product.bias)
        for tensor in _held(product):
            add(tensor)
    for layer in weights.layers:
        add(layer.input_norm)
        add(layer.post_norm)
    for tensor in (weights.embed, weights.norm, weights.inv_freq):
        add(tensor)
    return sum(seen.values())


def _held(product) -> list[torch.Tensor]:
    if isinstance(product, PackedLinear):
        return product._packed
    return [product._packed] if isinstance(product, KernelLinear) else [product.weight]


def model_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_lean_weights_are_held_once(path, tied):
    """On either product path a model on the lean forward holds at most 1.05x its own bytes
    (2.0x or more before); a tied output layer, which token lookup also reads in plain layout,
    adds its packed copy on the packed path and nothing else."""
    model = tiny_llama(tied)
    own = model_bytes(model)
    LlamaForward(model)
    extra = model.lm_head.weight.numel() * 4 if tied and path != "dense" else 0
    assert held_bytes(model) <= 1.05 * own + extra


def test_parameters_keep_their_values_and_identity(path):
    """After the lean forward read the model, its parameters are the same objects, Hugging Face's
    forward gives the same logits bit for bit, and the state dict holds the same values."""
    model = tiny_llama()
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    params = list(model.parameters())
    with torch.inference_mode():
        before_logits = model(input_ids=ids).logits
    before_state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    lean = LlamaForward(model)
    with torch.inference_mode():
        lean.logits(ids[0], last_only=False)
        assert torch.equal(model(input_ids=ids).logits, before_logits)
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(torch.equal(before_state[name], tensor) for name, tensor in model.state_dict().items())
    assert torch.equal(output_weight(model), before_state["lm_head.weight"])


def test_weights_changed_in_place_are_read_again(path):
    """A training step after the lean forward read the model (the model's own forward, then a
    parameter changed in place) reaches the next lean forward, which again matches Hugging Face's
    logits; reading the weights again copies nothing on the dense path."""
    model = tiny_llama()
    ids = torch.tensor([5, 17, 42, 99, 3])
    LlamaForward(model)
    model(input_ids=ids[None]).logits.sum().backward()
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.sub_(model.model.layers[1].self_attn.k_proj.weight.grad)
    lean = LlamaForward(model)
    with torch.inference_mode():
        torch.testing.assert_close(
            lean.logits(ids, last_only=False), model(input_ids=ids[None]).logits[0], rtol=1e-5, atol=1e-5
        )
    if path == "dense":
        qkv = weights_of(model).layers[1].qkv
        assert isinstance(qkv, DenseLinear)
        assert qkv.weight.untyped_storage().data_ptr() == model.model.layers[1].self_attn.q_proj.weight.data_ptr()


def test_a_load_lays_out_the_weights_and_says_so(tmp_path):
    """Loading a pair lays out the target's lean weights under the load's progress, so the first
    session starts decoding at once instead of sitting silent while they are laid out."""
    from tiny import build_pair

    from specdeck.engine.forward import lean_weights
    from specdeck.engine.pair import PairSpec
    from specdeck.engine.session import load_pair

    target_dir, _ = build_pair(tmp_path, "llama")
    said: list[str] = []
    pair = load_pair(PairSpec(target=str(target_dir), drafter="prompt-lookup", device="cpu"), progress=said.append)
    assert pair.target.model in lean_weights._WEIGHTS
    assert any(line.startswith("Laying out") for line in said), said
