"""A GGUF file's tokenizer, read the quick way where its architecture allows, is the tokenizer
transformers' `AutoTokenizer` makes of the file: the same saved files (the config listing the added
tokens too), the same token ids."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.gguf_tokenizer import GENERIC_TOKENIZER_ARCHITECTURES, gguf_tokenizer_folder
from specdeck.engine.loading.registry import DEFAULT_TARGET

BUILTIN = gguf_file(DEFAULT_TARGET)
TEXTS = ["def add(a, b):\n    return a + b", "Ünïcödé  spaces\t\ttabs <|im_start|>user", " leading space", ""]


def files_of(folder: Path) -> dict[str, bytes]:
    """The tokenizer's files (not the manifest SpecDeck keeps beside them)."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if not path.name.startswith(".")}


@pytest.mark.parametrize("architecture", sorted(GENERIC_TOKENIZER_ARCHITECTURES))
def test_the_quick_path_is_taken_only_where_auto_would_take_the_generic_class(architecture):
    # the rule the quick path rests on: transformers gives this architecture no tokenizer class of
    # its own, so `AutoTokenizer` ends at the generic one too (a newer transformers may add one)
    assert TOKENIZER_MAPPING_NAMES.get(architecture) in (None, "TokenizersBackend", "PreTrainedTokenizerFast")


def test_the_built_in_files_tokenizer_is_what_auto_tokenizer_makes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path / "cache"))
    ours = gguf_tokenizer_folder(BUILTIN)
    theirs = tmp_path / "auto"
    reference = AutoTokenizer.from_pretrained(str(BUILTIN.parent), gguf_file=BUILTIN.name)
    reference.save_pretrained(theirs)
    ours_files, their_files = files_of(ours), files_of(theirs)
    # the same files, but that ours list the added tokens in the config too (a load then need not
    # parse tokenizer.json in Python to find them)
    config, their_config = (json.loads(files.pop("tokenizer_config.json")) for files in (ours_files, their_files))
    assert ours_files == their_files
    listed = config.pop("added_tokens_decoder")
    assert config == their_config
    assert {int(i): t["content"] for i, t in listed.items()} == {
        i: t.content for i, t in reference.added_tokens_decoder.items()
    }
    loaded = AutoTokenizer.from_pretrained(str(ours))
    assert loaded.added_tokens_decoder == reference.added_tokens_decoder
    assert loaded.all_special_tokens == reference.all_special_tokens
    for text in TEXTS:
        assert loaded.encode(text) == reference.encode(text)
    chat = [{"role": "user", "content": "Hi"}]
    assert loaded.apply_chat_template(chat, tokenize=False) == reference.apply_chat_template(chat, tokenize=False)


def test_a_tokenizer_an_earlier_version_cached_gets_its_added_tokens_listed(tmp_path, monkeypatch):
    """A cached tokenizer whose config lists no added tokens (as SpecDeck wrote them before) has them
    listed at its next load, and tokenizes as before."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path / "cache"))
    folder = gguf_tokenizer_folder(BUILTIN)
    config_file = folder / "tokenizer_config.json"
    listed = json.loads(config_file.read_text(encoding="utf-8"))
    earlier = {key: value for key, value in listed.items() if key != "added_tokens_decoder"}
    config_file.write_text(json.dumps(earlier), encoding="utf-8")
    before = AutoTokenizer.from_pretrained(str(folder))
    assert gguf_tokenizer_folder(BUILTIN) == folder
    assert json.loads(config_file.read_text(encoding="utf-8")) == listed
    after = AutoTokenizer.from_pretrained(str(folder))
    assert after.added_tokens_decoder == before.added_tokens_decoder
    assert [after.encode(text) for text in TEXTS] == [before.encode(text) for text in TEXTS]
