"""The context window: how many positions a model was trained on, and what a session does at its edge.

A prompt that leaves no room for an answer is refused before anything runs ("prompt N tokens,
context M"), or, when the user allows it (`DecodeConfig.truncate_prompt`), cut to its last part;
a session whose answer reaches the end of the context stops there with stop reason "context".
Beyond its trained positions a Llama's rotary angles were never seen in training (its text
degrades silently) and a GPT-2's position table has no row (an IndexError), so neither may go there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdeck.engine.errors import SpecDeckError

if TYPE_CHECKING:  # annotations only: the window reads `prompt_cut_notice` before torch has imported
    import torch

    from specdeck.engine.forward.llamacpp_backend import LlamaCppModel


def context_length(model: torch.nn.Module | LlamaCppModel) -> int | None:
    """The positions `model` was trained on: its config's `max_position_embeddings` (GPT-2's
    `n_positions`), or None when the config does not say."""
    value = getattr(model.config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def shortest(*lengths: int | None) -> int | None:
    """The smallest of the known context lengths (a session is bound by the target's and a draft's)."""
    return min((n for n in lengths if n is not None), default=None)


def fit_prompt(prompt_ids: list[int], context: int | None, max_new_tokens: int, truncate: bool) -> list[int]:
    """The prompt as it will be decoded: whole when at least one new token fits after it in
    `context`; else its last part when `truncate` (leaving room for `max_new_tokens`, at most half
    the context), else a `SpecDeckError` that gives both sizes."""
    if context is None or len(prompt_ids) < context:
        return prompt_ids
    if not truncate:
        raise SpecDeckError(
            f"The prompt is too long for the model: prompt {len(prompt_ids)} tokens, context {context} "
            "(prompt and answer must fit together). Shorten the prompt, or let SpecDeck keep its last part "
            "(--truncate-prompt; in the window: 'Keep the end of long prompts')."
        )
    return prompt_ids[len(prompt_ids) - (context - min(max_new_tokens, context // 2)) :]


def prompt_cut_notice(prompt_tokens: int, dropped: int) -> str:
    """What `truncate_prompt` did to a prompt too long for the context (`SessionStarted`'s counts)."""
    return (
        f"The prompt ({prompt_tokens + dropped} tokens) was too long for the model's context: "
        f"kept its last {prompt_tokens} tokens, dropped the first {dropped}."
    )
