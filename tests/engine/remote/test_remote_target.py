"""A remote target against a real OpenAI-compatible server: llama-cpp-python's, started here on
127.0.0.1 with the built-in GGUF (flash attention and a q8_0 KV cache, so that its one-token and
many-token forwards give the same logits); its faults against a small stub server."""

import json
import re
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from serving import NOT_SERVED, SERVED, free_port, llama_cpp_server, post

from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specdeck.engine.loading.models import encode_prompt, load_tokenizer
from specdeck.engine.loading.registry import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_HEAD, DEFAULT_TARGET
from specdeck.engine.loop.decoding import generate
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.remote.remote_answers import Timed
from specdeck.engine.remote.remote_http import API_KEY_VARIABLE, Endpoint
from specdeck.engine.remote.remote_scoring import ServerTime
from specdeck.engine.remote.remote_target import RemoteSettings, RemoteTarget, connect
from specdeck.engine.session import load_pair
from specdeck.engine.stats import expected_tokens_per_round, remote_tokens_per_s

needs_server = pytest.mark.skipif(not SERVED, reason=NOT_SERVED)
GREEDY = DecodeConfig(k=4, schedule="constant", max_new_tokens=16)


@pytest.fixture(scope="module")
def server_log(tmp_path_factory):
    """Where the server writes its log, which names the prompt tokens each request computed."""
    return tmp_path_factory.mktemp("llama-cpp-server") / "server.log"


@pytest.fixture(scope="module")
def server(server_log):
    """The base URL of a llama-cpp-python server on the built-in GGUF, model name "target"."""
    with llama_cpp_server(BUILTIN_MODELS[DEFAULT_TARGET].path(), log=server_log) as url:
        yield url


def server_greedy(url: str, prompt_text: str, n: int) -> str:
    """The server's own greedy completion (its repeat penalty off, which would change greedy text)."""
    body = {
        "model": "target",
        "prompt": prompt_text,
        "max_tokens": n,
        "temperature": 0,
        "top_k": 1,
        "repeat_penalty": 1.0,
    }
    return post(url + "/completions", body)["choices"][0]["text"]


@needs_server
@pytest.mark.parametrize(
    "drafter, draft, prompt",
    [
        (DrafterKind.PROMPT_LOOKUP, None, "The cat sat on the mat. The cat"),
        (DrafterKind.DRAFT_MODEL, DEFAULT_DRAFT, "Once upon a time,"),
    ],
)
def test_remote_greedy_text_is_the_servers_own(server, drafter, draft, prompt):
    """Speculative decoding against the server writes exactly the server's own greedy completion,
    each round keeping its whole continuation (fewer requests than tokens); prompt lookup's copies of
    the repeated prompt agree with it."""
    pair = load_pair(PairSpec(server, draft, drafter, device="cpu", target_model="target"))
    ids = encode_prompt(pair.target.tokenizer, prompt, chat=False)
    events = list(generate(pair.target, ids, GREEDY, pair.make_drafter()))
    summary = events[-1]
    assert summary.text == server_greedy(server, prompt, GREEDY.max_new_tokens)
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert summary.rounds < summary.new_tokens
    assert summary.accepted > 0 or drafter is not DrafterKind.PROMPT_LOOKUP
    assert all(r.network_ms is not None and r.network_ms > 0 for r in rounds)


@needs_server
def test_remote_chat_prompt_matches_too(server):
    """A chat prompt (which opens with the BOS token the server leaves out of its answer) decodes
    to the server's own greedy text as well."""
    pair = load_pair(PairSpec(server, DEFAULT_DRAFT, DrafterKind.DRAFT_MODEL, device="cpu", target_model="target"))
    ids = encode_prompt(pair.target.tokenizer, "Name three colours.", chat=True)
    config = DecodeConfig(k=4, schedule="constant", max_new_tokens=6)  # a long prompt: each request scores it all
    summary = list(generate(pair.target, ids, config, pair.make_drafter()))[-1]
    assert summary.text == server_greedy(server, pair.target.tokenizer.decode(ids), 6)


LONG_PROMPT = " ".join(f"Item {n}: the parcel for house {n} goes to the blue door." for n in range(1, 21))
COMPUTED = re.compile(rb"prompt eval time = .* / +(\d+) tokens")  # one a request, in the server's log


@needs_server
def test_a_long_context_costs_the_new_tokens_a_round(server, server_log):
    """After a prompt of some 300 tokens each round makes the server compute only the tokens kept
    since the last (as its log reports), not the whole context again, and the text is its own."""
    pair = load_pair(PairSpec(server, None, DrafterKind.PROMPT_LOOKUP, device="cpu", target_model="target"))
    ids = encode_prompt(pair.target.tokenizer, LONG_PROMPT, chat=False)
    config = DecodeConfig(k=4, schedule="constant", max_new_tokens=12)
    logged = server_log.stat().st_size
    summary = list(generate(pair.target, ids, config, pair.make_drafter()))[-1]
    with open(server_log, "rb") as log:
        log.seek(logged)
        computed = [int(n) for n in COMPUTED.findall(log.read())]
    assert len(ids) > 250 and len(computed) == summary.rounds and computed[0] > 250  # the first computes the prompt
    assert max(computed[1:]) <= config.k + 1  # the kept tokens since the last round, not the context
    assert summary.text == server_greedy(server, LONG_PROMPT, config.max_new_tokens)


@needs_server
def test_remote_sampling_is_refused(server):
    """Sampling against a server is refused, saying that servers give only top-k log-probabilities."""
    pair = load_pair(PairSpec(server, None, DrafterKind.PROMPT_LOOKUP, target_model="target"))
    with pytest.raises(SpecDeckError, match="greedily only.*top few log-probabilities"):
        next(generate(pair.target, [1, 2, 3], DecodeConfig(temperature=0.8), pair.make_drafter()))


@needs_server
def test_wrong_model_name_lists_the_served_ones(server):
    """A model name the server does not serve is refused with the names it does serve."""
    with pytest.raises(SpecDeckError, match="serves target, not 'llama-70b'.*--target-model"):
        load_pair(PairSpec(server, None, DrafterKind.PROMPT_LOOKUP, target_model="llama-70b"))


@needs_server
def test_dropped_connection_keeps_the_text_so_far(server):
    """A connection dropped mid-session stops it with a clear message; the text written is kept."""
    with Stub(upstream=server, drop_after=2) as stub:
        pair = load_pair(PairSpec(stub.url, None, DrafterKind.PROMPT_LOOKUP, target_model="target"))
        ids = encode_prompt(pair.target.tokenizer, "The cat sat on the mat. The cat", chat=False)
        events = []
        with pytest.raises(SpecDeckError, match="dropped before the answer was complete.*Run again.*kept"):
            for event in generate(pair.target, ids, GREEDY, pair.make_drafter()):
                events.append(event)
    summary = events[-1]
    assert isinstance(summary, SummaryEvent) and summary.stop_reason == "server_error"
    assert summary.new_tokens > 0 and server_greedy(server, "The cat sat on the mat. The cat", 16).startswith(
        summary.text
    )


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that gave up (a timeout, a drop) leaves a broken pipe here: expected, not news."""


class Stub:
    """A stub OpenAI-compatible server on a free port: it lists the model "target", answers with
    `status` (and `detail`) or after `delay_s`, wants `key` if given, and forwards to `upstream`
    otherwise, dropping the connection at the request after `drop_after` completions."""

    def __init__(
        self,
        status: int = 200,
        detail: str = "",
        delay_s: float = 0.0,
        key: str = "",
        upstream: str = "",
        drop_after: int | None = None,
    ) -> None:
        stub = self
        self.completions = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(200, {"object": "list", "data": [{"id": "target", "owned_by": "me"}]})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    return self._answer(401, {"detail": "Invalid API key"})
                if status != 200:
                    return self._answer(status, {"detail": detail})
                time.sleep(delay_s)
                if self.path.endswith("/completions"):
                    stub.completions += 1
                    if drop_after is not None and stub.completions > drop_after:
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return None
                if not upstream:
                    return self._answer(404, {"detail": "no upstream"})
                path = self.path.removeprefix("/v1")
                target = upstream + path if path.startswith("/completions") else upstream.removesuffix("/v1") + path
                request = urllib.request.Request(target, body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=300) as response:  # as it came: JSON or events
                    self._answer(200, response.read(), response.headers.get("Content-Type", ""))
                return None

            def _answer(self, code: int, answer: dict | bytes, kind: str = "application/json") -> None:
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Stub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_TARGET)


def first_round(url: str, tokenizer, timeout_s: float = 10.0) -> list:
    """The events of a one-round session against `url`, up to the error it ends with."""
    target = connect(RemoteSettings(url, "target", timeout_s), tokenizer)
    events = []
    for event in generate(target, tokenizer.encode("The cat sat"), DecodeConfig(max_new_tokens=4)):
        events.append(event)
    return events


@pytest.mark.parametrize(
    "stub, message",
    [
        (
            dict(status=500, detail="CUDA out of memory"),
            r"failed on /extras/tokenize: HTTP 500 \(CUDA out of memory\).*log",
        ),
        (dict(status=400, detail="prompt too long"), r"rejected the request .*HTTP 400 \(prompt too long\)"),
        (dict(status=503), r"HTTP 503.*run again once it is healthy"),
        (
            dict(key="sesame"),
            rf"refused the request: HTTP 401 \(Invalid API key\).*set the environment variable {API_KEY_VARIABLE}",
        ),
    ],
)
def test_server_errors_say_what_happened(tokenizer, stub, message):
    """Error statuses and a missing API key each stop the session with what went wrong and what to do."""
    with Stub(**stub) as server, pytest.raises(SpecDeckError, match=message):
        first_round(server.url, tokenizer)


def test_error_summary_comes_before_the_error(tokenizer):
    """A session whose server fails still hands out its summary, stop reason server_error."""
    events = []
    with Stub(status=502) as server, pytest.raises(SpecDeckError, match="HTTP 502"):
        target = connect(RemoteSettings(server.url, "target", 5.0), tokenizer)
        for event in generate(target, tokenizer.encode("The cat sat"), DecodeConfig(max_new_tokens=4)):
            events.append(event)
    assert isinstance(events[-1], SummaryEvent) and events[-1].stop_reason == "server_error"


def test_wrong_api_key_is_named(tokenizer, monkeypatch):
    """A key the server refuses is named as the one in the environment variable to check."""
    monkeypatch.setenv(API_KEY_VARIABLE, "guess")
    with Stub(key="sesame") as server, pytest.raises(SpecDeckError, match=f"Check the API key in {API_KEY_VARIABLE}"):
        first_round(server.url, tokenizer)


def test_slow_server_times_out_at_the_users_timeout(tokenizer):
    """A server slower than --timeout stops the session at that timeout, saying how to raise it."""
    with Stub(delay_s=2.0) as server, pytest.raises(SpecDeckError, match=r"did not answer within 0.3 s \(--timeout\)"):
        started = time.perf_counter()
        try:
            first_round(server.url, tokenizer, timeout_s=0.3)
        finally:
            assert time.perf_counter() - started < 2.0


class DripServer:
    """A server on a free port that sends its answer to /models one byte every `interval_s`, from
    the status line (`in_headers`) or from the body's first byte."""

    def __init__(self, interval_s: float, in_headers: bool) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.interval_s, self.in_headers = interval_s, in_headers
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            connection.recv(65536)
            body = json.dumps({"object": "list", "data": [{"id": "target"}] * 20}).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            if not self.in_headers:
                connection.sendall(head)
            try:
                for byte in head + body if self.in_headers else body:
                    connection.sendall(bytes([byte]))
                    time.sleep(self.interval_s)
            except OSError:
                pass  # the client gave up

    def __enter__(self) -> "DripServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()


@pytest.mark.parametrize("in_headers", [False, True], ids=["drip in the body", "drip in the headers"])
def test_timeout_bounds_a_whole_request_not_each_read(in_headers):
    """A server that sends a byte now and then, each well within --timeout, is stopped at --timeout
    for the whole answer (its full answer would take minutes)."""
    with DripServer(0.2, in_headers) as server, pytest.raises(SpecDeckError, match=r"did not answer within 1 s"):
        started = time.monotonic()
        try:
            connect(RemoteSettings(server.url, "target", 1.0), None)
        finally:
            assert time.monotonic() - started < 30


def test_server_down_is_named():
    """An address where nothing listens says so, and what to do."""
    with pytest.raises(SpecDeckError, match="Nothing answers at .*connection refused.*start the server"):
        connect(RemoteSettings(f"http://127.0.0.1:{free_port()}/v1", "target", 5.0), None)


def test_feature_head_is_refused_for_a_remote_target(tokenizer):
    """A feature head needs hidden states a server does not return: refused, naming the drafters that work."""
    with Stub() as server, pytest.raises(SpecDeckError, match="hidden states.*draft-model, prompt-lookup"):
        load_pair(PairSpec(server.url, DEFAULT_HEAD, DrafterKind.FEATURE_HEAD, target_model="target"))


def test_latency_model_pays_more_the_longer_the_round_trip():
    """Speculation's gain over plain decoding grows with the round trip; drafts never accepted never pay."""

    def speedup(a, rtt):
        kept = expected_tokens_per_round(a, 4)
        return remote_tokens_per_s(kept, 4, rtt, 2.0, 20.0) / remote_tokens_per_s(1.0, 0, rtt, 0.0, 15.0)

    gains = [speedup(0.7, rtt) for rtt in (0, 10, 100, 300)]
    assert gains == sorted(gains) and gains[-1] > 2.0
    assert all(speedup(0.0, rtt) < 1.0 for rtt in (0, 10, 100, 300))


def test_server_time_reads_what_servers_report():
    """The round's split: llama.cpp's timings and OpenAI's cached-token count; nothing invented where absent."""
    timed = ServerTime.of(
        Timed.model_validate({"timings": {"prompt_ms": 30.0, "predicted_ms": 10.0, "cache_n": 0}}), 100.0
    )
    assert (timed.server_ms, timed.network_ms, timed.cache_hit) == (40.0, 60.0, False)
    cached = ServerTime.of(Timed.model_validate({"usage": {"prompt_tokens_details": {"cached_tokens": 96}}}), 50.0)
    assert (cached.server_ms, cached.network_ms, cached.cache_hit) == (None, 50.0, True)
    assert ServerTime.of(Timed.model_validate({}), 25.0).cache_hit is None


class _Rows:
    """A scoring that answers the same crafted row at every position."""

    def __init__(self, row: dict[int, float]) -> None:
        self.row = row

    def continues(self, ids, drafts):
        return False

    def admit(self, endpoint, ids, drafts):
        return drafts

    def score(self, endpoint, model, ids, drafts, length):
        return [dict(self.row) for _ in range(length)], ServerTime(1.0)


@pytest.mark.parametrize(
    "row, message",
    [
        ({0: -10.8018, 1: -10.8018, 2: -10.8018}, r"same log-probability for every token .*weights"),
        ({5: float("nan"), 6: -1.0}, r"not finite numbers.*bfloat16 or float32"),
        ({5: 0.7, 6: -1.0}, r"not finite numbers"),
    ],
)
def test_a_served_distribution_no_model_gives_stops_the_session(tokenizer, row, message):
    """A uniform distribution (a server whose model did not load its weights) or values that are
    not log-probabilities stop the session with the cause, instead of text that agrees with any draft;
    a sensible row passes."""

    def served(row):
        settings = RemoteSettings("http://127.0.0.1:9/v1", "target", 1.0)
        return RemoteTarget(settings, tokenizer, Endpoint(settings.url, 1.0), _Rows(row), "vllm")

    with pytest.raises(SpecDeckError, match=message):
        list(generate(served(row), tokenizer.encode("The cat sat"), DecodeConfig(max_new_tokens=4)))
    events = list(generate(served({5: -0.1, 6: -3.0}), tokenizer.encode("The cat sat"), DecodeConfig(max_new_tokens=4)))
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == [5, 5, 5, 5]
