"""Where each tensor of a GGUF file lies, read once and kept in SpecDeck's cache.

gguf-py's reader parses every metadata field of a file when it opens it, a tokenizer's tens of
thousands of strings included: seconds for the built-in model at every load, while the products on
the file's blocks (`specdeck.engine.forward.gguf_blocks`) need only each tensor's name, type, shape and offset. Those
are read with gguf-py once per file (its path, size and time of change), stepping over arrays of
strings rather than parsing them (`_TensorsOnly`), and written to `gguf-tensors/` in the cache;
later loads map the tensors from the index alone. An index that does not read back, or names bytes
past the file's end, is read again from the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdeck.engine.atomic import write_text
from specdeck.engine.cache import tensor_index_cache

log = logging.getLogger(__name__)

VERSION = 2  # of the index's layout: another one is read again from the file (2: the file type)


@dataclass(frozen=True)
class IndexedTensor:
    """One tensor of the file, as gguf-py's reader gives it: `shape` innermost dimension first,
    `data` memory-mapped (a quantized type's as bytes, one row of blocks per row)."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


def tensors_of(path: Path) -> dict[str, IndexedTensor]:
    """The file's tensors by name, from the cached index where it matches the file."""
    return _mapped(path, _index(path))


def file_type(path: Path) -> str:
    """The file's weight type as llama.cpp names it ("Q4_1", "Q4_K_M": `general.file_type`), or
    "unknown" where the file does not say."""
    from gguf import LlamaFileType

    number = _index(path).get("file_type")
    if number is None:
        return "unknown"
    try:
        return LlamaFileType(number).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return "unknown"


def _index(path: Path) -> dict:
    index = _cached(path)
    if index is None:
        index = _read(path)
        folder = tensor_index_cache()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_text(_index_path(path), json.dumps(index))
        except Exception as error:  # a read-only or full cache only costs the next load the read
            log.info("the tensor index of %s was not kept: %s", path, error)
    return index


def matches_path(path: Path) -> Path:
    """Where the verdicts of `specdeck.engine.forward.gguf_blocks` on the file's tensors are kept (which rows of each
    match a model's weights bit for bit), beside its index and under the same key."""
    return _index_path(path).with_suffix(".rows.json")


def config_path(path: Path) -> Path:
    """Where the file's model config, as transformers reads it from the file's metadata, is kept
    (`specdeck.engine.loading.gguf_in_place`): beside its index and under the same key."""
    return _index_path(path).with_suffix(".config.json")


def _index_path(path: Path) -> Path:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{VERSION}"
    return tensor_index_cache() / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _cached(path: Path) -> dict | None:
    cached = _index_path(path)
    if not cached.is_file():
        return None
    try:
        index = json.loads(cached.read_text(encoding="utf-8"))
        size = path.stat().st_size
        if index["version"] == VERSION and all(t["offset"] + t["bytes"] <= size for t in index["tensors"]):
            return index
    except (OSError, ValueError, KeyError, TypeError):
        pass
    log.info("the tensor index of %s does not read back: reading the file again", path)
    return None


def tensors_only_reader():
    """gguf-py's reader, except that arrays (a tokenizer's vocabulary, merges and token types: most
    of the fields of a model's file, each parsed on its own, and most of the time gguf-py takes to
    open it) are stepped over: their lengths are kept, their items are not. The tensors are read as
    gguf-py reads them."""
    from gguf import GGUFReader, GGUFValueType

    length = struct.Struct("<Q")

    class TensorsOnly(GGUFReader):
        def _get_field_parts(self, orig_offs: int, raw_type: int):
            if raw_type == GGUFValueType.ARRAY and self.byte_order == "I" and sys.byteorder == "little":
                item, count = int(self._get(orig_offs, np.uint32)[0]), int(self._get(orig_offs + 4, np.uint64)[0])
                scalar = self.gguf_scalar_to_np.get(GGUFValueType(item))
                if item == GGUFValueType.STRING:
                    data, offs = self.data.data, orig_offs + 12
                    for _ in range(count):
                        offs += 8 + length.unpack_from(data, offs)[0]
                    return offs - orig_offs, [], [], [GGUFValueType.ARRAY, GGUFValueType.STRING]
                if scalar is not None:
                    return 12 + count * np.dtype(scalar).itemsize, [], [], [GGUFValueType.ARRAY, GGUFValueType(item)]
            return super()._get_field_parts(orig_offs, raw_type)

    return TensorsOnly


def _read(path: Path) -> dict:
    reader = tensors_only_reader()(str(path), "r")
    field = reader.fields.get("general.file_type")
    kind = int(field.parts[field.data[0]][0]) if field is not None and field.data else None
    tensors = [
        {
            "name": t.name,
            "type": int(t.tensor_type),
            "shape": [int(n) for n in t.shape],
            "offset": int(t.data_offset),
            "bytes": int(t.n_bytes),
            "dtype": t.data.dtype.str,
            "layout": list(t.data.shape),
        }
        for t in reader.tensors
    ]
    return {"version": VERSION, "tensors": tensors, "file_type": kind}


def _mapped(path: Path, index: dict) -> dict[str, IndexedTensor]:
    from gguf import GGMLQuantizationType

    whole = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for t in index["tensors"]:
        raw = whole[t["offset"] : t["offset"] + t["bytes"]]
        data = raw.view(np.dtype(t["dtype"])).reshape(t["layout"])
        tensors[t["name"]] = IndexedTensor(t["name"], GGMLQuantizationType(t["type"]), tuple(t["shape"]), data)
    return tensors
