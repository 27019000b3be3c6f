"""Issue 35 item 2: an error for a wrong endpoint names the URL tried, adds the hint that
fits (a 404 on ``.../chat/completions`` with no ``/v1`` in the base URL: "does the base URL
need /v1?"), keeps the HTTP library's text out ("ConnectError", aiohttp's "ssl:default"),
and the relay logs it on its console. Real HTTP on loopback: the scripted server, a closed
port, ``toollatch run`` and ``toollatch serve`` as subprocesses."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from relay_helpers import parse_sse, serve
from toollatch.runtime._clients._errors import connect_reason, endpoint_hint
from toollatch.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
INTERNALS = ("ConnectError", "ssl:default", "Errno", "httpx", "aiohttp", "Connect call failed")


@pytest.fixture(scope="module")
def scripted():
    with ScriptedServer(delay_scale=0) as running:
        yield running


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again: nothing listens there


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_base_url_without_v1_gets_the_url_and_the_hint(scripted):
    base = scripted.base_url("openai_chat").removesuffix("/v1")
    done = _run("--base-url", base, "--model", "scripted")
    assert done.returncode == 1
    assert done.stderr == (
        f"toollatch: error: model: openai_chat: HTTP 404: Not Found (from {base}/chat/"
        "completions; does the base URL need /v1?)\n"
    )


def test_an_anthropic_base_url_ending_in_v1_gets_the_other_hint(scripted):
    base = scripted.base_url("anthropic") + "/v1"
    done = _run("--provider", "anthropic", "--base-url", base, "--model", "scripted")
    assert done.returncode == 1
    assert f"from {base}/v1/messages; the base URL should not end in /v1" in done.stderr


def test_an_unreachable_model_names_the_url_and_no_library_internals():
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    done = _run("--base-url", base, "--model", "m")
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"toollatch: error: model: openai_chat: cannot reach the model at {base}/chat/"
        "completions: connection refused"
    )
    for internal in INTERNALS:
        assert internal not in done.stderr


def test_the_relay_page_gets_the_url_and_its_console_logs_the_failure(scripted):
    bad = [
        (scripted.base_url("openai_chat").removesuffix("/v1"), "does the base URL need /v1?"),
        (f"http://127.0.0.1:{_closed_port()}/v1", "connection refused"),
    ]
    for base, hint in bad:
        proc, url = serve("--base-url", base, "--model", "scripted", "--ledger", "none")
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                run = client.post("/runs", json={"message": "hi"}).json()
                frames, _ = parse_sse(client.get(run["events_url"]).text)
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.stderr is not None
            console = proc.stderr.read()
            proc.stderr.close()
            proc.wait(timeout=15)
        error = frames[-1].data["error"]
        assert f"{base}/chat/completions" in error
        assert hint in error
        for internal in INTERNALS:
            assert internal not in error
        assert "toollatch: ERROR: toollatch.relay: run " in console
        assert f"{base}/chat/completions" in console


class _AiohttpLike(Exception):
    """Shaped as aiohttp's ClientConnectorError: the OSError on ``os_error``."""

    def __init__(self) -> None:
        super().__init__("Cannot connect to host 127.0.0.1:9 ssl:default [Connect call failed]")
        self.os_error = ConnectionRefusedError(111, "Connect call failed")


def test_connect_reason_reads_the_os_error_in_the_chain():
    wrapped = httpx.ConnectError("Cannot connect to host 127.0.0.1:9 ssl:default")
    wrapped.__cause__ = _AiohttpLike()
    assert connect_reason(wrapped).startswith("connection refused")
    resolving = httpx.ConnectError("[Errno -2] Name or service not known")
    resolving.__context__ = socket.gaierror(-2, "Name or service not known")
    assert connect_reason(resolving) == "the host name does not resolve"
    assert connect_reason(httpx.ConnectTimeout("")) == "connecting timed out"
    assert connect_reason(httpx.ConnectError("who knows")) == "the connection failed"


@pytest.mark.parametrize(
    ("status", "base", "default", "path", "hint"),
    [
        (404, "http://h:1", "https://api.openai.com/v1", "/chat/completions",
         "does the base URL need /v1?"),
        (404, "http://h:1/v1", "https://api.openai.com/v1", "/chat/completions", None),
        (500, "http://h:1", "https://api.openai.com/v1", "/chat/completions", None),
        (404, "http://h:1/v1", "https://api.anthropic.com", "/v1/messages",
         "the base URL should not end in /v1: the request path starts with it"),
        (404, "http://h:1", "https://api.anthropic.com", "/v1/messages", None),
    ],
)  # fmt: skip
def test_endpoint_hint(status, base, default, path, hint):
    assert endpoint_hint(status, base, default, path) == hint
