"""SpecDeck's cache of converted models (`specdeck cache`): what is in it, how big, and healing;
and where the other cached things live (measured costs, past sessions' texts for suffix drafting).

A GGUF file is dequantized once into a safetensors folder under `cache_root()/gguf/` (see
`specdeck.engine.loading.gguf_conversion.convert_gguf`). An entry is built under a hidden name
carrying the writer's process id (`specdeck.engine.atomic`); one whose process is gone was
interrupted, and `heal` removes it. A GGUF file run by llama.cpp keeps only its tokenizer here, in a
folder named `TOKENIZER_SUFFIX`. The row kernel (`specdeck.engine.forward.row_kernel`) is compiled
into `kernels_cache()`, each library beside the record of its size and digest. `heal` and `clear`
also take what killed writes left anywhere in the cache's own and training folders.

The cache deletes only what it wrote: its root is checked at the first use (`cache_root`), and
`clear` empties only the folders SpecDeck names (`CLEARED`, `TRAINING`), in a root SpecDeck made
(`MARKER`) or that holds nothing else (`check_clearable`).
"""

from __future__ import annotations

import functools
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdeck.engine.atomic import (
    leftover_writer,
    process_alive,
    record_path,
    recorded_damage,
    remove_abandoned,
    remove_path,
)
from specdeck.engine.errors import SpecDeckError

Notice = Callable[[str], None]
TOKENIZER_SUFFIX = "-tokenizer"


def cache_root() -> Path:
    """Where SpecDeck keeps what it converts and measures: $SPECDECK_CACHE, else
    $XDG_CACHE_HOME/specdeck, else ~/.cache/specdeck; made (with its marker) and proven writable
    once per process, else SpecDeckError saying which setting to change."""
    if "SPECDECK_CACHE" in os.environ:
        return _checked_root(os.environ["SPECDECK_CACHE"], "SPECDECK_CACHE")
    if os.environ.get("XDG_CACHE_HOME"):
        return _checked_root(os.path.join(os.environ["XDG_CACHE_HOME"], "specdeck"), "XDG_CACHE_HOME")
    home = os.environ.get("HOME")
    if home is not None and (not Path(home).is_absolute() or not Path(home).is_dir()):  # "" would be "/"
        raise SpecDeckError(
            f"HOME ({home!r}) is not a folder, so SpecDeck has no cache folder: set HOME to your home "
            "folder, or SPECDECK_CACHE to a folder for SpecDeck's cache."
        )
    try:
        base = Path.home()
    except RuntimeError as error:  # no HOME and no entry in the password database
        raise SpecDeckError(
            "No home folder is known (HOME is unset), so SpecDeck has no cache folder: set HOME, "
            "or SPECDECK_CACHE to a folder for SpecDeck's cache."
        ) from error
    return _checked_root(str(base / ".cache" / "specdeck"), "HOME")


MARKER = ".specdeck-cache"  # in the cache's root, written when SpecDeck makes it: --clear empties only such a root
CLEARED = ("gguf", "gguf-tensors", "costs", "kernels", "suffix")  # the cache's own folders
TRAINING = ("teacher-head", "cross-draft", "target-texts")  # the training commands' folders, where no --out is given


@functools.cache
def _checked_root(value: str, setting: str) -> Path:
    """The cache folder `value` (from `setting`), made if missing and proven writable, at the first
    use: a read-only or file-shaped path fails here at once, not after a model has loaded."""
    what = f"the cache folder {value!r} (from {setting})"
    if not value.strip():
        raise SpecDeckError(f"{setting} is empty: set it to a folder for SpecDeck's cache, or unset it.")
    root = Path(value).expanduser()
    if not root.is_absolute():  # it would follow the current folder, and --clear with it
        raise SpecDeckError(
            f"{setting} is a relative path ({value!r}): give an absolute path, such as {root.absolute()}."
        )
    blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise SpecDeckError(f"Cannot use {what}: {blocker} is a file. Set SPECDECK_CACHE to a folder.")
    try:
        fresh = not root.exists() or not any(root.iterdir())
        root.mkdir(parents=True, exist_ok=True)
        if fresh or (root.name == "specdeck" and setting != "SPECDECK_CACHE"):  # a folder SpecDeck made or names
            (root / MARKER).touch()
        descriptor, probe = tempfile.mkstemp(dir=root, prefix=".probe-", suffix=".tmp")
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise SpecDeckError(
            f"Cannot use {what}: {error.strerror or error}. Set SPECDECK_CACHE to a folder you can write."
        ) from error
    return root


def foreign_entries(root: Path) -> list[str]:
    """The names in the cache's root that are not SpecDeck's (its own and training folders, its
    marker, writes under way)."""
    ours = {*CLEARED, *TRAINING, MARKER}
    return sorted(p.name for p in root.iterdir() if p.name not in ours and leftover_writer(p) is None)


def check_clearable() -> Path:
    """The cache's root, where `clear` may empty SpecDeck's folders: one it made (its marker) or that
    holds nothing else; else SpecDeckError, before anything is removed."""
    root = cache_root()
    others = foreign_entries(root)
    if not (root / MARKER).is_file() and others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise SpecDeckError(
            f"{root} is not a folder SpecDeck made (no {MARKER} in it) and holds other things ({shown}): "
            "nothing was removed. Point SPECDECK_CACHE at a folder of SpecDeck's own, or delete its "
            f"folders ({', '.join(CLEARED)}) yourself."
        )
    return root


def cpu_info(*fields: str) -> str:
    """The first of `fields` that /proc/cpuinfo gives (its value), else the platform's processor name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(fields):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_name() -> str:
    """The CPU's model name, for the keys of what is measured on it (`costs_cache`) and for reports."""
    return cpu_info("model name")


def gguf_cache() -> Path:
    """The folder of converted GGUF models."""
    return cache_root() / "gguf"


def tensor_index_cache() -> Path:
    """The folder of GGUF files' tensor indexes (`specdeck.engine.forward.gguf_index`)."""
    return cache_root() / "gguf-tensors"


def clear_tensor_indexes() -> int:
    """Forget every GGUF file's tensor index (read again when next needed); return how many were removed."""
    return _remove_all(tensor_index_cache(), "*.json")


def costs_cache() -> Path:
    """The folder of measured costs (`specdeck.engine.planner.costs`): target cost curves and drafters' costs."""
    return cache_root() / "costs"


def kernels_cache() -> Path:
    """The folder of kernels compiled for this machine (`specdeck.engine.forward.row_kernel`)."""
    return cache_root() / "kernels"


def suffix_cache() -> Path:
    """The folder of past sessions' texts that suffix drafting reads (`specdeck.engine.drafting.past_sessions`)."""
    return cache_root() / "suffix"


def clear_suffix_texts() -> int:
    """Forget every past session's text kept for suffix drafting; return how many files were removed."""
    return _remove_all(suffix_cache(), "*.tokens")


def clear_costs() -> int:
    """Forget every measured cost and its record (the next session measures again); return how many
    measurements were removed."""
    removed = _remove_all(costs_cache(), "*.json")
    _remove_all(costs_cache(), "*.json.sha256")
    return removed


def training_folders() -> list[CacheEntry]:
    """The training commands' data and drafters, written in the cache where no --out was given
    (`specdeck cache` lists them; --clear removes them unless a live process is writing in one);
    only the folders those commands name, never another folder that happens to be there."""
    root = cache_root()
    return [CacheEntry(root / name, _size(root / name)) for name in TRAINING if (root / name).is_dir()]


def in_use(folder: Path) -> int | None:
    """The id of a live process writing somewhere in `folder` (a partial file of its own), else None."""
    for path in folder.rglob("*"):
        writer = leftover_writer(path)
        if writer is not None and process_alive(writer):
            return writer
    return None


def _remove_all(folder: Path, pattern: str) -> int:
    """Remove the files of `folder` that match `pattern`; return how many."""
    files = sorted(folder.glob(pattern)) if folder.is_dir() else []
    for path in files:
        remove_path(path)
    return len(files)


@dataclass(frozen=True)
class CacheEntry:
    """One converted model, or one being (or left half) written."""

    path: Path
    size: int  # bytes

    @property
    def writer(self) -> int | None:
        """The process still writing this entry, if one is."""
        pid = leftover_writer(self.path)
        return pid if pid is not None and process_alive(pid) else None

    @property
    def state(self) -> str:
        if self.writer is not None:
            return f"being written by process {self.writer}"
        if self.path.name.startswith("."):
            return "incomplete"
        if self.path.name.endswith(TOKENIZER_SUFFIX):
            return "complete" if (self.path / "tokenizer_config.json").is_file() else "incomplete"
        return "complete" if (self.path / "model.safetensors").is_file() else "incomplete"


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def entries() -> list[CacheEntry]:
    """The cache's entries, by name."""
    folder = gguf_cache()
    if not folder.is_dir():
        return []
    return [CacheEntry(path, _size(path)) for path in sorted(folder.iterdir())]


def _folders() -> list[Path]:
    """The cache's folders: its root and the trees of its own and training folders (never another
    folder in the root), but not those inside a write's temporary entry."""
    root = cache_root()
    found = [root]
    for name in (*CLEARED, *TRAINING):
        for folder, subfolders, _ in os.walk(root / name):
            subfolders[:] = sorted(name for name in subfolders if leftover_writer(Path(name)) is None)
            found.append(Path(folder))
    return found


def leftovers() -> list[CacheEntry]:
    """Temporary entries of writes in the cache (`.NAME.partial-PID-...`), by path; those of
    converted models are among `entries()`."""
    return [
        CacheEntry(path, _size(path))
        for folder in _folders()
        if folder != gguf_cache()
        for path in sorted(folder.iterdir())
        if leftover_writer(path) is not None
    ]


def heal(notice: Notice | None = None) -> list[Path]:
    """Remove what writers that are gone left anywhere in the cache, telling `notice` about each."""
    return [path for folder in _folders() for path in remove_abandoned(folder, notice)]


def kernels() -> list[CacheEntry]:
    """The compiled libraries, by name (their sizes with their records')."""
    folder = kernels_cache()
    if not folder.is_dir():
        return []
    return [
        CacheEntry(path, _size(path) + (_size(record_path(path)) if record_path(path).is_file() else 0))
        for path in sorted(folder.glob("*.so"))
    ]


def clear_kernels() -> int:
    """Remove every compiled library and its record (built again when next needed); return how many."""
    listed = kernels()
    for entry in listed:
        remove_path(entry.path)
        record_path(entry.path).unlink(missing_ok=True)
    for path in kernels_cache().glob("*.sha256") if kernels_cache().is_dir() else []:
        path.unlink()  # records whose library is already gone
    return len(listed)


def clear() -> tuple[list[CacheEntry], list[CacheEntry]]:
    """Remove every entry but those another process is writing now; return (removed, kept)."""
    removed, kept = [], []
    for entry in entries():
        if entry.writer is not None:
            kept.append(entry)
        else:
            remove_path(entry.path)
            removed.append(entry)
    return removed, kept


def format_size(size: int) -> str:
    """Bytes as people read them: 812 B, 3.4 kB, 270.1 MB, 1.2 GB."""
    if size < 1000:
        return f"{size} B"
    value = size / 1000
    for unit in ("kB", "MB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def _counted(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _kernel_state(path: Path) -> str:
    damage = recorded_damage(path)
    return "complete" if damage is None else f"damaged: {damage}; built again when next needed"


def describe(listed: list[CacheEntry]) -> str:
    """The `specdeck cache` listing: the converted models (`listed`), the compiled kernels and any
    unfinished writes, each with its folder and total, one line per entry."""
    lines = [
        f"{gguf_cache()}: {format_size(sum(e.size for e in listed))} in {_counted(len(listed), 'entry', 'entries')}"
    ]
    lines += [f"  {format_size(entry.size):>9}  {entry.path.name}  ({entry.state})" for entry in listed]
    built = kernels()
    if built:
        total = format_size(sum(e.size for e in built))
        lines.append(f"{kernels_cache()}: {total} in {_counted(len(built), 'kernel', 'kernels')}")
        lines += [f"  {format_size(e.size):>9}  {e.path.name}  ({_kernel_state(e.path)})" for e in built]
    training = training_folders()
    if training:
        lines.append(f"Training data: {_counted(len(training), 'folder', 'folders')}")
        lines += [f"  {format_size(e.size):>9}  {e.path}" for e in training]
    unfinished = leftovers()
    if unfinished:
        lines.append(f"Unfinished writes: {_counted(len(unfinished), 'entry', 'entries')}")
        root = cache_root()
        lines += [f"  {format_size(e.size):>9}  {e.path.relative_to(root)}  ({e.state})" for e in unfinished]
    return "\n".join(lines)
