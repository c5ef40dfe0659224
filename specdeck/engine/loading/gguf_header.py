"""A GGUF file's header, read once for all who need it (`read_gguf`): its metadata, each tensor's
shape and type, and the bytes of the values a caller asks to keep as the file stores them.

The header is walked with `struct` rather than gguf-py's reader, which parses every string of a
tokenizer on its own (seconds for the built-in model, where this takes tens of milliseconds);
arrays of strings are stepped over, their lengths kept. Every count is bounded by the file's size
and every tensor's data must lie inside the file, so a damaged header never sends the walk through
gigabytes and a download cut short is told as such (`UnreadableHeader`).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9  # gguf's value types of a string and an array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
KEPT_ARRAY = 4096  # items of a numeric array kept (per-layer head counts); longer ones only counted


@dataclass(frozen=True)
class Bounds:
    """Sizes beyond any published model (the largest have ~130 layers, 16k-wide embeddings,
    256k-token vocabularies): a file claiming more is damaged, and reading on would take for ever."""

    layers: int = 1024
    width: int = 1 << 17  # embedding_length, key and value widths
    feed_forward: int = 1 << 20
    heads: int = 1 << 12
    vocabulary: int = 1 << 22
    context: int = 1 << 24
    dimensions: int = 4  # of one tensor
    entries: int = 1 << 20  # metadata keys, tensors


BOUNDS = Bounds()


@dataclass
class Header:
    """What the file says: its metadata (numeric arrays of up to `KEPT_ARRAY` items as lists, others
    as their lengths in `lengths`), each tensor's shape (innermost dimension first) and type, and the
    values asked for in `stored` as the bytes the file stores them in, in the file's order."""

    fields: dict[str, object] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)
    stored: dict[str, bytes] = field(default_factory=dict)


class UnreadableHeader(Exception):
    """The file cannot be read, or ends or contradicts itself where its header should go on."""


def read_gguf(path: Path, stored: tuple[str, ...] = ()) -> Header:
    """The header of the GGUF file `path`, keeping the values of the keys in `stored` as their bytes;
    `UnreadableHeader` with the reason (a clause: 'it ends inside its header') where it does not read."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _read(data, stored)
    except struct.error:
        raise UnreadableHeader("it ends inside its header") from None
    except (UnicodeDecodeError, ValueError, OSError) as error:  # an empty file cannot be mapped: ValueError
        raise UnreadableHeader(str(error)) from None


def _read(data: mmap.mmap, stored: tuple[str, ...]) -> Header:
    if data[:4] != MAGIC:
        raise UnreadableHeader("it does not begin with GGUF")
    version, tensors, entries = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise UnreadableHeader(f"GGUF version {version}, where 2 and 3 are known")
    if max(tensors, entries) > min(BOUNDS.entries, len(data)):
        raise UnreadableHeader(f"it claims {entries} metadata entries and {tensors} tensors")
    header, at = Header(), 24
    offsets: dict[str, int] = {}

    def string(at: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", data, at)
        if at + 8 + length > len(data):
            raise UnreadableHeader(f"a string of {length} bytes runs past the end of the file")
        return bytes(data[at + 8 : at + 8 + length]).decode("utf-8"), at + 8 + length

    def value(kind: int, at: int, key: str) -> tuple[object, int]:
        if kind == STRING:
            return string(at)
        if kind in SCALARS:
            form = SCALARS[kind]
            return struct.unpack_from(form, data, at)[0], at + struct.calcsize(form)
        if kind != ARRAY:
            raise UnreadableHeader(f"{key} has value type {kind}, which GGUF does not define")
        item, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if count > len(data) - at or item == STRING and 8 * count > len(data) - at:
            raise UnreadableHeader(f"{key} claims {count} items, more than the file holds")
        header.lengths[key] = count
        if item == STRING:
            for _ in range(count):  # stepped over, not decoded: a tokenizer's vocabulary is most of a header
                at += 8 + struct.unpack_from("<Q", data, at)[0]
            if at > len(data):  # the last string's length ran past the end, as a cut-off file's does
                raise UnreadableHeader("it ends inside its header")
            return None, at
        if item not in SCALARS:
            raise UnreadableHeader(f"{key} is an array of value type {item}")
        size = struct.calcsize(SCALARS[item])
        kept = list(struct.unpack_from(f"<{count}{SCALARS[item][1]}", data, at)) if count <= KEPT_ARRAY else None
        return kept, at + count * size

    for _ in range(entries):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", data, at)
        start = at + 4
        header.fields[key], at = value(kind, start, key)
        if key in stored:
            header.stored[key] = bytes(data[start:at])
    for _ in range(tensors):
        name, at = string(at)
        (dimensions,) = struct.unpack_from("<I", data, at)
        if not 1 <= dimensions <= BOUNDS.dimensions:
            raise UnreadableHeader(f"tensor {name} claims {dimensions} dimensions")
        shape = struct.unpack_from(f"<{dimensions}Q", data, at + 4)
        kind, offset = struct.unpack_from("<IQ", data, at + 4 + 8 * dimensions)
        at += 4 + 8 * dimensions + 12
        if name in header.tensors:
            raise UnreadableHeader(f"tensor {name} is listed twice")
        header.tensors[name] = (tuple(shape), kind)
        offsets[name] = offset
    alignment = header.fields.get("general.alignment", 32)
    start = -(-at // alignment) * alignment if isinstance(alignment, int) and alignment > 0 else at
    for name, (shape, kind) in header.tensors.items():
        end = start + offsets[name] + _bytes(name, shape, kind)
        if end > len(data):
            raise UnreadableHeader(f"tensor {name} ends {end - len(data)} bytes past the end of the file (cut short?)")
    return header


def _bytes(name: str, shape: tuple[int, ...], kind: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise UnreadableHeader(f"tensor {name} has type {kind}, which this gguf library does not know") from None
    if shape[0] % block:
        raise UnreadableHeader(
            f"tensor {name} has rows of {shape[0]} values, not a whole number of {block}-value blocks"
        )
    return math.prod(shape) // block * size
