"""`toollatch proxy` and `toollatch probe` as commands: real subprocesses, real HTTP, the
official `openai` SDK as the proxy's client, the scripted server (with a quirk profile) as
the upstream."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import typing
from collections.abc import Iterator

import openai
import pytest

from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

CLI = [sys.executable, "-m", "toollatch.cli"]
TWO = Script(
    turns=(
        Turn(
            items=(
                Text(text="Checking."),
                Call(call_id="c_osl", name="get_weather", arguments='{"city": "Oslo"}'),
                Call(call_id="c_lim", name="get_weather", arguments='{"city": "Lima"}'),
            ),
            delay_ms=0.5,
        ),
    )
)
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "required": ["city"]}},
}


@pytest.fixture
def ollama_like():
    with ScriptedServer({"m": TWO}, delay_scale=0.1, quirks="ollama") as server:
        yield server


@contextlib.contextmanager
def proxy_process(*flags: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``toollatch proxy FLAGS --port 0`` as a child process, and the base URL it printed;
    killed if it still runs at the end."""
    proc = subprocess.Popen(
        [*CLI, "proxy", *flags, "--port", "0"], stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+/v1", line)
        assert match, line
        yield proc, match.group(0)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_proxy_serves_the_sdk_clean_calls_then_stops_on_sigterm(ollama_like, tmp_path):
    upstream = ollama_like.base_url("openai_chat")
    with proxy_process("--upstream", upstream, "--record", str(tmp_path)) as (proc, url):
        with openai.OpenAI(base_url=url, api_key="sk-x", max_retries=0) as client:
            with client.chat.completions.stream(
                model="m", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
            ) as stream:
                final = stream.get_final_completion()
        calls = final.choices[0].message.tool_calls or []
        assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
            ("c_osl", "get_weather", '{"city": "Oslo"}'),
            ("c_lim", "get_weather", '{"city": "Lima"}'),
        ]  # directly, the SDK's helper fails on this stream (Q1: no index)
        assert final.choices[0].finish_reason == "tool_calls"  # (the upstream said "stop")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    assert len(list(tmp_path.glob("*.sse"))) == 1


def test_proxy_refuses_a_bad_upstream_and_beyond_loopback_without_a_token():
    bad = subprocess.run([*CLI, "proxy", "--upstream", "ftp://x"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "toollatch: error:" in bad.stderr and "upstream" in bad.stderr
    wide = subprocess.run(
        [*CLI, "proxy", "--upstream", "http://127.0.0.1:9/v1", "--host", "0.0.0.0"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert wide.returncode == 2
    assert "token" in wide.stderr


def test_probe_reports_the_profiles_quirks_as_json_and_as_a_table(ollama_like):
    base = ollama_like.base_url("openai_chat")
    env = {**os.environ, "TOOLLATCH_PROBE_API_KEY": "sk-probe-0123456789abcdefghij"}
    done = subprocess.run(
        [*CLI, "probe", "--base-url", base, "--model", "m", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document["quirks"]) == {"Q1", "Q8", "Q12"}
    assert len(document["probes"]) == 8
    single = document["probes"][0]
    assert single["name"] == "single"
    assert [c["committed"] for c in single["calls"]] == [True, True]
    table = subprocess.run(
        [*CLI, "probe", "--base-url", base, "--model", "m"], capture_output=True, text=True
    )
    assert table.returncode == 0
    assert 'Q12: finish_reason "stop" although calls streamed' in table.stdout


def test_probe_of_a_server_that_is_not_there_exits_1_with_the_reason():
    done = subprocess.run(
        [*CLI, "probe", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "ConnectError" in done.stdout


def test_proxy_reads_an_anthropic_upstream_for_an_openai_client():
    with ScriptedServer({"m": TWO}, delay_scale=0.1) as upstream:
        flags = ("--upstream", upstream.base_url("anthropic"), "--upstream-provider", "anthropic")
        with proxy_process(*flags) as (proc, url):
            with openai.OpenAI(base_url=url, api_key="sk-x", max_retries=0) as client:
                whole = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
                )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
        [seen] = upstream.requests
    assert seen.path == "/v1/messages" and seen.headers["x-api-key"] == "sk-x"
    calls = whole.choices[0].message.tool_calls or []
    assert [(c.id, c.function.arguments) for c in calls] == [
        ("c_osl", '{"city": "Oslo"}'),
        ("c_lim", '{"city": "Lima"}'),
    ]


def test_the_flags_providers_are_the_proxys():
    from toollatch.cli import build_parser
    from toollatch.cli._app_config import ProxyConfig
    from toollatch.cli._proxy import proxy_server
    from toollatch.relay._proxy_upstreams import UPSTREAM_PROVIDERS

    parser = build_parser()
    args = parser.parse_args(["proxy", "--upstream", "http://x"])
    assert args.upstream_provider is None  # unset: proxy.upstream_provider decides
    assert proxy_server(args, env={}).upstream_provider == "openai_chat"
    subparsers = next(a for a in parser._actions if a.dest == "command")
    proxy = subparsers.choices["proxy"]  # type: ignore[attr-defined]
    [flag] = [a for a in proxy._actions if a.dest == "upstream_provider"]
    assert set(flag.choices) == set(UPSTREAM_PROVIDERS)
    configured = ProxyConfig.model_fields["upstream_provider"].annotation
    assert set(typing.get_args(configured)) == set(UPSTREAM_PROVIDERS)


def test_proxy_settles_its_heap_once_started():
    """``toollatch proxy`` freezes what its start made and makes full collections rarer, as
    ``toollatch serve`` does (``settle_heap``, whose own test shows later garbage still
    collected: a full collection of the start's objects paused every stream for tens of ms,
    benchmarks/README.md). A real ProxyServer, stopped as soon as it serves; in a child
    process (a frozen heap is never given back, so the test process must not freeze its
    own)."""
    script = """
import asyncio, gc
from toollatch.relay import _server, ProxyServer
from toollatch.cli import _proxy as _command
called = []
_server.settle_heap, real = (lambda: (called.append(1), real())), _server.settle_heap
class Once(ProxyServer):
    async def serve_forever(self):
        seen.append((gc.get_freeze_count(), gc.get_threshold()[2]))
        self.stop()
        await super().serve_forever()
seen = []
assert asyncio.run(_command._serve(Once("http://127.0.0.1:9/v1"))) == 0
assert called == [1], called
[(frozen, full_every)] = seen
assert frozen > 1000 and full_every == 100, seen
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
