"""The texts of past sessions that a suffix drafter reads under scope `all` (`DecodeConfig.suffix_scope`),
and a target's own texts, which it reads under scopes `session` and `all`.

Token ids mean something for one tokenizer only, so each tokenizer has its own file,
`cache_root()/suffix/<tokenizer key>.tokens`, named by a hash of its vocabulary. The file holds
whole texts (prompt and answer, as token ids), oldest first; past `max_tokens` the oldest are
dropped. Every change rewrites the file whole through `specdeck.engine.atomic`, so a crash leaves the old
file or the new one. Two SpecDeck processes saving at once may each drop the other's newest text;
nothing worse.

Format: the line `specdeck-suffix 1`, then per text its length (uint32) and its ids (int32), little-endian.
`specdeck cache --clear` removes these files with the other caches.

A target's own texts (`specdeck.train.target_texts`: its answers to requests SpecDeck composes,
made by `specdeck suffix-texts`) are in the same format, in `cache_root()/target-texts/<tokenizer
key>.tokens`, or else, for the built-in target, in SpecDeck's bundled `resources/texts/`. They are
read once per process and never written by a session.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import sys
from array import array
from pathlib import Path

from specdeck.engine.atomic import write_bytes
from specdeck.engine.cache import cache_root, suffix_cache
from specdeck.engine.drafting.suffix import SuffixIndex
from specdeck.engine.resources import resource_path

log = logging.getLogger(__name__)

MAGIC = b"specdeck-suffix 1\n"
MAX_TOKENS = 200_000  # about 0.8 MB a tokenizer; indexing that many tokens takes about a second


def tokenizer_key(tokenizer) -> str:
    """A name for `tokenizer`'s ids: the same for tokenizers with the same vocabulary."""
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    digest = hashlib.sha256("\n".join(f"{i} {piece}" for piece, i in vocabulary).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


def read_texts(path: Path, vocabulary: int | None = None) -> list[list[int]]:
    """The texts of a store file; none for a missing, foreign or damaged file (the next save
    replaces it), and where `vocabulary` is given, none with an id outside it (a damaged text: a
    draft copied from it would name no token)."""
    texts = _read_texts(path)
    if vocabulary is None:
        return texts
    whole = [text for text in texts if all(0 <= i < vocabulary for i in text)]
    if len(whole) < len(texts):
        log.warning("%s holds %d damaged texts (ids outside the vocabulary): left out", path, len(texts) - len(whole))
    return whole


def _read_texts(path: Path) -> list[list[int]]:
    try:
        data = path.read_bytes()
    except OSError:
        return []
    if not data.startswith(MAGIC):
        return []
    texts: list[list[int]] = []
    at = len(MAGIC)
    while at + 4 <= len(data):
        (length,) = struct.unpack_from("<I", data, at)
        end = at + 4 + 4 * length
        if end > len(data):
            return texts  # cut short: keep the whole texts before it
        ids = array("i", data[at + 4 : end])
        if sys.byteorder != "little":
            ids.byteswap()
        texts.append(ids.tolist())
        at = end
    return texts


def encode_texts(texts: list[list[int]]) -> bytes:
    parts = [MAGIC]
    for text in texts:
        ids = array("i", text)
        if sys.byteorder != "little":
            ids.byteswap()
        parts += [struct.pack("<I", len(text)), ids.tobytes()]
    return b"".join(parts)


def target_texts_folder() -> Path:
    """Where `specdeck suffix-texts` writes a target's own texts (`specdeck.train.target_texts`)."""
    return cache_root() / "target-texts"


def target_texts_file(key: str) -> Path | None:
    """The target's own texts for tokenizer `key`: one made on this machine, else a bundled one."""
    for path in (target_texts_folder() / f"{key}.tokens", resource_path("texts", f"{key}.tokens")):
        if path.is_file():
            return path
    return None


_TARGET_TEXTS: dict[Path, SuffixIndex | None] = {}  # by file: read once per process


class PastSessions:
    """One tokenizer's store of past sessions' texts, read once (on first use) into a `SuffixIndex`."""

    def __init__(self, tokenizer, max_tokens: int = MAX_TOKENS) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._path: Path | None = None
        self._index: SuffixIndex | None = None

    @property
    def path(self) -> Path:
        if self._path is None:  # hashing a vocabulary takes a moment: only for sessions that use the store
            self._path = suffix_cache() / f"{tokenizer_key(self.tokenizer)}.tokens"
        return self._path

    def index(self) -> SuffixIndex:
        """The past sessions' texts as they were when first asked for (what this process saves
        later is in the session's own history already)."""
        if self._index is None:
            self._index = SuffixIndex()
            for text in read_texts(self.path, len(self.tokenizer)):
                self._index.extend(text)
                self._index.separate()
        return self._index

    def target_texts(self) -> SuffixIndex | None:
        """The target's own texts for this tokenizer (None where there are none), read on first use."""
        path = target_texts_file(self.path.stem)
        if path is None:
            return None
        if path not in _TARGET_TEXTS:
            texts = read_texts(path, len(self.tokenizer))
            index = SuffixIndex() if texts else None
            for text in texts:
                index.extend(text)  # type: ignore[union-attr]
                index.separate()  # type: ignore[union-attr]
            _TARGET_TEXTS[path] = index
        return _TARGET_TEXTS[path]

    def save(self, ids: list[int]) -> None:
        """Add one text (prompt and answer) to the store, dropping the oldest past `max_tokens`."""
        texts = read_texts(self.path, len(self.tokenizer)) + [list(ids)]
        total = sum(len(text) for text in texts)
        while len(texts) > 1 and total > self.max_tokens:
            total -= len(texts.pop(0))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(self.path, encode_texts(texts))
