"""A model plus its KV cache, with the one invariant the decoding loop relies on.

Invariant (target and draft model alike): between rounds the cache holds every kept token except
the newest one. The newest kept token is fed first in the next forward, so each round is a single
forward over [newest kept token, drafted tokens...]; after a rejection the cache is cropped back
to the kept prefix, so no round ever re-reads the context.

Llama-family models run on `engine.llama_forward` (same logits, far less overhead per step),
GGUF files opened by llama.cpp on `engine.llamacpp_backend`, every other model on Hugging Face's
own forward over a `DynamicCache`.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from engine import llama_forward
from engine.llamacpp_backend import LlamaCppForward, LlamaCppModel


class HFForward:
    """Hugging Face's forward over a `DynamicCache`: works for any causal LM."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    def __len__(self) -> int:
        return self.cache.get_seq_length()

    def logits(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        out = self.model(input_ids=ids[None], past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0)
        self.cache = out.past_key_values
        return out.logits[0]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        return self._last_hidden(input_ids=ids[None])

    def hidden_from_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._last_hidden(inputs_embeds=inputs[None])

    def output_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    def _last_hidden(self, **inputs) -> torch.Tensor:
        out = self.model.base_model(**inputs, past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.last_hidden_state[0]

    def crop(self, length: int) -> None:
        excess = len(self) - length
        if excess > 0:
            self.cache.crop(-excess)  # transformers 5: a negative count removes that many positions


def backend_for(model: torch.nn.Module | LlamaCppModel) -> llama_forward.LlamaForward | HFForward | LlamaCppForward:
    """llama.cpp for a model it opened; else the lean Llama forward where it reproduces `model`, else
    Hugging Face's."""
    if isinstance(model, LlamaCppModel):
        return LlamaCppForward(model)
    return llama_forward.LlamaForward(model) if llama_forward.supports(model) else HFForward(model)


class CachedModel:
    """A causal LM and its KV cache, on llama.cpp for a model it opened, on the lean Llama forward
    when that reproduces the model, else on Hugging Face's."""

    def __init__(self, model: torch.nn.Module | LlamaCppModel) -> None:
        self.model = model
        self.device = model.device
        self.backend = backend_for(model)

    def reset(self) -> None:
        self.backend.reset()

    def __len__(self) -> int:
        return len(self.backend)

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Logits (n, vocab) for `token_ids` appended after the cached tokens; (1, vocab) if last_only."""
        return self.backend.logits(torch.tensor(token_ids, dtype=torch.long, device=self.device), last_only)

    @torch.inference_mode()
    def forward_hidden(self, token_ids: list[int]) -> torch.Tensor:
        """The last layer's (normalised) hidden states (n, hidden) for `token_ids` appended after the
        cached tokens: the output layer left to the caller."""
        return self.backend.hidden(torch.tensor(token_ids, dtype=torch.long, device=self.device))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer applied to `forward_hidden`'s states: the same logits `forward` gives for
        Llama-family models, whose logits are exactly that (through the same product path). On
        llama.cpp, the logits of the latest `forward_hidden`'s own call, for its states only."""
        return self.backend.output_layer(hidden)

    @property
    def supports_trees(self) -> bool:
        """Whether `forward_tree` can run: the lean Llama forward's tree attention."""
        return isinstance(self.backend, llama_forward.LlamaForward)

    @torch.inference_mode()
    def forward_tree(self, token_ids: list[int], parents: list[int]) -> torch.Tensor:
        """The last hidden states (n, hidden) of a token tree appended after the cached tokens (see
        `LlamaForward.hidden_tree`); `compact` then keeps one path of it."""
        return self.backend.hidden_tree(torch.tensor(token_ids, dtype=torch.long, device=self.device), parents)

    @torch.inference_mode()
    def compact(self, path: list[int]) -> None:
        """Keep only the nodes `path` (root first) of the last `forward_tree` in the cache."""
        self.backend.compact(path)

    def crop(self, length: int) -> None:
        """Forget cached positions from `length` on (rejected drafts)."""
        self.backend.crop(length)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that perf_counter() measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
