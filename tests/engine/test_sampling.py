"""The greedy choice: `argmaxes` (numpy's argmax for float32 on the CPU) picks what torch's argmax
picks, ties included, so plain and speculative greedy decoding keep choosing the same token."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeck.engine.sampling import argmaxes


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5),
    width=st.integers(1, 300),
    levels=st.integers(1, 4),  # few distinct values: many ties for the maximum
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_argmaxes_pick_torchs_argmax_ties_included(rows, width, levels, seed, dtype):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (rows, width), generator=generator).to(dtype)
    assert argmaxes(logits) == logits.argmax(dim=-1).tolist()
    assert argmaxes(logits[:, ::2]) == logits[:, ::2].argmax(dim=-1).tolist()  # a strided view


def test_argmaxes_of_a_vocabulary_row():
    logits = torch.randn(3, 49152, generator=torch.Generator().manual_seed(0))
    logits[1, 17] = logits[1, 40000] = logits[1].max() + 1  # a tie: the first wins
    assert argmaxes(logits) == logits.argmax(dim=-1).tolist()
    assert argmaxes(logits)[1] == 17
