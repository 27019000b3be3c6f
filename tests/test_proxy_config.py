"""The whole-app configuration's ``proxy:`` section (cli/_app_config.py) and ``toollatch proxy
--config FILE``: every flag has a key, and a flag wins over TOOLLATCH_PROXY__<KEY>, which
wins over the file, which wins over the defaults (the rule of ``serve`` and ``relay:``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import yaml

from test_proxy_live import MESSAGES, WEATHER
from toollatch import ConfigError, Limits
from toollatch.cli import build_parser
from toollatch.cli._app_config import EXAMPLE, load_config
from toollatch.cli._proxy import proxy_server
from toollatch.scripted import Call, Script, ScriptedServer, Turn

CLI = [sys.executable, "-m", "toollatch.cli"]
FILE = """
proxy:
  upstream: http://127.0.0.1:9/v1
  port: 9001
  calls: stream
  record: /tmp/from-file
  idle_timeout_s: 7
  max_request_bytes: 1000
  allowed_hosts: [proxy.example]
  max_connections: 50
  keepalive_timeout_s: 2
  upstream_key_env: MY_UPSTREAM_KEY
agent_stream_assemble:
  max_tool_argument_bytes: 4096
"""


def server_of(tmp_path: Path, *flags: str, env: dict[str, str] | None = None):
    path = tmp_path / "toollatch.yaml"
    path.write_text(FILE, encoding="utf-8")
    args = build_parser().parse_args(["proxy", "--config", str(path), *flags])
    return proxy_server(args, env=env or {})


def test_the_file_sets_every_proxy_setting(tmp_path):
    server = server_of(tmp_path, env={"MY_UPSTREAM_KEY": "sk-upstream"})
    assert server.upstream == "http://127.0.0.1:9/v1"
    assert (server.port, server.calls) == (9001, "stream")
    assert str(server.record) == "/tmp/from-file"
    assert (server.idle_timeout_s, server.max_request_bytes) == (7, 1000)
    assert server.access.host_allowed("proxy.example")
    assert server.connections.max_connections == 50
    assert server.connections.idle_timeout_s == 2
    assert server.upstream_key == "sk-upstream"
    assert server.limits == Limits(max_argument_bytes=4096)


def test_the_environment_wins_over_the_file_and_a_flag_over_both(tmp_path):
    env = {"TOOLLATCH_PROXY__PORT": "9002", "TOOLLATCH_PROXY__CALLS": "hold"}
    server = server_of(tmp_path, env=env)
    assert (server.port, server.calls) == (9002, "hold")
    flags = ["--port", "9003", "--calls", "stream", "--idle-timeout", "3"]
    flags += ["--max-request-bytes", "77", "--record", "/tmp/from-flag"]
    flagged = server_of(tmp_path, *flags, env=env)
    assert (flagged.port, flagged.calls) == (9003, "stream")
    assert (flagged.idle_timeout_s, flagged.max_request_bytes) == (3, 77)
    assert str(flagged.record) == "/tmp/from-flag"


def test_defaults_without_a_file_and_the_upstream_is_required():
    args = build_parser().parse_args(["proxy", "--upstream", "http://127.0.0.1:9/v1"])
    server = proxy_server(args, env={})
    assert (server.host, server.port, server.calls) == ("127.0.0.1", 8080, "hold")
    assert (server.idle_timeout_s, server.max_request_bytes) == (60.0, 16 * 1024 * 1024)
    assert server.upstream_key is None
    with pytest.raises(ConfigError, match="upstream is required"):
        proxy_server(build_parser().parse_args(["proxy"]), env={})
    with pytest.raises(ConfigError, match=r"proxy\.calls.*TOOLLATCH_PROXY__CALLS"):
        proxy_server(args, env={"TOOLLATCH_PROXY__CALLS": "eager"})


def test_the_example_documents_the_section_and_the_token_is_masked():
    section = yaml.safe_load(EXAMPLE)["proxy"]
    flags = {"upstream", "host", "port", "calls", "token", "record", "idle_timeout_s",
             "max_request_bytes", "allowed_hosts"}  # fmt: skip
    assert flags <= set(section)
    shown = load_config(env={"TOOLLATCH_PROXY__TOKEN": "a-secret-token-0123456789"}).effective()
    assert "a-secret-token" not in shown
    assert yaml.safe_load(shown)["proxy"]["token"] == "[set]"


TWO = Script(
    turns=(
        Turn(
            items=(Call(call_id="c_1", name="get_weather", arguments='{"city": "Oslo"}'),),
            delay_ms=0.5,
        ),
    )
)


def test_proxy_config_file_runs_the_command(tmp_path):
    with ScriptedServer({"m": TWO}, delay_scale=0.1) as upstream:
        path = tmp_path / "toollatch.yaml"
        base = upstream.base_url("openai_chat")
        path.write_text(f"proxy:\n  upstream: {base}\n  port: 0\n  calls: stream\n")
        proc = subprocess.Popen(
            [*CLI, "proxy", "--config", str(path)], stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            match = re.search(r"http://127\.0\.0\.1:\d+/v1", line)
            assert match, line
            assert base in line
            with openai.OpenAI(base_url=match.group(0), api_key="k", max_retries=0) as client:
                stream = client.chat.completions.create(
                    model="m", messages=MESSAGES, tools=[WEATHER], stream=True
                )
                deltas = [d for ch in stream for c in ch.choices for d in c.delta.tool_calls or ()]
            assert len(deltas) > 1  # stream mode: the head, then fragments
            assert "".join(d.function.arguments or "" for d in deltas) == '{"city": "Oslo"}'
        finally:
            proc.terminate()
            proc.wait(timeout=15)
            if proc.stderr is not None:
                proc.stderr.close()
