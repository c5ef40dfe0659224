"""A lean forward pass for Llama-family models over a preallocated KV cache.

The arithmetic is Hugging Face's `LlamaForCausalLM` (Touvron et al. 2023): RMSNorm, rotary
positions (Su et al. 2021), grouped-query attention (Ainslie et al. 2023) and a SwiGLU MLP, with
the same operations in the same order, so the logits match Hugging Face's forward to float32
rounding and greedy text stays identical. The same forward covers the families built on it:
Qwen2/2.5 (biases on query, key and value), Qwen3 (an RMSNorm on each query and key head) and
Mistral (a sliding window: each position attends to the `sliding_window` latest ones, itself
included). What it leaves out is the machinery around them: per module calls and hooks, mask
building, and a cache that concatenates every layer's keys and values on each step. A decode step
here is four matrix products per layer (query/key/value and gate/up fused into one each), a handful
of element-wise operations, and one attention call.

Every matrix product goes through `specdeck.engine.forward.linear`: on the CPU, where this machine's oneDNN allows,
on weights packed once into its blocked layout, which keeps a verify over 8 tokens near the cost of
a one-token step and gives each row the same bits however many rows share the forward. The fused
and packed weights are read once per model, replacing its own copy
(`specdeck.engine.forward.lean_weights`). On a GPU steps and verifies run at one fixed shape,
replayed as CUDA graphs (`specdeck.engine.forward.graphed_steps`). Which models it runs is
`specdeck.engine.forward.llama_families`; its cache is `specdeck.engine.forward.llama_cache`; a
token tree's paths and the masks of its fused attention call are
`specdeck.engine.forward.attention_masks`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specdeck.engine.forward import row_attention, row_kernel
from specdeck.engine.forward.attention_masks import chunk_mask, tree_paths
from specdeck.engine.forward.fused_layers import LIMIT as FUSED_LIMIT
from specdeck.engine.forward.fused_layers import FusedLayers
from specdeck.engine.forward.graphed_steps import FixedShapeSteps, fixed_shape_on
from specdeck.engine.forward.hf_parts import output_projection
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.linear import Linear, make_linear
from specdeck.engine.forward.llama_cache import KVCache, LlamaShape
from specdeck.engine.forward.llama_families import attention_windows, supports

# chunks after cached positions up to this many tokens attend row by row (`specdeck.engine.forward.row_attention`)
ROW_BY_ROW_LIMIT = 16


def output_layer(model: PreTrainedModel) -> Linear:
    """The model's output layer as a product: the lean forward's own where it runs the model (shared,
    nothing copied), else one made from the model's matrix."""
    if supports(model):
        return weights_of(model).output
    return make_linear(output_projection(model).weight.detach())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 as Hugging Face does."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` of float32 rows (n, hidden) on the CPU, row by row through numpy's multiply and
    sum, so that a row's bits never depend on the rows beside it. The fused layers' final norm runs
    between the two products that stream a step's weights through every cache: there each library
    call pays its code from memory again, and torch's eight operations took twice as long as these
    few. Other rows go to `rms_norm`."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2:
        return rms_norm(x[None], weight, eps)[0]
    rows, scale = x.detach().numpy(), weight.detach().numpy()
    out = np.empty_like(rows)
    for row, normed in zip(rows, out):
        squares = float(np.multiply(row, row, out=normed).sum())
        np.multiply(row, np.float32(1.0 / math.sqrt(squares / row.size + eps)), out=normed)
        np.multiply(normed, scale, out=normed)
    return torch.from_numpy(out)


FIRST_CAPACITY = 256  # positions a KV cache holds at first
FIRST_CACHE_BYTES = 32 << 20  # on the CPU, at most this much of it at first


def first_capacity(shape: LlamaShape, dtype: torch.dtype, device: torch.device) -> int:
    """Positions a new KV cache holds: `FIRST_CAPACITY`, or on the CPU fewer (a power of two, at least
    16) where those would take more than `FIRST_CACHE_BYTES`: a 1.7B model's 256 positions are 100
    MB, a tenth of its Q4_K_M file, resident before a short prompt needs them; the cache doubles as
    a session needs more."""
    if device.type != "cpu":
        return FIRST_CAPACITY  # the fixed-shape steps attend over the whole capacity: grown seldom
    per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype.itemsize
    capacity = FIRST_CAPACITY
    while capacity > 16 and capacity * per_position > FIRST_CACHE_BYTES:
        capacity //= 2
    return capacity


class LlamaForward:
    """A Llama-family model's forward plus its KV cache: the interface of the backends of
    `specdeck.engine.forward.kvcache.CachedModel` (`logits`, `hidden`, `crop`, `reset`, `len`)."""

    def __init__(self, model: PreTrainedModel, capacity: int | None = None, fixed_shape: bool | None = None) -> None:
        """`capacity`: positions the KV cache holds at first (it doubles when full; by default
        `first_capacity`). `fixed_shape`: run steps and verifies at one fixed shape
        (`specdeck.engine.forward.graphed_steps`), replayed
        as CUDA graphs on a GPU. Default: on `FIXED_SHAPE_DEVICES` (CUDA), unless the environment sets
        SPECDECK_CUDA_GRAPHS=0 (each kernel launched from Python, and a verify's bits may then differ
        from a plain step's)."""
        windows = attention_windows(model.config)
        if windows is None:
            raise ValueError(f"the lean forward does not reproduce {model.config.model_type}'s attention")
        self.shape = LlamaShape.of(model.config)
        self.windows = windows
        self.weights = weights_of(model)
        self.row_exact = self.weights.row_exact
        device, dtype = self.weights.embed.device, self.weights.embed.dtype
        self.cache = KVCache(self.shape, dtype, device, capacity or first_capacity(self.shape, dtype, device))
        # Feature taps (for heads that fuse lower layers, `specdeck.engine.drafting.heads`): after each forward,
        # `tapped` holds (n, len(taps), hidden), the residual stream after each of `taps` layers.
        self.taps: tuple[int, ...] = ()
        self.tapped: torch.Tensor | None = None
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None  # the rotary's cos and sin by position
        device = self.cache.device
        if fixed_shape is None:
            fixed_shape = fixed_shape_on(device)
        self.steps = FixedShapeSteps(self, capture=device.type == "cuda") if fixed_shape else None
        # steps and verifies (chains after cached positions) through all layers in one row kernel call
        self.fused_unavailable = FusedLayers.unavailable(self)
        self.fused = FusedLayers(self) if self.fused_unavailable is None else None
        # a first chunk (nothing cached) of up to the fused layers' bound through them too, faster than
        # eagerly: a drafter's, whose bits change drafts, never the text. A target's first chunk stays eager.
        self.fused_first_chunk = False

    @property
    def supports_trees(self) -> bool:
        """Whether token trees keep a verify exact here. The fixed-shape steps would give a side
        branch's nodes their ancestors in slots that are not adjacent, and attention's sums over
        them (with masked slots between) round differently from a plain step's over adjacent ones:
        on them drafts are chains. So are they on the fused layers (`specdeck.engine.forward.fused_layers`), whose
        small operations round otherwise than the eager path a side branch takes."""
        return self.steps is None and self.fused is None

    def reset(self) -> None:
        self.cache.length = 0

    def __len__(self) -> int:
        return self.cache.length

    def crop(self, length: int) -> None:
        self.cache.length = min(self.cache.length, length)

    def logits(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Logits (n, vocab) for token ids (n,) appended after the cached ones; (1, vocab) if last_only."""
        hidden = self.hidden(ids)
        return self.output_layer(hidden[-1:] if last_only else hidden)

    def output_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's output layer on final-norm states (n, hidden): `logits` without the forward."""
        return self.weights.output(hidden) if self.steps is None else self.steps.output(hidden)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final norm's output (n, hidden) for token ids (n,) appended after the cached ones."""
        return self.hidden_from_inputs(self.weights.embedding(ids))

    def hidden_tree(self, ids: torch.Tensor, parents: list[int]) -> torch.Tensor:
        """`hidden` for a token tree: node i's parent is node parents[i] of this chunk, or the last
        cached token where it is -1. Each node sits at the position after its parent's and attends to
        the cached tokens and its own ancestors only; every node's keys and values are cached in
        chunk order (`compact` keeps one path)."""
        return self.hidden_from_inputs(self.weights.embedding(ids), parents)

    def compact(self, path: list[int]) -> None:
        """Keep the nodes `path` (chunk indices, root first) of the last tree forward as the cached
        tokens after the ones before it, dropping the rest."""
        cache = self.cache
        start = cache.length - self._chunk
        index = torch.tensor(path, device=cache.keys.device) + start
        cache.keys[:, :, :, start : start + len(path)] = cache.keys.index_select(3, index)
        cache.values[:, :, :, start : start + len(path)] = cache.values.index_select(3, index)
        cache.length = start + len(path)

    def hidden_from_inputs(self, inputs: torch.Tensor, parents: list[int] | None = None) -> torch.Tensor:
        """The final norm's output (n, hidden) for input vectors (n, hidden) in place of token
        embeddings (Hugging Face's `inputs_embeds`), appended after the cached positions (as a
        tree where `parents` is given, see `hidden_tree`)."""
        w, cache = self.weights, self.cache
        start, n = cache.length, inputs.shape[0]
        self._chunk = n
        if self.steps is not None and self.steps.takes(n, start, tree=parents is not None):
            return self.steps.hidden(inputs)
        cache.reserve(start + n)
        # On the fused layers, every row is computed alone up to their bound (a feature head's 32 pairs
        # after a run of plain steps too, faster than eagerly); the rotary's rows are slices of its table.
        if (start > 0 or self.fused_first_chunk) and n <= FUSED_LIMIT and parents is None and self.fused is not None:
            cos, sin = self._rotary_table(start + n)
            x, self.tapped = self.fused.run(
                inputs, cos[start : start + n], sin[start : start + n], cache, start, self.taps
            )
            cache.length = start + n
            return rms_norm_rows(x, w.norm, self.shape.rms_eps)
        x = inputs.unsqueeze(0)  # (1, n, hidden)
        paths = tree_paths(parents) if parents is not None else None
        depths = [len(path) - 1 for path in paths] if paths else list(range(n))
        cos, sin = self._rotary_rows(start, depths if paths else None, n, x.dtype)
        # After cached positions, up to ROW_BY_ROW_LIMIT queries attend row by row
        # (`specdeck.engine.forward.row_attention`), each query's bits those of a one-token step at its
        # position; a first chunk or a longer one takes one fused call.
        rowwise = start > 0 and n <= ROW_BY_ROW_LIMIT
        if rowwise:
            cache.reserve(row_attention.span(start + n))
            calls = self._calls(start, n, paths, inputs.dtype, inputs.device)
            masks = {}
        else:
            calls = {}
            masks = {window: chunk_mask(start, depths, paths, window, inputs.device) for window in set(self.windows)}

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            window = self.windows[i]
            return self._attention(i, q, k, v, start, masks.get(window), calls.get(window), paths)

        hidden, self.tapped = self.run_layers(x, cos, sin, attend)
        cache.length = start + n
        if self.steps is not None:  # a long first prompt: the steps after it are captured now
            self.steps.ready()
        return hidden

    def run_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> tuple[torch.Tensor, Any]:
        """Every decoder layer and the final norm over inputs x (1, n, hidden) at rotary cos and sin:
        (final states (n, hidden), the taps' residual streams (n, len(taps), hidden) or None).
        `attend(i, q, k, v)` stores layer i's new keys and values (1, kv_heads, n, head_dim) in the
        cache and returns the attention output for queries q (1, heads, n, head_dim): the one part
        the eager and the fixed-shape forwards (`specdeck.engine.forward.graphed_steps`) do differently."""
        s, w = self.shape, self.weights
        n = x.shape[1]
        tapped = []
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.input_norm, s.rms_eps)
            qkv = layer.qkv(h).view(1, n, s.heads + 2 * s.kv_heads, s.head_dim)
            qk = qkv[:, :, : s.heads + s.kv_heads]
            if layer.qk_norm is not None:  # Qwen3
                qk = rms_norm(qk, layer.qk_norm, s.rms_eps)
            qk = qk * cos + qk.roll(s.head_dim // 2, dims=-1) * sin  # rotary, query and key heads at once
            out = attend(
                i,
                qk[:, :, : s.heads].transpose(1, 2),
                qk[:, :, s.heads :].transpose(1, 2),
                qkv[:, :, s.heads + s.kv_heads :].transpose(1, 2),
            )
            x = x + layer.out(out.transpose(1, 2).reshape(1, n, s.heads * s.head_dim))
            gate, up = layer.gate_up(rms_norm(x, layer.post_norm, s.rms_eps)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
            if i + 1 in self.taps:
                tapped.append(x[0])
        return rms_norm(x, w.norm, s.rms_eps)[0], torch.stack(tapped, dim=1) if tapped else None

    def _rotary_rows(
        self, start: int, depths: list[int] | None, n: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_rotary` at positions start + depths (start, ..., start + n - 1 without depths), read
        from a table of every position so far. The table grows by whole new positions, each row
        computed once, so a position's values never depend on which others were asked with it; a
        step reads two slices instead of running eight small operations (a tenth of a feature
        head's draft)."""
        cos, sin = self._rotary_table(start + (max(depths) + 1 if depths else n))
        if depths is None:
            cos, sin = cos[start : start + n], sin[start : start + n]
        else:
            rows = torch.tensor(depths, device=cos.device) + start
            cos, sin = cos[rows], sin[rows]
        return cos.to(dtype)[None, :, None], sin.to(dtype)[None, :, None]

    def _rotary_table(self, top: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary's cos and sin (positions, head_dim), float32, for every position up to `top` at
        least: grown by whole new positions, each row computed once."""
        table = self._table
        have = 0 if table is None else table[0].shape[0]
        if table is None or top > have:
            grown = torch.arange(
                have, max(top, 2 * have, 256), dtype=torch.float32, device=self.weights.inv_freq.device
            )
            cos, sin = (part[0, :, 0] for part in self._rotary(grown, torch.float32))
            if table is not None:
                cos, sin = torch.cat([table[0], cos]), torch.cat([table[1], sin])
            table = self._table = (cos, sin)
        return table

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

    def _calls(
        self, start: int, n: int, paths: list[list[int]] | None, dtype: torch.dtype, device: torch.device
    ) -> dict[int | None, tuple[list[row_attention.Call], list[row_attention.Call]]]:
        """Per attention window, the row-by-row calls of a chunk of n queries after `start` cached
        positions: (the chain's, each side branch's). Query j attends up to its own position, start +
        its depth; a tree's side branch (its path from the root leaves the chain) is a call of its own."""
        s = self.shape
        kernel = row_kernel.attention_unavailable(dtype, device, s.head_dim) is None
        batched = kernel or row_attention.rows_invariant(s.heads, s.kv_heads, s.head_dim, dtype, device)
        group = s.heads // s.kv_heads
        if paths is None:
            chain, branches, ends = list(range(n)), [], [start + j + 1 for j in range(n)]
        else:
            chain = [j for j, path in enumerate(paths) if path == list(range(len(path)))]
            branches = [j for j, path in enumerate(paths) if path != list(range(len(path)))]
            ends = [start + len(path) for path in paths]
        return {
            window: (
                row_attention.plan(chain, ends, window, group, batched, dtype, device, kernel=kernel),
                row_attention.plan(branches, ends, window, group, batched, dtype, device, share=False, kernel=kernel),
            )
            for window in set(self.windows)
        }

    def _attention(
        self,
        i: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        calls: tuple[list[row_attention.Call], list[row_attention.Call]] | None,
        paths: list[list[int]] | None,
    ) -> torch.Tensor:
        s, cache = self.shape, self.cache
        n = q.shape[2]
        end = start + n
        cache.keys[i, :, :, start:end] = k
        cache.values[i, :, :, start:end] = v
        scale = s.head_dim**-0.5
        if calls is not None:
            return self._row_by_row(q, cache.keys[i], cache.values[i], start, scale, calls, paths)
        # A first chunk (causal, Hugging Face's sdpa path: the same kernels run) or a long chunk after
        # cached positions (a boolean mask): one fused call. Grouped key/value heads go to the kernel
        # as they are (enable_gqa), the same numbers as repeating them per group, at half the cost.
        keys, values = cache.keys[i, :, :, :end], cache.values[i, :, :, :end]
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=mask is None and n > 1, scale=scale, enable_gqa=True
        )

    @staticmethod
    def _row_by_row(
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        start: int,
        scale: float,
        calls: tuple[list[row_attention.Call], list[row_attention.Call]],
        paths: list[list[int]] | None,
    ) -> torch.Tensor:
        """Attention for a step or a verify, each query the bits a one-token step at its position
        gets (`specdeck.engine.forward.row_attention`), over a layer's cache `keys` and `values` (1, kv_heads,
        capacity, head_dim) that already hold the chunk's.

        A chain's queries see the cache as it stands. A tree's side branch needs its ancestors in
        the slots after the cached tokens: the chunk's keys and values are saved once, each branch's
        path is copied in over the slots that hold another node, the branch's query attends, and the
        chunk is put back after the last branch (siblings share their ancestors' slots, so each costs
        one slot's copy). Branches are taken after the chain's queries, whose slots they overwrite."""
        chain, branches = calls
        n = q.shape[2]
        if len(chain) == 1 and not branches:  # a step, or a verify in one call
            return row_attention.run(chain[0], q, keys, values, scale)
        out = torch.empty_like(q)

        def run(call: row_attention.Call) -> None:
            a, b = call.rows
            out[:, :, a:b] = row_attention.run(call, q[:, :, a:b], keys, values, scale)

        for call in chain:
            run(call)
        if branches:
            assert paths is not None
            saved_k, saved_v = keys[:, :, start : start + n].clone(), values[:, :, start : start + n].clone()
            holds = list(range(n))  # which node's key and value each slot of the chunk holds now
            for call in branches:
                for slot, node in enumerate(paths[call.rows[0]]):
                    if holds[slot] != node:
                        keys[:, :, start + slot].copy_(saved_k[:, :, node])
                        values[:, :, start + slot].copy_(saved_v[:, :, node])
                        holds[slot] = node
                run(call)
            for slot, node in enumerate(holds):
                if slot != node:
                    keys[:, :, start + slot].copy_(saved_k[:, :, slot])
                    values[:, :, start + slot].copy_(saved_v[:, :, slot])
        return out
