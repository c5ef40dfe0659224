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

The header is read by `gguf_header`, the reader the file's identity also uses. A file's verdict is
kept for the process, keyed by its path, size and time of change.
"""

from __future__ import annotations

import re
from pathlib import Path

from specdeck.engine.errors import SpecDeckError, unreadable_gguf
from specdeck.engine.loading.gguf_header import BOUNDS, Header, UnreadableHeader, read_gguf

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # whose tensors the metadata implies exactly, here
# architectures transformers reads that gguf-py does not name, and whose tensors they have
# (llama.cpp writes Mistral models as llama; transformers also reads them named mistral)
TENSORS_AS = {"mistral": "llama"}


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
        header = read_gguf(path)
    except UnreadableHeader as reason:
        raise unreadable_gguf(path, reason) from None
    try:
        _check_metadata(header)
    except _Refused as refusal:
        raise SpecDeckError(
            f"{path} {refusal}: the file is damaged or was written wrong; re-download or re-convert it."
        ) from None
    _PASSED.add(key)


_PASSED: set[tuple[str, int, int]] = set()  # files that passed, by path, size and time of change


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
