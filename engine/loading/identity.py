"""Which model a GGUF file holds, read from its header: the architecture, the tokenizer (a digest of
its vocabulary and merges, `tokenizer.ggml.*`) and the shapes a drafter made for a model depends
on (hidden size, layers, vocabulary). Two files of one identity hold the same model in whatever
quantization and under whatever name, so the drafters SpecDeck ships for its built-in target attach
to any file of that target's identity (`builtin_difference`).

The header is walked field by field with `struct`, the tokenizer's arrays hashed as the file stores
them: gguf-py's reader parses each of their ~100,000 strings on its own, seconds for a file, where
this takes a few tens of milliseconds, once per file and process.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET

# GGUF's value types by number: the size of each fixed-size one (8: a string, 9: an array)
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INTEGERS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
_STRING, _ARRAY = 8, 9
_TOKENIZER = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges")


@dataclass(frozen=True)
class ModelIdentity:
    """What a drafter made for one model needs of another to attach to it."""

    architecture: str
    tokenizer: str  # sha256 of the tokenizer's model name, vocabulary and merges, as the file stores them
    hidden_size: int
    layers: int
    vocab: int

    def differences(self, other: ModelIdentity) -> list[str]:
        """How this identity differs from `other`, in words ('hidden size 960, not 576'); [] for none."""
        found = [
            f"{what} {mine}, not {theirs}"
            for what, mine, theirs in (
                ("architecture", self.architecture, other.architecture),
                ("hidden size", self.hidden_size, other.hidden_size),
                ("layers", self.layers, other.layers),
                ("vocabulary", self.vocab, other.vocab),
            )
            if mine != theirs
        ]
        if self.tokenizer != other.tokenizer and self.vocab == other.vocab:
            found.append("another tokenizer")
        return found


_READ: dict[tuple[str, int, int], ModelIdentity | str] = {}


def gguf_identity(path: Path) -> ModelIdentity | str:
    """The identity of the GGUF file `path`, or why its header does not say it (read once per file:
    its path, size and time of change)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _READ:
        try:
            with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _READ[key] = _identity(_Header(data))
        except (OSError, ValueError, struct.error) as error:
            _READ[key] = f"its header does not read ({error})"
    return _READ[key]


class _Header:
    """A cursor over a GGUF file's bytes (little-endian, version 2 or 3). A length that runs past
    the file's end is refused: a damaged header must not send the walk through gigabytes."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def advance(self, size: int) -> None:
        if size > len(self.data) - self.at:
            raise ValueError(f"a field at byte {self.at} runs past the file's end")
        self.at += size

    def take(self, layout: str):
        (value,) = struct.unpack_from(layout, self.data, self.at)
        self.advance(struct.calcsize(layout))
        return value

    def string(self) -> str:
        size = self.take("<Q")
        self.advance(size)
        return bytes(self.data[self.at - size : self.at]).decode("utf-8", "replace")

    def skip(self, kind: int, count: int = 1) -> None:
        if kind == _STRING:
            for _ in range(count):
                self.advance(self.take("<Q"))
        elif kind == _ARRAY:
            for _ in range(count):
                inner, length = self.take("<I"), self.take("<Q")
                self.skip(inner, length)
        elif kind in _SIZES:
            self.advance(_SIZES[kind] * count)
        else:
            raise ValueError(f"value type {kind} at byte {self.at}")


def _identity(header: _Header) -> ModelIdentity | str:
    if bytes(header.data[:4]) != b"GGUF":
        return "it is not a GGUF file"
    header.at = 4
    version = header.take("<I")
    if version not in (2, 3):
        return f"GGUF version {version} is not read here (2 and 3 are)"
    header.take("<Q")  # tensors
    fields: dict[str, int | str] = {}
    digest = hashlib.sha256()
    counts: dict[str, int] = {}
    for _ in range(header.take("<Q")):
        name, kind = header.string(), header.take("<I")
        start = header.at
        if kind == _STRING:
            fields[name] = header.string()
        elif kind in _INTEGERS:
            fields[name] = header.take(_INTEGERS[kind])
        elif kind == _ARRAY:
            counts[name] = struct.unpack_from("<Q", header.data, start + 4)[0]
            header.skip(kind)
        else:
            header.skip(kind)
        if name in _TOKENIZER:  # each in the order the file stores it, its bytes as they lie
            digest.update(name.encode() + bytes(header.data[start : header.at]))
    architecture = str(fields.get("general.architecture", ""))
    wanted = (f"{architecture}.embedding_length", f"{architecture}.block_count")
    missing = [name for name in ("general.architecture", *wanted) if name not in fields]
    missing += [] if "tokenizer.ggml.tokens" in counts else ["tokenizer.ggml.tokens"]
    if missing:
        return f"its header has no {', '.join(missing)}"
    hidden, layers = (int(fields[name]) for name in wanted)
    return ModelIdentity(architecture, digest.hexdigest(), hidden, layers, counts["tokenizer.ggml.tokens"])


def builtin_difference(target: str) -> str | None:
    """None where the drafters SpecDeck ships for its built-in target attach to `target`: the
    built-in target itself, or a GGUF file of its identity (the same architecture, tokenizer and
    shapes: the same model in another quantization or under another name); else why not, a clause
    ('this file differs: hidden size 960, not 576')."""
    if target == DEFAULT_TARGET:
        return None
    path = gguf_file(target)
    if path is None:
        return "that model is recognized in GGUF files only"
    try:
        builtin = BUILTIN_MODELS[DEFAULT_TARGET].path()
    except SpecDeckError as error:  # its package is not installed: nothing to compare with
        return f"the built-in file cannot be compared: {error}"
    mine, theirs = gguf_identity(path), gguf_identity(builtin)
    if isinstance(theirs, str):
        return f"the built-in file cannot be compared: {theirs}"
    if isinstance(mine, str):
        return f"this file cannot be compared: {mine}"
    found = mine.differences(theirs)
    return f"this file differs: {'; '.join(found)}" if found else None
