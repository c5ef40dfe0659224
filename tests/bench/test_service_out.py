"""`bench --out`: results written into the folder the user names, a mount point too, and an
earlier complete result never replaced by a cancelled run's partial one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tiny import build_pair, write_two_prompts

from specdeck.bench.prompts import read_prompts
from specdeck.bench.runner import BenchSettings
from specdeck.bench.service import check_results_folder, run_and_write
from specdeck.engine.atomic import MANIFEST
from specdeck.engine.config import DecodeConfig
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pairs

ROOT = Path(__file__).resolve().parents[3]
CONTEXT = {"command": "test", "target": "tiny", "device": "cpu", "dtype": "float32", "prompts": "p"}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return build_pair(tmp_path_factory.mktemp("models"), "llama", noise=0.3)[0]


@pytest.fixture(scope="module")
def pairs(target):
    return load_pairs([PairSpec(str(target), None, "prompt-lookup", device="cpu")])


def _bench(pairs, prompts: Path, out: Path, cancel_after: int | None = None, overwrite: bool = False):
    settings = BenchSettings(ks=(1,), baselines=("plain",), repeats=1, decode=DecodeConfig(k=1, max_new_tokens=8))
    cancel = threading.Event()

    def progress(done: int, total: int, label: str) -> None:
        if cancel_after is not None and done >= cancel_after:
            cancel.set()

    return run_and_write(
        pairs,
        read_prompts(prompts),
        settings,
        out,
        CONTEXT,
        plots=False,
        progress=progress,
        cancel=cancel,
        overwrite=overwrite,
    )


def _contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def test_results_go_into_the_folder_and_keep_what_else_it_holds(pairs, tmp_path):
    """The --out folder itself stays (same folder, as a mount point must), a file of the user's in it
    (written there with --overwrite) is kept, and the results are in it, with no temporary file left."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    inode = out.stat().st_ino
    check_results_folder(out, print, overwrite=True)
    written = _bench(pairs, write_two_prompts(tmp_path / "p.jsonl"), out, overwrite=True)
    assert written.folder == out and out.stat().st_ino == inode
    assert sorted(os.listdir(out)) == sorted(["notes.txt", MANIFEST, *written.files])
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine" and "summary.csv" in written.files


def test_a_cancelled_run_writes_beside_an_earlier_complete_one(pairs, tmp_path):
    """Cancelled after the first prompt, over a complete result: the earlier files are unchanged, the
    partial ones are in a new folder inside --out and say they were cancelled."""
    out, prompts = tmp_path / "out", write_two_prompts(tmp_path / "p.jsonl")
    _bench(pairs, prompts, out)
    earlier = _contents(out)
    written = _bench(pairs, prompts, out, cancel_after=2)
    assert 0 < len(written.summary) and written.folder.parent == out and written.folder.name.startswith("cancelled-")
    assert _contents(out) == earlier
    assert "Cancelled after 1 of 2 prompts" in (written.folder / "report.md").read_text(encoding="utf-8")


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


MOUNTED = """
set -e
mount --bind "$1" "$2"
"$3" -m specdeck.cli.main "${@:4}" --out "$2" 2>&1 || echo "specdeck exited $?"
echo "READ-ONLY NOW"
mount -o remount,bind,ro "$2"
"$3" -m specdeck.cli.main "${@:4}" --out "$2" 2>&1 || echo "specdeck exited $?"
"""


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` to make a mount point without privileges")
def test_bench_out_on_a_mount_point(target, tmp_path):
    """`bench --out` on a mount point writes its results there; on a read-only one it is refused
    before any model loads."""
    source, mount = tmp_path / "volume", tmp_path / "mnt"
    source.mkdir()
    mount.mkdir()
    argv = ["bench", "--target", str(target), "--drafter", "prompt-lookup", "--prompts"]
    argv += [str(write_two_prompts(tmp_path / "p.jsonl")), "--k", "1", "--repeats", "1", "--max-new-tokens", "8"]
    argv += ["--baselines", "plain", "--device", "cpu", "--no-plots"]
    done = subprocess.run(
        ["unshare", "-rm", "bash", "-c", MOUNTED, "bash", str(source), str(mount), sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    writable, _, read_only = done.stdout.partition("READ-ONLY NOW")
    assert f"Wrote {mount}/" in writable and "specdeck exited" not in writable, done.stdout + done.stderr
    assert sorted(os.listdir(source)) == [MANIFEST, "k_sweep.csv", "per_prompt.csv", "report.md", "summary.csv"]
    assert f"Cannot write results to {mount}: Read-only file system" in read_only
    assert "specdeck exited 2" in read_only and "Loading" not in read_only
