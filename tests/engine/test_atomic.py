"""Nothing lost: a write is whole or absent, an interrupted one heals, a folder is swapped in whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specdeck.engine.atomic import building_folder, filling_folder, remove_abandoned, write_text, write_with
from specdeck.engine.errors import SpecDeckError

ROOT = Path(__file__).resolve().parents[2]


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    """A save that fails half-way leaves the earlier file as it was and no temporary file."""
    path = tmp_path / "rounds.csv"
    write_text(path, "old\n")

    def half_then_fail(temporary: Path) -> None:
        temporary.write_text("new but unfinis", encoding="utf-8")
        raise ValueError("disk on fire")

    with pytest.raises(ValueError):
        write_with(path, half_then_fail)
    assert path.read_text(encoding="utf-8") == "old\n" and os.listdir(tmp_path) == ["rounds.csv"]


def test_folder_swapped_in_whole_or_not_at_all(tmp_path):
    """An earlier results folder stays whole while a new one fails; a finished one replaces it."""
    out = tmp_path / "out"
    with building_folder(out) as staging:
        (staging / "a.csv").write_text("1", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt), building_folder(out) as staging:
        (staging / "b.csv").write_text("2", encoding="utf-8")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["out"] and _visible(out) == ["a.csv"]
    with building_folder(out) as staging:
        (staging / "c.csv").write_text("3", encoding="utf-8")
    assert os.listdir(tmp_path) == ["out"] and _visible(out) == ["c.csv"]


def test_folder_filled_in_place_keeps_the_earlier_files_until_complete(tmp_path):
    """Filling a folder (a mount point cannot be swapped): a failed fill leaves it as it was, a
    finished one replaces the files it names, drops its own stale ones and keeps the user's."""
    out = tmp_path / "out"
    with filling_folder(out, replaces=("a.csv", "a.png")) as staging:
        (staging / "a.csv").write_text("old", encoding="utf-8")
        (staging / "a.png").write_text("old plot", encoding="utf-8")
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt), filling_folder(out, ("a.csv", "a.png"), overwrite=True) as staging:
        (staging / "a.csv").write_text("new", encoding="utf-8")
        raise KeyboardInterrupt
    assert _visible(out) == ["a.csv", "a.png", "notes.txt"]
    assert (out / "a.csv").read_text(encoding="utf-8") == "old"
    with filling_folder(out, replaces=("a.csv", "a.png"), overwrite=True) as staging:
        (staging / "a.csv").write_text("new", encoding="utf-8")
    assert _visible(out) == ["a.csv", "notes.txt"] and (out / "a.csv").read_text(encoding="utf-8") == "new"


def test_unwritable_target_is_a_clear_error(tmp_path):
    """Writing below a file names the path and the reason."""
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(SpecDeckError, match="Cannot write .*file/out"):
        write_text(blocker / "out", "data")


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from specdeck.engine.atomic import building_folder, write_with
    kind, target = sys.argv[1], Path(sys.argv[2])
    def slow(path):
        path.write_text("half", encoding="utf-8")
        print("writing", flush=True)
        time.sleep(60)
    if kind == "file":
        write_with(target, slow)
    else:
        with building_folder(target) as staging:
            slow(staging / "summary.csv")
""")


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_killed_writer_leaves_the_old_version_and_the_next_run_heals(tmp_path, kind):
    """SIGKILL mid-write: the old export or results folder is intact, nothing partial is visible,
    and the next writer removes the hidden leftover with a notice."""
    target = tmp_path / ("rounds.csv" if kind == "file" else "out")
    if kind == "file":
        write_text(target, "old")
    else:
        with building_folder(target) as staging:
            (staging / "summary.csv").write_text("old", encoding="utf-8")
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout.readline() == "writing\n"
        child.send_signal(signal.SIGKILL)
    assert _visible(tmp_path) == [target.name]
    assert (target if kind == "file" else target / "summary.csv").read_text(encoding="utf-8") == "old"
    notices: list[str] = []
    assert remove_abandoned(tmp_path, notices.append) and f"process {child.pid}" in notices[0]
    assert os.listdir(tmp_path) == [target.name]


def test_a_live_writers_partial_entry_is_left_alone(tmp_path):
    """Healing never removes what a running process is still writing."""
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, "folder", str(tmp_path / "out")], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout.readline() == "writing\n"
            assert remove_abandoned(tmp_path) == [] and len(os.listdir(tmp_path)) == 1
        finally:
            child.kill()
    assert len(remove_abandoned(tmp_path)) == 1


def test_a_swap_killed_half_way_gets_the_earlier_folder_back(tmp_path):
    """Killed between setting the old results aside and moving the new ones in: healing restores the old."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    aside = tmp_path / f".out.old-{int(dead.stdout)}-x" / "out"
    aside.mkdir(parents=True)
    (aside / "summary.csv").write_text("old", encoding="utf-8")
    remove_abandoned(tmp_path)
    assert os.listdir(tmp_path) == ["out"] and (tmp_path / "out" / "summary.csv").read_text(encoding="utf-8") == "old"
