"""The size ladder: how plain decoding and a verify's cost grow with the model, on SpecDeck's torch
path and on llama.cpp, side by side on the same random-weight files (`specdeck.bench.ladder_files`).

    python -m specdeck.bench.size_ladder --out DIR [--sizes 360m,1.7b] [--types Q4_K_M,Q8_0]
        [--backends torch,llama.cpp] [--threads 2]

For each size and file type, each backend in turn: plain tok/s (`generate` without a drafter, 48
new tokens after a short prompt, the best of two runs) and the verify cost curve c(n) = (one forward
of n tokens after 64 cached) / (one one-token step), n = 1, 2, 4, 8, as the auto schedule measures
it (`specdeck.engine.planner.costs.measure_curve`: a warm-up pass, the best of the passes). torch runs
whatever `--backend torch` runs for the file (the row kernel on Q4_1/Q8_0 blocks, float32 products
otherwise). The table names the CPU (lscpu's model name) and goes to DIR/ladder.md and
DIR/ladder.csv. The files are built once (a minute or more for 1.7b) and kept in SpecDeck's cache.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

import torch

from specdeck.bench.ladder_files import SHAPES, LadderShape, ladder_file
from specdeck.bench.report import markdown_table
from specdeck.engine.atomic import write_text
from specdeck.engine.cache import machine_name
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import SummaryEvent
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel, library
from specdeck.engine.forward.llamacpp_quantize import FILE_TYPES
from specdeck.engine.loading.models import LoadedModel, LoadOptions, load_model
from specdeck.engine.loading.registry import DEFAULT_TARGET
from specdeck.engine.planner.costs import measure_curve

BACKENDS = ("torch", "llama.cpp")
CURVE = (1, 2, 4, 8)
CONTEXT = 64  # cached tokens a verify is timed after
COLUMNS = ("size", "file_type", "file_mb", "backend", "plain_tok_s", "step_ms", "c2", "c4", "c8")


def load(path: Path, backend: str, tokenizer) -> LoadedModel:
    """The file on one backend; llama.cpp's shares the built-in tokenizer (the files copy its vocabulary)."""
    if backend == "torch":
        return load_model(str(path), LoadOptions(backend="torch"))
    model = LlamaCppModel(path)
    return LoadedModel(path.stem, model, tokenizer, model.device, torch.float32)


def plain_tokens_per_s(target: LoadedModel, runs: int = 2) -> float:
    """The best of `runs` plain sessions' tokens/s (48 new tokens; random weights write noise)."""
    from specdeck.engine import encode_prompt, generate

    ids = encode_prompt(target.tokenizer, "Write a Python function that returns the n-th Fibonacci number.")
    config = DecodeConfig(max_new_tokens=48)
    summaries = [list(generate(target, ids, config))[-1] for _ in range(runs)]
    return max(summary.tokens_per_s for summary in summaries if isinstance(summary, SummaryEvent))


def measure(shape: LadderShape, file_type: str, backends: tuple[str, ...], tokenizer) -> list[dict]:
    """One row per backend for `shape` in `file_type`: the backends are loaded together and timed
    in turn, so a burst of other work on the machine touches both alike."""
    path = ladder_file(shape, file_type, progress=lambda line: print(f"[{line}]", file=sys.stderr, flush=True))
    loaded = {backend: load(path, backend, tokenizer) for backend in backends}
    curves = {backend: measure_curve(loaded[backend].model, CURVE, context=CONTEXT) for backend in backends}
    plain = {backend: plain_tokens_per_s(loaded[backend]) for backend in backends}
    rows = []
    for backend in backends:
        step = curves[backend].ms(1)
        rows.append(
            dict(
                size=shape.name,
                file_type=file_type,
                file_mb=round(path.stat().st_size / 2**20),
                backend=backend,
                plain_tok_s=f"{plain[backend]:.1f}",
                step_ms=f"{step:.2f}",
                **{f"c{n}": f"{curves[backend].ms(n) / step:.2f}" for n in CURVE[1:]},
            )
        )
    return rows


def write_tables(rows: list[dict], out: Path, heading: str) -> str:
    """ladder.csv and ladder.md in `out`; returns the markdown."""
    text = io.StringIO()
    writer = csv.DictWriter(text, COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "ladder.csv", text.getvalue())
    table = f"{heading}\n\n{markdown_table(rows, COLUMNS)}\n"
    write_text(out / "ladder.md", table)
    return table


def _names(text: str, known, what: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise SpecDeckError(f"{what} takes any of {', '.join(known)}, comma-separated (got {text!r}).")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="360m,1.7b", help=f"any of {', '.join(SHAPES)} (default %(default)s)")
    parser.add_argument("--types", default="Q4_K_M,Q8_0", help="llama.cpp file types (default %(default)s)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="default %(default)s")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True, help="folder for ladder.md and ladder.csv")
    args = parser.parse_args(argv)
    try:
        sizes = _names(args.sizes, SHAPES, "--sizes")
        types = _names(args.types, FILE_TYPES, "--types")
        backends = _names(args.backends, BACKENDS, "--backends")
        if library() is None:
            raise SpecDeckError(
                "The size ladder quantizes with llama.cpp: install llama-cpp-python (`make` builds it)."
            )
    except SpecDeckError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    tokenizer = load_model(DEFAULT_TARGET, LoadOptions(backend="llama.cpp")).tokenizer
    heading = (
        f"Size ladder on {machine_name()}, {args.threads} threads: plain tok/s, a step's ms and "
        f"c(n) = a forward of n tokens after {CONTEXT} cached / a step (random-weight files)"
    )
    rows: list[dict] = []
    for size in sizes:
        for file_type in types:
            rows += measure(SHAPES[size], file_type, backends, tokenizer)
            print(write_tables(rows, Path(args.out), heading), flush=True)


if __name__ == "__main__":
    main()
