"""Finding and loading causal language models: built-in aliases, Hugging Face ids, local folders
and `.gguf` files, on the device and dtype the user asked for (or the best one here: `devices`), and
on the backend it asked for (`specdeck.engine.loading.backends`): torch, or llama.cpp for a `.gguf` file.

Model files are untrusted input: remote code runs only when the user passes `trust_remote_code`,
and weights come from safetensors or GGUF (transformers loads a pickled `.bin` with
`weights_only=True`). A GGUF file whose matrices the row kernel reads is read in place, its
products on the file's blocks (`specdeck.engine.loading.gguf_in_place`); any other is dequantized once into a
safetensors cache, since converting it takes far longer than loading the result; the cache records
the weights' size and SHA-256, and a cache that no longer matches them (a disk filled up, a copy
cut short) is converted again. On llama.cpp a GGUF file runs as it is; only its tokenizer is
cached (building it takes seconds), as it is for a file read in place.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specdeck.engine.bounded import TooSlow, read_json, within_seconds
from specdeck.engine.config import check_prompt
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward import gguf_blocks
from specdeck.engine.forward.hf_parts import output_projection
from specdeck.engine.forward.llamacpp_backend import LlamaCppModel
from specdeck.engine.forward.row_kernel import QuantizedLinear, QuantizedParts
from specdeck.engine.loading import gguf_in_place
from specdeck.engine.loading.backends import choose_backend, gguf_file
from specdeck.engine.loading.devices import resolve_device, resolve_dtype
from specdeck.engine.loading.gguf_checks import check_gguf
from specdeck.engine.loading.gguf_conversion import convert_gguf, converted_weights, pending_damage
from specdeck.engine.loading.gguf_tokenizer import gguf_tokenizer, gguf_tokenizer_folder
from specdeck.engine.loading.hub import hub_message, hub_source
from specdeck.engine.loading.preflight import check_model_folder
from specdeck.engine.loading.registry import BUILTIN_MODELS, is_head_folder

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Progress = Callable[[str], None]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    device: str = "auto"  # auto, cpu, cuda, cuda:N, mps
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    trust_remote_code: bool = False
    backend: str = "torch"  # auto, torch, llama.cpp (`specdeck.engine.loading.backends.choose_backend`)
    # a GGUF file's matrices read in place where the row kernel reads their blocks
    # (`specdeck.engine.loading.gguf_in_place`); False converts the file to float32 first, as where it cannot
    # (for comparing the two)
    read_in_place: bool = True


@dataclass
class LoadedModel:
    name: str
    model: PreTrainedModel | LlamaCppModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    output_ids: torch.Tensor | None = None  # a draft's reduced output vocabulary (`OUTPUT_TOKENS_FILE`)

    @property
    def vocab_width(self) -> int:
        """Rows of the output layer: the token ids the model can emit (padding rows included)."""
        if isinstance(self.model, LlamaCppModel):
            return self.model.vocab_width  # known without dequantizing the output layer
        return output_projection(self.model).weight.shape[0]

    @property
    def torch_model(self) -> PreTrainedModel:
        """The model, for what only torch runs (training, Hugging Face's `generate()`)."""
        if isinstance(self.model, LlamaCppModel):
            raise SpecDeckError(f"{self.name} runs on llama.cpp here, and this needs it on torch: use --backend torch.")
        return self.model

    @property
    def backend(self) -> str:
        """What runs the model: "torch", or "llama.cpp" with the file's weight type, e.g. "llama.cpp (Q4_1)"."""
        if isinstance(self.model, LlamaCppModel):
            return f"llama.cpp ({self.model.file_type})"
        return "torch"

    @property
    def runs(self) -> str:
        """What runs the model, in words, for every label (the window's, the terminal's, `--jsonl`'s
        and the export's): "llama.cpp Q4_K_M", "Q4_1 blocks on the row kernel (8-bit rows)", some
        products on blocks and the rest float32, or the dtype ("float32", "bfloat16"). A GGUF
        model's products are read here where the first session would read them (`weights_of`)."""
        if isinstance(self.model, LlamaCppModel):
            return f"llama.cpp {self.model.file_type}"
        from specdeck.engine.forward.gguf_index import file_type
        from specdeck.engine.forward.lean_weights import weights_of
        from specdeck.engine.forward.llama_families import supports

        dtype = str(self.dtype).removeprefix("torch.")
        path = gguf_blocks.source_of(self.model)
        if path is None or self.device.type != "cpu" or not supports(self.model):
            return dtype
        lean = weights_of(self.model)
        products = [p for layer in lean.layers for p in (layer.qkv, layer.out, layer.gate_up, layer.down)]
        products += [lean.head] if lean.head is not None else []
        on_blocks = [p for p in products if isinstance(p, QuantizedLinear | QuantizedParts)]
        if not on_blocks:
            return dtype
        rows = "8-bit rows" if any(p.activations == "int8" for p in on_blocks) else "float32 rows"
        label = f"{file_type(path)} blocks on the row kernel ({rows})"
        if len(on_blocks) < len(products):
            label += f" for {len(on_blocks)} of {len(products)} products, the rest {dtype}"
        return label

    @property
    def eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (
            self.tokenizer.eos_token_id,
            self.model.config.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        return frozenset(ids)


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith(".gguf") or os.sep in name and Path(name).exists()


def locate(name: str, progress: Progress | None = None, beside_load: bool = False) -> str:
    """A folder or Hugging Face id that `from_pretrained` can read for `name` (`beside_load`: see
    `convert_gguf`)."""
    if name in BUILTIN_MODELS:
        path = BUILTIN_MODELS[name].path()
        return str(convert_gguf(path, progress, beside_load) if path.suffix == ".gguf" else path)
    path = Path(name).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix == ".gguf":
                return str(convert_gguf(path, progress, beside_load))
            raise SpecDeckError(f"{path} is a file but not a .gguf model: pass a .gguf file or a model folder.")
        if not (path / "config.json").exists():
            raise SpecDeckError(f"{path} has no config.json: it is not a Hugging Face model folder.")
        return str(path)
    if _looks_like_path(name):
        raise SpecDeckError(f"No model at {path}: the file or folder does not exist.")
    return hub_source(name)


def load_model(name: str, options: LoadOptions = LoadOptions(), progress: Progress | None = None) -> LoadedModel:
    """Load a model and its tokenizer, ready for inference, or raise `SpecDeckError` saying why not."""
    from transformers import AutoModelForCausalLM

    if not name.strip():
        raise SpecDeckError("No model given: name a built-in model, a Hugging Face id, a folder or a .gguf file.")
    device = resolve_device(options.device)
    if (given := gguf_file(name.strip())) is not None:
        check_gguf(given)  # before either backend, or timing them, reads it: a damaged file is named as such
    on_torch = lambda name, progress: load_model(name, LoadOptions(device="cpu", backend="torch"), progress)  # noqa: E731
    if choose_backend(name.strip(), options.backend, device, options.dtype, progress, on_torch) == "llama.cpp":
        return _load_on_llama_cpp(name.strip(), progress)
    dtype = resolve_dtype(options.dtype, device)
    if (file := gguf_file(name.strip())) is not None and options.read_in_place:
        why = gguf_in_place.refusal(file, device, options.dtype, progress)
        if why is None:
            try:
                return _load_in_place(name.strip(), file, progress)
            except gguf_in_place.InPlaceRefused as refused:
                why = str(refused)
        log.info("%s is converted to float32: %s", file.name, why)
    source = locate(name.strip(), progress, beside_load=True)  # its checksum: `pending_damage` below
    if is_head_folder(Path(source)):
        raise SpecDeckError(
            f"{name} is a feature head, not a model: it drafts for its target with the "
            "feature-head drafter (--drafter feature-head)."
        )
    if Path(source).is_dir():
        check_model_folder(Path(source), name, dtype, device)
    if progress:
        progress(f"Loading {name}")
    try:
        failure: BaseException | None = None
        try:
            tokenizer = _load_tokenizer(name, tokenizer_source(source, progress), options.trust_remote_code)
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, trust_remote_code=options.trust_remote_code
            )
        except BaseException as error:  # raised below, unless damaged weights explain it
            failure = error
        if damage := pending_damage(Path(source)):  # the conversion's checksum, computed beside the load
            if progress:
                progress(f"The cached conversion of {name} in {source} is damaged ({damage}): converting it again")
            shutil.rmtree(source, ignore_errors=True)
            return load_model(name, options, progress)
        if failure is not None:
            raise failure
    except MemoryError as error:
        raise SpecDeckError(
            f"{name} does not fit in the memory this machine has free: close other programs, "
            "or choose a smaller model or dtype (--dtype bfloat16)."
        ) from error
    except OSError as error:
        raise SpecDeckError(hub_message(name, error)) from error
    except pickle.UnpicklingError as error:
        raise SpecDeckError(_pickle_message(name, error)) from error
    except ValueError as error:
        if "trust_remote_code" in str(error):
            raise SpecDeckError(
                f"{name} needs its own Python code to load. Only if you trust its authors, "
                "pass --trust-remote-code (in the window: the 'Trust remote code' box)."
            ) from error
        raise SpecDeckError(f"Could not load {name}: {error}") from error
    model.to(device).eval()  # type: ignore[arg-type]  # a decorator in transformers hides to()'s signature
    if (file := gguf_file(name.strip())) is not None:
        # its products may read the file's own blocks (`specdeck.engine.forward.gguf_blocks`)
        gguf_blocks.remember(model, file, converted_weights(Path(source)))
    output_ids = read_output_tokens(Path(source), output_projection(model).weight.shape[0])
    return LoadedModel(name, model, tokenizer, device, dtype, output_ids)


def _load_in_place(name: str, path: Path, progress: Progress | None) -> LoadedModel:
    """The GGUF file `name` on torch, its matrices its own blocks (`specdeck.engine.loading.gguf_in_place`)."""
    try:
        model = gguf_in_place.load_in_place(path, progress)
    except MemoryError as error:
        raise SpecDeckError(
            f"{name} does not fit in the memory this machine has free: close other programs, or choose a smaller model."
        ) from error
    return LoadedModel(name, model, gguf_tokenizer(path, progress), torch.device("cpu"), torch.float32)


def load_tokenizer(name: str, progress: Progress | None = None):
    """The tokenizer of model `name` alone (a remote target's, `specdeck.engine.remote.remote_target`)."""
    try:
        if (file := gguf_file(name.strip())) is not None:  # its tokenizer alone: no conversion
            return gguf_tokenizer(file, progress)
        return _load_tokenizer(name, tokenizer_source(locate(name.strip(), progress), progress), False)
    except OSError as error:
        raise SpecDeckError(hub_message(name, error)) from error


def _load_on_llama_cpp(name: str, progress: Progress | None) -> LoadedModel:
    """The GGUF file `name` on llama.cpp, its weights as they are in the file."""
    path = gguf_file(name)
    if path is None:
        raise SpecDeckError(f"{name} is no .gguf file: llama.cpp runs GGUF files only. Use --backend torch.")
    if progress:
        progress(f"Loading {name} on llama.cpp")
    model = LlamaCppModel(path)  # first: a damaged file is named by llama.cpp's reason
    return LoadedModel(name, model, gguf_tokenizer(path, progress), model.device, torch.float32)


def _load_tokenizer(name: str, source: str, trust_remote_code: bool):
    """The tokenizer at `source`; a local one that fails to load is named by its files."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as error:
        folder = Path(source)
        if not folder.is_dir() or isinstance(error, OSError) and not any(folder.glob("tokenizer*")):
            raise
        files = ", ".join(str(path) for path in sorted(folder.glob("tokenizer*"))) or str(folder)
        raise SpecDeckError(
            f"The tokenizer of {name} could not be read from {files} ({error}): the file is "
            "damaged or from another library version; restore it from the model's source."
        ) from error


OUTPUT_TOKENS_FILE = "output_tokens.json"
TOKENIZER_REFERENCE_FILE = "tokenizer_reference.json"


def tokenizer_source(source: str, progress: Progress | None = None) -> str:
    """Where a model's tokenizer is: its own folder, or the model that `tokenizer_reference.json`
    ({"model": NAME}) names, so a small draft need not carry a copy of its target's tokenizer."""
    path = Path(source) / TOKENIZER_REFERENCE_FILE
    if not path.is_file():
        return source
    try:
        name = read_json(path, "The tokenizer reference")["model"]
        if not isinstance(name, str) or not name.strip():
            raise ValueError("no model named")
    except (SpecDeckError, ValueError, KeyError, TypeError) as error:
        raise SpecDeckError(
            f"{path} is not a valid tokenizer reference ({error}): it must hold "
            '{"model": "<alias, folder or Hugging Face id>"}.'
        ) from error
    if (file := gguf_file(name.strip())) is not None:  # a GGUF model's tokenizer needs no conversion
        return str(gguf_tokenizer_folder(file, progress))
    return locate(name, progress)


def read_output_tokens(folder: Path, vocab_width: int) -> torch.Tensor | None:
    """The token ids a draft proposes from, if its folder lists them in `output_tokens.json`
    ({"token_ids": [...]}): the drafter then computes only those rows of the output layer."""
    path = folder / OUTPUT_TOKENS_FILE
    if not path.is_file():
        return None
    try:
        ids = read_json(path, "The output-token list")["token_ids"]
        if not ids or not all(isinstance(i, int) and 0 <= i < vocab_width for i in ids):
            raise ValueError(f"token ids must be integers from 0 to {vocab_width - 1}")
    except (SpecDeckError, ValueError, KeyError, TypeError) as error:
        raise SpecDeckError(f"{path} is not a valid output-token list ({error}): fix or delete it.") from error
    return torch.tensor(sorted(set(ids)), dtype=torch.long)


def _pickle_message(name: str, error: pickle.UnpicklingError) -> str:
    """Why a pickled weights file (pytorch_model.bin) was refused: it calls code, or it is damaged."""
    called = re.search(r"GLOBAL (\S+)", str(error))
    if called:
        return (
            f"The weights of {name} (a pickled .bin file) hold Python code: loading them would call "
            f"{called.group(1)}. SpecDeck did not run it and did not load the model. Use a copy of the "
            "model saved as safetensors (model.safetensors), or a .gguf file, from a source you trust."
        )
    return (
        f"The weights of {name} (a pickled .bin file) cannot be read ({str(error).splitlines()[0]}): "
        "the file is damaged or not PyTorch weights. Download the model again, preferably as safetensors."
    )


_CONTENT_MARK = "\ue000specdeck-prompt\ue000"  # private-use characters: no prompt or template holds them


MAX_TEMPLATE_CHARS = 256 * 1024  # a chat format takes a few kB; the longest known, tens
TEMPLATE_SECONDS = 5.0  # a chat format renders in milliseconds; a template looping for ever is stopped


def render_chat_template(tokenizer, messages: list[dict[str, str]]) -> str:
    """The text `tokenizer`'s chat template makes of `messages`, the turn to answer opened; a
    template too long to be a chat format, one that runs past `TEMPLATE_SECONDS`, or one that
    fails (malformed, raising, an unknown filter: it is the model's code), is a SpecDeckError
    saying so."""
    template = tokenizer.chat_template
    size = sum(map(len, template.values())) if isinstance(template, dict) else len(str(template))
    if size > MAX_TEMPLATE_CHARS:  # checked before rendering: a huge one would run for minutes
        raise SpecDeckError(
            f"This model's chat template is {size:,} characters long, more than a chat format takes "
            f"(at most {MAX_TEMPLATE_CHARS:,}): use raw completion (--no-chat), or fix the template."
        )
    try:
        return within_seconds(
            TEMPLATE_SECONDS,
            lambda: tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        )
    except TooSlow:
        raise SpecDeckError(
            f"This model's chat template ran for more than {TEMPLATE_SECONDS:.0f} s without finishing: use "
            "raw completion (--no-chat), or fix the chat_template in its tokenizer_config.json."
        ) from None
    except Exception as error:  # jinja2 and the template's own code raise many types
        said = " ".join(str(error).split())[:200] or type(error).__name__
        raise SpecDeckError(
            f"This model's chat template fails ({type(error).__name__}: {said}): use raw completion "
            "(--no-chat), or fix the chat_template in its tokenizer_config.json."
        ) from error


def encode_prompt(tokenizer, text: str, chat: bool = True) -> list[int]:
    """Token ids of a prompt, through the chat template when the tokenizer has one and `chat`.

    The prompt is data: a `<|im_end|>` typed in it is encoded as those characters, never as the
    control token (`split_special_tokens=True`); control tokens come only from the template."""
    return encode_conversation(tokenizer, [text], [], chat)


def encode_conversation(tokenizer, turns: list[str], answers: list[str], chat: bool = True) -> list[int]:
    """Token ids of a conversation that asks `turns[-1]` next: each earlier turn followed by its
    answer (as Spec-Bench asks MT-Bench's second turns). Like `encode_prompt`, the texts are data;
    without a chat template the turns and answers follow each other, a blank line between them."""
    for text in turns:
        check_prompt(text)
    texts = [text for pair in zip(turns, answers + [None]) for text in pair if text is not None]
    if not (chat and getattr(tokenizer, "chat_template", None)):
        return tokenizer("\n\n".join(texts), split_special_tokens=True)["input_ids"]
    marks = [f"{_CONTENT_MARK}{i}{_CONTENT_MARK}" for i in range(len(texts))]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": mark} for i, mark in enumerate(marks)]
    rest = render_chat_template(tokenizer, messages)
    template = lambda part: tokenizer(part, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids: list[int] = []
    for mark, text in zip(marks, texts):
        before, found, rest = rest.partition(mark)
        if not found:
            raise SpecDeckError(
                "This model's chat template rewrites the prompt, so its text could not be kept "
                "apart from control tokens: use raw completion (--no-chat)."
            )
        ids += template(before) + tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids + template(rest)
