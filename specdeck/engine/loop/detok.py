"""Incremental detokenization: each kept token's text piece, as it arrives.

Decoding tokens one by one is wrong for byte-level BPE (a multi-byte character spans tokens) and
for SentencePiece (a leading space depends on the previous token). So, as in Hugging Face's
TextStreamer and vLLM, we decode a short window ending at the new token and emit what it added
to the window's text; an incomplete character (U+FFFD at the end) is held back until the token
that completes it. Joining every emitted piece equals `tokenizer.decode` of all kept tokens, less
an unfinished character at the end: a session that stops (max-new-tokens, a Stop) between the
tokens of one character ends on the last whole one (`whole_text`).
"""

from __future__ import annotations

import os

_WINDOW = 6  # tokens of left context: enough for any SentencePiece space or UTF-8 sequence
_UNFINISHED = "\ufffd"  # what a decoder makes of bytes that are no character (yet)
# continuation bytes as a byte-level BPE vocabulary (GPT-2's bytes_to_unicode) and a byte-fallback
# one (SentencePiece's <0xNN>) name them: 0x80 continues most lead bytes, 0xA0 those that need a
# higher second byte (E0, F0)
_CONTINUATIONS = {0x80: (chr(256 + 34), "<0x80>"), 0xA0: (chr(256 + 66), "<0xA0>")}


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _byte_token(tokenizer, names: tuple[str, ...]) -> int | None:
    """The token that is one lone continuation byte, by one of its `names`, where the vocabulary has it."""
    for name in names:
        token = tokenizer.convert_tokens_to_ids(name)
        if isinstance(token, int) and token != tokenizer.unk_token_id and _decode(tokenizer, [token]) == _UNFINISHED:
            return token
    return None


def whole_text(tokenizer, ids: list[int]) -> str:
    """The text of `ids` as a user gets it at the end of a session: less a last character whose
    bytes were cut short (a stop inside an emoji), which would show as U+FFFD. A U+FFFD is taken
    for a cut character where continuation bytes complete it; bytes no continuation completes
    (a model's invalid output) stay as they are."""
    text = _decode(tokenizer, ids)
    if not text.endswith(_UNFINISHED):
        return text
    low, high = (_byte_token(tokenizer, names) for names in _CONTINUATIONS.values())
    if low is None or high is None:
        return text
    for first in (low, high):
        for count in range(3):  # a UTF-8 character lacks at most three bytes
            completed = _decode(tokenizer, ids + [first] + [low] * count)
            if not completed.endswith(_UNFINISHED):
                return text[: len(os.path.commonprefix([text, completed]))]
    return text


def _backend(tokenizer):
    """The Rust tokenizer whose `decode(ids, skip_special_tokens=True)` is `_decode` to the letter, or
    None: a transformers `TokenizersBackend` that overrides neither `decode` nor `_decode`, which then
    hand the ids to it as they are (cleaning up no spaces). A step decodes twice after its products
    streamed the weights through every cache, where transformers' wrappers paid their code from
    memory again."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    if not isinstance(tokenizer, TokenizersBackend):
        return None
    if (
        type(tokenizer).decode is not TokenizersBackend.decode
        or type(tokenizer)._decode is not TokenizersBackend._decode
    ):
        return None
    return getattr(tokenizer, "_tokenizer", None)


class Detokenizer:
    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._backend = _backend(tokenizer)
        self._ids: list[int] = []
        self._emitted = 0  # self._ids[:_emitted] are in self.text
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=True)
        return _decode(self._tokenizer, ids)

    def _rest_of_whole_text(self) -> str:
        """What the kept tokens add to the text shown so far, at the end of a session (`whole_text`)."""
        whole = whole_text(self._tokenizer, self._ids)
        return whole[len(self.text) :] if whole.startswith(self.text) else ""

    def _added_text(self, ids: list[int]) -> str:
        """What `ids[_emitted:]` add to the text, decoded with a few emitted tokens as left context."""
        left = ids[max(0, self._emitted - _WINDOW) : self._emitted]
        full = self._decode(left + ids[self._emitted :])
        left_text = self._decode(left) if left else ""
        if full.startswith(left_text):
            return full[len(left_text) :]
        return self._decode(ids)[len(self.text) :]  # rare: fall back to the whole text

    def push(self, token_id: int, final: bool = False) -> str:
        """Add a kept token; return the text it completes ("" while a character is unfinished,
        unless `final`: the session ends with this token, so nothing may stay held back)."""
        self._ids.append(token_id)
        piece = self._added_text(self._ids)
        if piece.endswith(_UNFINISHED):
            if not final:
                return ""
            piece = self._rest_of_whole_text()
        self._emitted = len(self._ids)
        self.text += piece
        return piece

    def peek(self, token_ids: list[int]) -> list[str]:
        """The piece each token would add if kept after the current text (rejected drafts)."""
        pieces: list[str] = []
        shown = ""
        for end in range(1, len(token_ids) + 1):
            text = self._added_text(self._ids + token_ids[:end])
            pieces.append(text[len(shown) :] if text.startswith(shown) else text)
            shown = text
        return pieces

    def flush(self) -> str:
        """At the end of a session, what is held back beyond an unfinished last character."""
        if self._emitted == len(self._ids):
            return ""
        piece = self._rest_of_whole_text()
        self._emitted = len(self._ids)
        self.text += piece
        return piece
