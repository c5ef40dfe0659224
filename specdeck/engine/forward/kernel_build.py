"""SpecDeck's row kernel (`row_kernel.c`), built for this machine at first use, and loaded.

The C source is compiled once per machine, compiler and source with the system's C compiler
(`$CC`, else `cc`; `-O3 -march=native -fopenmp`) into SpecDeck's cache, the way PyTorch's inductor
builds its CPU kernels; each build is loaded in a child process first and recorded (size and
digest), so that a damaged library is built again rather than loaded. Where there is no compiler,
or the CPU has neither AVX-512 nor AVX2, or the build fails, `library()` says why and products and
attention stay on PyTorch's paths.

This module imports neither torch nor numpy: the `specdeck` command starts a first build on a
thread before those libraries import (`build_in_background`), so that the compiler runs beside them.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from importlib.metadata import version as version_of
from pathlib import Path

from specdeck.engine.atomic import recorded_damage, remove_abandoned, write_with
from specdeck.engine.cache import cpu_info, kernels_cache
from specdeck.engine.errors import SpecDeckError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("row_kernel.c")
_BUILD_SECONDS = 120
_LIBRARY: list[ctypes.CDLL | str] = []  # the loaded library, or why there is none; once per process
_LOADING = threading.Lock()  # held while the library is built or loaded, by one thread at a time


def cpu_flags() -> str:
    """This CPU's feature flags (x86's `flags`, Arm's `Features`), as /proc/cpuinfo lists them."""
    return cpu_info("flags", "Features")


class _BuildFailed(Exception):
    pass


_SYMBOLS = ("block", "lanes", "int8", "product", "attention", "quantized", "layers")
_PROBE = (
    "import ctypes, sys\n"
    "library = ctypes.CDLL(sys.argv[1])\n"
    "for name in sys.argv[2:]: getattr(library, 'row_kernel_' + name)\n"
    "library.row_kernel_block(), library.row_kernel_int8()\n"
)


def _compile(compiler: str, path: Path, arch: str) -> None:
    """Compile the source for `arch` into `path`, or raise with the compiler's last word."""
    flags = ["-O3", f"-march={arch}", "-fopenmp", "-shared", "-fPIC"]
    command = [compiler, *flags, "-o", str(path), str(SOURCE)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_SECONDS, check=False)
    if done.returncode != 0:
        raise _BuildFailed((done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1])


def loads_alone(path: Path) -> str | None:
    """None if the library at `path` loads and runs in a child process, else what went wrong there:
    a crash there costs this process nothing."""
    command = [sys.executable, "-c", _PROBE, str(path), *_SYMBOLS]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"it could not be tried in a child process ({error})"
    if done.returncode < 0:
        return f"loading it killed a child process with signal {done.returncode * -1}"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return None


def _build(compiler: str, target: Path, arch: str) -> None:
    """Compile the source for `arch` into `target`, tried in a child process and recorded (size and
    digest), or raise with what went wrong."""

    def save(path: Path) -> None:
        _compile(compiler, path, arch)
        crash = loads_alone(path)
        if crash:
            raise _BuildFailed(f"the library built does not load: {crash}")

    write_with(target, save, record=True)


def build(arch: str = "native", progress: Callable[[str], None] | None = None) -> ctypes.CDLL | str:
    """The kernel's library compiled for `arch` (`-march=`; "native": this CPU, what SpecDeck runs;
    "haswell": the AVX2 variant, which tests check on machines that also have AVX-512), built once
    per machine and kept in the cache, and loaded; or why it cannot be. `progress` hears of a build."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the row kernel is written for x86-64 CPUs, not {platform.machine()}"
    if not SOURCE.is_file():
        return f"the row kernel's source {SOURCE} is not installed"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return "no C compiler (cc) to build the row kernel with"
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"the C compiler {compiler} does not run ({error})"
    key = hashlib.sha256("\n".join([SOURCE.read_text(), version, cpu_flags(), version_of("torch"), arch]).encode())
    try:
        target = kernels_cache() / f"row_kernel-{key.hexdigest()[:16]}.so"
    except SpecDeckError as error:  # an unusable cache folder: the command itself says so in its line
        return str(error)
    remove_abandoned(target.parent)  # what builds killed half-way left
    if target.is_file() and (damage := recorded_damage(target)):
        log.warning("The row kernel %s in the cache is damaged (%s): building it again.", target.name, damage)
        target.unlink(missing_ok=True)
    if not target.is_file():
        log.info("building the row kernel for this machine with %s", compiler)
        if progress:
            progress("Building SpecDeck's row kernel for this CPU (once: it is kept in the cache)")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _build(compiler, target, arch)
        except (OSError, subprocess.SubprocessError, SpecDeckError, _BuildFailed) as error:
            return f"the row kernel did not build ({error})"
    damage = recorded_damage(target)  # never dlopen bytes that were not checked
    if damage:
        return f"the row kernel in {target} is damaged ({damage})"
    try:
        library = ctypes.CDLL(str(target))
    except OSError as error:
        return f"the row kernel built but does not load ({error})"
    library.row_kernel_product.argtypes = [
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    library.row_kernel_product.restype = None
    library.row_kernel_attention.argtypes = [
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_long,
        ctypes.c_float,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    library.row_kernel_attention.restype = None
    library.row_kernel_quantized.argtypes = [ctypes.c_int, *library.row_kernel_product.argtypes]
    library.row_kernel_quantized.restype = None
    library.row_kernel_int8.restype = ctypes.c_int
    if library.row_kernel_int8():  # the 8-bit-row layouts exist where their products do
        library.row_kernel_laid_bytes.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_long]
        library.row_kernel_laid_bytes.restype = ctypes.c_long
        library.row_kernel_lay_out.argtypes = [ctypes.c_int, ctypes.c_void_p, *[ctypes.c_long] * 3, ctypes.c_void_p]
        library.row_kernel_lay_out.restype = None
    pointer, count = ctypes.c_void_p, ctypes.c_long
    library.row_kernel_layers.argtypes = [
        *(pointer, count, count, count, pointer, ctypes.c_float),  # x, m, hidden, layers, norms, eps
        *(pointer, pointer, pointer, pointer, pointer),  # kinds, weights, widths, cos, sin
        *(pointer, pointer, count, count, count),  # keys, values, layer_stride, kv_stride, start
        *(count, count, count, pointer, ctypes.c_float),  # heads, kv_heads, d, windows, scale
        *(pointer, count, pointer, pointer, ctypes.c_int),  # taps, n_taps, tapped, scratch, threads
    ]
    library.row_kernel_layers.restype = None
    return library


def library(progress: Callable[[str], None] | None = None) -> ctypes.CDLL | str:
    """The kernel's library, built and loaded once per process; or, where it cannot be, why not.
    Where `build_in_background` is at it, this waits for it (and says so)."""
    if _LIBRARY:
        return _LIBRARY[0]
    if not _LOADING.acquire(blocking=False):
        if progress:
            progress("Waiting for SpecDeck's row kernel for this CPU (built once: it is kept in the cache)")
        _LOADING.acquire()
    try:
        if not _LIBRARY:
            _LIBRARY.append(build(progress=progress))
            if isinstance(_LIBRARY[0], str):
                log.info("%s", _LIBRARY[0])
        return _LIBRARY[0]
    finally:
        _LOADING.release()


def building() -> bool:
    """Whether the library is being built or loaded on another thread (`build_in_background`)."""
    return not _LIBRARY and _LOADING.locked()


def buildable() -> str | None:
    """Why the library cannot be built here (no x86-64 CPU, no source, no compiler), or None: what a
    caller may go by while a build is under way, rather than wait for it."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the row kernel is written for x86-64 CPUs, not {platform.machine()}"
    if not SOURCE.is_file():
        return f"the row kernel's source {SOURCE} is not installed"
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler (cc) to build the row kernel with"
    return None


def build_in_background() -> threading.Thread | None:
    """Start building (or loading) the library on a thread of its own, so that a first build, which
    takes a compiler several seconds on one core, runs while the models load on the other; None
    where it is loaded already. `library()` then waits for that thread instead of building again."""
    if _LIBRARY:
        return None
    thread = threading.Thread(target=library, name="row kernel build", daemon=True)
    thread.start()
    return thread


def identity() -> str:
    """The loaded kernel's build, named by the hash of its source, compiler, CPU and arch ("" where
    none loads): in the keys of what was measured on it, so that another build measures again."""
    built = library()
    return "" if isinstance(built, str) else Path(built._name).name
