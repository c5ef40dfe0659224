"""A model plus its KV cache, with the one invariant the decoding loop relies on.

Invariant (target and draft model alike): between rounds the cache holds every kept token except
the newest one. The newest kept token is fed first in the next forward, so each round is a single
forward over [newest kept token, drafted tokens...]; after a rejection the cache is cropped back
to the kept prefix, so no round ever re-reads the context.

Llama-family models run on `specdeck.engine.forward.llama_forward` (same logits, far less overhead per step),
GGUF files opened by llama.cpp on `specdeck.engine.forward.llamacpp_backend`, every other model on Hugging Face's
own forward over a `DynamicCache`.
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, overload

import torch
from transformers import DynamicCache

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward import graphed_steps, llama_families, llama_forward, row_attention, row_kernel
from specdeck.engine.forward.hf_parts import input_embedding, output_projection
from specdeck.engine.forward.lean_weights import weights_of
from specdeck.engine.forward.llama_cache import LlamaShape
from specdeck.engine.forward.llamacpp_backend import LlamaCppForward, LlamaCppModel

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _cache_keyword(model: PreTrainedModel) -> str:
    """What the model's forward calls its KV cache, in its arguments and its output: `cache` from
    transformers 5.24 on (which deprecates the older name), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFForward:
    """Hugging Face's forward over a `DynamicCache`: works for any causal LM."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self._cache_name = _cache_keyword(model)
        self.taps: tuple[int, ...] = ()  # as `LlamaForward.taps`
        self.tapped: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    def __len__(self) -> int:
        return self.cache.get_seq_length()

    def logits(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        out = self.model(
            input_ids=ids[None], use_cache=True, logits_to_keep=1 if last_only else 0, **{self._cache_name: self.cache}
        )
        self.cache = out[self._cache_name]
        return out.logits[0]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        return self._last_hidden(input_ids=ids[None])

    def hidden_from_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._last_hidden(inputs_embeds=inputs[None])

    def output_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        return output_projection(self.model)(hidden)

    def _last_hidden(self, **inputs) -> torch.Tensor:
        out = self.model.base_model(
            **inputs, use_cache=True, output_hidden_states=bool(self.taps), **{self._cache_name: self.cache}
        )
        self.cache = out[self._cache_name]
        self.tapped = torch.stack([out.hidden_states[t][0] for t in self.taps], dim=1) if self.taps else None
        return out.last_hidden_state[0]

    def crop(self, length: int) -> None:
        excess = len(self) - length
        if excess > 0:
            self.cache.crop(-excess)  # transformers 5: a negative count removes that many positions


@overload
def backend_for(model: LlamaCppModel) -> LlamaCppForward: ...


@overload
def backend_for(model: PreTrainedModel) -> llama_forward.LlamaForward | HFForward: ...


def backend_for(model: PreTrainedModel | LlamaCppModel) -> llama_forward.LlamaForward | HFForward | LlamaCppForward:
    """llama.cpp for a model it opened; else the lean Llama forward where it reproduces `model`, else
    Hugging Face's."""
    if isinstance(model, LlamaCppModel):
        return LlamaCppForward(model)
    return llama_forward.LlamaForward(model) if llama_families.supports(model) else HFForward(model)


def products_path(model: PreTrainedModel | LlamaCppModel) -> str | None:
    """How the lean Llama forward runs `model`'s matrix products on this machine, in words, with
    why (`specdeck.engine.forward.linear.choose_path`); None where another forward runs it."""
    if isinstance(model, LlamaCppModel) or not llama_families.supports(model):
        return None
    weights = weights_of(model)
    products = weights.products.describe()
    device = weights.embed.device
    if graphed_steps.fixed_shape_on(device):
        return products + f"; every step and verify replayed as a CUDA graph of {graphed_steps.ROWS} rows"
    s = LlamaShape.of(model.config)
    if row_kernel.attention_unavailable(weights.embed.dtype, device, s.head_dim) is None:
        return products + "; a verify's queries attend in one call of the row kernel, each over its own slots"
    together = row_attention.rows_invariant(s.heads, s.kv_heads, s.head_dim, weights.embed.dtype, device)
    return products + (
        f"; a verify's queries attend in one call per {row_attention.SPAN} slots"
        if together
        else "; a verify's queries attend in a fused call each (batched products change a row's bits here)"
    )


# Lean forwards with fixed-shape steps (CUDA graphs) whose session ended, by model: the next
# CachedModel of the model takes one, cache and captured graph with it, so that a session does not
# capture its graph again (about 50 ms for SmolLM2 on an H100). Dropping the model drops them.
_IDLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _take_idle(model) -> llama_forward.LlamaForward | None:
    idle = _IDLE.get(model) if not isinstance(model, LlamaCppModel) else None
    return idle.pop() if idle else None


def _put_back(model, backend: llama_forward.LlamaForward) -> None:
    backend.reset()
    _IDLE.setdefault(model, []).append(backend)


class CachedModel:
    """A causal LM and its KV cache, on llama.cpp for a model it opened, on the lean Llama forward
    when that reproduces the model, else on Hugging Face's."""

    def __init__(self, model: PreTrainedModel | LlamaCppModel, taps: tuple[int, ...] = ()) -> None:
        self.model = model
        self.device = model.device if isinstance(model, LlamaCppModel) else next(model.parameters()).device
        self.rows = model.vocab_width if isinstance(model, LlamaCppModel) else input_embedding(model).num_embeddings
        self.backend = _take_idle(model) or backend_for(model)
        self.backend.taps = taps
        if isinstance(self.backend, llama_forward.LlamaForward) and self.backend.steps is not None:
            weakref.finalize(self, _put_back, model, self.backend)

    def inexact_reason(self) -> str | None:
        """Why a verify on this CPU may not give each token a one-token step's bits (the lean
        forward's products on F.linear, `specdeck.engine.forward.linear.choose_path`); None where it does, or where
        another forward runs the model."""
        backend = self.backend
        if not isinstance(backend, llama_forward.LlamaForward) or backend.row_exact or self.device.type != "cpu":
            return None
        return backend.weights.products.reason

    def states(self, hidden: torch.Tensor) -> torch.Tensor:
        """What a feature head reads of the last forward, whose final states are `hidden` (n, hidden):
        those alone without taps, else (n, len(taps) + 1, hidden), the tapped layers' residual
        streams and then the final states."""
        tapped = self.backend.tapped
        return hidden if tapped is None else torch.cat([tapped, hidden[:, None]], dim=1)

    def reset(self) -> None:
        self.backend.reset()

    def size_for(self, tokens: int) -> None:
        """Size the cache for a session of `tokens` positions, on the fixed-shape steps (whose
        attention spans the whole cache, see `specdeck.engine.forward.graphed_steps.FixedShapeSteps.size_for`);
        elsewhere the cache grows as it fills."""
        if isinstance(self.backend, llama_forward.LlamaForward) and self.backend.steps is not None:
            self.backend.steps.size_for(tokens)

    def reserve(self, tokens: int) -> None:
        """Room for `tokens` positions now, on the lean forward's cache, which otherwise doubles as it
        fills and copies what it holds each time (both copies resident at once); while the cache is
        empty that copies nothing. Elsewhere the cache grows as it fills."""
        if isinstance(self.backend, llama_forward.LlamaForward):
            self.backend.cache.reserve(tokens)

    def __len__(self) -> int:
        return len(self.backend)

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Logits (n, vocab) for `token_ids` appended after the cached tokens; (1, vocab) if last_only."""
        return self.backend.logits(self._ids(token_ids), last_only)

    @torch.inference_mode()
    def forward_hidden(self, token_ids: list[int]) -> torch.Tensor:
        """The last layer's (normalised) hidden states (n, hidden) for `token_ids` appended after the
        cached tokens: the output layer left to the caller."""
        return self.backend.hidden(self._ids(token_ids))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer applied to `forward_hidden`'s states: the same logits `forward` gives for
        Llama-family models, whose logits are exactly that (through the same product path). On
        llama.cpp, the logits of the latest `forward_hidden`'s own call, for its states only."""
        return self.backend.output_layer(hidden)

    @property
    def states_cost(self) -> bool:
        """Whether `forward_hidden` costs more than `forward`: on llama.cpp, where a call with states
        on outputs every position and copies their states out of its context as well."""
        return isinstance(self.backend, LlamaCppForward)

    @property
    def supports_trees(self) -> bool:
        """Whether `forward_tree` can run: the lean Llama forward's tree attention, which its fixed-shape
        steps (the GPU's) leave out (see `LlamaForward.supports_trees`)."""
        return isinstance(self.backend, llama_forward.LlamaForward) and self.backend.supports_trees

    @torch.inference_mode()
    def forward_tree(self, token_ids: list[int], parents: list[int]) -> torch.Tensor:
        """The last hidden states (n, hidden) of a token tree appended after the cached tokens (see
        `LlamaForward.hidden_tree`); `compact` then keeps one path of it."""
        return self._lean().hidden_tree(self._ids(token_ids), parents)

    @torch.inference_mode()
    def compact(self, path: list[int]) -> None:
        """Keep only the nodes `path` (root first) of the last `forward_tree` in the cache."""
        self._lean().compact(path)

    def _lean(self) -> llama_forward.LlamaForward:
        if not isinstance(self.backend, llama_forward.LlamaForward):
            raise RuntimeError("token trees run on the lean Llama forward only (see supports_trees)")
        return self.backend

    def crop(self, length: int) -> None:
        """Forget cached positions from `length` on (rejected drafts)."""
        self.backend.crop(length)

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        """The ids as a tensor on the model's device, checked first: an id beyond the embedding's rows
        would fail inside the device (on CUDA, an assert that leaves the process's GPU unusable)."""
        bad = next((i for i in token_ids if not 0 <= i < self.rows), None)
        if bad is not None:
            raise SpecDeckError(
                f"Token id {bad} is outside this model's vocabulary (ids 0 to {self.rows - 1}): "
                "the tokenizer or the drafter does not match the model. Load the model with "
                "its own tokenizer, and a draft of the same vocabulary."
            )
        return torch.tensor(token_ids, dtype=torch.long, device=self.device)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that perf_counter() measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
