"""The size ladder's files: random weights of the asked shape that llama.cpp loads and runs, with
the built-in file's tokenizer, built once and then taken from the cache."""

import pytest
import torch

from specdeck.bench import size_ladder
from specdeck.bench.ladder_files import LadderShape, ladder_file
from specdeck.engine.forward.llamacpp_backend import LlamaCppForward, LlamaCppModel, library
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_TARGET

pytestmark = pytest.mark.skipif(library() is None, reason="llama-cpp-python is not installed (`make` builds it)")

TINY = LadderShape("tiny", hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2)


def test_a_ladder_file_has_its_shape_and_runs_on_llama_cpp(tmp_path, monkeypatch):
    """A tiny Q8_0 ladder file loads in llama.cpp with the asked sizes, holds every matrix in the
    asked shape and the built-in tokenizer, gives finite logits, and a second call reuses it."""
    from gguf import GGUFReader

    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    path = ladder_file(TINY, "Q8_0", progress=lambda line: None)
    model = LlamaCppModel(path)
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.file_type) == (256, 2, "Q8_0")
    reader = GGUFReader(path)
    builtin = GGUFReader(BUILTIN_MODELS[DEFAULT_TARGET].path())
    shapes = {t.name: tuple(int(size) for size in reversed(t.shape)) for t in reader.tensors}
    assert shapes == dict(TINY.matrices(model.vocab_width))
    assert reader.fields["llama.attention.head_count_kv"].contents() == 2
    assert reader.fields["tokenizer.ggml.tokens"].contents() == builtin.fields["tokenizer.ggml.tokens"].contents()
    logits = LlamaCppForward(model).logits(torch.tensor([1, 2, 3]), last_only=False)
    assert logits.shape == (3, model.vocab_width) and torch.isfinite(logits).all()
    built = path.stat().st_mtime_ns
    assert ladder_file(TINY, "Q8_0", progress=lambda line: None) == path
    assert path.stat().st_mtime_ns == built
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the float16 file is gone


def test_an_unknown_size_is_named_with_the_known_ones(capsys):
    """--sizes 70b is refused in one line that lists the sizes the ladder has."""
    with pytest.raises(SystemExit):
        size_ladder.main(["--sizes", "70b", "--out", "unused"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--sizes takes any of 360m, 1.7b, 3b" in error and "70b" in error
