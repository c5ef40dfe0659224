"""The HTTP side of a remote target (`specdeck.engine.remote.remote_target`): JSON requests to an OpenAI-compatible
server, each bounded by the user's timeout, and every way one can fail told as a `ServerFault`
that says what went wrong and what to do.

The timeout bounds a whole request, connecting to the answer's last byte: a socket's own timeout
bounds each read, so a server sending a byte now and then would hold a request for ever. At the
deadline a timer shuts the request's sockets down, which ends whatever read waits on them.

Only the standard library's `urllib` is used. The API key, where the server wants one, comes from
the environment variable `SPECDECK_API_KEY` alone: never from a flag (it would show in the
process list and the shell's history) nor from the settings file, nor from the address (a user
name or password in it is refused). It goes only to the address given: every request goes
through one opener (`_opener`) that refuses a redirect to another scheme, host or port. Every
message that shows server text or an address passes through `redact` first.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, TypeVar

from specdeck.engine.bounded import TooLarge, read_at_most
from specdeck.engine.errors import SpecDeckError

if TYPE_CHECKING:  # pydantic and the answers' schemas load with the first answer read: a local model never needs them
    from specdeck.engine.remote.remote_answers import Answer, Expect

API_KEY_VARIABLE = "SPECDECK_API_KEY"
DEFAULT_TIMEOUT_S = 60.0
MOST_BODY_BYTES = 256 * 2**20  # an answer read whole: a round's log-probabilities take kB to a few MB
MOST_ERROR_BYTES = 64 * 2**10  # an error's body: only its first words are shown


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with each of `secrets` (and the API key of the environment) and the user name and
    password of any address in it replaced by ***: a server's message may echo what it was sent."""
    key = os.environ.get(API_KEY_VARIABLE, "")
    for secret in sorted({*secrets, key, urllib.parse.quote(key, safe="")} - {""}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _USERINFO.sub(r"\1***@", text)


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")


def redact_url(url: str) -> str:
    """An address as SpecDeck may show it: with no user name or password."""
    return redact(url)


A = TypeVar("A", bound="Answer")


class ServerFault(SpecDeckError):
    """A request to the target's server that failed: the server is down, slow, refused it or
    dropped the connection. A session stops at it and keeps the text it had. Its message is
    redacted (`redact`): it may quote the server."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


def is_url(name: str) -> bool:
    """Whether a target name is a server's address rather than a model."""
    return name.strip().lower().startswith(("http://", "https://"))


class Endpoint:
    """An OpenAI-compatible server at `url` (its `/v1` base, e.g. http://127.0.0.1:8000/v1); paths
    outside the base (llama-cpp-python's `/extras`, SGLang's `/generate`) are taken from its root."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        try:
            parts = urllib.parse.urlsplit(url.strip())
            parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
        except ValueError as error:
            raise SpecDeckError(
                f"{redact_url(url)!r} is not a server address ({error}): give one like http://127.0.0.1:8000/v1."
            ) from error
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SpecDeckError(f"{redact_url(url)!r} is not a server address: give one like http://127.0.0.1:8000/v1.")
        if "@" in parts.netloc:  # it would be shown, remembered and written into reports
            raise SpecDeckError(
                f"The address {redact_url(url)} carries a user name or password: remove it, and give the "
                f"server's key in the environment variable {API_KEY_VARIABLE}, which SpecDeck never shows."
            )
        if timeout_s <= 0:
            raise SpecDeckError(f"The timeout must be a positive number of seconds (got {timeout_s}).")
        self.base = url.strip().rstrip("/")
        path = parts.path.rstrip("/")
        self.root = f"{parts.scheme}://{parts.netloc}{path.removesuffix('/v1')}"
        self.timeout_s = timeout_s
        self.key = os.environ.get(API_KEY_VARIABLE, "")

    def get(self, path: str, schema: type[A], root: bool = False) -> A:
        return self.request(path, None, schema, None, root)[0]

    def post(
        self,
        path: str,
        body: dict,
        schema: type[A],
        expect: Expect | None = None,
        root: bool = False,
        events: bool = False,
    ) -> tuple[A, float]:
        """The server's answer to `body` at `path`, validated against `schema` and what was sent
        (`expect`), and the milliseconds from sending to the whole answer read (the round trip,
        the server's own time included). With `events`, the answer is a stream of server-sent
        events, read to its end and validated as {"chunks": [each event's JSON]}."""
        return self.request(path, body, schema, expect, root, events)

    def request(
        self, path: str, body: dict | None, schema: type[A], expect: Expect | None, root: bool, events: bool = False
    ) -> tuple[A, float]:
        """Every answer comes through here, and through its schema: nothing of one is read before
        it has been checked against what was sent (`remote_answers`)."""
        url = (self.root if root else self.base) + path
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
        started = time.perf_counter()
        with _Deadline(self.timeout_s) as deadline:
            try:
                with _opener(deadline).open(request, timeout=self.timeout_s) as response:
                    raw = read_at_most(response, MOST_BODY_BYTES)
                if deadline.expired:  # the answer was cut short at the deadline
                    raise TimeoutError
            except _CrossOriginRedirect as error:
                raise ServerFault(
                    f"The server at {self.base} redirected {path} to {error.location}, another address: "
                    "SpecDeck sends the request (and the API key) only to the address given. Give that "
                    "address as --target if it is the server's."
                ) from error
            except TooLarge as error:
                raise ServerFault(
                    f"The server at {self.base} sent more than {MOST_BODY_BYTES / 2**20:g} MiB for {path}, more "
                    "than any answer SpecDeck asks for: check that --target names an OpenAI-compatible API."
                ) from error
            except urllib.error.HTTPError as error:
                text = _error_text(error)
                if deadline.expired:
                    raise ServerFault(self._connection_message(TimeoutError())) from error
                raise ServerFault(self._status_message(error.code, text, path)) from error
            except Exception as error:
                if deadline.expired:  # a read ended by the deadline fails in any of several ways
                    raise ServerFault(self._connection_message(TimeoutError())) from error
                if isinstance(error, urllib.error.URLError):
                    raise ServerFault(self._connection_message(error.reason)) from error
                if isinstance(error, (TimeoutError, http.client.HTTPException, ConnectionError)):
                    raise ServerFault(self._connection_message(error)) from error
                raise
        elapsed_ms = (time.perf_counter() - started) * 1e3
        try:
            answer = _events(raw) if events else json.loads(raw)
        except ValueError as error:
            raise ServerFault(
                f"The server at {self.base} answered {path} with something that is not JSON "
                f"({raw[:80]!r}): check that --target names an OpenAI-compatible API."
            ) from error
        if not isinstance(answer, dict):
            raise ServerFault(
                f"The server at {self.base} answered {path} with {type(answer).__name__}, not an "
                "object: check that --target names an OpenAI-compatible API."
            )
        from pydantic import ValidationError

        from specdeck.engine.remote.remote_answers import context_of, problems

        try:
            return schema.model_validate(answer, context=context_of(expect)), elapsed_ms
        except ValidationError as error:
            raise ServerFault(
                f"The server at {self.base} ({schema.api} API) answered {path} with what SpecDeck cannot "
                f"trust, so no draft was judged by it: {problems(error)}. {schema.advice}"
            ) from None

    def _status_message(self, status: int, text: str, path: str) -> str:
        said = f" ({text})" if text else ""
        if status in (401, 403):
            return f"The server at {self.base} refused the request: HTTP {status}{said}. " + (
                f"Check the API key in {API_KEY_VARIABLE}."
                if self.key
                else f"It wants an API key: set the environment variable {API_KEY_VARIABLE} to it."
            )
        if status == 404:
            return (
                f"The server at {self.base} has no {path} (HTTP 404{said}): check the address (the API's "
                "base, usually ending in /v1) and the model name (--target-model)."
            )
        if status == 429:
            return f"The server at {self.base} is rate-limiting requests (HTTP 429{said}): wait and run again."
        if 400 <= status < 500:
            return (
                f"The server at {self.base} rejected the request to {path}: HTTP {status}{said}. Check "
                "--target-model and that the server offers log-probabilities (docs/remote.md)."
            )
        return (
            f"The server at {self.base} failed on {path}: HTTP {status}{said}. Check the server's log; "
            "run again once it is healthy."
        )

    def _connection_message(self, reason: object) -> str:
        if isinstance(reason, TimeoutError):
            return (
                f"The server at {self.base} did not answer within {self.timeout_s:g} s (--timeout): it is "
                "busy, or the model is slow on it. Raise --timeout, or check the server."
            )
        if isinstance(reason, ConnectionRefusedError):
            return (
                f"Nothing answers at {self.base} (connection refused): start the server, or check the "
                "host and port in --target."
            )
        if isinstance(reason, socket.gaierror):
            return f"The host in {self.base} cannot be found ({reason}): check the address in --target."
        if isinstance(
            reason,
            (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                http.client.IncompleteRead,
                BrokenPipeError,
                ConnectionAbortedError,
            ),
        ):
            return (
                f"The connection to {self.base} dropped before the answer was complete ({reason}): the "
                "server stopped or restarted. Run again once it is back."
            )
        return f"Cannot reach the server at {self.base} ({reason}): check the address in --target and the network."


class _Deadline:
    """A whole request's time limit: `seconds` after it starts, the sockets the request connected
    are shut down (through duplicates: the same connections, whatever wraps them, TLS included),
    so that a read blocked on one returns at once."""

    def __init__(self, seconds: float) -> None:
        self.ends = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()  # the timer's thread expires while the request's connects
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        with self._lock:
            for duplicate in self._sockets:
                duplicate.close()
            self._sockets.clear()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for duplicate in self._sockets:
                _shut(duplicate)

    def connect(self, address, timeout=None, source_address=None) -> socket.socket:
        """`socket.create_connection` within what is left of the time, the connection watched."""
        left = self.ends - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        connection = socket.create_connection(address, left, source_address)
        with self._lock:
            self._sockets.append(connection.dup())
            if self.expired:
                _shut(self._sockets[-1])
        return connection


def _shut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its reader


class _Watching(urllib.request.AbstractHTTPHandler):
    """Opens each connection through a `_Deadline`, so that the deadline can end it."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def do_open(self, http_class, req, **http_conn_args):
        def connection(host, **kwargs):
            made = http_class(host, **kwargs)
            made._create_connection = self._deadline.connect
            return made

        return super().do_open(connection, req, **http_conn_args)


class _HTTPHandler(_Watching, urllib.request.HTTPHandler):
    pass


class _CrossOriginRedirect(urllib.error.URLError):
    def __init__(self, location: str) -> None:
        super().__init__("redirected to another address")
        self.location = location


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect on the same scheme, host and port; refuses one elsewhere, which urllib
    would follow carrying every header, the key's included."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if (old.scheme, old.hostname, old.port) != (new.scheme, new.hostname, new.port):
            fp.close()  # the redirect's own answer: nothing more is read from it
            raise _CrossOriginRedirect(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """The one opener every request to a server goes through: connections the deadline can end,
    redirects only to the same address."""
    return urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline), _SameOriginRedirects())


class _HTTPSHandler(_Watching, urllib.request.HTTPSHandler):
    pass


def _events(raw: bytes) -> dict:
    """A stream of server-sent events as {"chunks": [...]}: the JSON of each `data:` line, up to
    the `[DONE]` that OpenAI-compatible servers close it with."""
    chunks = []
    for line in raw.decode("utf-8").splitlines():
        data = line.removeprefix("data:").strip() if line.startswith("data:") else None
        if data == "[DONE]":
            break
        if data:
            chunks.append(json.loads(data))
    return {"chunks": chunks}


def _error_text(error: urllib.error.HTTPError) -> str:
    """The message a server gave with an error status (OpenAI's {"error": {"message": ...}}, FastAPI's
    {"detail": ...}), cut short; empty when it gave none."""
    try:
        raw = error.read(MOST_ERROR_BYTES)
    except (OSError, http.client.HTTPException):
        return ""
    from pydantic import ValidationError

    from specdeck.engine.remote.remote_answers import ErrorBody

    try:
        return ErrorBody.model_validate_json(raw).said()[:200]
    except ValidationError:  # not JSON, or not an error body of a known shape: shown as it came
        return raw.decode("utf-8", "replace").strip()[:200]
