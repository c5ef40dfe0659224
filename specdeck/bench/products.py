"""Time a GGUF file's matrix products on the row kernel, float32 rows against 8-bit rows.

    python -m specdeck.bench.products [--model NAME_OR_FILE] [--rows 1,2,4,8,16] [--threads 2]

Every matrix the file holds in a block type the kernel takes
(`specdeck.engine.forward.row_kernel.QUANTIZED`) becomes one product on its blocks, once with
float32 rows and once with 8-bit rows (`QuantizedLinear`); a pass calls each product once on the
same rows, as a forward does. For each number of rows the two ways alternate and the best of
`--repeats` passes is kept. A forward fuses some of these matrices (queries, keys and values; gate
and up), so it makes fewer, larger calls than this does.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward import row_kernel
from specdeck.engine.forward.row_kernel import QUANTIZED, QuantizedLinear
from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.gguf_checks import check_gguf
from specdeck.engine.loading.registry import DEFAULT_TARGET


def file_products(path: Path, activations: str) -> list[QuantizedLinear]:
    """One product per matrix of the GGUF file at `path` in a block type the kernel takes."""
    from gguf import GGUFReader

    products = []
    for tensor in GGUFReader(str(path), "r").tensors:
        kind = tensor.tensor_type.name
        if kind in QUANTIZED and len(tensor.shape) == 2:
            width = int(tensor.shape[0])  # gguf lists dimensions innermost first
            blocks = np.asarray(tensor.data).reshape(int(tensor.shape[1]), -1)
            products.append(QuantizedLinear(blocks, kind, width, dense=None, activations=activations))
    return products


def time_products(products: list[QuantizedLinear], rows: int, inputs: dict[int, torch.Tensor]) -> float:
    """Milliseconds of one pass: each product once on `rows` rows."""
    started = time.perf_counter()
    for product in products:
        product(inputs[product.in_features][:rows])
    return (time.perf_counter() - started) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_TARGET, help="a built-in model's name or a .gguf file")
    parser.add_argument("--rows", default="1,2,4,8,16", help="numbers of rows, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    path = Path(args.model) if args.model.endswith(".gguf") else gguf_file(args.model)
    if path is None or not path.is_file():
        parser.error(f"{args.model} is not a GGUF file or a built-in model with one")
    try:
        check_gguf(path)  # its metadata must imply exactly its tensors before they are read
    except SpecDeckError as error:
        parser.error(str(error))
    missing = row_kernel.int8_available()
    if missing is not None:
        parser.error(missing)
    torch.set_num_threads(args.threads)
    counts = [int(n) for n in args.rows.split(",")]
    ways = {way: file_products(path, way) for way in ("float32", "int8")}
    inputs = {n: torch.randn(max(counts), n) for n in {p.in_features for p in ways["int8"]}}
    print(f"{len(ways['int8'])} products of {path.name}, {args.threads} threads, ms per pass (best of {args.repeats})")
    print("| rows | float32 rows | 8-bit rows | ratio |")
    print("| --- | --- | --- | --- |")
    for rows in counts:
        best = {way: float("inf") for way in ways}
        for _ in range(args.repeats):
            for way, products in ways.items():
                best[way] = min(best[way], time_products(products, rows, inputs))
        print(f"| {rows} | {best['float32']:.2f} | {best['int8']:.2f} | {best['float32'] / best['int8']:.2f} |")


if __name__ == "__main__":
    main()
