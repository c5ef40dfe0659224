"""Helpers for tests that start a real OpenAI-compatible server on 127.0.0.1 (llama-cpp-python's,
vLLM's): a free port, a JSON request, waiting for the server to answer, and llama-cpp-python's
server on a GGUF file; and a fake server's plumbing (`FakeServer`, `QuietHandler`)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# whether llama-cpp-python's server runs here (`llama_cpp_server`)
SERVED = importlib.util.find_spec("llama_cpp") is not None and all(
    importlib.util.find_spec(name) is not None for name in ("fastapi", "uvicorn", "sse_starlette", "pydantic_settings")
)
NOT_SERVED = 'llama_cpp or its server extra is not installed (pip install "llama-cpp-python[server]==0.3.36")'

# `python -m llama_cpp.server`, with the weights kept out of ggml's AMX buffers where the CPU has AMX
# (their product crashes the server at its first request there; `specdeck.engine.forward.llamacpp_backend.model_params`)
SERVER_WITHOUT_AMX_BUFFERS = """
import llama_cpp
from llama_cpp.server.__main__ import main
from specdeck.engine.forward.llamacpp_backend import model_params
llama_cpp.llama_cpp.llama_model_default_params = lambda: model_params(llama_cpp)
main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout_s: float = 300) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def wait_until_serving(process: subprocess.Popen, url: str, name: str, seconds: float) -> None:
    """Return once `url`/models answers; fail the test if the server exits or `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/models", timeout=1):
                return
        except OSError:
            if process.poll() is not None:
                pytest.fail(f"{name} exited while starting")
            time.sleep(0.25)
    process.terminate()
    pytest.fail(f"{name} did not answer within {seconds:.0f} s")


@contextmanager
def llama_cpp_server(model: Path, name: str = "target", log: Path | None = None) -> Iterator[str]:
    """The base URL of a llama-cpp-python server on the GGUF file `model`, served as `name`, one
    thread, with flash attention and a q8_0 KV cache (so that its one-token and many-token forwards
    give the same logits, and greedy text does not depend on how many tokens a request scores).
    With `log`, its verbose log goes there (it names the prompt tokens each request computed)."""
    if not SERVED:
        pytest.skip(NOT_SERVED)
    port = free_port()
    command = [sys.executable, "-c", SERVER_WITHOUT_AMX_BUFFERS, "--model", str(model), "--model_alias", name]
    command += ["--host", "127.0.0.1", "--port", str(port), "--n_threads", "1", "--logits_all", "true"]
    command += ["--flash_attn", "true", "--type_k", "8", "--type_v", "8"]
    if log is None:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        with open(log, "wb") as written:
            process = subprocess.Popen(command + ["--verbose", "true"], stdout=subprocess.DEVNULL, stderr=written)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_serving(process, url, "llama-cpp-python's server", 60)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


class QuietHandler(BaseHTTPRequestHandler):
    """A fake server's request handler: silent, reading JSON bodies, replying with whole bodies."""

    def log_message(self, *args) -> None:
        pass

    def body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def reply(self, answer: dict | bytes, kind: str = "application/json") -> None:
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeServer:
    """A fake server on a free port of 127.0.0.1, answering with `handler`, serving inside `with`;
    `url` is its API's base address."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
