"""The feature head's objective: which pairs prompt lookup could copy, and the loss that weighs
them apart."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig

from specdeck.engine.drafting.heads import FeatureHead, head_config
from specdeck.train.head import HeadConfig
from specdeck.train.head_objective import copyable_pairs, head_loss


def _copyable_by_search(row: list[int]) -> list[bool]:
    """Pair j: do ids[j], ids[j + 1] stand together anywhere before, ending at or before j?"""
    return [any(row[i - 1 : i + 1] == row[j : j + 2] for i in range(1, j + 1)) for j in range(len(row) - 1)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=12, max_size=12), min_size=1, max_size=4))
def test_copyable_pairs_are_those_whose_two_tokens_stood_together_before(rows):
    marked = copyable_pairs(torch.tensor(rows))
    assert marked.tolist() == [_copyable_by_search(row) for row in rows]


def test_copyable_pairs_of_a_repeated_phrase():
    # "a b c x a b c": after the second "a b" lookup copies "c", after the second "b c" it copies "x"
    marked = copyable_pairs(torch.tensor([[1, 2, 3, 9, 1, 2, 3]]))
    assert marked.tolist() == [[False, False, False, False, True, True]]


def _tiny_head() -> FeatureHead:
    target = LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return FeatureHead(head_config(target)).eval()


def test_a_zero_copy_weight_trains_only_on_what_lookup_cannot_copy():
    """The loss with copyable pairs weighed 0 is the loss over the other pairs alone, at every depth
    of the unrolled passes; weighed 1, the loss does not change."""
    head = _tiny_head()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 6, (3, 14), generator=generator)
    states = torch.randn(3, 14, 32, generator=generator)
    embeds = torch.randn(3, 13, 32, generator=generator)
    weight = torch.randn(40, 32, generator=generator)
    mask = torch.ones(3, 13, dtype=torch.bool)
    mask[:, :2] = False
    copyable = copyable_pairs(ids)
    assert copyable[mask].any() and (~copyable[mask]).any()
    config = HeadConfig(unroll=2, bfloat16=False, feature_weight=0.0)
    with torch.no_grad():
        weighed, _ = head_loss(head, states, embeds, mask, weight, config, copyable=copyable, copy_weight=0.0)
        others, _ = head_loss(head, states, embeds, mask & ~copyable, weight, config)
        unweighed, _ = head_loss(head, states, embeds, mask, weight, config, copyable=copyable, copy_weight=1.0)
        plain, _ = head_loss(head, states, embeds, mask, weight, config)
        half, _ = head_loss(head, states, embeds, mask, weight, config, copyable=copyable, copy_weight=0.5)
    torch.testing.assert_close(weighed, others)
    torch.testing.assert_close(unweighed, plain)
    assert not torch.isclose(half, plain) and not torch.isclose(half, others)
