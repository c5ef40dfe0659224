"""Incremental detokenization: each kept token's text piece, as it arrives.

Decoding tokens one by one is wrong for byte-level BPE (a multi-byte character spans tokens) and
for SentencePiece (a leading space depends on the previous token). So, as in Hugging Face's
TextStreamer and vLLM, we decode a short window ending at the new token and emit what it added
to the window's text; an incomplete character (U+FFFD at the end) is held back until the token
that completes it. Joining every emitted piece equals `tokenizer.decode` of all kept tokens.
"""

from __future__ import annotations

_WINDOW = 6  # tokens of left context: enough for any SentencePiece space or UTF-8 sequence


class Detokenizer:
    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = 0  # self._ids[:_emitted] are in self.text
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

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
        if piece.endswith("\ufffd") and not final:
            return ""
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
        """Whatever is still held back at the end of a session (an unfinished character)."""
        if self._emitted == len(self._ids):
            return ""
        piece = self._decode(self._ids)[len(self.text) :]
        self._emitted = len(self._ids)
        self.text += piece
        return piece
