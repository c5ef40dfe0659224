"""A served target's secrets stay where they were given: the API key goes to the address given
and nowhere else, and no message shows it or a password, whatever a server echoes."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeck.cli.main import main
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.remote.remote_answers import ModelList
from specdeck.engine.remote.remote_http import API_KEY_VARIABLE, Endpoint, ServerFault

EXAMPLES = settings(max_examples=30, deadline=None, database=None)

# what a key looks like in a header: printable ASCII, no blank at either end
keys = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=8, max_size=40)
secrets = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=4, max_size=20).filter(str.strip)


class Server:
    """A server on 127.0.0.1 that answers every request as `answer` says and records the
    Authorization headers it was sent."""

    def __init__(self) -> None:
        self.answer = lambda handler: handler.send_error(404)
        self.seen: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.seen.append(self.headers.get("Authorization"))
                outer.answer(self)

            do_POST = do_GET

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def servers():
    first, second = Server(), Server()
    yield first, second
    first.close()
    second.close()


def _reply(status: int, body: bytes, headers: dict[str, str] | None = None):
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def _echoes(key: str) -> list[bytes]:
    """Ways a server's error body may quote the key it was sent."""
    return [
        json.dumps({"error": {"message": f"Invalid API key {key}"}}).encode(),
        json.dumps({"detail": f"Bearer {key} is not allowed"}).encode(),
        f"bad key: {key}\n".encode(),
        json.dumps({"key": key, "sent": f"Bearer {urllib.parse.quote(key, safe='')}"}).encode(),
    ]


@EXAMPLES
@given(key=keys, status=st.sampled_from([400, 401, 403, 404, 422, 429, 500, 502, 200]), form=st.integers(0, 3))
def test_no_message_shows_the_key_a_server_echoes(servers, key, status, form):
    """A server's answer (an error or not JSON) that quotes the API key is shown with the key
    replaced, whatever the key and the status."""
    server, _ = servers
    body = _echoes(key)[form]
    server.answer = _reply(status, body if status != 200 else b"<html>" + body)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(API_KEY_VARIABLE, key)
        with pytest.raises(ServerFault) as raised:
            Endpoint(server.url + "/v1", timeout_s=5).get("/models", ModelList)
    assert key not in str(raised.value) and urllib.parse.quote(key, safe="") not in str(raised.value)


@EXAMPLES
@given(key=keys, code=st.sampled_from([301, 302, 303, 307, 308]), where=st.sampled_from(["port", "host", "scheme"]))
def test_a_redirect_elsewhere_never_carries_the_key(servers, key, code, where):
    """A server that redirects a request to another port, host name or scheme is refused in a line
    naming the redirect, and the other address receives nothing, the key least of all."""
    server, other = servers
    other.seen.clear()
    location = {
        "port": other.url + "/v1/models",
        "host": other.url.replace("127.0.0.1", "localhost") + "/v1/models",
        "scheme": other.url.replace("http:", "https:") + "/v1/models",
    }[where]
    server.answer = _reply(code, b"", {"Location": location})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(API_KEY_VARIABLE, key)
        with pytest.raises(ServerFault, match="redirected /models to .*another address") as raised:
            Endpoint(server.url + "/v1", timeout_s=5).get("/models", ModelList)
    assert other.seen == [] and key not in str(raised.value)


def test_a_redirect_on_the_same_server_is_followed_with_the_key(servers, monkeypatch):
    """A redirect to another path of the same address is followed, as urllib does, key and all."""
    server, _ = servers
    monkeypatch.setenv(API_KEY_VARIABLE, "sesame-sesame")

    def answer(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/v1/models":
            _reply(307, b"", {"Location": "/v2/models"})(handler)
        else:
            _reply(200, b'{"data": []}')(handler)

    server.seen.clear()
    server.answer = answer
    assert Endpoint(server.url + "/v1", timeout_s=5).get("/models", ModelList).data == []
    assert server.seen == ["Bearer sesame-sesame"] * 2


@EXAMPLES
@given(user=secrets, password=secrets)
def test_a_password_in_the_address_is_refused_and_never_shown(user, password):
    """A user name and password in --target's address are refused in a line that shows neither."""
    url = f"http://{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}@127.0.0.1:9/v1"
    with pytest.raises(SpecDeckError, match="carries a user name or password") as raised:
        Endpoint(url)
    shown = str(raised.value)
    assert password not in shown and urllib.parse.quote(password, safe="") not in shown
    assert urllib.parse.quote(user, safe="") not in shown


def test_specdeck_run_with_a_password_in_the_target_shows_it_nowhere(capsys):
    """`specdeck run --target http://user:pass@...` ends in one line; neither output holds the password."""
    code = main(["run", "--target", "http://me:hunter2-secret@127.0.0.1:9/v1", "--target-model", "m", "--prompt", "hi"])
    captured = capsys.readouterr()
    assert code == 2 and "hunter2-secret" not in captured.out + captured.err
    assert "carries a user name or password" in captured.err


@EXAMPLES
@given(key=keys)
def test_a_model_list_that_echoes_the_key_is_shown_without_it(servers, key):
    """Where the server does not serve the model asked for, the message listing what it serves
    (the server's own words) never shows the key, even where a model's name quotes it."""
    from specdeck.engine.remote.remote_target import RemoteSettings, connect

    server, _ = servers
    server.answer = _reply(200, json.dumps({"data": [{"id": f"echo-{key}"}, {"id": "other"}]}).encode())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(API_KEY_VARIABLE, key)
        with pytest.raises(SpecDeckError, match="serves .*other.*pass one of those") as raised:
            connect(RemoteSettings(server.url + "/v1", "wanted", 5), None)
    assert key not in str(raised.value)
