"""SpecDeck deletes and overwrites only what it wrote: a cache folder pointed at a user's folder,
an empty or relative setting, a results folder holding a user's files."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeck.bench.service import RESULT_FILES
from specdeck.cli.main import main
from specdeck.engine.atomic import building_folder, claim_folder, filling_folder
from specdeck.engine.cache import CLEARED, MARKER, TRAINING
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.export import TOKEN_COLUMNS, RunInfo, SessionRecord, export_paths, export_sessions
from specdeck.train import RUN_STATE, STORE_STATE

EXAMPLES = settings(max_examples=25, deadline=None, database=None)

# a user's names: anything a file system takes, SpecDeck's own (its folders, its results) included
user_names = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\:"), min_size=1, max_size=20
).filter(lambda name: name not in (".", "..") and not name.startswith(".") and len(name.encode()) < 200)
user_tree = st.dictionaries(
    st.tuples(user_names, st.none() | user_names | st.sampled_from([*CLEARED, *TRAINING])).map(
        lambda parts: "/".join(p for p in parts if p)
    ),
    st.binary(max_size=64),
    min_size=1,
    max_size=6,
)


def _plant(root: Path, tree: dict[str, bytes]) -> dict[Path, bytes]:
    """Write the user's files under `root`; return them (a name drawn twice, as file and folder, once)."""
    planted: dict[Path, bytes] = {}
    for name, data in tree.items():
        path = root / name
        if any(p in planted for p in path.parents) or any(path in p.parents for p in planted):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        planted[path] = data
    return planted


def _intact(planted: dict[Path, bytes]) -> bool:
    return all(path.is_file() and path.read_bytes() == data for path, data in planted.items())


@EXAMPLES
@given(tree=user_tree)
def test_clearing_a_cache_set_to_a_users_folder_keeps_every_file(tree):
    """`cache --clear` with SPECDECK_CACHE at a folder of a user's files (top-level names other
    than SpecDeck's) removes none of them, and says why in one line."""
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        root = Path(folder)
        planted = _plant(
            root, {name: data for name, data in tree.items() if name.split("/")[0] not in (*CLEARED, *TRAINING)}
        )
        if not planted:
            return
        patch.setenv("SPECDECK_CACHE", str(root))
        main(["cache", "--clear"])
        assert _intact(planted)


@pytest.mark.parametrize("value", ["", " ", "cache", "./here", "../up"])
def test_an_empty_or_relative_cache_setting_is_refused_before_anything(value, tmp_path, monkeypatch, capsys):
    """SPECDECK_CACHE empty or relative (it would follow the current folder) is refused in one line
    naming the setting, and the current folder's files are left alone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "notes.txt").write_text("mine")
    monkeypatch.setenv("SPECDECK_CACHE", value)
    assert main(["cache", "--clear"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdeck: error: SPECDECK_CACHE") and len(err.splitlines()) == 1
    assert (tmp_path / "project" / "notes.txt").read_text() == "mine"


def test_clearing_the_cache_keeps_what_a_user_put_beside_its_folders(tmp_path, monkeypatch, capsys):
    """In a cache SpecDeck made (its marker), --clear empties its own folders and leaves others."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path / "cache"))
    assert main(["cache"]) == 0 and (tmp_path / "cache" / MARKER).is_file()
    (tmp_path / "cache" / "costs").mkdir()
    (tmp_path / "cache" / "costs" / "curve.json").write_text("{}")
    (tmp_path / "cache" / "photos").mkdir()
    (tmp_path / "cache" / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    assert main(["cache", "--clear"]) == 0
    assert not (tmp_path / "cache" / "costs" / "curve.json").exists()
    assert (tmp_path / "cache" / "photos" / "cat.jpg").read_bytes() == b"\xff\xd8"


@EXAMPLES
@given(tree=user_tree, names=st.lists(st.sampled_from(RESULT_FILES), unique=True))
def test_results_never_land_in_a_folder_of_a_users_files(tree, names):
    """Writing results (a benchmark's files, the window's export) into a folder holding a user's
    files is refused and leaves every one of them as it was, whatever their names."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        planted = _plant(out, {**tree, **{name: b"user's " + name.encode() for name in names}})
        with pytest.raises(SpecDeckError, match="SpecDeck did not write"):
            with filling_folder(out, replaces=RESULT_FILES) as staging:
                for name in RESULT_FILES:
                    (staging / name).write_text("results")
        with pytest.raises(SpecDeckError, match="SpecDeck did not build"):
            with building_folder(out) as staging:
                (staging / "model.safetensors").write_text("weights")
        assert _intact(planted)


def test_a_second_benchmark_replaces_only_its_own_files(tmp_path):
    """Results written over SpecDeck's earlier ones drop its stale files; with --overwrite in a
    user's folder, a user's file of a result's name is replaced but no other is deleted."""
    out = tmp_path / "out"
    with filling_folder(out, replaces=RESULT_FILES) as staging:
        (staging / "report.md").write_text("1")
        (staging / "k_sweep.png").write_text("plot")
    with filling_folder(out, replaces=RESULT_FILES) as staging:
        (staging / "report.md").write_text("2")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["report.md"]
    user = tmp_path / "mine"
    user.mkdir()
    (user / "k_sweep.png").write_text("my plot")
    (user / "summary.csv").write_text("my table")
    with filling_folder(user, replaces=RESULT_FILES, overwrite=True) as staging:
        (staging / "summary.csv").write_text("results")
    assert (user / "k_sweep.png").read_text() == "my plot" and (user / "summary.csv").read_text() == "results"


@pytest.mark.parametrize("out", ["", "  "])
def test_bench_with_an_empty_out_is_refused_before_any_model(out, tmp_path, monkeypatch, capsys):
    """`specdeck bench --out ""` (which would be the current folder) is one line, nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.md").write_text("mine")
    assert main(["bench", "--out", out]) == 2
    assert "--out is empty" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["report.md"] and (tmp_path / "report.md").read_text() == "mine"


def test_bench_into_a_users_folder_is_refused_unless_overwrite(tmp_path, capsys):
    """`specdeck bench --out DIR` where DIR holds a user's files stops before loading a model and
    names --overwrite."""
    (tmp_path / "summary.csv").write_text("mine")
    assert main(["bench", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "SpecDeck did not write (summary.csv)" in err and "--overwrite" in err
    assert (tmp_path / "summary.csv").read_text() == "mine"


# every command that trains or grows training data, with the flags that make it quick to refuse
TRAINING_COMMANDS = {
    "train-draft": [],
    "train-head": [],
    "distill-head": [],
    "train-cross-draft": ["--answers", "1"],
    "head-data": [],
}


def _state_name(name: str) -> bool:
    top = name.split("/")[0]
    return any(fnmatch.fnmatchcase(top, p) for p in (*RUN_STATE, *STORE_STATE))


@EXAMPLES
@given(tree=user_tree.filter(lambda tree: not any(_state_name(name) for name in tree)))
def test_training_never_writes_into_a_folder_of_a_users_files(tree):
    """Each training command with --out at a folder of a user's files stops before any model is
    loaded, names --overwrite, and leaves every file as it was; nothing is added to the folder."""
    with tempfile.TemporaryDirectory() as folder:
        planted = _plant(Path(folder), tree)
        before = sorted(os.listdir(folder))
        for command, extra in TRAINING_COMMANDS.items():
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                assert main([command, "--out", folder, *extra]) == 2, command
            assert "--overwrite" in err.getvalue(), err.getvalue()
            assert _intact(planted) and sorted(os.listdir(folder)) == before, command


def test_a_training_folder_holding_only_a_runs_state_is_claimed(tmp_path):
    """A folder holding only what a run writes (an answers file unpacked there to resume from) is
    the run's: it is marked, and a user's file added later does not lock the run out."""
    (tmp_path / "answers.pt").write_bytes(b"state")
    assert claim_folder(tmp_path, RUN_STATE) == tmp_path
    (tmp_path / "notes.txt").write_text("mine")
    assert claim_folder(tmp_path, RUN_STATE) == tmp_path
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "answers.pt").read_bytes() == b"state"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SpecDeckError, match="notes.txt"):
        claim_folder(other, RUN_STATE)
    assert claim_folder(other, RUN_STATE, overwrite=True) == other


@EXAMPLES
@given(mine=st.binary(max_size=80), per_token=st.booleans())
def test_a_session_export_never_replaces_a_users_file_beside_the_chosen_one(mine, per_token):
    """Exporting to run.csv (the name the user chose) writes run.meta.json and run.tokens.csv
    beside it: a file of the user's under those names is refused and left as it was; SpecDeck's
    own earlier export there is replaced."""
    info = RunInfo("target", None, None, "cpu", "float32", DecodeConfig(), False, "hi")
    records = [SessionRecord(1, "plain")]
    with tempfile.TemporaryDirectory() as folder:
        chosen = Path(folder) / "run.csv"
        _, meta, tokens = export_paths(chosen)
        theirs = tokens if per_token else meta
        export_sessions(chosen, info, records, per_token=per_token)
        export_sessions(chosen, info, records, per_token=per_token)  # over its own earlier files
        theirs.write_bytes(mine)
        if mine.startswith(b'{\n  "models": ') or mine.startswith(",".join(TOKEN_COLUMNS).encode()):
            return  # as SpecDeck's own export begins
        with pytest.raises(SpecDeckError, match="no export of SpecDeck's"):
            export_sessions(chosen, info, records, per_token=per_token)
        assert theirs.read_bytes() == mine
