"""The one way SpecDeck writes files: whole or not at all.

A file is written beside its target under a hidden temporary name, flushed and fsynced, then
moved into place with `os.replace`, which POSIX and Windows both make atomic within a folder. A
folder of results (a benchmark's `--out`, a GGUF cache entry) is built under a hidden temporary
name and swapped in whole once complete, so a reader sees the earlier folder or the new one, never
a mixture, and a killed process leaves only hidden `.NAME.partial-PID-...` entries behind.

Those names carry the writer's process id: `remove_abandoned` deletes the ones whose process is
gone (a later run of any SpecDeck command heals what a killed one left).

A folder SpecDeck writes results into holds `MANIFEST`, the names it wrote there: SpecDeck
overwrites or deletes only those, and refuses a folder holding other files unless told to
(`check_own_folder`); a folder it builds whole replaces only one that it built. A folder a
training run keeps its state in over many starts holds `RUN_MARK` once the run has claimed it
(`claim_folder`).

A file written with `record=True` gets its size and SHA-256 beside it (`PATH.sha256`), so that a
reader can tell a damaged copy (`recorded_damage`) before trusting it, as before loading a library.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeck.engine.errors import SpecDeckError

_LEFTOVER = re.compile(r"^\..+\.(partial|old)-(\d+)-")
MANIFEST = ".specdeck-files"  # in a folder SpecDeck wrote into: one name a line of what it wrote there
_MANIFEST_LIMIT = 1 << 20  # bytes read of a manifest; SpecDeck's own are a few hundred
RUN_MARK = ".specdeck-run"  # in a folder a training run claimed: its state, written again on every start


def output_path(text: str, option: str = "--out") -> Path:
    """The folder or file a user named for SpecDeck's output; an empty name (which would be the
    current folder) raises SpecDeckError."""
    if not text.strip():
        raise SpecDeckError(f"{option} is empty: name a folder for the results (use {option} . for this one).")
    return Path(text).expanduser()


def written_here(folder: Path) -> set[str]:
    """The names SpecDeck's manifest in `folder` lists as written by it (none without one)."""
    try:
        with (folder / MANIFEST).open("rb") as handle:
            text = handle.read(_MANIFEST_LIMIT).decode("utf-8", errors="replace")
    except OSError:
        return set()
    return {line for line in text.splitlines() if line and "/" not in line}


def _note_written(folder: Path, names: Iterable[str]) -> None:
    """Add `names` to the manifest of `folder`, dropping those no longer there."""
    listed = {name for name in written_here(folder) | set(names) if (folder / name).exists()}
    write_text(folder / MANIFEST, "".join(f"{name}\n" for name in sorted(listed)))


def foreign_files(folder: Path) -> list[str]:
    """The names in `folder` SpecDeck did not write: neither in its manifest, nor hidden (its
    manifest, writes under way), nor a folder with a manifest of its own."""
    if not folder.is_dir():
        return []
    ours = written_here(folder)
    return sorted(
        path.name
        for path in folder.iterdir()
        if path.name not in ours and not path.name.startswith(".") and not (path / MANIFEST).is_file()
    )


def check_own_folder(folder: Path, overwrite: bool = False, flag: str = "--overwrite") -> None:
    """Refuse (SpecDeckError) to write results into a folder that holds files SpecDeck did not
    write, unless `overwrite`: a typo in --out must never cost a user's files."""
    others = foreign_files(folder)
    if others and not overwrite:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise SpecDeckError(
            f"{folder} holds files SpecDeck did not write ({shown}): choose a new or empty folder, "
            f"or pass {flag} to write there anyway (files of the same names are replaced)."
        )


def claim_folder(
    folder: str | os.PathLike, state: Iterable[str], overwrite: bool = False, flag: str = "--overwrite"
) -> Path:
    """Make `folder` a run's own: a run that writes its state there over many starts (training),
    under the names matching the glob patterns `state`. A new or empty folder, or one claimed
    before, is marked and returned; one holding only the run's state (an earlier run's, or a
    state the user put there to resume) is claimed too; one holding anything else is refused
    (SpecDeckError) unless `overwrite`, before anything is written: the run would mix its files
    with a user's. The folder is made and proven writable (`check_writable_folder`)."""
    folder = Path(folder)
    patterns = tuple(state)
    if not (folder / RUN_MARK).is_file():
        others = [name for name in foreign_files(folder) if not any(fnmatch.fnmatchcase(name, p) for p in patterns)]
        if others and not overwrite:
            shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
            raise SpecDeckError(
                f"{folder} holds files a training run does not write ({shown}): choose a new or empty "
                f"folder, or pass {flag} to write the run's files there anyway."
            )
    check_writable_folder(folder)
    if not (folder / RUN_MARK).is_file():
        write_text(folder / RUN_MARK, "")
    return folder


def _prefix(target: Path, kind: str = "partial") -> str:
    return f".{target.name}.{kind}-{os.getpid()}-"


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _fsync_folder(folder: Path) -> None:
    """Make a rename inside `folder` durable (a no-op where folders cannot be opened, as on Windows)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_with(path: str | os.PathLike, save: Callable[[Path], object], record: bool = False) -> None:
    """Let `save` write a file (torch.save, safetensors, savefig) under a temporary name beside
    `path`, then put it in place whole; or raise and leave `path` as it was. `record`: then write
    the file's size and digest beside it (`record_path`)."""
    target = Path(path)
    try:
        descriptor, name = tempfile.mkstemp(dir=target.parent, prefix=_prefix(target), suffix=".tmp")
        os.close(descriptor)
    except OSError as error:
        raise SpecDeckError(f"Cannot write {target}: {error.strerror or error}.") from error
    temporary = Path(name)
    try:
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it private; give it a normal file's mode
        save(temporary)
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        written = _fingerprint(temporary) if record else ""
        os.replace(temporary, target)
    except BaseException as error:  # Ctrl-C too: never leave the temporary file behind
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise SpecDeckError(f"Cannot write {target}: {error.strerror or error}.") from error
        raise
    _fsync_folder(target.parent)
    if record:  # after the file: a kill in between leaves a file without a record, which reads as damaged
        write_text(record_path(target), written + "\n")


def record_path(path: Path) -> Path:
    """Where the size and digest of a file written with `record=True` are kept."""
    return path.with_name(path.name + ".sha256")


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"{path.stat().st_size} {digest.hexdigest()}"


def recorded_damage(path: Path) -> str | None:
    """Why the file at `path` is not the one written with `record=True` (no record, another size or
    other bytes), or None where its size and digest are those recorded."""
    try:
        recorded = record_path(path).read_text(encoding="utf-8").split()
        size, _ = recorded
    except FileNotFoundError:
        return "its record of size and digest is missing"
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return f"its record cannot be read ({error})"
    try:
        actual = _fingerprint(path)
    except OSError as error:
        return f"it cannot be read ({error.strerror or error})"
    if actual.split()[0] != size:
        return f"{actual.split()[0]} bytes where {size} were written"
    if actual != " ".join(recorded):
        return "its bytes differ from those written"
    return None


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` all at once, or raise SpecDeckError and leave `path` as it was."""
    write_with(path, lambda temporary: temporary.write_bytes(data))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` as UTF-8 to `path` all at once, or raise SpecDeckError and leave `path` as it was."""
    write_bytes(path, text.encode("utf-8"))


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):  # files before the folders holding them
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
        else:
            _fsync_folder(path)
    _fsync_folder(folder)


@contextmanager
def building_folder(target: str | os.PathLike, replace_unmarked: bool = False) -> Iterator[Path]:
    """Yield a hidden empty folder beside `target`; when the block ends normally, it replaces
    `target` whole. If the block raises (Ctrl-C included), the new folder is removed and `target`
    stays as it was. The new folder gets a manifest; an existing `target` without one (a folder
    SpecDeck did not build, unless `replace_unmarked`, for the cache's own entries) is refused first.

    A folder cannot be renamed over a non-empty one, so the swap is two renames: the old folder
    steps aside under a hidden name, the new one takes its place, then the old one is deleted. At
    every moment one complete folder exists."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise SpecDeckError(
            f"Cannot write the folder {target}: a file of that name is there. Move it, or choose another place."
        )
    unmarked = target.is_dir() and not (target / MANIFEST).is_file() and any(target.iterdir())
    if unmarked and not replace_unmarked:
        raise SpecDeckError(
            f"Cannot write {target}: it is a folder SpecDeck did not build, which would be replaced. "
            "Move it, or choose another --out."
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=_prefix(target)))
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it private; give it a normal folder's mode
    except OSError as error:
        raise SpecDeckError(f"Cannot write {target}: {error.strerror or error}.") from error
    try:
        yield staging
        _note_written(staging, [path.name for path in staging.iterdir()])
        _fsync_tree(staging)
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(dir=target.parent, prefix=_prefix(target, "old")))
            os.replace(target, old / target.name)
        os.replace(staging, target)
        _fsync_folder(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise SpecDeckError(f"Cannot write {target}: {error.strerror or error}.") from error
        raise


@contextmanager
def filling_folder(target: str | os.PathLike, replaces: Iterable[str] = (), overwrite: bool = False) -> Iterator[Path]:
    """Yield a hidden empty folder inside `target` (made if missing); when the block ends normally,
    each file written there moves into `target` under its own name, and the files named in
    `replaces` that SpecDeck wrote there before but not this time are deleted. If the block raises
    (Ctrl-C included), the hidden folder is removed and `target` stays as it was. A `target` that
    holds files SpecDeck did not write is refused first (`check_own_folder`) unless `overwrite`.

    `target` itself is never renamed, so it may be a mount point; every file is complete before
    the renames start, so old and new files mix only for the moments between them."""
    target = Path(target)
    check_own_folder(target, overwrite)
    try:
        target.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target, prefix=_prefix(target)))
    except OSError as error:
        raise SpecDeckError(f"Cannot write {target}: {error.strerror or error}.") from error
    try:
        yield staging
        _fsync_tree(staging)
        written = sorted(path.name for path in staging.iterdir())
        for name in written:
            os.replace(staging / name, target / name)
        for name in (set(replaces) & written_here(target)) - set(written):
            (target / name).unlink(missing_ok=True)
        _note_written(target, written)
        _fsync_folder(target)
    except OSError as error:
        raise SpecDeckError(f"Cannot write {target}: {error.strerror or error}.") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs (one owned by another user counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def leftover_writer(path: Path) -> int | None:
    """The process id a hidden partial entry's name carries, or None for an ordinary entry."""
    match = _LEFTOVER.match(path.name)
    return int(match.group(2)) if match else None


def abandoned(folder: Path, name: str | None = None) -> list[Path]:
    """Partial entries in `folder` (of the entry `name` only, if given) whose writing process is gone."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if (pid := leftover_writer(path)) is not None
        and not process_alive(pid)
        and (name is None or path.name.startswith(f".{name}."))
    )


def remove_path(path: Path) -> None:
    """Delete a file or a folder tree."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _restore_set_aside(leftover: Path) -> bool:
    """A process killed between a swap's two renames left the earlier folder set aside inside
    `leftover` and no folder in its place: put the earlier one back; say whether it did."""
    name = leftover.name[1:].split(".old-")[0]
    if ".old-" in leftover.name and (leftover / name).is_dir() and not (leftover.parent / name).exists():
        os.replace(leftover / name, leftover.parent / name)
        return True
    return False


def remove_abandoned(folder: Path, notice: Callable[[str], None] | None = None, name: str | None = None) -> list[Path]:
    """Delete what killed writers left in `folder` (of the entry `name` only, if given), telling
    `notice` about each; return the paths."""
    removed = abandoned(folder, name)
    for path in removed:
        restored = _restore_set_aside(path)
        remove_path(path)
        if notice:
            notice(
                f"Put back {path.parent / path.name[1:].split('.old-')[0]}, set aside by process "
                f"{leftover_writer(path)}, which is gone"
                if restored
                else f"Removed {path}, left incomplete by process {leftover_writer(path)}, which is gone"
            )
    return removed


def check_writable_folder(folder: str | os.PathLike) -> Path:
    """Create `folder` (and its parents) and prove a file can be made in it, where results will be
    written; else raise SpecDeckError naming the folder and the reason. Called before any slow
    work, so a typo or a read-only mount costs nothing."""
    folder = Path(folder)
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise SpecDeckError(f"Cannot write results to {folder}: {blocker} is a file, not a folder.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(dir=folder, prefix=_prefix(folder), suffix=".tmp")
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise SpecDeckError(f"Cannot write results to {folder}: {error.strerror or error}.") from error
    return folder
