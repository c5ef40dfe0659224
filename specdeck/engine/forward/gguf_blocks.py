"""A GGUF target's matrices multiplied as the file stores them, on the row kernel.

A `.gguf` model runs on torch dequantized to float32
(`specdeck.engine.loading.gguf_conversion.convert_gguf`): SmolLM2-135M's Q4_1 file becomes 540 MB
of weights that every decode step streams from memory. Its matrices are
4.5 bits a weight in the file (Q4_1; the output layer Q8_0, 8.5), 90 MB in all. Where the products
run on SpecDeck's row kernel, each product whose matrices the file holds in a block type the kernel
decodes (`specdeck.engine.forward.row_kernel.QUANTIZED`) runs on the file's blocks instead: the kernel decodes every
weight with gguf-py's rounding and sums it as the float32 product sums the dequantized matrix, so
the logits keep their bits, and with them every text, while a step reads a sixth of the bytes.

Which blocks are which matrix is checked, not assumed: a matrix is taken from the file only where
gguf-py's dequantization of the named tensor equals the loaded float32 matrix bit for bit, row by
row (the converter reorders the rows of the query and key projections for the rotary, so rows
are matched by value). Anything else (another file, another block type, a tensor missing) keeps
its float32 product, and the products' report says how many run on the file's blocks.

A model read in place (`specdeck.engine.loading.gguf_in_place`) has no float32 matrices to compare: its
loader knows which of the file's rows is which (the converter's order, undone as transformers
undoes it) and hands that order over (`remember`'s `rows`); its products are always the file's.
Matrices of different block types fused into one product (a Q4_K_M file's query and value
projections, say) run as one product of parts, each on its own blocks.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from specdeck.engine.atomic import write_text
from specdeck.engine.forward import block_codes, row_kernel
from specdeck.engine.forward.gguf_index import matches_path, tensors_of
from specdeck.engine.forward.linear import PathChoice
from specdeck.engine.forward.row_kernel import QUANTIZED, QuantizedLinear, QuantizedParts

log = logging.getLogger(__name__)

# llama.cpp's names for a decoder layer's matrices, as the lean forward fuses them (q, k, v; the
# output projection; gate, up; down), and for the output layer (a tied model has only the embedding)
LAYER_TENSORS = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
OUTPUT_TENSORS = ("output", "token_embd")

_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the GGUF file it was read from
_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (weights' digest, their folder)
ROW_MATCHES_FILE = "row_matches.json"  # in a converted folder: `FileMatrices`' verdicts on its weights
_OWN: weakref.WeakSet = weakref.WeakSet()  # drafters' models whose products take Q8_0 blocks of their own weights
_IN_PLACE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {tensor: the file's rows in its order}


def remember(
    model: torch.nn.Module,
    path: Path,
    weights: tuple[str, Path] | None = None,
    rows: dict[str, np.ndarray] | None = None,
) -> None:
    """Note that `model`'s weights are the dequantized weights of the GGUF file `path`. `weights`:
    their recorded digest, checked when they loaded, and the folder they were converted into: the
    verdicts on which rows match are kept there under that digest (`FileMatrices`), so they last
    as long as the weights they judge, and a load need not checksum each matrix to find them.
    `rows`: a model read in place, whose matrices are the file's tensors named, each row the file's
    row given (its placeholders hold no values to compare)."""
    _SOURCES[model] = path
    if weights is not None:
        _WEIGHTS[model] = weights
    if rows is not None:
        _IN_PLACE[model] = rows


def read_in_place(model: torch.nn.Module) -> bool:
    """Whether `model`'s matrices exist only as its GGUF file's blocks (`specdeck.engine.loading.gguf_in_place`)."""
    return model in _IN_PLACE


def matrix_kinds(path: Path) -> dict[str, str]:
    """The block type of each large matrix of the GGUF file `path` (a decoder layer's products and
    the output layer, where untied), by tensor name."""
    tensors = tensors_of(path)
    layer = {f"{name}.weight" for group in LAYER_TENSORS for name in group}
    return {
        name: t.tensor_type.name
        for name, t in tensors.items()
        if name == "output.weight" or name.startswith("blk.") and name.split(".", 2)[2] in layer
    }


def unread_kinds(kinds: dict[str, str]) -> dict[str, int]:
    """Of `matrix_kinds`, the block types the row kernel does not read, with how many matrices hold each."""
    unread = [kind for kind in kinds.values() if kind not in QUANTIZED]
    return {kind: unread.count(kind) for kind in sorted(set(unread))}


OFF = ("off", "0", "no")  # SPECDECK_GGUF_BLOCKS values that keep every product on float32 weights


def _setting() -> str:
    return os.environ.get("SPECDECK_GGUF_BLOCKS", "").strip().lower()


def blocks_off() -> bool:
    """Whether `SPECDECK_GGUF_BLOCKS` keeps every product on float32 weights."""
    return _setting() in OFF


def source_of(model: torch.nn.Module) -> Path | None:
    """The GGUF file whose blocks `model`'s products on the row kernel take, or None: a model from
    elsewhere, or `SPECDECK_GGUF_BLOCKS=off` (float32 products, for measuring one against the other)."""
    if _setting() in OFF and model not in _IN_PLACE:  # read in place: the file's blocks are all it has
        return None
    return _SOURCES.get(model)


def activations() -> str:
    """How products on a file's blocks take their rows: "int8" (each row's groups of 32 in 8 bits,
    as llama.cpp multiplies them: about twice as fast, and the logits move by the activations'
    rounding, the same at every number of rows) where the kernel has such products (every build
    but AVX-512 without VNNI), else, or with `SPECDECK_GGUF_BLOCKS=float32`, "float32" (the float32
    product's bits on the decoded weights)."""
    if _setting() in ("float32", "float"):
        return "float32"
    return "int8" if row_kernel.int8_available() is None else "float32"


def quantize_for_drafting(model: torch.nn.Module) -> None:
    """Let `model`, a drafter's layers (whose numbers decide which tokens are proposed, never the
    text: a proposal is verified by the target), multiply on Q8_0 blocks of its own float32 matrices
    with 8-bit rows where the products run so (`own_blocks`): a quarter of the bytes a draft reads,
    and less of the target's weights pushed out of the caches between its steps."""
    _OWN.add(model)


def own_blocks(model: torch.nn.Module) -> bool:
    """Whether `model`'s products on the row kernel take Q8_0 blocks of its own matrices: a model
    handed to `quantize_for_drafting`, where rows go in 8 bits (`activations`) and blocks are on."""
    return model in _OWN and _setting() not in OFF and activations() == "int8"


def blocks_key(model: torch.nn.Module) -> str:
    """How `model`'s products take blocks, for keys of what was measured on them ("" for none)."""
    if source_of(model) is not None:
        return f" on the GGUF file's blocks, rows in {activations()}"
    return " on Q8_0 blocks of its own weights, rows in int8" if own_blocks(model) else ""


def blocks_of(model: torch.nn.Module) -> FileMatrices | OwnMatrices | None:
    """The quantized matrices of the GGUF file `model` was read from (`source_of`), or of its own
    weights (`own_blocks`); None for neither, also where the file no longer reads."""
    if own_blocks(model) and model not in _IN_PLACE:  # in place: its own float32 matrices do not exist
        return OwnMatrices()
    path = source_of(model)
    if path is None:
        return None
    try:
        return FileMatrices(path, weights=_WEIGHTS.get(model), known=_IN_PLACE.get(model))
    except Exception as error:  # gguf's reader raises many types on a changed file
        log.info("the matrices of %s stay float32: the file does not read (%s)", path, error)
        return None


def prefer_kernel(model: torch.nn.Module, choose: Callable[[], PathChoice]) -> PathChoice:
    """The row kernel for `model`'s products where they can read its GGUF file's blocks, whatever
    path float32 products would take (an AVX2 build streams float32 weights faster through oneDNN,
    while the file's blocks take a third of either), without timing float32 paths it will not take;
    else `choose()`: where the model has no file, the kernel does not run or a path is forced."""
    on_blocks = source_of(model) is not None or own_blocks(model)
    if not on_blocks or os.environ.get("SPECDECK_LINEAR", "").strip():
        return choose()
    if row_kernel.unavailable(next(model.parameters()).detach()) is not None:
        return choose()
    return PathChoice("kernel", "the blocks of its GGUF file run on it")


class FileMatrices:
    """A GGUF file's tensors, memory-mapped, by name."""

    def __init__(
        self,
        path: Path,
        rows: str | None = None,
        weights: tuple[str, Path] | None = None,
        known: dict[str, np.ndarray] | None = None,
    ) -> None:
        """`rows`: how its products take their rows (`activations()` by default); `weights`: the
        digest and folder of the weights compared with the file (`remember`); `known`: each
        tensor's rows in the model's order, for a model read in place (nothing compared)."""
        self.path = path
        self._known = known
        self._tensors = tensors_of(path)
        self.used: list[str] = []  # the block types of the products made, one a product
        self.activations = rows or activations()
        self._digest, folder = weights or ("", None)
        self._matches_file = folder / ROW_MATCHES_FILE if folder is not None else matches_path(path)
        self._matches = _read_matches(self._matches_file)
        self._learnt = False

    def _rows(self, name: str, tensor, weight: np.ndarray) -> np.ndarray | None:
        """`_matching_rows`, decided once per file and weights: a verdict is kept under the tensor's
        name and the weights' shape and digest (of all the weights, where `remember` was given it,
        else of this matrix), so that a later load of the same weights skips decoding the file's
        blocks to compare them. A model read in place gives the rows (`known`)."""
        if self._known is not None:
            return self._known.get(name, np.arange(weight.shape[0]))
        digest = self._digest or f"{zlib.crc32(np.ascontiguousarray(weight).data):08x}"
        key = f"{name}|{weight.shape}|{digest}"
        if key in self._matches:
            known = self._matches[key]
            return None if known is None else np.arange(weight.shape[0]) if known == "same" else np.array(known)
        rows = _matching_rows(tensor, weight)
        same = rows is not None and np.array_equal(rows, np.arange(weight.shape[0]))
        self._matches[key] = None if rows is None else "same" if same else rows.tolist()
        self._learnt = True
        return rows

    def remember(self) -> None:
        """Keep the verdicts reached since the file was opened (a cache that cannot be written only
        costs the next load the comparison)."""
        if not self._learnt:
            return
        try:
            path = self._matches_file
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps(self._matches))
            self._learnt = False
        except Exception as error:
            log.info("the row matches of %s were not kept: %s", self.path, error)

    def layer_names(self, layer: int) -> list[list[str]]:
        return [[f"blk.{layer}.{name}.weight" for name in group] for group in LAYER_TENSORS]

    def output_names(self) -> list[str]:
        return next(([f"{n}.weight"] for n in OUTPUT_TENSORS if f"{n}.weight" in self._tensors), [])

    def product(
        self, names: Sequence[str], params: Sequence[torch.Tensor], bias: torch.Tensor | None
    ) -> QuantizedLinear | QuantizedParts | None:
        """The product of `params` (stacked by rows) on the file's blocks of the tensors `names`, or
        None where the file does not hold exactly these matrices in block types the kernel takes.
        Matrices of one type make one product; of several, one product of parts, one a type run."""
        tensors = [self._tensors[name] for name in names if name in self._tensors]
        if not names or len(tensors) != len(names) or len(tensors) != len(params):
            return None
        kinds = [t.tensor_type.name for t in tensors]
        if not set(kinds) <= QUANTIZED.keys():
            return None
        if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params):
            return None
        pieces = []
        for name, tensor, param in zip(names, tensors, params):
            rows = self._rows(name, tensor, param.detach().numpy())
            if rows is None:
                return None
            pieces.append((tensor, rows))
        width = params[0].shape[1]
        runs = [[pieces[0]]]  # neighbours of one type share a product
        for previous, piece in zip(pieces, pieces[1:]):
            if piece[0].tensor_type == previous[0].tensor_type:
                runs[-1].append(piece)
            else:
                runs.append([piece])
        self.used.append("+".join(dict.fromkeys(kinds)))
        if len(runs) == 1:
            return self._product(runs[0], width, bias)
        if set(kinds) <= set(block_codes.WIDENS_TO_Q8_0):  # one product, as the fused layers take it
            return self._product(pieces, width, bias, "Q8_0")
        parts = [self._product(run, width, None) for run in runs]
        return QuantizedParts(parts, bias)

    def _product(
        self, pieces: list, width: int, bias: torch.Tensor | None, widened: str | None = None
    ) -> QuantizedLinear:
        """One product on the blocks of `pieces` ((tensor, its rows in order), all of one type, or
        all `widened` to Q8_0 blocks of the same weights)."""

        def blocks(pieces=pieces) -> np.ndarray:
            if widened:
                return np.concatenate(
                    [block_codes.as_q8_0(np.asarray(t.data)[rows], t.tensor_type.name) for t, rows in pieces]
                )
            (tensor, rows), *others = pieces
            if not others and np.array_equal(rows, np.arange(len(rows))):
                return np.asarray(tensor.data)  # the mapped blocks themselves, read where they lie
            return np.concatenate([np.asarray(t.data)[rows] for t, rows in pieces])

        def dense(pieces=pieces, width=width) -> torch.Tensor:
            return torch.cat([torch.from_numpy(_in_order(_dequantized(t, width), rows)) for t, rows in pieces])

        kind = widened or pieces[0][0].tensor_type.name
        product = QuantizedLinear(blocks(), kind, width, dense, bias, source=blocks, activations=self.activations)
        for tensor, _ in pieces:  # laid out for the kernel: the file's pages need not stay resident too
            row_kernel.release_pages(tensor.data)
        return product

    def summary(self, total: int) -> str:
        """For the products' report: how many run on the file's blocks, in which types."""
        kinds = ", ".join(f"{self.used.count(k)} {k}" for k in sorted(set(self.used)))
        rows = ", rows in 8 bits" if self.activations == "int8" else ""
        return f"{len(self.used)} of {total} products on {self.path.name}'s own blocks ({kinds}{rows})"


def _read_matches(path: Path) -> dict:
    try:
        matches = json.loads(path.read_text(encoding="utf-8"))
        return matches if isinstance(matches, dict) else {}
    except (OSError, ValueError):
        return {}


def _in_order(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`values`' rows `rows`: the array itself where they are all of them in order (no copy)."""
    return values if np.array_equal(rows, np.arange(len(values))) else values[rows]


DEQUANTIZED_ROWS = 1024  # rows gguf-py dequantizes at once: its scratch is several float32 copies of them


def _dequantized(tensor, width: int) -> np.ndarray:
    """The tensor's rows dequantized (float32), a chunk of rows at a time into one array: gguf-py works
    block by block, so the values are the whole tensor's at once, without its scratch for all of it
    (gigabytes for a 1.7B model's embedding); the file's pages read are dropped after."""
    from gguf import dequantize

    data = np.asarray(tensor.data)
    out = np.empty((data.shape[0], width), np.float32)
    for start in range(0, data.shape[0], DEQUANTIZED_ROWS):
        chunk = data[start : start + DEQUANTIZED_ROWS]
        out[start : start + len(chunk)] = dequantize(chunk, tensor.tensor_type).reshape(-1, width)
    row_kernel.release_pages(data)
    return out


def _matching_rows(tensor, weight: np.ndarray) -> np.ndarray | None:
    """The file's rows of `tensor` in the order of `weight`'s rows, where every row of `weight` is
    one of them bit for bit; else None."""
    if tuple(int(n) for n in tensor.shape[::-1]) != weight.shape:  # gguf lists dimensions innermost first
        return None
    decoded = _dequantized(tensor, weight.shape[1])
    if np.array_equal(decoded.view(np.uint32), weight.view(np.uint32)):
        return np.arange(weight.shape[0])
    where = {row.tobytes(): i for i, row in enumerate(decoded)}
    rows = [where.get(row.tobytes()) for row in weight]
    return None if any(r is None for r in rows) else np.array(rows)


class OwnMatrices:
    """A drafter's own float32 matrices quantized to Q8_0 (gguf-py's quantization: a float16 scale
    and 32 8-bit weights a block), as `FileMatrices` offers a file's: each product's matrices, rows
    in 8 bits. The float32 matrices stay the model's (`QuantizedLinear.exact` is False: the blocks
    give them back only to within the quantization)."""

    activations = "int8"

    def __init__(self) -> None:
        self.used: list[str] = []

    def layer_names(self, layer: int) -> list[list[str]]:
        return [["own"] * len(group) for group in LAYER_TENSORS]

    def output_names(self) -> list[str]:
        return ["own"]

    def product(
        self, names: Sequence[str], params: Sequence[torch.Tensor], bias: torch.Tensor | None
    ) -> QuantizedLinear | None:
        """The product of `params` (stacked by rows) on Q8_0 blocks of them; None where the inner
        dimension is not whole blocks or they are not float32 on the CPU."""
        from gguf import GGMLQuantizationType, quants

        width = params[0].shape[1] if params else 0
        if not names or width % 32 or any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params):
            return None
        matrix = torch.cat([p.detach() for p in params]).numpy()
        blocks = quants.quantize(matrix, GGMLQuantizationType.Q8_0)

        def dense(blocks=blocks, width=width) -> torch.Tensor:
            decoded = quants.dequantize(blocks, GGMLQuantizationType.Q8_0)
            return torch.from_numpy(np.ascontiguousarray(decoded.reshape(-1, width)))

        self.used.append("Q8_0")
        return QuantizedLinear(
            blocks, "Q8_0", width, dense, bias, source=lambda: blocks, activations="int8", exact=False
        )

    def summary(self, total: int) -> str:
        return f"{len(self.used)} of {total} products on Q8_0 blocks of its own weights, rows in 8 bits"
