"""The session files: the token CSV tells each draft's fate where it was proposed."""

import csv
import dataclasses
import io

from specdeck.engine import DecodeConfig, DraftModelDrafter, RoundEvent, encode_prompt, generate
from specdeck.engine.export import ROUND_COLUMNS, SessionRecord, rounds_csv, tokens_csv


def test_token_rows_give_each_draft_its_position_and_unjudged_drafts_their_own_state(tiny_pair):
    """In the token CSV a round with a rejection before its last draft lists its drafts at
    consecutive positions, one rejected with min(1, p/q), the rest discarded without; the round
    CSV counts the discarded apart."""
    target, draft = tiny_pair
    ids = encode_prompt(target.tokenizer, "Café, naïve, 東京 and the quick brown fox", chat=False)
    record = SessionRecord(1, "speculative")
    config = DecodeConfig(k=6, schedule="constant", max_new_tokens=40, temperature=1.0, seed=3)
    for event in generate(target, ids, config, DraftModelDrafter(draft.model)):
        record.add(event)
    tokens = list(csv.DictReader(io.StringIO(tokens_csv([record]))))
    rounds = list(csv.DictReader(io.StringIO(rounds_csv([record]))))
    assert tuple(rounds[0]) == ROUND_COLUMNS
    early = [r for r in record.rounds if r.discarded]
    assert early and isinstance(early[0], RoundEvent)
    for r in early:
        drafts = [t for t in tokens if int(t["round"]) == r.round and int(t["depth"])]
        start = int(drafts[0]["pos"])
        assert [int(t["pos"]) for t in drafts] == list(range(start, start + r.drafted))
        assert [t["state"] for t in drafts] == ["accepted"] * r.accepted + ["rejected"] + ["discarded"] * r.discarded
        assert drafts[r.accepted]["acceptance_probability"] != ""
        assert all(t["acceptance_probability"] == "" for t in drafts[r.accepted + 1 :])
        assert int(rounds[r.round - 1]["discarded"]) == r.discarded
    assert sum(t["state"] == "discarded" for t in tokens) == sum(int(r["discarded"]) for r in rounds)


def test_token_text_with_line_breaks_reads_back_as_one_row(tiny_pair):
    """A token whose text holds a lone carriage return, a newline or a quote stays one row of the
    token CSV, its text as written (spreadsheets and csv readers take a bare \\r for a line end)."""
    target, _ = tiny_pair
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    record = SessionRecord(1, "plain")
    for event in generate(target, ids, DecodeConfig(max_new_tokens=4)):
        record.add(event)
    odd = ["a\rb", "c\nd", 'say "hi"\r']
    record.tokens[: len(odd)] = [dataclasses.replace(t, text=text) for t, text in zip(record.tokens, odd)]
    rows = list(csv.DictReader(io.StringIO(tokens_csv([record]), newline="")))
    assert [row["text"] for row in rows[: len(odd)]] == odd
    assert len(rows) == len(record.tokens)
