"""The `llama.cpp` baseline of `specdeck bench`: llama-cpp-python's own generation (`Llama.generate`,
one token per call, its own sampler) on the target's GGUF file with its default settings and
torch's thread count, which is what a user who runs the file with llama.cpp gets.

It is timed as SpecDeck's plain run is: the prompt but its last token is evaluated first (the
prefill, timed apart), then every new token costs one call, the first one fed the last prompt
token. Its defaults (float16 KV cache, no flash attention) round otherwise than SpecDeck's
llama.cpp backend (flash attention on an 8-bit KV cache, `specdeck.engine.forward.llamacpp_backend`), so its greedy
text may part from SpecDeck's at a near-tie. It keeps llama.cpp's extra (repacked) weight buffers;
ggml's tiled K-quant product, which SpecDeck's process switches off, serves calls of 8 tokens or
more alone: its prefill, not its one-token steps.
"""

from __future__ import annotations

import atexit
import time
from pathlib import Path

import torch

from specdeck.bench.methods import Run
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward.hf_parts import decode
from specdeck.engine.forward.llamacpp_backend import CONTEXT_LIMIT, default_params, library
from specdeck.engine.loading.backends import gguf_file, llama_cpp_installed
from specdeck.engine.session import ModelPair

METHOD = "llama.cpp"
OTHER_ROUNDING = (
    "llama.cpp's own loop, with its defaults (float16 KV cache, no flash attention), rounds otherwise "
    "than SpecDeck's target ({backend}): another arithmetic, not a decoding bug"
)

_OPENED: dict[tuple[Path, int], object] = {}  # the one `Llama` a benchmark times, by file and threads
_OPENED_AT_EXIT: list[bool] = []  # whether `_close_opened` runs at the interpreter's end


def check_baseline(pair: ModelPair) -> Path:
    """The GGUF file the baseline runs, or a `SpecDeckError` saying why it cannot run."""
    path = gguf_file(pair.target.name)
    if path is None:
        raise SpecDeckError(
            f"The llama.cpp baseline runs .gguf files, and the target {pair.target.name} is not "
            "one: drop llama.cpp from --baselines."
        )
    if not llama_cpp_installed():
        raise SpecDeckError(
            "The llama.cpp baseline needs llama-cpp-python, which is not installed: "
            "`pip install llama-cpp-python`, or drop llama.cpp from --baselines."
        )
    return path


def _close_opened() -> None:
    """Free the opened model while llama-cpp-python is whole: left to the interpreter's end, its
    `__del__` runs after the module's globals are gone and prints a traceback."""
    for llm in _OPENED.values():
        llm.close()  # type: ignore[attr-defined]
    _OPENED.clear()


def _opened(path: Path):
    threads = torch.get_num_threads()
    key = (path, threads)
    if key not in _OPENED:
        _close_opened()
        if not _OPENED_AT_EXIT:
            atexit.register(_close_opened)
            _OPENED_AT_EXIT.append(True)
        llama = library()
        # `Llama` has no argument for the weights' buffers: its defaults are read from the low-level
        # module, so they are swapped for `default_params`'s (no AMX buffers, which crash) while it loads.
        defaults = llama.llama_cpp.llama_model_default_params
        llama.llama_cpp.llama_model_default_params = lambda: default_params(llama)
        try:
            _OPENED[key] = llama.Llama(
                model_path=str(path), n_ctx=CONTEXT_LIMIT, n_threads=threads, n_threads_batch=threads, verbose=False
            )
        finally:
            llama.llama_cpp.llama_model_default_params = defaults
    return _OPENED[key]


def run_llama_cpp(pair: ModelPair, prompt_ids: list[int], config: DecodeConfig) -> Run:
    """One timed generation of llama-cpp-python's own loop; stops at an end-of-text token, at
    `config.max_new_tokens`, or at the end of the context."""
    llm = _opened(check_baseline(pair))
    budget = min(config.max_new_tokens, llm.n_ctx() - len(prompt_ids))
    sampling = (
        dict(temp=0.0) if config.greedy else dict(temp=config.temperature, top_k=config.top_k, top_p=config.top_p)
    )
    llm.reset()
    llm.set_seed(config.seed)
    started = time.perf_counter()
    llm.eval(prompt_ids[:-1])  # the cache: every prompt token but the last, as in SpecDeck's loop
    prefill_s = time.perf_counter() - started
    eos = pair.target.eos_ids
    token_ids: list[int] = []
    started = time.perf_counter()
    for token in llm.generate(prompt_ids, **sampling, min_p=0.0, typical_p=1.0, repeat_penalty=1.0):
        token_ids.append(int(token))
        if token in eos or len(token_ids) >= budget:
            break
    decode_s = time.perf_counter() - started
    text = decode(pair.target.tokenizer, token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return Run(METHOD, 0, token_ids, text, len(token_ids), max(decode_s, 1e-9), prefill_s * 1e3, len(token_ids))
