"""A decoder's weights as the lean forward (`specdeck.engine.forward.llama_forward`) multiplies them, held once.

The lean forward runs four products per layer: query/key/value fused into one, the output
projection, gate/up fused into one, and down; then the output layer. A fused matrix concatenated
beside the model's own would hold those weights twice (1.5x the model's bytes: 25 GB instead of
16 for an 8B model in bfloat16), so the fused matrix becomes the only copy:

- On the dense path (`F.linear`: every GPU, and CPUs where packing does not pay) the model's own
  parameters are pointed at row slices of the fused matrix (`param.data = fused[a:b]`). They stay
  the same `Parameter` objects, so Hugging Face's forward, optimizers and state dicts see the
  same values in the same places.
- On a packed path (oneDNN's blocked layout or the row kernel's blocks, `specdeck.engine.forward.linear`) the
  packed matrices are the copy the forward reads, and the model's plain matrices are released: each parameter keeps its shape,
  dtype and device on a one-element placeholder. They come back, bit for bit (the product's `dense`),
  the first time anything runs one of the released modules (Hugging Face's forward, the
  benchmark's `generate()` baseline) or asks for its state dict; from then on the model holds both.
  The input embedding is not released (token lookup reads it), so a model whose output layer is
  its embedding (tied) keeps the plain table beside the packed one; but a GGUF model read in place,
  whose lookups read the file's blocks (`specdeck.engine.forward.token_rows`): its table is a placeholder, brought
  back with the rest.

`output_weight` gives the output matrix's values whichever state the model is in.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specdeck.engine.forward import gguf_blocks, weight_arena
from specdeck.engine.forward.hf_parts import input_embedding, output_projection
from specdeck.engine.forward.linear import PACKED, Linear, PathChoice, choose_path, make_linear
from specdeck.engine.forward.token_rows import BlockEmbedding, TokenRows
from specdeck.engine.memory import trim_heap


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # rows: query heads, then key heads, then value heads (bias likewise, if any)
    qk_norm: torch.Tensor | None  # Qwen3's per-head RMSNorm weights, (query heads + key heads, head_dim)
    out: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # rows: gate, then up
    down: Linear


@dataclass
class LeanWeights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    head: Linear | None  # the output layer; None for a bare decoder (no output layer)
    inv_freq: torch.Tensor
    rope_scaling: float  # the rotary "attention factor" (1 except for yarn)
    products: PathChoice  # the path every product of the model runs on, and why (`choose_path`)
    token_rows: TokenRows | None = None  # lookups on a GGUF file's blocks; `embed` is then a placeholder

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings of `ids` (..., hidden)."""
        return F.embedding(ids, self.embed) if self.token_rows is None else self.token_rows(ids)

    @property
    def output(self) -> Linear:
        """The output layer, which a bare decoder lacks."""
        if self.head is None:
            raise ValueError("this model has no output layer: it is a bare decoder")
        return self.head

    @property
    def row_exact(self) -> bool:
        """Whether every product gives each row the same bits alone as in a batch (`specdeck.engine.forward.linear`):
        then, with attention that does too (`specdeck.engine.forward.row_attention`), a verify's logits for a token
        equal bit for bit the logits a plain step would give it. Every product takes the one
        path chosen for the whole model."""
        return self.products.path in PACKED


class _Dense(Protocol):
    def dense(self) -> torch.Tensor: ...


@dataclass
class _Released:
    """A model's parameters whose values live only in packed products (or a file's blocks), and the
    hooks that bring them back."""

    parts: list[tuple[torch.Tensor, _Dense, int, int]]  # parameter, what holds its values, its rows [a, b)
    hooks: list = field(default_factory=list)


_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (parameters' key, LeanWeights)
_RELEASED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _Released


def weights_of(model: PreTrainedModel) -> LeanWeights:
    """The model's weights for the lean forward, read once and kept while the model lives; read
    again when its parameters were moved or changed in place (their storage or version differ)."""
    cached = _WEIGHTS.get(model)
    if cached is not None and cached[0] == _key(model):
        return cached[1]
    restore(model)  # the model changed since its matrices were released: their values back first
    with torch.inference_mode(False), torch.no_grad():  # plain tensors: the parameters may be trained later
        weights = _read(model)
    _WEIGHTS[model] = (_key(model), weights)
    trim_heap()  # the replaced copies and the packing's scratch, back to the system
    return weights


def share_first_layers(partial: PreTrainedModel, model: PreTrainedModel, layers: int) -> None:
    """Let `partial`, whose parameters are `model`'s embedding, first `layers` layers, final norm and
    output layer (`specdeck.engine.drafting.layer_skip`), run on `model`'s lean weights: nothing is read, fused or
    packed again, so the partial model costs no memory for weights."""
    full = weights_of(model)
    _WEIGHTS[partial] = (_key(partial), replace(full, layers=full.layers[:layers]))


def rows_in_8_bits(model: object) -> bool:
    """Whether the model's lean forward, as last read, takes its rows in 8 bits on a GGUF file's
    blocks (`specdeck.engine.forward.gguf_blocks.activations`): another arithmetic than Hugging Face's forward."""
    cached = _WEIGHTS.get(model)
    return cached is not None and any(
        getattr(product, "activations", None) == "int8"
        for layer in cached[1].layers
        for product in (layer.qkv, layer.out, layer.gate_up, layer.down)
    )


def _key(model: torch.nn.Module) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def _read(model: PreTrainedModel) -> LeanWeights:
    base: Any = model.base_model  # a Hugging Face decoder, walked by its submodules' names
    head = output_projection(model) if base is not model else None
    groups = []  # per layer: the modules of qkv, out, gate_up, down (fused where one input feeds several)
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        groups.append(
            [[attn.q_proj, attn.k_proj, attn.v_proj], [attn.o_proj], [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]]
        )
    matrices = [module.weight for layer in groups for group in layer for module in group]
    weighed = matrices + ([head.weight] if head is not None else [])
    on_file = gguf_blocks.blocks_of(model)  # its index read first, while a kernel build may still run
    choice = gguf_blocks.prefer_kernel(model, lambda: choose_path(weighed))
    embedding = base.embed_tokens
    token_rows = embedding.rows if isinstance(embedding, BlockEmbedding) else None
    keep = set() if token_rows is not None else {id(embedding.weight)}  # lookups read the plain table
    if model not in _WEIGHTS and next(model.parameters()).device.type == "cpu":
        _own_storage(model, groups, head, keep if choice.path in PACKED else None)
    released = _Released([])
    owner = weakref.ref(model)  # the hooks must not keep the model alive

    def bring_back(*_) -> None:
        if (alive := owner()) is not None:
            restore(alive)

    # a GGUF target's products on the row kernel take the file's own blocks where it holds them
    blocks = on_file if choice.path == "kernel" else None

    def product(modules: list[torch.nn.Linear], names: list[str]) -> Linear:
        bias = _stack([m.bias for m in modules]) if modules[0].bias is not None else None
        on_file = blocks.product(names, [m.weight for m in modules], bias) if blocks else None
        linear: Linear = (
            on_file if on_file is not None else make_linear(_stack([m.weight for m in modules]), choice, bias)
        )
        if linear.path in PACKED and getattr(linear, "exact", True):  # else the model keeps its own
            row = 0
            for module in modules:
                if id(module.weight) not in keep:
                    released.parts.append((module.weight, linear, row, row + module.weight.shape[0]))
                    released.hooks.append(module.register_forward_pre_hook(bring_back))
                    released.hooks.append(module.register_state_dict_pre_hook(bring_back))
                row += module.weight.shape[0]
        return linear

    layers = []
    for index, (layer, (qkv, out, gate_up, down)) in enumerate(zip(base.layers, groups)):
        names = blocks.layer_names(index) if blocks else [[]] * 4
        attn = layer.self_attn
        qk_norm = None
        if hasattr(attn, "q_norm"):  # Qwen3: each query and key head normalised before the rotary
            qk_norm = torch.cat(
                [
                    attn.q_norm.weight.detach().expand(attn.config.num_attention_heads, -1),
                    attn.k_norm.weight.detach().expand(attn.config.num_key_value_heads, -1),
                ]
            )
        layers.append(
            LayerWeights(
                layer.input_layernorm.weight.detach(),
                product(qkv, names[0]),
                qk_norm,
                product(out, names[1]),
                layer.post_attention_layernorm.weight.detach(),
                product(gate_up, names[2]),
                product(down, names[3]),
            )
        )
    output = product([head], blocks.output_names() if blocks else []) if head is not None else None
    if token_rows is not None and not any(param is embedding.weight for param, *_ in released.parts):
        released.parts.append((embedding.weight, embedding, 0, embedding.num_embeddings))  # untied: its own
        released.hooks.append(embedding.register_state_dict_pre_hook(bring_back))
    if isinstance(blocks, gguf_blocks.FileMatrices):
        blocks.remember()
    if blocks and blocks.used:
        count = len(layers) * 4 + (output is not None)
        choice = replace(choice, reason=f"{choice.reason}; {blocks.summary(count)}")
    if choice.path == "kernel":  # a step streams them from memory: one run on huge pages (`weight_arena`)
        weight_arena.gather(
            [p for layer in layers for p in (layer.qkv, layer.out, layer.gate_up, layer.down)] + [output]
        )
    for param, *_ in released.parts:  # the packed products hold these now
        param.data = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)
    if released.parts:
        _RELEASED[model] = released
    rotary = base.rotary_emb
    return LeanWeights(
        base.embed_tokens.weight.detach(),
        layers,
        base.norm.weight.detach(),
        output,
        rotary.inv_freq.float(),
        float(rotary.attention_scaling),
        choice,
        token_rows,
    )


def _own_storage(model: torch.nn.Module, groups: list, head: torch.nn.Module | None, packed_keep: set | None) -> None:
    """Give every parameter the lean weights will not copy or release a storage of its own.

    A loader maps the weights file once and hands out views of it, and the mapping lives (and its
    pages stay resident) while any of them does: the matrices fused or packed here would still
    occupy it. A first read on the CPU therefore copies the rest (embedding, norms, the products it
    keeps plain) out of the mapping, so that it closes once the fused and packed copies exist."""
    moved = {
        id(p)
        for layer in groups
        for group in layer
        if len(group) > 1
        for m in group
        for p in (m.weight, m.bias)
        if p is not None
    }
    if packed_keep is not None:  # packed: every matrix but the kept ones is released
        moved |= {id(m.weight) for layer in groups for group in layer for m in group}
        moved |= {id(head.weight)} if head is not None else set()
        moved -= packed_keep
    for param in model.parameters():  # each shared (tied) parameter once
        if id(param) not in moved and not _placeholder(param):
            param.data = param.detach().clone()


def _placeholder(param: torch.Tensor) -> bool:
    """Whether `param` is a stand-in of its shape on one element (its values kept elsewhere): a copy
    would only fill memory with its zeros."""
    return param.numel() > 1 and all(stride == 0 for stride in param.stride())


def _stack(params: list[torch.Tensor]) -> torch.Tensor:
    """The parameters stacked by rows as one tensor that they are views of: theirs if they already
    lie side by side in one storage (read before), else a new one they are pointed at."""
    if len(params) == 1:
        return params[0].detach()
    rows = sum(p.shape[0] for p in params)
    first = params[0]
    if all(
        p.is_contiguous() and p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for p in params
    ) and all(b.storage_offset() == a.storage_offset() + a.numel() for a, b in zip(params, params[1:])):
        return first.detach().as_strided((rows, *first.shape[1:]), first.stride())
    stacked = torch.cat([p.detach() for p in params])
    row = 0
    for p in params:
        p.data = stacked[row : row + p.shape[0]]
        row += p.shape[0]
    return stacked


def restore(model: PreTrainedModel) -> None:
    """Give the model's released parameters their values again (no-op if none were released); the
    packed products keep theirs. The parameters of one fused product become views of one matrix."""
    released = _RELEASED.pop(model, None)
    if released is None:
        return
    for hook in released.hooks:
        hook.remove()
    cached = _WEIGHTS.get(model)
    current = cached is not None and cached[0] == _key(model)
    with torch.inference_mode(False), torch.no_grad():
        plain: dict[int, torch.Tensor] = {}
        for param, linear, a, b in released.parts:
            if id(linear) not in plain:
                plain[id(linear)] = linear.dense()
            param.data = plain[id(linear)][a:b].to(param.device, param.dtype)
    if current and cached is not None:  # the values the products were packed from: the lean weights stay valid
        _WEIGHTS[model] = (_key(model), cached[1])


def embedding_weight(model: PreTrainedModel) -> torch.Tensor:
    """The model's token embedding table (vocab, hidden) with its values: the parameter, or, where
    the embedding is read from a GGUF file's blocks (its parameter a placeholder), the table
    dequantized (for the caller to drop)."""
    embedding = input_embedding(model)
    return embedding.dense() if isinstance(embedding, BlockEmbedding) else embedding.weight.detach()


def output_weight(model: PreTrainedModel) -> torch.Tensor:
    """The model's output matrix (vocab, hidden) with its values: the parameter, or, where the lean
    forward released it, a plain copy rebuilt from the packed product (for the caller to drop)."""
    weight = output_projection(model).weight
    released = _RELEASED.get(model)
    for param, linear, a, b in released.parts if released else []:
        if param is weight:
            return linear.dense()[a:b]
    return weight.detach()


def output_rows(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the model's output matrix, the values `output_weight(model)[ids]` has. Where that
    matrix is a token embedding read from a GGUF file's blocks (a tied output layer), only these rows
    are dequantized: a row's values do not depend on the others, and the whole table is seconds."""
    embedding = input_embedding(model)
    if isinstance(embedding, BlockEmbedding) and getattr(model.config, "tie_word_embeddings", False):
        return embedding.rows(ids.cpu())
    weight = output_weight(model)
    return weight[ids.to(weight.device)]
