"""SpecDeck's cache of converted models (`specdeck cache`): what is in it, how big, and healing;
and where the other cached things live (measured costs, past sessions' texts for suffix drafting).

A GGUF file is dequantized once into a safetensors folder under `cache_root()/gguf/` (see
`engine.gguf_conversion.convert_gguf`). An entry is built under a hidden name carrying the writer's process
id (`engine.atomic`); one whose process is gone was interrupted, and `heal` removes it. A GGUF file
run by llama.cpp keeps only its tokenizer here, in a folder named `TOKENIZER_SUFFIX`. The row
kernel (`engine.row_kernel`) is compiled into `kernels_cache()`, each library beside the record of
its size and digest. `heal` and `clear` also take what killed writes left anywhere in the cache.
"""

from __future__ import annotations

import os
import platform
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

Notice = Callable[[str], None]
TOKENIZER_SUFFIX = "-tokenizer"


def cache_root() -> Path:
    """Where SpecDeck keeps what it converts and measures: $SPECDECK_CACHE, else
    $XDG_CACHE_HOME/specdeck, else ~/.cache/specdeck."""
    if "SPECDECK_CACHE" in os.environ:
        return Path(os.environ["SPECDECK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specdeck"


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
    """The folder of GGUF files' tensor indexes (`engine.gguf_index`)."""
    return cache_root() / "gguf-tensors"


def clear_tensor_indexes() -> int:
    """Forget every GGUF file's tensor index (read again when next needed); return how many were removed."""
    return _remove_all(tensor_index_cache(), "*.json")


def costs_cache() -> Path:
    """The folder of measured costs (`engine.costs`): target cost curves and drafters' costs."""
    return cache_root() / "costs"


def kernels_cache() -> Path:
    """The folder of kernels compiled for this machine (`engine.row_kernel`)."""
    return cache_root() / "kernels"


def suffix_cache() -> Path:
    """The folder of past sessions' texts that suffix drafting reads (`engine.past_sessions`)."""
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


CLEARED = ("gguf", "gguf-tensors", "costs", "kernels", "suffix")  # the cache's own folders; others hold training data


def training_folders() -> list[CacheEntry]:
    """The cache's other folders: the training commands' data and drafters, written there where no
    --out was given (`specdeck cache` lists them; --clear removes them unless a live process is
    writing in one)."""
    root = cache_root()
    if not root.is_dir():
        return []
    return [
        CacheEntry(path, _size(path))
        for path in sorted(root.iterdir())
        if path.is_dir() and path.name not in CLEARED and leftover_writer(path) is None
    ]


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
    """The cache's folders, its root included, but not those inside a write's temporary entry."""
    found = []
    for folder, subfolders, _ in os.walk(cache_root()):
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
