"""A lean forward pass for Llama-family models over a preallocated KV cache.

The arithmetic is Hugging Face's `LlamaForCausalLM` (Touvron et al. 2023): RMSNorm, rotary
positions (Su et al. 2021), grouped-query attention (Ainslie et al. 2023) and a SwiGLU MLP, with
the same operations in the same order, so the logits match Hugging Face's forward to float32
rounding and greedy text stays identical. What it leaves out is the machinery around them: per
module calls and hooks, mask building, and a cache that concatenates every layer's keys and values
on each step. A decode step here is four matrix products per layer (query/key/value and gate/up
fused into one each), a handful of element-wise operations, and one attention call.

Every matrix product goes through `engine.linear`: on the CPU, where this machine's oneDNN allows,
on weights packed once into its blocked layout, which keeps a verify over 8 tokens near the cost of
a one-token step and gives each row the same bits however many rows share the forward. The packed
and fused weights are built once per model and rebuilt if its parameters change in place.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, LlamaModel

from engine.linear import Linear, choose_path, make_linear

# Rotary variants whose frequencies are fixed when the model loads ("dynamic" and "longrope"
# change them with the sequence length, which this forward does not follow).
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})
PER_QUERY_LIMIT = 16  # verifies up to this many tokens attend per query (see `LlamaWeights.row_exact`)


def supports(model: torch.nn.Module) -> bool:
    """Whether `LlamaForward` reproduces this model's forward (a Llama with or without its output layer)."""
    if not isinstance(model, (LlamaForCausalLM, LlamaModel)):
        return False
    config = model.config
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    device = next(model.parameters()).device
    return (config.model_type == "llama" and rope_type in STATIC_ROPE_TYPES
            and not config.attention_bias and not config.mlp_bias and config.hidden_act == "silu"
            and device.type in ("cpu", "cuda"))


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float

    @classmethod
    def of(cls, config) -> LlamaShape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                   head_dim, config.rms_norm_eps)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # rows: query heads, then key heads, then value heads
    out: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # rows: gate, then up
    down: Linear


@dataclass
class LlamaWeights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    head: Linear | None  # the output layer; None for a bare `LlamaModel`
    inv_freq: torch.Tensor
    rope_scaling: float  # the rotary "attention factor" (1 except for yarn)

    @property
    def row_exact(self) -> bool:
        """Whether every product gives each row the same bits alone as in a batch (`engine.linear`):
        then, with attention computed per query as a one-token step does, a verify's logits for a
        token equal bit for bit the logits a plain step would give it."""
        products = [p for layer in self.layers for p in (layer.qkv, layer.out, layer.gate_up, layer.down)]
        return all(p.path == "packed" for p in products + ([self.head] if self.head is not None else []))

    @classmethod
    def read(cls, model: LlamaForCausalLM | LlamaModel) -> LlamaWeights:
        base = model.model if isinstance(model, LlamaForCausalLM) else model
        matrices = []  # per layer: qkv, out, gate_up, down (fused where one input feeds several)
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            matrices.append([torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                             attn.o_proj.weight.detach(),
                             torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                             mlp.down_proj.weight.detach()])
        output = model.lm_head.weight.detach() if base is not model else None
        choice = choose_path([w for ws in matrices for w in ws] + ([output] if output is not None else []))
        layers = [LayerWeights(layer.input_layernorm.weight.detach(), make_linear(qkv, choice), make_linear(out, choice),
                               layer.post_attention_layernorm.weight.detach(), make_linear(gate_up, choice),
                               make_linear(down, choice))
                  for layer, (qkv, out, gate_up, down) in zip(base.layers, matrices)]
        rotary = base.rotary_emb
        head = make_linear(output, choice) if output is not None else None
        return cls(base.embed_tokens.weight.detach(), layers, base.norm.weight.detach(), head,
                   rotary.inv_freq.float(), float(rotary.attention_scaling))


# Fused weights per model, kept while the model lives; the key of its parameters' storage and
# in-place version tells when they must be read again (a model moved, or trained in place).
_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _weights_of(model: LlamaForCausalLM | LlamaModel) -> LlamaWeights:
    key = tuple((p.data_ptr(), p._version) for p in model.parameters())
    cached = _WEIGHTS.get(model)
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, LlamaWeights.read(model))
        _WEIGHTS[model] = cached
    return cached[1]


class KVCache:
    """Every layer's keys and values in two tensors (layers, 1, kv_heads, capacity, head_dim).

    Positions [0, length) are valid. Cropping only lowers `length` (the stale rows beyond it are
    overwritten by the next forward); running out of room doubles the capacity.
    """

    def __init__(self, shape: LlamaShape, dtype: torch.dtype, device: torch.device, capacity: int = 256) -> None:
        self.shape, self.dtype, self.device = shape, dtype, device
        self.keys = self._empty(capacity)
        self.values = self._empty(capacity)
        self.length = 0

    def _empty(self, capacity: int) -> torch.Tensor:
        s = self.shape
        return torch.empty(s.layers, 1, s.kv_heads, capacity, s.head_dim, dtype=self.dtype, device=self.device)

    def reserve(self, length: int) -> None:
        capacity = self.keys.shape[3]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        keys, values = self._empty(capacity), self._empty(capacity)
        keys[:, :, :, : self.length] = self.keys[:, :, :, : self.length]
        values[:, :, :, : self.length] = self.values[:, :, :, : self.length]
        self.keys, self.values = keys, values


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 as Hugging Face does."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class LlamaForward:
    """A Llama model's forward plus its KV cache: the interface of `engine.kvcache.CachedModel`'s
    backends (`logits`, `hidden`, `crop`, `reset`, `len`)."""

    def __init__(self, model: LlamaForCausalLM | LlamaModel, capacity: int = 256) -> None:
        self.shape = LlamaShape.of(model.config)
        self.weights = _weights_of(model)
        self.row_exact = self.weights.row_exact
        self.cache = KVCache(self.shape, self.weights.embed.dtype, self.weights.embed.device, capacity)
        # Feature taps (for heads that fuse lower layers, `engine.heads`): after each forward,
        # `tapped` holds (n, len(taps), hidden), the residual stream after each of `taps` layers.
        self.taps: tuple[int, ...] = ()
        self.tapped: torch.Tensor | None = None

    def reset(self) -> None:
        self.cache.length = 0

    def __len__(self) -> int:
        return self.cache.length

    def crop(self, length: int) -> None:
        self.cache.length = min(self.cache.length, length)

    def logits(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Logits (n, vocab) for token ids (n,) appended after the cached ones; (1, vocab) if last_only."""
        hidden = self.hidden(ids)
        return self.weights.head(hidden[-1:] if last_only else hidden)

    def output_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's output layer on final-norm states (n, hidden): `logits` without the forward."""
        return self.weights.head(hidden)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final norm's output (n, hidden) for token ids (n,) appended after the cached ones."""
        return self.hidden_from_inputs(F.embedding(ids, self.weights.embed))

    def hidden_tree(self, ids: torch.Tensor, parents: list[int]) -> torch.Tensor:
        """`hidden` for a token tree: node i's parent is node parents[i] of this chunk, or the last
        cached token where it is -1. Each node sits at the position after its parent's and attends to
        the cached tokens and its own ancestors only; every node's keys and values are cached in
        chunk order (`compact` keeps one path)."""
        return self.hidden_from_inputs(F.embedding(ids, self.weights.embed), parents)

    def compact(self, path: list[int]) -> None:
        """Keep the nodes `path` (chunk indices, root first) of the last tree forward as the cached
        tokens after the ones before it, dropping the rest."""
        cache = self.cache
        start = cache.length - self._chunk
        index = torch.tensor(path, device=cache.keys.device) + start
        cache.keys[:, :, :, start: start + len(path)] = cache.keys.index_select(3, index)
        cache.values[:, :, :, start: start + len(path)] = cache.values.index_select(3, index)
        cache.length = start + len(path)

    def hidden_from_inputs(self, inputs: torch.Tensor, parents: list[int] | None = None) -> torch.Tensor:
        """The final norm's output (n, hidden) for input vectors (n, hidden) in place of token
        embeddings (Hugging Face's `inputs_embeds`), appended after the cached positions (as a
        tree where `parents` is given, see `hidden_tree`)."""
        s, w, cache = self.shape, self.weights, self.cache
        start, n = cache.length, inputs.shape[0]
        cache.reserve(start + n)
        self._chunk = n
        x = inputs.unsqueeze(0)  # (1, n, hidden)
        paths = _paths(parents) if parents is not None else None
        depths = [len(path) - 1 for path in paths] if paths else list(range(n))
        cos, sin = self._rotary(torch.tensor(depths, dtype=torch.float32) + start, x.dtype)
        mask = None
        per_query = self.row_exact and start > 0 and 1 < n <= PER_QUERY_LIMIT
        if paths is not None and not per_query:  # query i sees the cache and its own ancestors
            mask = torch.zeros(n, start + n, dtype=torch.bool, device=inputs.device)
            mask[:, :start] = True
            for i, path in enumerate(paths):
                mask[i, [start + j for j in path]] = True
        elif n > 1 and start > 0 and not per_query:  # a chunk after cached positions: query j sees up to start + j
            mask = torch.ones(n, start + n, dtype=torch.bool, device=inputs.device).tril(start)
        tapped = []
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.input_norm, s.rms_eps)
            x = x + self._attention(i, layer, h, start, cos, sin, mask, (paths or True) if per_query else None)
            gate, up = layer.gate_up(rms_norm(x, layer.post_norm, s.rms_eps)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
            if i + 1 in self.taps:
                tapped.append(x[0])
        self.tapped = torch.stack(tapped, dim=1) if tapped else None
        cache.length = start + n
        return rms_norm(x, w.norm, s.rms_eps)[0]


    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (1, n, 1, head_dim) for n positions (float32). The sin carries rotate_half's
        sign, so rotate_half(x) * sin == x.roll(half) * signed_sin, exactly."""
        w = self.weights
        freqs = positions.to(w.inv_freq.device)[:, None] * w.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = angles.cos() * w.rope_scaling
        sin = angles.sin() * w.rope_scaling
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return cos.to(dtype)[None, :, None], sin.to(dtype)[None, :, None]

    def _attention(self, i: int, layer: LayerWeights, h: torch.Tensor, start: int, cos: torch.Tensor,
                   sin: torch.Tensor, mask: torch.Tensor | None, per_query) -> torch.Tensor:
        s, cache = self.shape, self.cache
        n = h.shape[1]
        end = start + n
        qkv = layer.qkv(h).view(1, n, s.heads + 2 * s.kv_heads, s.head_dim)
        qk = qkv[:, :, : s.heads + s.kv_heads]
        qk = qk * cos + qk.roll(s.head_dim // 2, dims=-1) * sin  # rotary, query and key heads at once
        q = qk[:, :, : s.heads].transpose(1, 2)
        cache.keys[i, :, :, start:end] = qk[:, :, s.heads:].transpose(1, 2)
        cache.values[i, :, :, start:end] = qkv[:, :, s.heads + s.kv_heads:].transpose(1, 2)
        keys, values = cache.keys[i, :, :, :end], cache.values[i, :, :, :end]
        # No mask for one query or a first chunk (Hugging Face's sdpa path: the same kernels run);
        # a chunk after cached positions, where query j sees positions up to start + j, gets a
        # boolean mask. Grouped key/value heads go to the kernel as they are (enable_gqa), which
        # gives the same numbers as repeating them per group, as Hugging Face does, at half the cost.
        # Per query (a verify on shape-invariant products): the very call a one-token step makes for
        # that position, so a verified token's logits are a plain step's, bit for bit. `per_query`
        # is True for a chain, or each node's path from the root for a tree; a side branch's path is
        # copied over the chain's first slots for its call (a few rows, not the whole cache).
        scale = s.head_dim ** -0.5
        if per_query:
            outs = []
            for j in range(n):
                path = per_query[j] if per_query is not True else list(range(j + 1))
                end_j = start + len(path)
                if path == list(range(j + 1)):  # a chain: the cache as it stands
                    out_j = F.scaled_dot_product_attention(q[:, :, j: j + 1], keys[:, :, :end_j], values[:, :, :end_j],
                                                           scale=scale, enable_gqa=True)
                else:  # a side branch: its path moved in after the cache for this call, then put back
                    index = torch.tensor(path, device=keys.device) + start
                    kept_k, kept_v = keys[:, :, start:end_j].clone(), values[:, :, start:end_j].clone()
                    keys[:, :, start:end_j], values[:, :, start:end_j] = keys[:, :, index], values[:, :, index]
                    out_j = F.scaled_dot_product_attention(q[:, :, j: j + 1], keys[:, :, :end_j], values[:, :, :end_j],
                                                           scale=scale, enable_gqa=True)
                    keys[:, :, start:end_j], values[:, :, start:end_j] = kept_k, kept_v
                outs.append(out_j)
            out = torch.cat(outs, dim=2)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None and n > 1,
                                                 scale=scale, enable_gqa=True)
        return layer.out(out.transpose(1, 2).reshape(1, n, s.heads * s.head_dim))


def _paths(parents: list[int]) -> list[list[int]]:
    """Each node's chunk indices from the tree's root to itself (parents come before children)."""
    paths: list[list[int]] = []
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError(f"node {i}'s parent {parent} must come before it")
        paths.append((paths[parent] if parent >= 0 else []) + [i])
    return paths
