"""Whether a GGUF file's metadata implies exactly the tensors it holds, checked before any work is
done with it (`check_gguf`): before a conversion, a load on llama.cpp, or reading its tokenizer.

A GGUF file describes its model twice: in metadata (`llama.block_count`, `embedding_length`,
head counts, the vocabulary) and in the tensors themselves. Readers trust the metadata: a
`block_count` of 31 for 30 layers of weights makes transformers invent a layer of random weights,
29 drops one, an architecture renamed to `qwen2` loads q/k/v biases the file lacks as random
ones, and a `block_count` of 10^9 loops for ever. So before anything reads the file for a model:
- the header parses within the file, every count bounded by the file's size, and every tensor's
  data lies inside the file (a download cut short);
- the numbers are within bounds no model exceeds (`Bounds`);
- the layers `blk.0` .. `blk.{block_count - 1}` are exactly those that hold tensors, each with the
  same kinds of tensor, all of them kinds the architecture has (gguf-py's `MODEL_TENSORS`);
- the token embedding is embedding_length x the vocabulary's size;
- for the architectures SpecDeck's own forward runs (Llama, Mistral, Qwen2, Qwen3), the tensors
  are exactly those the metadata implies, each of the shape it implies.
A refusal blames the file, which is what is wrong: SpecDeck's cache is untouched by then.

The header is read here with `struct` rather than gguf-py's reader, which parses every string of
a tokenizer (seconds for the built-in model); arrays are stepped over, their lengths kept. A
file's verdict is kept for the process, keyed by its path, size and time of change.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from specdeck.engine.errors import SpecDeckError

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9  # gguf's value types of a string and an array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # whose tensors the metadata implies exactly, here
# architectures transformers reads that gguf-py does not name, and whose tensors they have
# (llama.cpp writes Mistral models as llama; transformers also reads them named mistral)
TENSORS_AS = {"mistral": "llama"}
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
    as their lengths in `lengths`) and each tensor's shape (innermost dimension first) and type."""

    fields: dict[str, object] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)


class _Damaged(Exception):
    """The file ends or contradicts itself where its header should go on."""


class _Refused(Exception):
    """The metadata and the tensors disagree, or a number is out of bounds: what the file says."""


def check_gguf(path: Path) -> None:
    """Refuse a GGUF file whose header does not read, or whose metadata does not imply exactly the
    tensors it holds, with a `SpecDeckError` that names the file and what is wrong with it."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _PASSED:
        return
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            header = _read_header(data)
    except (_Damaged, struct.error, UnicodeDecodeError, ValueError, OSError) as error:
        reason = "it ends inside its header" if isinstance(error, struct.error) else str(error)
        raise SpecDeckError(
            f"{path} is not a readable GGUF model ({reason}). Check that the download finished, or pick another file."
        ) from None
    try:
        _check_metadata(header)
    except _Refused as refusal:
        raise SpecDeckError(
            f"{path} {refusal}: the file is damaged or was written wrong; re-download or re-convert it."
        ) from None
    _PASSED.add(key)


_PASSED: set[tuple[str, int, int]] = set()  # files that passed, by path, size and time of change


def _read_header(data) -> Header:
    if data[:4] != MAGIC:
        raise _Damaged("it does not begin with GGUF")
    version, tensors, entries = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise _Damaged(f"GGUF version {version}, where 2 and 3 are known")
    if max(tensors, entries) > min(BOUNDS.entries, len(data)):
        raise _Damaged(f"it claims {entries} metadata entries and {tensors} tensors")
    header, at = Header(), 24
    offsets: dict[str, int] = {}

    def string(at: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", data, at)
        if at + 8 + length > len(data):
            raise _Damaged(f"a string of {length} bytes runs past the end of the file")
        return bytes(data[at + 8 : at + 8 + length]).decode("utf-8"), at + 8 + length

    def value(kind: int, at: int, key: str) -> tuple[object, int]:
        if kind == STRING:
            return string(at)
        if kind in SCALARS:
            form = SCALARS[kind]
            return struct.unpack_from(form, data, at)[0], at + struct.calcsize(form)
        if kind != ARRAY:
            raise _Damaged(f"{key} has value type {kind}, which GGUF does not define")
        item, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if count > len(data) - at or item == STRING and 8 * count > len(data) - at:
            raise _Damaged(f"{key} claims {count} items, more than the file holds")
        header.lengths[key] = count
        if item == STRING:
            for _ in range(count):  # stepped over, not decoded: a tokenizer's vocabulary is most of a header
                at += 8 + struct.unpack_from("<Q", data, at)[0]
            return None, at
        if item not in SCALARS:
            raise _Damaged(f"{key} is an array of value type {item}")
        size = struct.calcsize(SCALARS[item])
        kept = list(struct.unpack_from(f"<{count}{SCALARS[item][1]}", data, at)) if count <= KEPT_ARRAY else None
        return kept, at + count * size

    for _ in range(entries):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", data, at)
        header.fields[key], at = value(kind, at + 4, key)
    for _ in range(tensors):
        name, at = string(at)
        (dimensions,) = struct.unpack_from("<I", data, at)
        if not 1 <= dimensions <= BOUNDS.dimensions:
            raise _Damaged(f"tensor {name} claims {dimensions} dimensions")
        shape = struct.unpack_from(f"<{dimensions}Q", data, at + 4)
        kind, offset = struct.unpack_from("<IQ", data, at + 4 + 8 * dimensions)
        at += 4 + 8 * dimensions + 12
        if name in header.tensors:
            raise _Damaged(f"tensor {name} is listed twice")
        header.tensors[name] = (tuple(shape), kind)
        offsets[name] = offset
    alignment = header.fields.get("general.alignment", 32)
    start = -(-at // alignment) * alignment if isinstance(alignment, int) and alignment > 0 else at
    for name, (shape, kind) in header.tensors.items():
        end = start + offsets[name] + _bytes(name, shape, kind)
        if end > len(data):
            raise _Damaged(f"tensor {name} ends {end - len(data)} bytes past the end of the file (cut short?)")
    return header


def _bytes(name: str, shape: tuple[int, ...], kind: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise _Damaged(f"tensor {name} has type {kind}, which this gguf library does not know") from None
    if shape[0] % block:
        raise _Damaged(f"tensor {name} has rows of {shape[0]} values, not a whole number of {block}-value blocks")
    return math.prod(shape) // block * size


def _check_metadata(header: Header) -> None:
    from gguf import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

    fields = header.fields
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise _Refused("names no architecture (general.architecture)")
    known = {name: kind for kind, name in MODEL_ARCH_NAMES.items()}
    known |= {alias: known[name] for alias, name in TENSORS_AS.items()}
    if arch not in known:
        raise _Refused(f"names architecture {arch!r}, which no GGUF reader knows")
    numbers = _Numbers(arch, fields)
    layers = numbers.get("block_count", 1, BOUNDS.layers)
    blocks: dict[int, set[str]] = {}
    for name in header.tensors:
        if found := re.fullmatch(r"blk\.(\d+)\.(.+)", name):
            blocks.setdefault(int(found[1]), set()).add(found[2])
    held = max(blocks, default=-1) + 1
    if sorted(blocks) != list(range(held)) or held != layers:
        gaps = sorted(set(range(held)) - set(blocks))
        holds = f"tensors for {len(blocks)}" + (f" (no tensors for layer {gaps[0]})" if gaps else "")
        raise _Refused(f"says {layers} layers but holds {holds}")
    kinds = {TENSOR_NAMES[t].format(bid="N") for t in MODEL_TENSORS[known[arch]]}
    for name in header.tensors:
        kind = re.sub(r"^blk\.\d+\.", "blk.N.", name).rsplit(".", 1)[0]
        if kind not in kinds:
            raise _Refused(f"holds tensor {name}, which a {arch} model has not")
    for index, names in blocks.items():
        if names != blocks[0]:
            odd = sorted(names ^ blocks[0])[0]
            raise _Refused(f"holds layers of different kinds: layer {index} {'has' if odd in names else 'lacks'} {odd}")
    _check_shapes(header, numbers, layers)


class _Numbers:
    """The architecture's numbers (`{arch}.embedding_length`, ...), each a whole number within bounds."""

    def __init__(self, arch: str, fields: dict[str, object]) -> None:
        self.arch, self.fields = arch, fields

    def get(self, key: str, least: int, most: int, default: int | None = None) -> int:
        name = f"{self.arch}.{key}"
        value = self.fields.get(name, default)
        if value is None:
            raise _Refused(f"has no {name}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Refused(f"says {name} is {value!r}, not a whole number")
        if not least <= value <= most:
            raise _Refused(f"says {name} is {value}, outside {least}..{most} (no model has that)")
        return value


def _check_shapes(header: Header, numbers: _Numbers, layers: int) -> None:
    vocabulary = header.lengths.get("tokenizer.ggml.tokens") or numbers.fields.get(f"{numbers.arch}.vocab_size")
    width = numbers.get("embedding_length", 1, BOUNDS.width)
    if isinstance(vocabulary, bool) or not isinstance(vocabulary, int) or not 1 <= vocabulary <= BOUNDS.vocabulary:
        raise _Refused(f"says its vocabulary holds {vocabulary!r} tokens")
    embedding = header.tensors.get("token_embd.weight")
    if embedding is not None and embedding[0] != (width, vocabulary):
        raise _Refused(
            f"says {width} x {vocabulary} (embedding_length x vocabulary) but its token_embd.weight "
            f"is {_shown(embedding[0])}"
        )
    if numbers.arch not in FAMILIES or f"{numbers.arch}.expert_count" in numbers.fields:
        return
    required, optional = _implied(numbers, width, vocabulary, layers)
    missing = sorted(set(required) - set(header.tensors))
    if missing:
        more = f" and {len(missing) - 1} more tensors" if len(missing) > 1 else ""
        raise _Refused(f"is a {numbers.arch} model by its metadata but lacks {missing[0]}{more}")
    for name, (shape, _) in header.tensors.items():
        wanted = required.get(name, optional.get(name))
        if wanted is None:
            raise _Refused(f"holds tensor {name}, which a {numbers.arch} model of its metadata has not")
        if shape != wanted:
            raise _Refused(f"says {name} is {_shown(wanted)} (from its metadata) but holds {_shown(shape)}")


Shapes = dict[str, tuple[int, ...]]


def _implied(numbers: _Numbers, width: int, vocabulary: int, layers: int) -> tuple[Shapes, Shapes]:
    """The tensors a Llama-family model of these numbers has, required and optional, by shape."""
    heads = numbers.get("attention.head_count", 1, BOUNDS.heads)
    kv_heads = numbers.get("attention.head_count_kv", 1, heads, default=heads)
    hidden = numbers.get("feed_forward_length", 1, BOUNDS.feed_forward)
    if heads % kv_heads:
        raise _Refused(f"says {heads} heads share {kv_heads} key-value heads, which does not divide them")
    named = f"{numbers.arch}.attention.key_length" in numbers.fields
    if not named and width % heads:
        raise _Refused(f"says {heads} heads share an embedding of {width}, which they do not divide")
    key = numbers.get("attention.key_length", 1, BOUNDS.width, default=width // heads)
    value = numbers.get("attention.value_length", 1, BOUNDS.width, default=width // heads)
    rotary = numbers.get("rope.dimension_count", 2, BOUNDS.width, default=key)
    required: Shapes = {"token_embd.weight": (width, vocabulary), "output_norm.weight": (width,)}
    optional: Shapes = {"output.weight": (width, vocabulary), "rope_freqs.weight": (rotary // 2,)}
    layer: Shapes = {
        "attn_norm.weight": (width,),
        "attn_q.weight": (width, heads * key),
        "attn_k.weight": (width, kv_heads * key),
        "attn_v.weight": (width, kv_heads * value),
        "attn_output.weight": (heads * value, width),
        "ffn_norm.weight": (width,),
        "ffn_gate.weight": (width, hidden),
        "ffn_up.weight": (width, hidden),
        "ffn_down.weight": (hidden, width),
    }
    if numbers.arch == "qwen2":  # Qwen2 projects queries, keys and values with biases
        layer |= {"attn_q.bias": (heads * key,), "attn_k.bias": (kv_heads * key,), "attn_v.bias": (kv_heads * value,)}
    if numbers.arch == "qwen3":  # Qwen3 normalizes each head's queries and keys
        layer |= {"attn_q_norm.weight": (key,), "attn_k_norm.weight": (key,)}
    for index in range(layers):
        required |= {f"blk.{index}.{name}": shape for name, shape in layer.items()}
    return required, optional


def _shown(shape: tuple[int, ...]) -> str:
    return " x ".join(str(n) for n in shape)
