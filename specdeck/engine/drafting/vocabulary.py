"""Two tokenizers over the same text: each token as the bytes it spells, which tokens of a draft's
vocabulary have a twin (the same string) in the target's, and which case a pair is.

Comparing tokens as bytes makes GPT-2's byte-level pieces ("Ġthe"), SentencePiece pieces ("▁the")
and byte-fallback pieces ("<0xE2>") comparable: " the" is " the" in either. Control tokens
(`<|im_end|>`, `</s>`) are twins only of control tokens with the same content, and the end-of-text
tokens of the two sides are twins of each other whatever they are called. Timor et al. 2025,
"Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies", sample drafts from the draft's distribution over these twins (`specdeck.engine.drafting.cross_vocab`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache

import torch

from specdeck.engine.errors import SpecDeckError

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback
LITTLE_SHARED = 0.25  # below this share of the draft's tokens with a twin, a pair has "little in common"


@cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (character -> byte)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _types(node) -> set[str]:
    """Every component type named in a tokenizer.json node (normalizer, pre-tokenizer, decoder)."""
    if isinstance(node, dict):
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        return found.union(*(_types(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_types(value) for value in node))
    return set()


def _without_prefix_space(node):
    """A tokenizer.json normalizer or pre-tokenizer that adds no space before the text: text is
    encoded as a continuation of earlier text, where SentencePiece's "dummy prefix" does not belong."""
    if isinstance(node, list):
        return [n for n in (_without_prefix_space(child) for child in node) if n is not None]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "Prepend":
        return None
    node = {key: _without_prefix_space(value) for key, value in node.items()}
    if node.get("type") == "Metaspace":
        node["prepend_scheme"] = "never"
        node.pop("add_prefix_space", None)
    if node.get("type") == "ByteLevel":
        node["add_prefix_space"] = False
    return node


def _read_pieces(tokenizer, added: dict, byte_level: bool) -> tuple[list[bytes], set[int]]:
    """Each token's bytes (an added token's are its content) and the ids of byte-fallback pieces."""
    pieces, fallback = [], set()
    alphabet = _byte_level_alphabet()
    for token_id, name in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        name = name or ""
        if token_id in added:
            pieces.append(added[token_id].content.encode())
        elif byte_level and all(c in alphabet for c in name):
            pieces.append(bytes(alphabet[c] for c in name))
        elif (byte := _BYTE_PIECE.fullmatch(name)) is not None:
            pieces.append(bytes([int(byte.group(1), 16)]))
            fallback.add(token_id)
        else:
            pieces.append(name.replace("\u2581", " ").encode())
    return pieces, fallback


class TokenText:
    """One tokenizer's tokens as bytes, and text (bytes) encoded in its tokens.

    `encode` returns (token id, end offset) pairs whose pieces spell the text exactly; where the
    tokenizer's own encoding would not (a normalizer that rewrites text), it spells the text with
    the longest pieces that match, and a character that no piece spells becomes the unknown token
    (or, without one, is left out). Text is read as the continuation of earlier text, except at
    its start, where the tokenizer's start-of-text token and its space before the first word (a
    SentencePiece "dummy prefix") belong, as they do when it encodes a prompt; `starting` strips
    them from a token sequence's start again.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", {})
        self.special = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", [])) | frozenset(
            int(i) for i, token in added.items() if getattr(token, "special", False)
        )
        backend = getattr(tokenizer, "backend_tokenizer", None)
        spec = json.loads(backend.to_str()) if backend is not None else {}
        self.pieces, fallback = _read_pieces(tokenizer, added, "ByteLevel" in _types(spec.get("decoder")))
        self._by_bytes: dict[bytes, int] = {}  # a text token per string, rather not a byte-fallback one
        for token_id, piece in enumerate(self.pieces):
            if (
                piece
                and token_id not in self.special
                and (piece not in self._by_bytes or token_id not in fallback and self._by_bytes[piece] in fallback)
            ):
                self._by_bytes[piece] = token_id
        self._longest = max(map(len, self._by_bytes), default=1)
        self._encoder = None
        if backend is not None:
            from tokenizers import Tokenizer

            spec["normalizer"] = _without_prefix_space(spec.get("normalizer"))
            spec["pre_tokenizer"] = _without_prefix_space(spec.get("pre_tokenizer"))
            spec["post_processor"] = None
            self._encoder = Tokenizer.from_str(json.dumps(spec))
        self.unk = tokenizer.unk_token_id if isinstance(tokenizer.unk_token_id, int) else None
        plain, marked = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
        self.bos = marked[0] if len(marked) > len(plain) and marked[0] == tokenizer.bos_token_id else None
        self.prefix_space = self.text(plain) == b" a"

    def __len__(self) -> int:
        return len(self.pieces)

    def text(self, ids: list[int]) -> bytes:
        """The bytes `ids` spell (a control token spells its content, e.g. b"<|im_end|>")."""
        return b"".join(self.pieces[i] if 0 <= i < len(self.pieces) else b"" for i in ids)

    def id_of(self, piece: bytes) -> int | None:
        """The text token that spells exactly `piece`, if the vocabulary has one."""
        return self._by_bytes.get(piece)

    def starting(self, ids: list[int]) -> list[bytes]:
        """The text of each of `ids`, which start a text: the start-of-text token and the space
        before the first word that encoding added are no part of it."""
        pieces = [self.pieces[i] if 0 <= i < len(self.pieces) else b"" for i in ids]
        first = 1 if ids and ids[0] == self.bos else 0
        pieces[:first] = [b""] * first
        if self.prefix_space and first < len(pieces) and pieces[first].startswith(b" "):
            pieces[first] = pieces[first][1:]
        return pieces

    def encode(self, text: bytes, at_start: bool = False) -> list[tuple[int, int]]:
        """(token id, end offset in `text`) for each token of `text`, read as the continuation of
        earlier text, or `at_start` as the start of one (the inverse of `starting`); bytes that are
        not UTF-8 (a character cut at the end) are spelled by pieces."""
        if at_start and text:
            opening = self._encode_start(text)
            if opening is not None:
                return opening
        out: list[tuple[int, int]] = []
        start = 0
        while start < len(text):
            run: str | None
            try:
                run, end = text[start:].decode("utf-8"), len(text)
            except UnicodeDecodeError as error:
                end = start + error.start if error.start else start + max(error.end, 1)
                run = text[start:end].decode("utf-8") if error.start else None
            if run is None:  # bytes that are no character: spelled one piece at a time
                out += self._spell(text, start, end)
            else:
                out += self._encode_run(text, start, end, run)
            start = end
        return out

    def _encode_start(self, text: bytes) -> list[tuple[int, int]] | None:
        try:
            ids = self.tokenizer(text.decode("utf-8"), add_special_tokens=False)["input_ids"]
        except UnicodeDecodeError:
            return None
        spelled = self.text(ids)
        lead = 1 if self.prefix_space and spelled == b" " + text else 0
        if spelled[lead:] != text:
            return None
        out = [(self.bos, 0)] if self.bos is not None else []
        position = -lead
        for token_id in ids:
            position += len(self.pieces[token_id])
            out.append((token_id, max(position, 0)))
        return out

    def _encode_run(self, text: bytes, start: int, end: int, run: str) -> list[tuple[int, int]]:
        if self._encoder is not None:
            ids = self._encoder.encode(run, add_special_tokens=False).ids
        else:
            ids = self.tokenizer(run, add_special_tokens=False)["input_ids"]
        if self.text(ids) != text[start:end]:
            return self._spell(text, start, end)
        out, position = [], start
        for token_id in ids:
            position += len(self.pieces[token_id])
            out.append((token_id, position))
        return out

    def _spell(self, text: bytes, start: int, end: int) -> list[tuple[int, int]]:
        """Longest matching pieces from `start` to `end`; a character with none is the unknown token."""
        out = []
        position = start
        while position < end:
            for length in range(min(self._longest, end - position), 0, -1):
                token_id = self._by_bytes.get(text[position : position + length])
                if token_id is not None:
                    position += length
                    out.append((token_id, position))
                    break
            else:
                position += _char_length(text, position, end)
                if self.unk is not None:
                    out.append((self.unk, position))
        return out


def _char_length(text: bytes, position: int, end: int) -> int:
    """Bytes of the UTF-8 character at `position` (1 for a byte that starts none)."""
    for length in (1, 2, 3, 4):
        try:
            text[position : position + length].decode("utf-8")
            return length
        except UnicodeDecodeError:
            continue
    return 1 if position < end else 0


def twins(
    target: TokenText,
    draft: TokenText,
    target_eos: frozenset[int],
    draft_eos: frozenset[int],
    draft_width: int,
    target_width: int,
) -> torch.Tensor:
    """For each of the draft's `draft_width` output ids, its twin among the target's first
    `target_width` ids, or -1: the text token spelling the same bytes, the control token with the
    same content, the target's end of text for the draft's."""
    controls = {target.pieces[i]: i for i in sorted(target.special) if i < target_width}
    end = min(target_eos) if target_eos else None
    result = torch.full((draft_width,), -1, dtype=torch.long)
    for draft_id in range(min(draft_width, len(draft))):
        piece = draft.pieces[draft_id]
        twin: int | None
        if draft_id in draft_eos and end is not None:
            twin = end
        elif draft_id in draft.special:
            twin = controls.get(piece)
        else:
            twin = target.id_of(piece) if piece else None
        if twin is not None and twin < target_width:
            result[draft_id] = twin
    return result


@dataclass(frozen=True)
class VocabularyMatch:
    """How a draft's vocabulary relates to its target's: the same (the draft's ids mean the target's
    tokens), or different tokenizers with `shared` of the draft's `draft_tokens` text tokens having
    a twin ("little" in common below `LITTLE_SHARED`). Different ones carry what drafting across
    them needs: both sides' `TokenText` and the draft's `twins`."""

    case: str  # "same", "different" or "little"
    shared: int
    draft_tokens: int
    difference: str = ""  # where the two vocabularies first differ
    target_text: TokenText | None = field(default=None, compare=False, repr=False)
    draft_text: TokenText | None = field(default=None, compare=False, repr=False)
    twins: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @property
    def same(self) -> bool:
        return self.case == "same"

    def describe(self) -> str:
        """The case in words, as the terminal and the window show it."""
        if self.same:
            return "same vocabulary"
        share = self.shared / self.draft_tokens if self.draft_tokens else 0.0
        counts = f"{self.shared:,} of the draft's {self.draft_tokens:,} tokens have a twin in the target's"
        if self.case == "different":
            return f"different tokenizers: {counts} ({share:.0%}); greedy and sampling both exact"
        return (
            f"different tokenizers with little in common: only {counts} ({share:.1%}), so sampled "
            "drafts are rarely possible; greedy drafts through the text; both exact"
        )


def vocabulary_difference(target, draft) -> str | None:
    """Where the draft's token ids stop meaning the target's tokens, or None when every id the draft
    can emit is scored by the target and is the same token string. The target may have extra
    (padding) rows and extra tokens after the draft's, which the draft never proposes and reads
    as a stand-in token (`DraftModelDrafter`)."""
    if draft.vocab_width > target.vocab_width:
        return f"the draft can emit {draft.vocab_width} token ids, the target scores {target.vocab_width}"
    draft_tokens = draft.tokenizer.convert_ids_to_tokens(list(range(len(draft.tokenizer))))
    target_tokens = target.tokenizer.convert_ids_to_tokens(list(range(min(len(target.tokenizer), len(draft_tokens)))))
    for token_id, (mine, theirs) in enumerate(zip(draft_tokens, target_tokens)):
        if mine != theirs:
            return f"id {token_id} is {mine!r} for the draft, {theirs!r} for the target"
    if len(draft_tokens) > len(target_tokens):
        return f"the draft has {len(draft_tokens)} tokens, the target {len(target_tokens)}"
    return None


def match_vocabularies(target, draft) -> VocabularyMatch:
    """The pair's case (`VocabularyMatch`) for a loaded target and draft
    (`specdeck.engine.loading.models.LoadedModel`)."""
    difference = vocabulary_difference(target, draft)
    if difference is None:
        return VocabularyMatch("same", len(draft.tokenizer), len(draft.tokenizer))
    try:
        target_text, draft_text = TokenText(target.tokenizer), TokenText(draft.tokenizer)
    except Exception as error:  # the tokenizers library raises bare Exceptions
        raise SpecDeckError(
            f"The tokenizers of {target.name!r} and {draft.name!r} differ ({difference}) and "
            f"could not be compared token by token ({error}): pick a draft from the target's "
            "model family."
        ) from error
    table = twins(target_text, draft_text, target.eos_ids, draft.eos_ids, draft.vocab_width, target.vocab_width)
    text_tokens = [i for i in range(min(len(draft_text), draft.vocab_width)) if i not in draft_text.special]
    shared = int((table[text_tokens] >= 0).sum()) if text_tokens else 0
    case = "different" if shared >= LITTLE_SHARED * len(text_tokens) else "little"
    return VocabularyMatch(case, shared, len(text_tokens), difference, target_text, draft_text, table)
