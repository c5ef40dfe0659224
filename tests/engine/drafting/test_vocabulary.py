"""A draft whose vocabulary is a prefix of the target's: the target's extra tokens never crash a session."""

import pytest
import torch
from tiny import ON_CPU, build_model, build_tokenizer

from specdeck.engine import DecodeConfig, DraftModelDrafter, TokenEvent, TokenState, encode_prompt, generate
from specdeck.engine.drafting.vocabulary import match_vocabularies
from specdeck.engine.loading.models import load_model

EXTRA = ["<|user|>", "<|end|>"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def prefix_pair(request, tiny_root):
    """A target whose tokenizer adds two tokens to its draft's, and a draft that cannot embed them."""
    root = tiny_root / f"prefix-{request.param}"
    tokenizer = build_tokenizer(root / "draft")
    build_model(root / "draft", request.param, len(tokenizer), seed=1, layers=1, eos_token_id=tokenizer.eos_token_id)
    tokenizer.add_tokens(EXTRA, special_tokens=True)
    tokenizer.save_pretrained(root / "target")
    build_model(root / "target", request.param, len(tokenizer), seed=0, eos_token_id=tokenizer.eos_token_id)
    return load_model(str(root / "target"), ON_CPU), load_model(str(root / "draft"), ON_CPU)


def kept(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept]


def test_target_only_tokens_in_prompt_and_output_keep_greedy_exact(prefix_pair):
    """The pair counts as one vocabulary; with the extra tokens in the prompt and emitted by the
    target, speculative text equals plain text and the draft proposes only tokens it knows."""
    target, draft = prefix_pair
    assert match_vocabularies(target, draft).same
    extra_ids = set(target.tokenizer.convert_tokens_to_ids(EXTRA))
    # typed text never becomes a control token (prompts are data), so the ids go in directly
    ids = [min(extra_ids)] + encode_prompt(target.tokenizer, " The quick brown fox ", chat=False) + [max(extra_ids)]
    config = DecodeConfig(k=3, schedule="constant", max_new_tokens=24, lookup=0)
    first = kept(generate(target, ids, DecodeConfig(max_new_tokens=1)))[0]
    head = target.model.get_output_embeddings().weight
    with torch.no_grad():  # the target now says <|end|> wherever it would have said `first`
        head[max(extra_ids)] = 2 * head[first]
    plain = kept(generate(target, ids, config))
    events = list(generate(target, ids, config, DraftModelDrafter(draft.model)))
    assert kept(events) == plain and max(extra_ids) in plain
    drafted = {
        e.token_id
        for e in events
        if isinstance(e, TokenEvent) and e.state in (TokenState.ACCEPTED, TokenState.REJECTED, TokenState.DISCARDED)
    }
    assert drafted and max(drafted) < draft.vocab_width
