"""The event stream is the engine's contract with every front end."""

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdeck.engine import (
    DecodeConfig,
    DraftModelDrafter,
    RoundEvent,
    SummaryEvent,
    TokenEvent,
    encode_prompt,
    generate,
)
from specdeck.engine.drafting.drafters import PromptLookupDrafter
from specdeck.engine.drafting.proposals import Proposal, one_hot
from specdeck.engine.loop.detok import Detokenizer, whole_text


def session(target, draft, **settings):
    ids = encode_prompt(target.tokenizer, "Café, naïve, 東京 and the quick brown fox", chat=False)
    config = DecodeConfig(**{"k": 4, "schedule": "constant", "max_new_tokens": 40, **settings})
    return list(generate(target, ids, config, DraftModelDrafter(draft.model)))


def test_kept_pieces_join_to_decoded_text(tiny_pair):
    """Joining the kept tokens' pieces gives exactly tokenizer.decode of the kept ids (less a last
    character cut short)."""
    target, draft = tiny_pair
    for temperature in (0.0, 1.0):
        events = session(target, draft, temperature=temperature)
        kept = [e for e in events if isinstance(e, TokenEvent) and e.state.kept]
        decoded = whole_text(target.tokenizer, [e.token_id for e in kept])
        assert "".join(e.text for e in kept) == decoded == events[-1].text


def test_round_counts_add_up(tiny_pair):
    """Per round accepted + rejected + discarded = drafted, at most one rejected (a chain); the
    summary's counts match the events."""
    target, draft = tiny_pair
    events = session(target, draft, temperature=1.0, seed=3)
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    for r in rounds:
        mine = [e for e in tokens if e.round == r.round]
        accepted = sum(e.state.value == "accepted" for e in mine)
        rejected = sum(e.state.value == "rejected" for e in mine)
        discarded = sum(e.state.value == "discarded" for e in mine)
        assert (accepted, accepted + rejected + discarded, discarded) == (r.accepted, r.drafted, r.discarded)
        assert rejected <= 1 and (discarded == 0 or rejected == 1)
        assert sum(e.state.kept for e in mine) == (accepted + 1 if rejected or r.drafted == accepted else 1)
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    assert summary.rounds == len(rounds)
    assert summary.new_tokens == sum(e.state.kept for e in tokens) == rounds[-1].new_tokens
    assert summary.drafted == sum(r.drafted for r in rounds)
    assert summary.accepted == sum(r.accepted for r in rounds)
    assert summary.discarded == sum(r.discarded for r in rounds)
    assert summary.mean_accepted_length == summary.new_tokens / summary.rounds


def test_drafts_stand_where_they_were_proposed_and_unjudged_ones_are_discarded(tiny_pair):
    """In a round with an early rejection each draft's pos is the round's start plus its depth - 1;
    the first refused draft is rejected (with min(1, p/q)), the later ones discarded (without), and
    the resampled token shares the rejected draft's pos and has no acceptance probability."""
    target, draft = tiny_pair
    events = session(target, draft, temperature=1.0, seed=3, k=6)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    early = [r for r in events if isinstance(r, RoundEvent) and r.discarded]
    assert early, "the seed gives a round rejected before its last draft"
    for r in early:
        mine = [e for e in tokens if e.round == r.round]
        start = min(e.pos for e in mine)
        drafts = [e for e in mine if e.depth]
        assert [e.pos for e in drafts] == [start + e.depth - 1 for e in drafts] == list(range(start, start + r.drafted))
        states = [e.state.value for e in drafts]
        assert states == ["accepted"] * r.accepted + ["rejected"] + ["discarded"] * r.discarded
        rejected = drafts[r.accepted]
        assert rejected.acceptance_probability is not None
        assert all(e.acceptance_probability is None for e in drafts[r.accepted + 1 :])
        resampled = [e for e in mine if e.state.value == "resampled"]
        assert [e.pos for e in resampled] == [rejected.pos] and resampled[0].acceptance_probability is None


def test_a_proposal_reads_q_of_its_tokens_as_its_rows_hold_it():
    """The q a round's events show (`Proposal.q_of`) and the rank of the target's token (`rank`)
    are the distribution's own: a model draft's rows, a copy's one-hot rows and a cut output
    layer's rows over some ids (0 elsewhere), the last two read without making the whole rows."""
    generator = torch.Generator().manual_seed(0)
    dists = torch.softmax(torch.randn(3, 11, generator=generator), -1)
    columns = torch.tensor([1, 2, 4, 7, 9])
    cut = torch.softmax(torch.randn(3, 5, generator=generator), -1)
    whole = torch.zeros(3, 11).index_copy_(1, columns, cut)
    drafts = [4, 2, 9]
    proposals = {
        "drafted": (Proposal(drafts, dists), dists),
        "copied": (one_hot(drafts, 11, torch.device("cpu"), source="prompt", match_length=3), None),
        "cut": (Proposal(drafts, cut, width=11, columns=columns), whole),
    }
    for proposal, q in proposals.values():
        q = proposal.q if q is None else q
        for tokens in ([4, 2, 9], [4, 7], [1, 2, 9], [0, 10, 3], []):
            rows = q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)]
            assert proposal.q_of(tokens) == rows.tolist()
        for row in (0, 1):
            assert proposal.q_of([4, 5, 9, 4, 0], row=row) == q[row, [4, 5, 9, 4, 0]].tolist()
    cut, _ = proposals["cut"]
    full = Proposal(drafts, whole.clone())
    assert [cut.rank(t) for t in range(11)] == [full.rank(t) for t in range(11)]
    assert torch.equal(cut.q, whole) and cut.columns is None  # read whole, it is widened once


def test_copied_drafts_show_q_one_and_the_token_replacing_one_q_zero(tiny_llama):
    """Prompt lookup's drafts are one-hot: each copied draft, kept or refused, shows q = 1, and the
    target's token in place of a refused copy shows q = 0 (the copy gave it no probability)."""
    target, _ = tiny_llama
    ids = encode_prompt(target.tokenizer, "one two three four one two three four one two three", chat=False)
    config = DecodeConfig(k=4, schedule="constant", max_new_tokens=40)
    events = list(generate(target, ids, config, PromptLookupDrafter(max_ngram=2)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    copied = [e for e in tokens if e.depth]
    assert copied and any(e.state.value == "rejected" for e in copied), "the prompt gives copies, some refused"
    assert all(e.q == 1.0 for e in copied)
    replacing = [e for e in tokens if e.state.value == "resampled"]
    assert replacing and all(e.q == 0.0 for e in replacing)


def test_plain_decoding_scores_one_token_per_forward(tiny_llama):
    """Plain decoding goes through the same events: every token plain, mean accepted length 1."""
    target, _ = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick", chat=False)
    events = list(generate(target, ids, DecodeConfig(max_new_tokens=12)))
    assert {e.state.value for e in events if isinstance(e, TokenEvent)} == {"plain"}
    assert events[-1].mean_accepted_length == 1.0 and events[-1].target_forwards_per_token == 1.0


def test_stop_string_and_cancel(tiny_llama):
    """A stop string ends the session at the token that completes it; cancel keeps the text so far."""
    import threading

    target, draft = tiny_llama
    ids = encode_prompt(target.tokenizer, "The quick brown fox", chat=False)
    full = list(generate(target, ids, DecodeConfig(max_new_tokens=40)))[-1].text
    stop = full[10:13]
    stopped = list(generate(target, ids, DecodeConfig(max_new_tokens=40, stop_strings=(stop,))))[-1]
    assert stopped.stop_reason == "stop_string" and stop in stopped.text and full.startswith(stopped.text)
    cancel = threading.Event()
    kept_before_cancel = ""
    for event in generate(
        target, ids, DecodeConfig(k=3, schedule="constant", max_new_tokens=40), DraftModelDrafter(draft.model), cancel
    ):
        if isinstance(event, RoundEvent) and event.round == 3:
            cancel.set()
            kept_before_cancel = event.new_tokens
        if isinstance(event, SummaryEvent):
            assert event.stop_reason == "cancelled" and event.new_tokens == kept_before_cancel
            assert full.startswith(event.text) and event.text


def sentencepiece_like_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-style: ▁ marks spaces, characters outside the vocabulary fall back to <0xNN> bytes."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for ch in "▁abcdefghijklmnopqrstuvwxyzü":
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Metaspace()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_detokenizer_handles_multibyte_and_sentencepiece_spaces():
    """Piece by piece, byte-fallback characters and ▁ spaces come out exactly as a full decode."""
    tokenizer = sentencepiece_like_tokenizer()
    text = "Zürich 東京 🙂 quick  brown fox ✓"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert any(tokenizer.convert_ids_to_tokens(i).startswith("<0x") for i in ids)  # byte fallback in play
    naive = "".join(tokenizer.decode([i]) for i in ids)
    assert naive != tokenizer.decode(ids)  # token-by-token decoding would get this text wrong
    detok = Detokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert "\ufffd" not in "".join(pieces)
