"""SpecDeck's environment settings (`SPECDECK_*`), each checked like the flag it stands beside, in
one place: `check_environment` runs before any command, so a typo in a value is one line saying
what is allowed, never a traceback half-way through loading a model.

A `SPECDECK_` name that is no setting is said to be ignored (a typo in a name would otherwise be
silently without effect). The cache's folder (`SPECDECK_CACHE`) is checked where it is used,
`specdeck.engine.cache.cache_root`, which knows how to make it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from specdeck.engine.errors import SpecDeckError

Check = Callable[[str], str | None]  # a value's fault, or None where it is fine


def one_of(*allowed: str) -> Check:
    """Values compared as written, blanks and case aside; empty means the default."""
    return lambda value: None if value.strip().lower() in ("", *allowed) else f"one of {', '.join(allowed)}"


def _positive_integer(value: str) -> str | None:
    digits = value.strip()
    return (
        None if not digits or (digits.isascii() and digits.isdigit() and int(digits) > 0) else "a positive whole number"
    )


def _header_value(value: str) -> str | None:
    # sent as an HTTP header: latin-1 bytes with no line break, else the request cannot be made
    if any(ord(c) < 32 or ord(c) == 127 for c in value) or not value.isascii():
        return "printable ASCII (an API key as the server gave it), with no line break"
    return None


SETTINGS: dict[str, Check] = {
    "SPECDECK_API_KEY": _header_value,
    "SPECDECK_THREADS": _positive_integer,
    "SPECDECK_LINEAR": one_of("dense", "packed", "kernel"),
    "SPECDECK_DRAFT_DTYPE": one_of("float32", "bfloat16"),
    "SPECDECK_GGUF_BLOCKS": one_of("on", "1", "yes", "off", "0", "no", "float32", "float"),
    "SPECDECK_FUSED_LAYERS": one_of("1", "0"),
    "SPECDECK_CUDA_GRAPHS": one_of("1", "0"),
}
ELSEWHERE = ("SPECDECK_CACHE",)  # checked where it is used (`specdeck.engine.cache`)
TESTS_ONLY = ("SPECDECK_HYPOTHESIS", "SPECDECK_TEST_DEVICE", "SPECDECK_VLLM_PYTHON")  # read by the tests


def check_environment(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Raise SpecDeckError for the first `SPECDECK_*` setting whose value is not allowed; return a
    notice for each `SPECDECK_*` name that is no setting (ignored)."""
    for name, check in SETTINGS.items():
        value = environ.get(name)
        fault = check(value) if value is not None else None
        if fault is not None:
            shown = "a value" if name == "SPECDECK_API_KEY" else repr(value)  # a key is never shown
            raise SpecDeckError(f"{name} is {shown}, not {fault}: set it to one, or unset it.")
    known = {*SETTINGS, *ELSEWHERE, *TESTS_ONLY}
    return [
        f"{name} is not a SpecDeck setting: ignored (the settings: {', '.join(sorted({*SETTINGS, *ELSEWHERE}))})"
        for name in sorted(environ)
        if name.startswith("SPECDECK_") and name not in known
    ]
