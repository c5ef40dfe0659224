"""Every read of what a user or a server gives SpecDeck is bounded while it is read: a file with
no size to check (a FIFO, /dev/zero) and an endless HTTP body stop at the limit with one line."""

from __future__ import annotations

import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeck.bench.prompts import read_prompt_text
from specdeck.engine.bounded import TooLarge, read_at_most, read_file, read_json
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.remote import remote_http
from specdeck.engine.remote.remote_answers import ModelList
from specdeck.engine.remote.remote_http import Endpoint, ServerFault

EXAMPLES = settings(max_examples=30, deadline=None, database=None)


class Endless:
    """A stream that never ends (a FIFO whose writer keeps writing), counting what was read."""

    def __init__(self) -> None:
        self.given = 0

    def read(self, size: int = -1) -> bytes:
        assert size > 0, "an unbounded read of an endless stream never returns"
        self.given += size
        return b"x" * size


@EXAMPLES
@given(limit=st.integers(1, 5 * 2**20))
def test_an_endless_stream_stops_just_past_the_limit(limit):
    """Reading an endless stream stops once the limit is passed, having taken one byte more."""
    stream = Endless()
    with pytest.raises(TooLarge):
        read_at_most(stream, limit)
    assert stream.given == limit + 1


@EXAMPLES
@given(data=st.binary(max_size=300), limit=st.integers(0, 300))
def test_a_file_is_read_whole_or_refused_by_what_it_holds(data, limit):
    """A file of any size is read whole within the limit and refused in one line past it."""
    with tempfile.NamedTemporaryFile() as file:
        file.write(data)
        file.flush()
        if len(data) <= limit:
            assert read_file(Path(file.name), limit, "The file") == data
        else:
            with pytest.raises(SpecDeckError, match="holds more than"):
                read_file(Path(file.name), limit, "The file")


@EXAMPLES
@given(document=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=5))
def test_a_json_file_reads_back_within_its_limit(document):
    """A JSON file SpecDeck reads (configs, token lists) reads back whole when within its limit."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(document, file)
        file.flush()
        assert read_json(Path(file.name)) == document


def test_a_prompt_file_with_no_size_is_bounded_while_read():
    """/dev/zero as a prompt file (its size reads 0) is refused once 64 MiB have come, not read for ever."""
    with pytest.raises(SpecDeckError, match="The prompt file /dev/zero holds more than 64 MiB"):
        read_prompt_text(Path("/dev/zero"))


class _Serving:
    """A server on 127.0.0.1 whose every answer is `body` bytes of JSON padding, or endless."""

    def __init__(self) -> None:
        self.size: int | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no length to trust

            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                try:
                    if outer.size is None:
                        while True:
                            self.wfile.write(b" " * 65536)
                    body = b'{"data":[]}'
                    self.wfile.write(body + b" " * (outer.size - len(body)))
                except OSError:
                    pass  # the reader left

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def serving():
    server = _Serving()
    yield server
    server.http.shutdown()
    server.http.server_close()


@EXAMPLES
@given(size=st.integers(11, 3000) | st.none())
def test_a_servers_answer_is_read_within_its_limit(serving, size):
    """An answer within the limit is read; a longer or endless one stops the request in one line."""
    serving.size = size
    limit = 2000
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(remote_http, "MOST_BODY_BYTES", limit)
        endpoint = Endpoint(serving.url, timeout_s=20)
        if size is not None and size <= limit:
            assert endpoint.get("/models", ModelList).data == []
        else:
            with pytest.raises(ServerFault, match="sent more than"):
                endpoint.get("/models", ModelList)
