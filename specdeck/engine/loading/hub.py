"""Models named by a Hugging Face id: whether the Hub answers, where a model's files are when it
does not (the Hugging Face cache of an earlier download), and why a download failed, in words a
user can act on rather than huggingface_hub's exceptions.
"""

from __future__ import annotations

import socket
import urllib.parse
import urllib.request

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.registry import BUILTIN_MODELS


def hub_source(name: str) -> str:
    """`name` itself when the Hub answers; else the folder of its cached copy, or a clear error.

    With no network huggingface_hub retries each file for most of a minute before giving up, so a
    short connection probe decides first: offline, a model downloaded before still loads from the
    Hugging Face cache and one that never was fails at once.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not constants.is_offline_mode() and _hub_answers(constants.ENDPOINT):
        return name
    try:
        return snapshot_download(name, local_files_only=True)
    except LocalEntryNotFoundError as error:
        raise SpecDeckError(_unreachable_message(name)) from error
    except ValueError as error:  # not of the form owner/name
        raise SpecDeckError(
            f"{name!r} is not a built-in model, a folder, a .gguf file or a Hugging Face id (owner/name)."
        ) from error


def _hub_answers(endpoint: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub opens; behind a proxy, leave it to huggingface_hub."""
    if urllib.request.getproxies():
        return True
    url = urllib.parse.urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _unreachable_message(name: str) -> str:
    return (
        f"Could not download {name!r}: the Hugging Face Hub could not be reached. "
        "Download the model on a machine with network access (`hf download "
        f"{name} --local-dir DIR`) and pass that local folder instead, or use a built-in model "
        f"({', '.join(BUILTIN_MODELS)})."
    )


def hub_message(name: str, error: OSError) -> str:
    """Why `from_pretrained` failed, read from the exceptions huggingface_hub chained under it."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    causes = []
    cause: BaseException | None = error
    while cause is not None and cause not in causes:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, GatedRepoError) for c in causes):
        return (
            f"{name!r} is gated on the Hugging Face Hub: accept its terms on its page, "
            "then log in with `hf auth login`."
        )
    if any(isinstance(c, RepositoryNotFoundError) for c in causes):
        return (
            f"There is no model {name!r} on the Hugging Face Hub: check the spelling "
            "(a private model needs `hf auth login`)."
        )
    if any(isinstance(c, (LocalEntryNotFoundError, ConnectionError, TimeoutError)) for c in causes):
        return _unreachable_message(name)
    text = str(error)
    return f"Could not load {name!r}: {text.splitlines()[0] if text else type(error).__name__}"
