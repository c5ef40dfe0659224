"""SpecDeck's feature head and draft attach to the built-in target's model in any file: another
quantization or another name gets the default pair; a file of another shape or tokenizer gets
prompt lookup, and a line that says why."""

import shutil
import struct
from pathlib import Path

import pytest
from tiny import ON_CPU, build_pair

from specdeck.engine import DecodeConfig, TokenEvent
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.backends import gguf_file
from specdeck.engine.loading.identity import gguf_identity
from specdeck.engine.loading.registry import DEFAULT_DRAFT, DEFAULT_HEAD, DEFAULT_TARGET, LAST_STATE_HEAD
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.session import load_pair, run_session

BUILTIN = gguf_file(DEFAULT_TARGET)


def _field(name: str, value: int) -> bytes:
    """A uint32 field of a GGUF header as the file stores it after its key's length."""
    return name.encode() + struct.pack("<II", 4, value)


def edited_copy(folder: Path, name: str, edits: list[tuple[bytes, bytes]]) -> Path:
    """A copy of the built-in file with each (old, new) pair of equal length replaced in its header."""
    data = bytearray(BUILTIN.read_bytes())
    for old, new in edits:
        assert len(old) == len(new) and data.count(old) == 1
        at = data.index(old)
        data[at : at + len(old)] = new
    path = folder / name
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def renamed(folder) -> Path:
    path = folder / "my-smollm2.gguf"
    shutil.copyfile(BUILTIN, path)
    return path


@pytest.fixture(scope="module")
def q8_0(folder) -> Path:
    """The built-in Q4_1 file requantized to Q8_0 by llama.cpp's own quantizer."""
    import ctypes

    llama_cpp = pytest.importorskip("llama_cpp")
    path = folder / "SmolLM2-135M-Instruct.Q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, True, 1
    assert llama_cpp.llama_model_quantize(str(BUILTIN).encode(), str(path).encode(), ctypes.byref(params)) == 0
    return path


@pytest.fixture(scope="module")
def other_shape(folder) -> Path:
    """A file that says it is 960 wide and 32 layers deep (SmolLM2-360M's shape), its tokenizer the built-in's."""
    edits = [
        (_field("llama.embedding_length", 576), _field("llama.embedding_length", 960)),
        (_field("llama.block_count", 30), _field("llama.block_count", 32)),
    ]
    return edited_copy(folder, "SmolLM2-360M-Instruct.Q4_1.gguf", edits)


@pytest.fixture(scope="module")
def other_tokenizer(folder) -> Path:
    """The built-in file with one special token spelt otherwise: every shape the same."""
    return edited_copy(folder, "smollm2-retokenized.gguf", [(b"<gh_stars>", b"<gh_starz>")])


def test_the_same_model_in_another_quantization_or_name_gets_the_default_pair(renamed, q8_0):
    """A renamed copy of the built-in file and a Q8_0 requantization of it are recognized as the
    built-in target's model: no drafter chosen, they get its feature head (on llama.cpp the suffix
    drafter, and the head on the last state where a head is chosen), its draft for the draft-model
    drafter, and no note."""
    for path in (renamed, q8_0):
        assert gguf_identity(path) == gguf_identity(BUILTIN)
        spec = PairSpec(str(path))
        assert spec.resolved() == spec.with_drafter(DrafterKind.FEATURE_HEAD, DEFAULT_HEAD)
        assert spec.resolved("llama.cpp") == spec.with_drafter(DrafterKind.SUFFIX, None)
        assert PairSpec(str(path), drafter="hybrid").resolved("llama.cpp").draft == LAST_STATE_HEAD
        assert PairSpec(str(path), drafter="draft-model").resolved().draft == DEFAULT_DRAFT
        assert spec.default_note() is None


def test_a_file_of_another_shape_or_tokenizer_gets_prompt_lookup_and_says_why(other_shape, other_tokenizer):
    """A file whose shapes or tokenizer differ from the built-in target's gets prompt lookup, and
    the note names what differs; asked for the feature head with no head named, the error says
    why SpecDeck's own does not attach."""
    for path, differs in (
        (other_shape, ["hidden size 960, not 576", "layers 32, not 30"]),
        (other_tokenizer, ["another tokenizer"]),
    ):
        spec = PairSpec(str(path))
        assert spec.resolved() == spec.with_drafter(DrafterKind.PROMPT_LOOKUP, None)
        note = spec.default_note()
        assert note is not None and note.startswith(f"{path.name} gets prompt lookup")
        assert all(difference in note for difference in differs) and "\n" not in note
        with pytest.raises(SpecDeckError, match=differs[0]):
            PairSpec(str(path), drafter="feature-head").resolved()
    assert "another tokenizer" not in PairSpec(str(other_shape)).default_note()


def test_a_users_q8_0_file_drafts_with_the_builtin_head_and_writes_plain_text(q8_0, tmp_path, monkeypatch):
    """Loaded with no drafter chosen, a Q8_0 file of the built-in model (on torch, its weights in
    float32) drafts with SpecDeck's feature head, whose drafts pass, and greedy text equals plain."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))  # the file's conversion goes with the test
    lines: list[str] = []
    spec = PairSpec(str(q8_0), device=ON_CPU.device, dtype=ON_CPU.dtype, backend="torch")
    pair = load_pair(spec, progress=lines.append)
    assert pair.drafter_kind is DrafterKind.FEATURE_HEAD and pair.head.name == DEFAULT_HEAD
    assert pair.note == "" and not any("gets" in line for line in lines)
    config = DecodeConfig(k=1, schedule="constant", lookup=0, max_new_tokens=24)
    prompt = "Explain in simple terms why the sky is blue."
    plain = [e.token_id for e in run_session(pair, prompt, config, plain=True) if isinstance(e, TokenEvent)]
    events = list(run_session(pair, prompt, config))
    assert [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept] == plain
    assert events[-1].accepted > 0


def test_a_target_of_its_own_gets_prompt_lookup_and_the_load_says_why(tmp_path):
    """A model folder is not the built-in target's file: loaded with no drafter chosen it gets
    prompt lookup, and the load's progress and the pair's note say why in one line."""
    target_dir, _ = build_pair(tmp_path, "llama")
    lines: list[str] = []
    pair = load_pair(PairSpec(str(target_dir), device="cpu", dtype="float32"), progress=lines.append)
    assert pair.drafter_kind is DrafterKind.PROMPT_LOOKUP
    assert pair.note.startswith(f"{target_dir} gets prompt lookup") and pair.note in lines


def test_a_file_whose_header_does_not_read_gets_prompt_lookup_and_says_so(tmp_path):
    """A file cut off in its header or in its weights, one whose lengths run past its end and an
    empty one are no file of the built-in model: prompt lookup, and the note says the file cannot
    be compared, with no traceback."""
    cut, short = tmp_path / "cut.gguf", tmp_path / "short.gguf"
    wild, empty = tmp_path / "wild.gguf", tmp_path / "empty.gguf"
    cut.write_bytes(BUILTIN.read_bytes()[:4096])
    short.write_bytes(BUILTIN.read_bytes()[:-1000])  # a download that stopped in its last tensor
    wild.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    empty.write_bytes(b"")
    for path in (cut, short, wild, empty):
        spec = PairSpec(str(path))
        assert spec.resolved().drafter is DrafterKind.PROMPT_LOOKUP
        assert "this file cannot be compared" in spec.default_note()
