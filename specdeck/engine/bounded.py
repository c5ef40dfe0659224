"""Every read of what a user or a server gives SpecDeck is bounded while it is read, not only by
the size a file claims: a FIFO, /dev/zero, a growing log or an endless HTTP body has no size to
check beforehand, and read whole it would fill the memory. Code a model brings (its chat
template) runs with a time limit (`within_seconds`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from specdeck.engine.errors import SpecDeckError

MOST_CONFIG_BYTES = 16 * 2**20  # a model's or drafter's JSON file: configs and token lists take kB to a few MB


T = TypeVar("T")


class TooLarge(Exception):
    """More than the limit was there to read."""


class TooSlow(Exception):
    """The call ran past its time limit and was stopped."""


def within_seconds(seconds: float, call: Callable[[], T]) -> T:
    """`call()`, stopped with TooSlow once it has run `seconds`: a trace function checks the
    clock on every line of Python it runs (as a Jinja template's compiled code), and raises there.
    Only this thread is traced, and its earlier trace function (a debugger's) is put back."""
    deadline = time.monotonic() + seconds

    def check(frame, event, arg):
        if time.monotonic() > deadline:
            raise TooSlow
        return check

    earlier = sys.gettrace()
    sys.settrace(check)
    try:
        return call()
    finally:
        sys.settrace(earlier)


def read_at_most(stream: BinaryIO, limit: int) -> bytes:
    """All of `stream`, or TooLarge as soon as more than `limit` bytes have come."""
    chunks, size = [], 0
    while chunk := stream.read(min(1 << 20, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise TooLarge
    return b"".join(chunks)


def read_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the file `path` (`what` it is, for the message), or SpecDeckError where it
    cannot be read or holds more than `limit` bytes."""
    try:
        with path.open("rb") as stream:
            return read_at_most(stream, limit)
    except TooLarge:
        raise SpecDeckError(
            f"{what} {path} holds more than {limit / 2**20:g} MiB, more than such a file takes: pick "
            "the file you meant."
        ) from None
    except OSError as error:
        raise SpecDeckError(f"Cannot read {what.lower()} {path}: {error.strerror or error}.") from error


def read_json(path: Path, what: str = "The JSON file", limit: int = MOST_CONFIG_BYTES) -> Any:
    """The JSON document in `path`, read within `limit` bytes; SpecDeckError where it is too large
    or cannot be read; ValueError (UnicodeDecodeError, JSONDecodeError) where it is no JSON."""
    return json.loads(read_file(path, limit, what))
