"""`specdeck cache`: what converted models SpecDeck keeps, their size, clearing, healing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdeck.cli.main import main
from specdeck.engine.atomic import write_with


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    folder = tmp_path / "gguf"
    (folder / "model-abc").mkdir(parents=True)
    (folder / "model-abc" / "model.safetensors").write_bytes(b"\0" * 2500)
    return folder


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def test_listing_names_entries_and_sizes(cache, capsys):
    """Each entry is listed with its size and state, under the cache folder and its total."""
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"{cache}: 2.5 kB in 1 entry" in out and "model-abc  (complete)" in out


def test_entries_of_a_vanished_writer_are_removed_with_a_notice(cache, capsys):
    """A conversion whose process died is removed at the next start, and the user is told."""
    pid = _dead_pid()
    partial = cache / f".model-def.partial-{pid}-x1"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 10)
    assert main(["cache"]) == 0
    captured = capsys.readouterr()
    assert not partial.exists() and f"left incomplete by process {pid}" in captured.err
    assert "1 entry" in captured.out


def test_clear_removes_every_entry(cache, capsys):
    """`specdeck cache --clear` empties the cache and says how much it freed."""
    assert main(["cache", "--clear"]) == 0
    assert "Removed 1 entry (2.5 kB)" in capsys.readouterr().out and list(cache.iterdir()) == []


def _kernel(cache_root: Path, name: str = "row_kernel-abc.so") -> Path:
    library = cache_root / "kernels" / name
    library.parent.mkdir()
    write_with(library, lambda path: path.write_bytes(b"\x7fELF" + b"\0" * 996), record=True)
    return library


def test_listing_names_kernels_and_damaged_ones(cache, capsys):
    """`specdeck cache` lists the compiled kernels with their sizes and says which one is damaged."""
    library = _kernel(cache.parent)
    assert main(["cache"]) == 0
    assert "row_kernel-abc.so  (complete)" in capsys.readouterr().out
    library.write_bytes(b"\x7fELF" + b"\1" * 996)
    assert main(["cache"]) == 0
    assert "row_kernel-abc.so  (damaged: its bytes differ from those written" in capsys.readouterr().out


def test_clear_removes_kernels_and_what_killed_writes_left_anywhere(cache, capsys):
    """`cache --clear` removes compiled kernels and the temporary files of writes killed anywhere in
    the cache, with a notice for each leftover; a write still under way is kept."""
    library = _kernel(cache.parent)
    dead, alive = _dead_pid(), os.getpid()
    killed_build = library.parent / f".{library.name}.partial-{dead}-x1.tmp"
    killed_cost = cache.parent / "costs" / f".curve.json.partial-{dead}-x2.tmp"
    under_way = cache.parent / "costs" / f".other.json.partial-{alive}-x3.tmp"
    killed_cost.parent.mkdir()
    for path in (killed_build, killed_cost, under_way):
        path.write_bytes(b"half")
    assert main(["cache"]) == 0
    captured = capsys.readouterr()
    assert not killed_build.exists() and not killed_cost.exists()
    assert f"{killed_build}, left incomplete by process {dead}" in captured.err and str(killed_cost) in captured.err
    assert f"costs/{under_way.name}  (being written by process {alive})" in captured.out
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert "Removed 1 compiled kernel from" in out and os.listdir(library.parent) == []
    assert f"Kept {under_way}: being written by process {alive}." in out


def test_clear_leaves_no_file_but_what_a_live_process_is_writing(cache, capsys):
    """`cache --clear` removes every measured cost with its record of size and digest, and the
    training commands' data written in the cache (listed by `specdeck cache` first); a training
    folder a live process is writing in stays, named."""
    costs = cache.parent / "costs"
    costs.mkdir()
    write_with(
        costs / "curve-abc.json", lambda path: path.write_text('{"tokens": [1], "forward_ms": [3.0]}'), record=True
    )
    texts = cache.parent / "teacher-head" / "smollm2"
    texts.mkdir(parents=True)
    (texts / "shard-0.pt").write_bytes(b"\0" * 1500)
    running = cache.parent / "cross-draft" / "smollm2"
    running.mkdir(parents=True)
    (running / f".checkpoint.pt.partial-{os.getpid()}-x1.tmp").write_bytes(b"half")
    assert main(["cache"]) == 0
    assert f"1.5 kB  {cache.parent / 'teacher-head'}" in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert list(costs.iterdir()) == [] and not (cache.parent / "teacher-head").exists()
    assert f"Removed {cache.parent / 'teacher-head'} (1.5 kB): training data" in out
    assert running.is_dir() and f"Kept {cache.parent / 'cross-draft'}: training data that process {os.getpid()}" in out
