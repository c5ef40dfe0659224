"""A GGUF file's tokenizer: built from the file once, as transformers builds it, and kept in
SpecDeck's cache beside the file's conversion folder (`TOKENIZER_SUFFIX`), which later loads read."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from specdeck.engine.atomic import building_folder, write_text
from specdeck.engine.cache import TOKENIZER_SUFFIX
from specdeck.engine.errors import SpecDeckError, unreadable_gguf
from specdeck.engine.loading.gguf_conversion import conversion_folder
from specdeck.engine.loading.gguf_header import UnreadableHeader, read_gguf

Progress = Callable[[str], None]
log = logging.getLogger(__name__)


def gguf_tokenizer(path: Path, progress: Progress | None = None):
    """The tokenizer of a GGUF file, built from it once and then read from the cache."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_tokenizer_folder(path, progress)))


def gguf_tokenizer_folder(path: Path, progress: Progress | None = None) -> Path:
    """The cache's folder of a GGUF file's tokenizer, built from the file the first time (one an
    earlier SpecDeck built gets its added tokens listed now)."""
    folder = conversion_folder(path).with_name(conversion_folder(path).name + TOKENIZER_SUFFIX)
    if not (folder / "tokenizer_config.json").is_file():
        if progress:
            progress(f"Reading the tokenizer of {path.name} (once)")
        try:
            tokenizer = _read_gguf_tokenizer(path)
        except Exception as error:  # the gguf reader raises many types on a damaged file
            raise unreadable_gguf(path, error, part="tokenizer") from error
        with building_folder(folder, replace_unmarked=True) as staging:  # an entry of the cache's own
            tokenizer.save_pretrained(staging)
            _list_added_tokens(staging)
    else:
        try:
            _list_added_tokens(folder)
        except (OSError, ValueError, KeyError, SpecDeckError) as error:  # a read-only cache, say: loads as it is
            log.info("the added tokens of %s were not listed in its config: %s", folder, error)
    return folder


def _list_added_tokens(folder: Path) -> None:
    """Write `tokenizer.json`'s added tokens (the control tokens) into `tokenizer_config.json` as
    `added_tokens_decoder`, the form transformers saves for its slow tokenizers: a load then takes
    them from there, where it would otherwise parse the whole `tokenizer.json` in Python to find them
    before the Rust tokenizer parses it again, at every launch."""
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if "added_tokens_decoder" in config:
        return
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens", [])
    config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
    write_text(config_file, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


# Architectures whose tokenizer `AutoTokenizer` builds with the generic fast class (no class of their
# own in transformers' table): for them that class reads the file directly, the same files result
# (tests/engine/loading/test_gguf_tokenizer.py), and the model's configuration is not parsed.
GENERIC_TOKENIZER_ARCHITECTURES = frozenset({"llama"})


def _read_gguf_tokenizer(path: Path):
    """The tokenizer a GGUF file describes, as transformers builds it. `AutoTokenizer` first parses the
    file's whole configuration with gguf-py's reader (seconds on a first launch: every string of the
    vocabulary on its own) only to choose the tokenizer's class; where that class is the generic one,
    it is taken at once."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        architecture = read_gguf(path).fields.get("general.architecture")
    except UnreadableHeader:
        architecture = None  # transformers' reader names what is wrong with the file
    if architecture in GENERIC_TOKENIZER_ARCHITECTURES:
        return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
