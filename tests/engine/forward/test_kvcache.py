"""After rejections, the KV caches must describe exactly the kept text."""

import torch

from specdeck.engine import DecodeConfig, DraftModelDrafter, TokenEvent, encode_prompt, generate
from specdeck.engine.forward.kvcache import CachedModel
from specdeck.engine.planner.round_shape import ProposalShape


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_target_cache_after_rejection_matches_fresh_forward(tiny_pair):
    """Verify K drafts, crop to the accepted prefix, feed the next token: same logits as a fresh pass."""
    target, _ = tiny_pair
    lm = CachedModel(target.model)
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    lm.forward(ids[:-1])
    drafts = [5, 17, 42, 99]
    lm.forward([ids[-1]] + drafts)  # verify forward over the newest kept token and 4 drafts
    kept = ids + drafts[:2] + [7]  # two accepted, then a replacement token
    lm.crop(len(ids) + 2)
    assert len(lm) == len(kept) - 1
    torch.testing.assert_close(lm.forward([kept[-1]])[-1], fresh_logits(target.model, kept), atol=1e-4, rtol=1e-4)


def test_draft_cache_after_session_matches_fresh_forward(tiny_pair):
    """After a session with rejections, the drafter's next proposal comes from the kept text alone."""
    target, draft = tiny_pair
    ids = encode_prompt(target.tokenizer, "def add(a, b):\n    return", chat=False)
    drafter = DraftModelDrafter(draft.model)
    events = list(generate(target, ids, DecodeConfig(k=3, schedule="constant", max_new_tokens=30), drafter))
    assert any(isinstance(e, TokenEvent) and e.state.value == "rejected" for e in events)
    kept = ids + [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]
    proposal = drafter.propose(kept, ProposalShape(1))
    expected = torch.softmax(fresh_logits(draft.model, kept).float(), dim=-1)
    torch.testing.assert_close(proposal.q[0], expected, atol=1e-5, rtol=1e-4)
