"""The text a user gets is whole: a session that stops between the tokens of one character (an
emoji, a right-to-left letter, a combining mark) ends on the last whole character, never on
U+FFFD, through the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeck.engine.loading.models import load_tokenizer
from specdeck.engine.loading.registry import DEFAULT_TARGET
from specdeck.engine.loop.detok import Detokenizer, whole_text

EXAMPLES = settings(max_examples=60, deadline=None, database=None)

# text as models write it, weighted towards characters of several bytes and several tokens
pieces = st.sampled_from(
    [
        "🙂",
        "🦩",
        "👩‍👩‍👧",
        "🇫🇷",
        "שלום",
        "مرحبا",
        "नमस्ते",
        "e\u0301",
        "ñ",
        "中文",
        "ア",
        " ",
        "a",
        "\n",
        "𝔘",
        "\U0010fffd",
    ]
)
texts = st.lists(
    pieces | st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=3), min_size=1, max_size=12
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_TARGET)


def _stopped_at(tokenizer, ids: list[int], stop: str) -> tuple[str, str]:
    """The pieces shown and the final text of a session that keeps `ids` and then stops: at its
    token budget (the last token final) or by the user's Stop (held text flushed)."""
    detok = Detokenizer(tokenizer)
    shown = [detok.push(token, final=stop == "budget" and i == len(ids) - 1) for i, token in enumerate(ids)]
    shown.append(detok.flush())
    return "".join(shown), detok.text


@EXAMPLES
@given(parts=texts, cut=st.integers(min_value=1), stop=st.sampled_from(["budget", "user"]))
def test_a_cut_anywhere_keeps_whole_characters(tokenizer, parts, cut, stop):
    """Kept tokens cut after any token: the final text has no U+FFFD, is the start of the whole
    text, loses no whole character of the kept tokens, and is what the streamed pieces add up to."""
    text = "".join(parts).replace("\ufffd", "")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        return
    whole = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if "\ufffd" in whole:  # a character this vocabulary cannot spell (it has no token for some bytes)
        return
    kept = ids[: 1 + cut % len(ids)]
    streamed, final = _stopped_at(tokenizer, kept, stop)
    assert "\ufffd" not in final and whole.startswith(final) and streamed == final
    assert final == tokenizer.decode(kept, skip_special_tokens=True).rstrip("\ufffd")


def test_an_emoji_cut_after_its_first_token_is_left_out(tokenizer):
    """Stopped after the first byte-token of the emoji in "Hi 🦩", the text is "Hi ", not "Hi \ufffd"."""
    ids = tokenizer("Hi 🦩", add_special_tokens=False)["input_ids"]
    decoded = [tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1)]
    first_partial = next(n for n, text in enumerate(decoded, 1) if text.endswith("\ufffd"))
    assert _stopped_at(tokenizer, ids[:first_partial], "budget")[1] == "Hi "


@EXAMPLES
@given(ids=st.lists(st.integers(0, 49151), min_size=1, max_size=12), special=st.sampled_from([0, 1, 2]))
def test_streamed_pieces_are_transformers_text_for_any_ids(tokenizer, ids, special):
    """Any ids, special tokens among them: the pieces a session streams (through the Rust tokenizer
    where transformers would hand it the ids as they are) add up to transformers' own text, whole."""
    ids = [special, *ids]
    detok = Detokenizer(tokenizer)
    streamed = "".join(detok.push(token) for token in ids) + detok.flush()
    assert streamed == whole_text(tokenizer, ids)
