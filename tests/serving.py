"""Helpers for tests that start a real OpenAI-compatible server on 127.0.0.1 (llama-cpp-python's,
vLLM's): a free port, a JSON request, and waiting for the server to answer."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import pytest


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
