"""The one exception type whose message is meant for the user."""

from __future__ import annotations

import os


class SpecDeckError(Exception):
    """Bad input or an unusable model: the message says what is wrong and what to do."""


def unreadable_gguf(path: str | os.PathLike, reason: object, part: str | None = None) -> SpecDeckError:
    """A GGUF file, or the `part` of it named ("tokenizer"), that does not read: `reason` (an error
    is named by its type and message), and what to do (a cut-short download is the usual cause)."""
    if isinstance(reason, BaseException):
        reason = f"{type(reason).__name__}: {reason}"
    subject = f"The {part} in {path} cannot be read" if part else f"{path} is not a readable GGUF model"
    return SpecDeckError(f"{subject} ({reason}). Check that the download finished, or pick another file.")
