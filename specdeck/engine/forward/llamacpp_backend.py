"""GGUF models run by llama.cpp (through llama-cpp-python) on their quantized weights, behind the
interface of the torch backends (`specdeck.engine.forward.kvcache.CachedModel`), so every drafter, event and figure
works unchanged.

One llama.cpp call over n new tokens gives the logits of every position and, with embeddings on
and pooling none, the final norm's output for every position (what a feature head reads); a
rejection drops positions from the KV cache with `llama_memory_seq_rm`.

Exactness: plain decoding feeds one token a call, a verify several, and llama.cpp's CPU attention
picks its kernel by call shape. Without flash attention a position gets other logits in a
one-token call than in a several-token call (up to 0.6 apart on the built-in model, enough to flip
near-ties). With flash attention on a float16 or float32 KV cache, a one-token call over 512 or
more cached positions splits them between threads and adds the parts in another order (up to 1.0
apart with 2 threads; `ggml_compute_forward_flash_attn_ext_f16`, llama-cpp-python 0.3.36), and
calls of 64 tokens or more take a tiled kernel. With flash attention on an 8-bit (q8_0) KV cache
every call shape runs the same kernel, one query row per thread over all cached positions, so a
position gets the same logits bit for bit whatever the call shape, context length or thread count,
and greedy speculative text equals plain text on this backend (tests/engine/forward/test_llamacpp_backend.py
checks both). The 8-bit cache is also half the memory of llama.cpp's default float16 one.

The matrix products pick their kernel by call shape too (`ggml_compute_forward_mul_mat`,
llama-cpp-python 0.3.36, x86). A one-token call takes `vec_dot` on activations quantized a row at a
time. A call of 2 or more tokens takes llamafile's sgemm for Q4_0/Q5_0/Q8_0/IQ4_NL weights (each
output the same sum in the same order as `vec_dot`: the same bits), ggml's tiled kernel for
K-quants (Q2_K to Q6_K, IQ types) from 8 tokens on, and, for weights repacked into llama.cpp's
extra buffers (Q4_0, Q4_K and IQ4_NL on AVX2), a 4-row kernel for each 4 tokens of the call. The
last two round otherwise than `vec_dot` (up to 1.3 apart in logits on SmolLM2-135M's Q4_K_M and Q6_K
files), so a verify could flip a near-tie plain decoding resolves the other way. SpecDeck loads
weights without the extra buffers (`model_params`) and switches the tiled kernel off
(`GGML_CPU_TILED_MM=0`, read once by ggml when it first multiplies): every call shape then runs
`vec_dot` or the sgemm that matches it, for every block type (tests/engine/forward/test_llamacpp_backend_block_types.py
checks Q4_1, Q8_0, Q6_K and Q4_K_M files). Prompts are read by the same kernels, a little slower
for K-quants than with the tiled one; steps and verifies of up to 7 tokens ran those kernels before.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from specdeck.engine.errors import SpecDeckError, unreadable_gguf

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CONTEXT_LIMIT = 8192  # positions a context holds at most (its KV cache is allocated whole)
BATCH = 512  # tokens per llama.cpp call; a longer prefill goes in several


@functools.cache
def library():
    """The llama_cpp module, or None where llama-cpp-python is not installed (or its library fails to load)."""
    # ggml's tiled K-quant product rounds otherwise than a one-token call's (see above): off before
    # llama.cpp first multiplies, which is when ggml reads the switch
    os.environ["GGML_CPU_TILED_MM"] = "0"
    try:
        module = importlib.import_module("llama_cpp")
    except (ImportError, OSError):
        return None
    module.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))  # llama.cpp's log goes to `_log`, not stderr
    return module


def model_params(llama):
    """llama.cpp's default model parameters, but with the weights kept in its plain CPU buffers: ggml
    repacks some block types there for a product that rounds a 4-token group otherwise than one
    token (see above), and for AMX, whose product crashes some machines (`default_params`)."""
    params = llama.llama_model_default_params()
    params.use_extra_bufts = False
    return params


def default_params(llama):
    """llama.cpp's default model parameters (what its own tools run), but with the weights kept in
    its plain CPU buffers where the CPU has AMX. ggml repacks a quantized file's weights for AMX
    there, and its AMX product crashes the process (SIGSEGV in `ggml_backend_amx_mul_mat`, llama.cpp
    issue 20824; seen with llama-cpp-python 0.3.36 on SmolLM2's Q4_1 file on a 2-core Xeon) at the
    first forward. Other CPUs keep the extra buffers (repacked weights for faster products)."""
    params = llama.llama_model_default_params()
    if has_amx(llama):
        params.use_extra_bufts = False
    return params


def has_amx(llama) -> bool:
    """Whether llama.cpp's CPU backend reports AMX (its system information line)."""
    return b"AMX_INT8 = 1" in llama.llama_print_system_info()


_ERRORS: list[str] = []  # llama.cpp's latest error lines, for the message when a file does not load


def _log(level: int, text: bytes, user_data) -> None:
    if level == 3:  # GGML_LOG_LEVEL_ERROR
        _ERRORS.append(text.decode("utf-8", "replace").strip())
        del _ERRORS[:-4]


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(_log)


class LlamaCppModel:
    """A GGUF file opened by llama.cpp, shaped like the Hugging Face models the engine runs: a
    `config` (sizes, context, end-of-text token), a `generation_config`, `device`, and embedding
    matrices whose values are read from the file only when used (`FileMatrix`)."""

    backend = "llama.cpp"
    device = torch.device("cpu")

    def __init__(self, path: Path) -> None:
        from transformers import GenerationConfig, PretrainedConfig

        llama = library()
        self.path = path
        _ERRORS.clear()
        handle = llama.llama_model_load_from_file(str(path).encode(), model_params(llama))
        if not handle:
            reason = "; ".join(_ERRORS) or "llama.cpp could not read it"
            raise unreadable_gguf(path, reason)
        self.handle = handle
        self._idle: list[_Context] = []  # contexts no forward uses now, kept for the next (opening one takes 0.1 s)
        weakref.finalize(self, _free_model, llama, handle, self._idle)
        vocab = llama.llama_model_get_vocab(handle)
        self.vocab_width = llama.llama_vocab_n_tokens(vocab)
        eos = llama.llama_vocab_eos(vocab)
        description = ctypes.create_string_buffer(256)
        llama.llama_model_desc(handle, description, len(description))
        self.file_type = description.value.decode("utf-8", "replace").split(" ")[-1]  # e.g. "Q4_1"
        stat = path.stat()
        self.config = PretrainedConfig.from_dict(
            dict(
                vocab_size=self.vocab_width,
                hidden_size=llama.llama_model_n_embd(handle),
                num_hidden_layers=llama.llama_model_n_layer(handle),
                max_position_embeddings=min(llama.llama_model_n_ctx_train(handle), CONTEXT_LIMIT),
                eos_token_id=eos if eos >= 0 else None,
                # what the measured costs are cached by (`specdeck.engine.planner.costs`): the file and the library
                gguf_file=str(path.resolve()),
                gguf_size=stat.st_size,
                gguf_mtime_ns=stat.st_mtime_ns,
                llama_cpp_version=llama.__version__,
            )
        )
        self.generation_config = GenerationConfig(eos_token_id=self.config.eos_token_id)

    def take_context(self) -> _Context:
        """A context with an empty KV cache, running on torch's threads now: an idle one, or a new one."""
        context = self._idle.pop() if self._idle else _Context(self)
        threads = torch.get_num_threads()
        library().llama_set_n_threads(context.handle, threads, threads)
        return context

    def give_back(self, context: _Context) -> None:
        library().llama_memory_clear(context.memory, True)
        self._idle.append(context)

    def parameters(self):
        """No torch parameters: the weights live in llama.cpp."""
        return iter(())

    def get_input_embeddings(self) -> FileMatrix:
        return self._embeddings[0]

    def get_output_embeddings(self) -> FileMatrix:
        """The output layer (`output.weight`, or the token embedding where the file ties them)."""
        return self._embeddings[1]

    @functools.cached_property
    def _embeddings(self) -> tuple[FileMatrix, FileMatrix]:
        from specdeck.engine.forward.gguf_index import tensors_of

        tensors = tensors_of(Path(self.path))  # the file's tensor index: gguf-py's reader would parse every string
        if "token_embd.weight" not in tensors:
            raise SpecDeckError(f"{self.path} has no token embedding (token_embd.weight) that SpecDeck can read.")
        embedding = FileMatrix(tensors["token_embd.weight"])
        return embedding, FileMatrix(tensors["output.weight"]) if "output.weight" in tensors else embedding


def matrices_of(model: PreTrainedModel | LlamaCppModel) -> PreTrainedModel:
    """`model` where only its embedding and output matrices are read (`specdeck.engine.forward.hf_parts`,
    `specdeck.engine.forward.lean_weights.output_weight`): a LlamaCppModel has them, as `FileMatrix`es."""
    return cast("PreTrainedModel", model)


class FileMatrix(torch.nn.Module):
    """An embedding or output matrix of a GGUF file: its sizes known at once, its values dequantized
    (to float32, as transformers' GGUF loader does) when first used, so that only a feature head,
    which reads them, pays their memory. Called on token ids it embeds them."""

    def __init__(self, tensor) -> None:
        super().__init__()
        self._tensor = tensor
        self.num_embeddings, self.embedding_dim = (int(size) for size in reversed(tensor.shape))

    @functools.cached_property
    def weight(self) -> torch.Tensor:
        from gguf.quants import dequantize

        values = dequantize(self._tensor.data, self._tensor.tensor_type)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(
            self.num_embeddings, self.embedding_dim
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(ids, self.weight)


class _Context:
    """A llama.cpp context (its KV cache) of a model, and a batch to feed it: flash attention on a
    q8_0 KV cache, so that every call shape gives a position the same logits (see above)."""

    def __init__(self, model: LlamaCppModel) -> None:
        llama = library()
        params = llama.llama_context_default_params()
        params.n_ctx = model.config.max_position_embeddings
        params.n_batch = params.n_ubatch = BATCH
        params.n_seq_max = 1
        params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k = params.type_v = llama.GGML_TYPE_Q8_0
        params.pooling_type = llama.LLAMA_POOLING_TYPE_NONE  # a state per position, not one per sequence
        params.embeddings = False  # switched on for the calls that need states (`LlamaCppForward.hidden`)
        params.no_perf = True
        self.handle = llama.llama_init_from_model(model.handle, params)
        if not self.handle:
            raise SpecDeckError(
                f"llama.cpp could not open a context of {params.n_ctx} positions for "
                f"{model.path.name} (out of memory?): close other programs, or use --backend torch."
            )
        self.memory = llama.llama_get_memory(self.handle)
        self.batch = llama.llama_batch_init(BATCH, 0, 1)
        for i in range(BATCH):  # every token of every call is in sequence 0: set once, not per call
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = 0
        self.states = False

    def free(self, llama) -> None:
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.handle)


def _free_model(llama, handle, idle: list[_Context]) -> None:
    for context in idle:  # contexts go before their model
        context.free(llama)
    llama.llama_model_free(handle)


def _decode_error(code: int) -> str:
    return {1: "no room left in its KV cache", 2: "aborted", -1: "invalid batch"}.get(code, f"error {code}")


class LlamaCppForward:
    """A model's forward on a llama.cpp context: the interface of `CachedModel`'s backends
    (`logits`, `hidden`, `output_layer`, `crop`, `reset`, `len`), on llama.cpp's KV cache. Its
    context goes back to the model when it is dropped."""

    def __init__(self, model: LlamaCppModel) -> None:
        self._llama = library()
        self.model = model
        self.context = model.take_context()
        weakref.finalize(self, model.give_back, self.context)
        self.width = model.vocab_width
        self.hidden_size = model.config.hidden_size
        self.length = 0
        self._latest: tuple[torch.Tensor, torch.Tensor] | None = None  # (states, logits) of the latest `hidden`
        self.tapped = None  # no lower layer's states: see `taps`

    @property
    def taps(self) -> tuple[int, ...]:
        return ()

    @taps.setter
    def taps(self, layers: tuple[int, ...]) -> None:
        """Lower layers' states (`LlamaForward.taps`) are torch's alone."""
        if layers:
            raise SpecDeckError(
                "This feature head reads lower layers of its target, which SpecDeck takes from torch "
                "only: run the target with --backend torch, or choose a head on its last state alone."
            )

    def reset(self) -> None:
        self.crop(0)

    def __len__(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        """Forget cached positions from `length` on."""
        if length < self.length:
            self._llama.llama_memory_seq_rm(self.context.memory, 0, length, -1)
            self.length = length

    def logits(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Logits (n, vocab) for token ids (n,) appended after the cached ones; (1, vocab) if last_only
        (llama.cpp then computes the output layer for that position alone)."""
        return self._forward(ids.tolist(), states=False, last_only=last_only)[1]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final norm's output (n, hidden) for token ids (n,) appended after the cached ones; the
        logits of the same call are kept for `output_layer`."""
        self._latest = self._forward(ids.tolist(), states=True, last_only=False)
        return self._latest[0]

    def output_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits llama.cpp computed along with `hidden`, the states `hidden` just returned: the
        output layer on the quantized weights, as a plain step computes it (no second product)."""
        if self._latest is None or hidden is not self._latest[0]:
            raise ValueError("the llama.cpp backend gives logits for the states of its latest forward only")
        return self._latest[1]

    def _forward(self, ids: list[int], states: bool, last_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(final-norm states, logits) of `ids` after the cached positions, in calls of up to BATCH tokens;
        no states (0 rows) unless `states`."""
        llama = self._llama
        if self.length + len(ids) > self.model.config.max_position_embeddings:
            raise SpecDeckError(
                f"The llama.cpp context holds {self.model.config.max_position_embeddings} positions: "
                f"{self.length + len(ids)} do not fit."
            )
        context = self.context
        if states != context.states:
            llama.llama_set_embeddings(context.handle, states)  # with states on, every position is output
            context.states = states
        logits, hidden = [], []
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            last = start + len(chunk) == len(ids)
            every = states or not last_only  # output rows: all, else the last call's last alone
            batch = context.batch
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = self.length + i
                batch.logits[i] = every
            batch.logits[len(chunk) - 1] = every or last
            code = llama.llama_decode(context.handle, batch)
            if code != 0:
                raise RuntimeError(f"llama.cpp could not decode {len(chunk)} tokens: {_decode_error(code)}")
            self.length += len(chunk)
            if every or last:
                rows = len(chunk) if every else 1
                logits.append(_copy(llama.llama_get_logits(context.handle), rows, self.width))
            if states:
                hidden.append(_copy(llama.llama_get_embeddings(context.handle), len(chunk), self.hidden_size))
        if not states:
            return torch.empty(0, self.hidden_size), logits[0] if len(logits) == 1 else torch.cat(logits)
        return torch.cat(hidden), torch.cat(logits)


def _copy(pointer, rows: int, width: int) -> torch.Tensor:
    """rows x width floats from llama.cpp's output buffer, copied (the next call overwrites it)."""
    values = torch.empty(rows, width)
    ctypes.memmove(values.data_ptr(), pointer, rows * width * 4)
    return values
