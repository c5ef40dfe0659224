"""`specdeck cache`: what converted models SpecDeck keeps, their size, clearing, healing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdeck.cli.main import main


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
