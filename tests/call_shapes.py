"""Checks that a position's logits do not depend on the call that computes them: a verify's tokens
against one-token steps, on the lean forward (`CachedModel`) and on llama.cpp (`LlamaCppForward`)."""

import torch

from specdeck.engine import encode_prompt
from specdeck.engine.forward.kvcache import CachedModel

PROMPT = "Name three rivers of Europe and say where each one meets the sea."


def verify_and_steps(lm: CachedModel, tokenizer, new: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of a prompt's last `new` tokens fed in one forward (a verify) and one at a time
    (steps), after the same cached prefix."""
    ids = encode_prompt(tokenizer, PROMPT)
    lm.size_for(len(ids) + new)
    lm.forward(ids[:-new], last_only=True)
    together = lm.forward(ids[-new:])
    lm.crop(len(ids) - new)
    return together, torch.cat([lm.forward([token]) for token in ids[-new:]])


def logits_in_calls(forward, ids: list[int], sizes: list[int], states: bool) -> torch.Tensor:
    """Every position's logits of `ids` fed to a llama.cpp forward in calls of `sizes` tokens, from
    its final-norm states through the output layer where `states`, else as logits."""
    rows, start = [], 0
    for size in sizes:
        chunk = torch.tensor(ids[start : start + size])
        rows.append(forward.output_layer(forward.hidden(chunk)) if states else forward.logits(chunk, last_only=False))
        start += size
    return torch.cat(rows)
