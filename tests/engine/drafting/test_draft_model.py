"""A draft with a reduced output vocabulary (`output_tokens.json`) proposes only those tokens and
keeps decoding exact."""

import json

import pytest
import torch
from tiny import ON_CPU, build_pair

from specdeck.engine import DecodeConfig, DraftModelDrafter, TokenEvent, TokenState, encode_prompt, generate
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.models import OUTPUT_TOKENS_FILE, load_model


def test_reduced_output_greedy_equals_plain(tiny_pair):
    """Greedy output is unchanged for K = 1..6 when the draft may only propose a third of the tokens,
    and every token the draft proposed comes from that third (copies by prompt lookup aside)."""
    target, draft = tiny_pair
    allowed = torch.arange(0, target.vocab_width, 3)
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    plain = [
        e.token_id
        for e in generate(target, ids, DecodeConfig(max_new_tokens=32))
        if isinstance(e, TokenEvent) and e.state.kept
    ]
    for k in range(1, 7):
        events = list(
            generate(
                target,
                ids,
                DecodeConfig(k=k, schedule="constant", max_new_tokens=32),
                DraftModelDrafter(draft.model, output_ids=allowed),
            )
        )
        assert [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept] == plain, k
        drafted = {
            e.token_id
            for e in events
            if isinstance(e, TokenEvent)
            and not e.copied
            and e.state in (TokenState.ACCEPTED, TokenState.REJECTED, TokenState.DISCARDED)
        }
        assert drafted and drafted <= set(allowed.tolist())


def test_output_token_file_is_read_and_checked(tmp_path):
    """load_model reads the list beside the weights; a malformed list is refused with the file named."""
    _, draft_dir = build_pair(tmp_path, "llama", noise=0.2)
    (draft_dir / OUTPUT_TOKENS_FILE).write_text(json.dumps({"token_ids": [5, 3, 9, 3]}))
    assert load_model(str(draft_dir), ON_CPU).output_ids.tolist() == [3, 5, 9]
    for bad in ('{"token_ids": [1, 100000]}', '{"ids": [1]}', "not json", '{"token_ids": []}'):
        (draft_dir / OUTPUT_TOKENS_FILE).write_text(bad)
        with pytest.raises(SpecDeckError, match=OUTPUT_TOKENS_FILE):
            load_model(str(draft_dir), ON_CPU)
