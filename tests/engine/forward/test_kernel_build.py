"""A damaged row kernel in the cache is never loaded: it is built again, with a notice."""

from __future__ import annotations

import _ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specdeck.engine.atomic import record_path
from specdeck.engine.forward import kernel_build

# in a child process, so that a damaged library loaded by mistake fails the test, not pytest
CHILD = textwrap.dedent("""
    import shutil, sys
    from specdeck.engine.forward import kernel_build

    def copy_the_good_one(compiler, path, arch):
        shutil.copyfile(sys.argv[1], path)

    kernel_build._compile = copy_the_good_one  # a build without the compiler's 15 s
    built = kernel_build.build()
    assert not isinstance(built, str), built
    print("block", built.row_kernel_block())
""")


@pytest.fixture(scope="module")
def good_kernel() -> Path:
    built = kernel_build.library()
    if isinstance(built, str):
        pytest.skip(built)
    return Path(built._name)


def _truncated(good: bytes) -> bytes:
    return good[:20000]


def _other_bytes(good: bytes) -> bytes:
    return bytes((i * 7919) % 251 for i in range(len(good)))


def _garbled_code(good: bytes) -> bytes:
    middle = len(good) // 2
    return good[:middle] + b"\xff" * 4096 + good[middle + 4096 :]


def _wrong_library(good: bytes) -> bytes:
    return Path(_ctypes.__file__).read_bytes()


@pytest.mark.parametrize("damage", [_truncated, _other_bytes, _garbled_code, _wrong_library])
def test_a_damaged_kernel_is_built_again_with_a_notice(good_kernel, tmp_path, damage):
    """Truncated, overwritten, garbled or another library: the next run says so, builds and runs."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    cached = kernels / good_kernel.name
    shutil.copyfile(record_path(good_kernel), record_path(cached))
    cached.write_bytes(damage(good_kernel.read_bytes()))
    env = {**os.environ, "SPECDECK_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(good_kernel)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"{cached.name} in the cache is damaged" in done.stderr and "building it again" in done.stderr
    assert "block" in done.stdout and cached.read_bytes() == good_kernel.read_bytes()


def test_a_kernel_without_its_record_is_built_again(good_kernel, tmp_path):
    """A library whose size and digest were never recorded (a write killed in between) is not trusted."""
    (tmp_path / "kernels").mkdir()
    shutil.copyfile(good_kernel, tmp_path / "kernels" / good_kernel.name)
    env = {**os.environ, "SPECDECK_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(good_kernel)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "record of size and digest is missing" in done.stderr, done.stderr
    assert record_path(tmp_path / "kernels" / good_kernel.name).is_file()


def test_a_build_that_crashes_when_loaded_is_refused(good_kernel, tmp_path, monkeypatch):
    """A new library that kills the process loading it is tried in a child, refused, and not kept."""
    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    monkeypatch.setattr(
        kernel_build, "_compile", lambda compiler, path, arch: path.write_bytes(good_kernel.read_bytes()[:20000])
    )
    reason = kernel_build.build()
    assert isinstance(reason, str) and "the library built does not load" in reason
    assert os.listdir(tmp_path / "kernels") == []


def test_a_build_started_in_the_background_is_waited_for_not_repeated(monkeypatch):
    """`build_in_background` starts the build on its own thread; a caller of `library()` meanwhile
    hears that it waits, gets what that build made, and nothing is built twice."""
    import threading

    started, finish, calls = threading.Event(), threading.Event(), []

    def slow_build(progress=None):
        calls.append(progress)
        started.set()
        finish.wait(10)
        return "built once"

    monkeypatch.setattr(kernel_build, "_LIBRARY", [])
    monkeypatch.setattr(kernel_build, "build", slow_build)
    thread = kernel_build.build_in_background()
    assert thread is not None and started.wait(10)
    heard = []
    threading.Timer(0.2, finish.set).start()
    assert kernel_build.library(heard.append) == "built once"
    thread.join(10)
    assert calls == [None] and heard and "Waiting" in heard[0]
    assert kernel_build.build_in_background() is None  # loaded: nothing more to start


def test_a_first_build_starts_before_torch_imports():
    """What builds the kernel imports neither torch nor numpy, so that the `specdeck` command starts
    the compiler before they import (about as long as the compiler runs) rather than after."""
    code = (
        "import sys; import specdeck.engine.forward.kernel_build; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_the_command_starts_the_kernel_only_for_commands_that_load_a_model(monkeypatch):
    from specdeck.cli import launch, main

    started = []
    monkeypatch.setattr(kernel_build, "build_in_background", lambda: started.append(1))
    monkeypatch.setattr(main, "main", lambda: 0)
    for argv, expected in ((["specdeck", "cache"], []), (["specdeck", "run"], [1]), (["specdeck", "bench"], [1, 1])):
        monkeypatch.setattr(sys, "argv", argv)
        assert launch.main() == 0
        assert started == expected, argv


def test_the_backend_choice_goes_on_beside_a_build_under_way(monkeypatch):
    """While the kernel builds on its own thread, auto's choice for a GGUF file does not wait for
    it: it goes by whether the kernel can build here (a compiler, an x86-64 CPU)."""
    from specdeck.engine.loading import backends, preflight
    from specdeck.engine.loading.backends import gguf_file

    def waited(progress=None):
        raise AssertionError("waited for the build")

    path = gguf_file("smollm2-135m-instruct")
    monkeypatch.delenv("SPECDECK_GGUF_BLOCKS", raising=False)
    monkeypatch.setattr(preflight, "available_memory", lambda: 64 << 30)  # whatever else runs beside the test
    monkeypatch.setattr(kernel_build, "building", lambda: True)
    monkeypatch.setattr(kernel_build, "library", waited)
    monkeypatch.setattr(kernel_build, "buildable", lambda: None)
    assert backends.blocks_on_row_kernel(path)
    monkeypatch.setattr(kernel_build, "buildable", lambda: "no C compiler (cc) to build the row kernel with")
    assert not backends.blocks_on_row_kernel(path)
