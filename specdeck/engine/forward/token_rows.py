"""A token embedding read from a GGUF file's blocks, a few rows at a time.

A model read in place (`specdeck.engine.loading.gguf_in_place`) keeps its matrices in the file's blocks. Its
token embedding is one of the largest: 400 MB in float32 for a 1.7B model, against 83 MB in the
file's Q6_K blocks. A lookup reads a few rows (a step's token, a verify's few, a prompt's), so the
table is never dequantized whole: each lookup dequantizes only the rows it reads, with gguf-py's
`dequantize`, which works block by block (a row's values do not depend on the rows dequantized
beside it): the rows have the bits the whole table would give them. Rows read lately are kept
(`KEPT_BYTES`), since text repeats its tokens and gguf-py's per-call cost (a few hundred
microseconds) is a tenth of a small model's step.

`BlockEmbedding` puts such a table where a Hugging Face model keeps its `nn.Embedding`: its weight is
a placeholder of the table's shape (no memory), its lookups the file's rows, and `dense` gives the
whole table for a reader that needs it (`specdeck.engine.forward.lean_weights.restore`).
"""

from __future__ import annotations

import numpy as np
import torch

KEPT_BYTES = 8 << 20  # float32 rows kept from earlier lookups, at most
CHUNK_ROWS = 1024  # rows dequantized at once for the whole table: bounds gguf-py's scratch arrays


class TokenRows:
    """The rows of a GGUF file's embedding tensor, dequantized on lookup (float32)."""

    def __init__(self, tensor, order: np.ndarray | None = None) -> None:
        """`tensor`: a memory-mapped tensor (`specdeck.engine.forward.gguf_index.IndexedTensor`); `order`: the file's row of
        each of the model's rows, where a loader reorders them (None: the same order)."""
        self._tensor = tensor
        self.count, self.width = (int(n) for n in reversed(tensor.shape))
        self._order = order
        self._kept: dict[int, torch.Tensor] = {}
        self._room = max(1, KEPT_BYTES // (4 * self.width))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of `ids` (any shape of token ids), float32, shaped (*ids.shape, width)."""
        flat = ids.reshape(-1).tolist()
        wanted = set(flat)
        if not flat or len(wanted) > self._room:  # more rows than are kept (a long prompt): read at once
            return self._dequantized(np.asarray(flat, dtype=np.int64)).reshape(*ids.shape, self.width)
        missing = sorted(wanted - self._kept.keys())
        if missing:
            over = len(self._kept) + len(missing) - self._room
            for old in [i for i in self._kept if i not in wanted][: max(over, 0)]:  # the oldest out first
                del self._kept[old]
            self._kept.update(zip(missing, self._dequantized(np.asarray(missing, dtype=np.int64))))
        return torch.stack([self._kept[i] for i in flat]).reshape(*ids.shape, self.width)

    def _dequantized(self, ids: np.ndarray) -> torch.Tensor:
        from gguf import GGMLQuantizationType, dequantize

        if ids.size and (ids.min() < 0 or ids.max() >= self.count):
            raise IndexError(f"token ids run from 0 to {self.count - 1}, not {ids.min()} to {ids.max()}")
        rows = ids if self._order is None else self._order[ids]
        blocks = np.asarray(self._tensor.data)[rows]
        if self._tensor.tensor_type == GGMLQuantizationType.Q8_0:
            values = _q8_0_values(blocks)
        else:
            values = dequantize(blocks, self._tensor.tensor_type)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(len(ids), self.width))

    def dense(self) -> torch.Tensor:
        """The whole table (count, width), float32: a new tensor, dequantized a chunk of rows at a time."""
        table = torch.empty(self.count, self.width)
        for start in range(0, self.count, CHUNK_ROWS):
            ids = np.arange(start, min(start + CHUNK_ROWS, self.count))
            table[start : start + len(ids)] = self._dequantized(ids)
        return table


def _q8_0_values(blocks: np.ndarray) -> np.ndarray:
    """Q8_0 blocks (whole blocks, uint8) as float32 values d * q: gguf-py's `dequantize` to the bit
    (one float32 product each) at a fifth of its cost. The files llama.cpp's quantizer made of
    SmolLM2 keep their embedding in Q8_0 whatever their type (Q4_K_M, Q6_K, Q8_0), and a step that
    reads a token not read before pays this."""
    groups = blocks.reshape(-1, 34)  # a block: its scale d (float16), then 32 quants q (int8)
    d = groups[:, :2].copy().view(np.float16).astype(np.float32)
    return groups[:, 2:].view(np.int8).astype(np.float32) * d


class BlockEmbedding(torch.nn.Embedding):
    """A model's token embedding whose weight is a placeholder and whose lookups read `rows`."""

    def __init__(self, rows: TokenRows, dtype: torch.dtype = torch.float32) -> None:
        placeholder = torch.zeros((), dtype=dtype).expand(rows.count, rows.width)
        super().__init__(rows.count, rows.width, _weight=placeholder, _freeze=True)
        self.rows = rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(ids).to(self.weight.dtype)

    def dense(self) -> torch.Tensor:
        """The whole table, float32 (`TokenRows.dense`)."""
        return self.rows.dense()
