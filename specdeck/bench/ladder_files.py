"""Random-weight GGUF files shaped like larger models of the built-in target's family, for timing
forwards on them (their text is noise): every metadata field of the built-in file, tokenizer
included, but the `llama.*` sizes; float16 matrices of N(0, 0.02) and norms of ones, written with
gguf-py's `GGUFWriter` a matrix at a time, then quantized by llama.cpp's own quantizer. Kept in
SpecDeck's cache (`ladder/`), so a rerun times the same files without building them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdeck.engine.atomic import write_with
from specdeck.engine.cache import cache_root
from specdeck.engine.forward.llamacpp_quantize import quantize
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LadderShape:
    """The sizes of a Llama-shaped model (Hugging Face's `LlamaConfig` names them alike)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def matrices(self, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
        """(name, numpy shape) of every tensor, norms as 1-D, in the built-in file's naming."""
        kv = self.kv_heads * self.head_dim
        tensors: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, self.hidden))]
        for i in range(self.layers):
            tensors += [
                (f"blk.{i}.attn_norm.weight", (self.hidden,)),
                (f"blk.{i}.attn_q.weight", (self.hidden, self.hidden)),
                (f"blk.{i}.attn_k.weight", (kv, self.hidden)),
                (f"blk.{i}.attn_v.weight", (kv, self.hidden)),
                (f"blk.{i}.attn_output.weight", (self.hidden, self.hidden)),
                (f"blk.{i}.ffn_norm.weight", (self.hidden,)),
                (f"blk.{i}.ffn_gate.weight", (self.intermediate, self.hidden)),
                (f"blk.{i}.ffn_up.weight", (self.intermediate, self.hidden)),
                (f"blk.{i}.ffn_down.weight", (self.hidden, self.intermediate)),
            ]
        return tensors + [("output_norm.weight", (self.hidden,))]


# SmolLM2-360M and -1.7B (their config.json), and a Llama-3.2-3B-sized one where memory allows
SHAPES = {
    shape.name: shape
    for shape in (
        LadderShape("360m", 960, 2560, 32, 15, 5),
        LadderShape("1.7b", 2048, 8192, 24, 32, 32),
        LadderShape("3b", 3072, 8192, 28, 24, 8),
    )
}
FORMAT = 1  # of a ladder file: a change to how they are written names new files


def ladder_folder() -> Path:
    return cache_root() / "ladder"


def ladder_file(shape: LadderShape, file_type: str, progress: Progress = print) -> Path:
    """The random-weight file of `shape` in `file_type`, from the cache or built now (the float16
    file it is quantized from is written beside it and removed after)."""
    sizes = f"{shape.hidden}x{shape.intermediate}x{shape.layers}x{shape.heads}x{shape.kv_heads}"
    target = ladder_folder() / f"{shape.name}-{sizes}-v{FORMAT}-{file_type}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    f16 = target.with_name(f".{shape.name}-{sizes}-v{FORMAT}-F16.gguf")
    progress(f"Writing {shape.name}-shaped random weights in float16 ({f16.name})")
    try:
        write_random_gguf(shape, f16)
        progress(f"Quantizing them to {file_type} ({target.name})")
        return quantize(f16, target, file_type)
    finally:
        f16.unlink(missing_ok=True)


def write_random_gguf(
    shape: LadderShape, path: Path, source: Path | None = None, seed: int = 0, vocab: int | None = None
) -> None:
    """A float16 GGUF file of `shape` at `path`, written whole or not at all: the metadata of
    `source` (the built-in file) with the sizes replaced, random matrices (std 0.02), norms of ones.
    `vocab` keeps the tokenizer's first `vocab` tokens and the merges that make them (a byte-level
    BPE lists its merges in the order of the tokens they make): a file that opens in a blink."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source or BUILTIN_MODELS[DEFAULT_TARGET].path())
    sizes: dict[str, object] = {
        "llama.block_count": shape.layers,
        "llama.embedding_length": shape.hidden,
        "llama.feed_forward_length": shape.intermediate,
        "llama.attention.head_count": shape.heads,
        "llama.attention.head_count_kv": shape.kv_heads,
        "llama.rope.dimension_count": shape.head_dim,
        "general.file_type": 1,  # LLAMA_FTYPE_MOSTLY_F16
    }
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    if vocab is not None:
        kept = set(tokens[:vocab])
        merges = reader.fields["tokenizer.ggml.merges"].contents()
        sizes["tokenizer.ggml.tokens"] = tokens[:vocab]
        sizes["tokenizer.ggml.token_type"] = reader.fields["tokenizer.ggml.token_type"].contents()[:vocab]
        sizes["tokenizer.ggml.merges"] = [m for m in merges if m.replace(" ", "", 1) in kept]
        sizes["llama.vocab_size"] = vocab  # where the file states it
    tensors = shape.matrices(vocab or len(tokens))
    noise = np.random.default_rng(seed)

    def save(partial: Path) -> None:
        writer = GGUFWriter(partial, reader.fields["general.architecture"].contents())
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue  # the writer writes these itself
            kind = field.types[0]
            value = sizes.get(key, field.contents())
            writer.add_key_value(key, value, kind, field.types[-1] if kind == GGUFValueType.ARRAY else None)
        for name, dims in tensors:
            dtype = np.float32 if len(dims) == 1 else np.float16
            writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, dims in tensors:  # a matrix at a time: a 1.7B file never sits in memory whole
            if len(dims) == 1:
                writer.write_tensor_data(np.ones(dims, dtype=np.float32))
            else:
                writer.write_tensor_data((noise.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16))
        writer.close()

    write_with(path, save)
