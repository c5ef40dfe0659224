"""Which model a GGUF file holds, read from its header: the architecture, the tokenizer (a digest of
its vocabulary and merges, `tokenizer.ggml.*`) and the shapes a drafter made for a model depends
on (hidden size, layers, vocabulary). Two files of one identity hold the same model in whatever
quantization and under whatever name, so the drafters SpecDeck ships for its built-in target attach
to any file of that target's identity (`builtin_difference`).

The header is read by `gguf_header`, the reader the checks before a load also use; the tokenizer's
values are hashed as the file stores them, not parsed string by string, once per file and process.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.gguf_header import Header, UnreadableHeader, read_gguf
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET, gguf_file

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
            _READ[key] = _identity(read_gguf(path, stored=_TOKENIZER))
        except UnreadableHeader as reason:
            _READ[key] = f"its header does not read ({reason})"
    return _READ[key]


def _identity(header: Header) -> ModelIdentity | str:
    architecture = header.fields.get("general.architecture")
    if not isinstance(architecture, str):
        return "its header has no general.architecture"
    wanted = (f"{architecture}.embedding_length", f"{architecture}.block_count")
    # a count is a whole number: a float or a flag there says nothing of the model's shape
    counts = {name: header.fields.get(name) for name in wanted}
    shape = {name: value for name, value in counts.items() if isinstance(value, int) and not isinstance(value, bool)}
    missing = [name for name in wanted if name not in shape]
    missing += [] if "tokenizer.ggml.tokens" in header.lengths else ["tokenizer.ggml.tokens"]
    if missing:
        return f"its header has no {', '.join(missing)}"
    digest = hashlib.sha256()
    for name, stored in header.stored.items():  # each in the order the file stores it, its bytes as they lie
        digest.update(name.encode() + stored)
    hidden, layers = (shape[name] for name in wanted)
    return ModelIdentity(architecture, digest.hexdigest(), hidden, layers, header.lengths["tokenizer.ggml.tokens"])


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
