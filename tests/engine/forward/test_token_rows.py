"""A GGUF model's token embedding read from the file's blocks on lookup
(`specdeck.engine.forward.token_rows`): the rows have the bits of the whole table's dequantization,
and a model read in place holds no float32 copy of it (nor of any other matrix), nor the file's
pages it has laid out."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny import PACKED_PATHS

from specdeck.engine.forward import token_rows
from specdeck.engine.forward.gguf_index import tensors_of
from specdeck.engine.forward.lean_weights import embedding_weight, output_weight, restore, weights_of
from specdeck.engine.forward.row_kernel import release_pages
from specdeck.engine.forward.token_rows import TokenRows
from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.models import LoadOptions, load_model
from specdeck.engine.loading.registry import DEFAULT_TARGET

gguf = pytest.importorskip("gguf")
needs_kernel = pytest.mark.skipif("kernel" not in PACKED_PATHS, reason="the row kernel does not build here")


def test_looked_up_rows_have_the_bits_of_the_whole_table(monkeypatch):
    """Rows looked up in any order, repeated, kept from earlier lookups or pushed out of the kept
    ones, and more at once than are kept, equal the whole table's rows bit for bit."""
    tensor = tensors_of(gguf_file(DEFAULT_TARGET))["token_embd.weight"]
    table = torch.from_numpy(gguf.dequantize(np.asarray(tensor.data), tensor.tensor_type).copy())
    monkeypatch.setattr(token_rows, "KEPT_BYTES", 6 * 4 * table.shape[1])  # 6 rows kept
    rows = TokenRows(tensor)
    for ids in ([5], [7, 5, 5, 49151], [[1, 2], [3, 4]], [9, 8, 7, 6, 5, 4, 3, 2], [5, 7], []):
        ids = torch.tensor(ids, dtype=torch.long)
        assert torch.equal(rows(ids), table[ids])
    assert torch.equal(rows.dense(), table)
    with pytest.raises(IndexError):
        rows(torch.tensor([table.shape[0]]))


@needs_kernel
def test_a_model_read_in_place_holds_no_float32_matrix():
    """The built-in target read in place keeps every matrix, the embedding too, in its file's blocks:
    no parameter holds more than a norm's values, and the tied output matrix and the embedding come
    back from the blocks with their values when asked for."""
    loaded = load_model(DEFAULT_TARGET, LoadOptions(device="cpu"))
    model = loaded.model
    weights_of(model)
    largest = max(p.untyped_storage().nbytes() for p in model.parameters())
    assert largest <= 4 * model.config.hidden_size
    tensor = tensors_of(gguf_file(DEFAULT_TARGET))["token_embd.weight"]
    table = torch.from_numpy(gguf.dequantize(np.asarray(tensor.data), tensor.tensor_type).copy())
    assert torch.equal(output_weight(model), table)
    ids = torch.tensor([[1, 330, 2]])
    assert torch.equal(model.get_input_embeddings()(ids), table[ids])
    assert torch.equal(embedding_weight(model), table)  # what training reads of a target
    restore(model)
    assert torch.equal(model.get_input_embeddings().weight, table)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="resident memory is read from Linux's /proc")
def test_pages_of_a_mapped_file_are_dropped_once_read_and_read_again_unchanged(tmp_path):
    """Blocks read through a file's mapping stop counting in the process's resident memory once
    released, and read back the same bytes afterwards; an array of its own is left alone."""
    path = tmp_path / "blocks.bin"
    values = np.random.default_rng(0).integers(0, 256, 32 << 20, dtype=np.uint8)
    values.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")[4096:].reshape(-1, 4096)
    before = int(mapped.sum(dtype=np.int64))  # every page read
    resident = _resident_file_kb()
    release_pages(mapped)
    assert _resident_file_kb() < resident - 16 * 1024
    assert int(mapped.sum(dtype=np.int64)) == before and np.array_equal(mapped.reshape(-1), values[4096:])
    own = values.copy()
    release_pages(own)
    assert np.array_equal(own, values)


def _resident_file_kb() -> int:
    """This process's resident pages of mapped files, in kB."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssFile:"))


def test_q8_0_rows_have_gguf_py_s_bits():
    """A Q8_0 table (the embedding of llama.cpp's requantized SmolLM2 files), read a few rows at a
    time and whole, equals gguf-py's own dequantization bit for bit."""
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    values = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32) * 3
    blocks = gguf.quantize(values, q8_0)
    table = torch.from_numpy(gguf.dequantize(blocks, q8_0).copy())
    rows = TokenRows(SimpleNamespace(data=blocks, shape=(96, 64), tensor_type=q8_0))
    for ids in ([3], [0, 63, 3], [[5, 6], [7, 5]]):
        ids = torch.tensor(ids, dtype=torch.long)
        assert torch.equal(rows(ids), table[ids])
    assert torch.equal(rows.dense(), table)
