"""``toollatch run --mcp ...`` and the config file's ``mcp:`` section, run as a user runs
them (a subprocess), against the scripted model server and the example MCP server."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_helpers import SERVER, calls_of, http_server
from toollatch import ConfigError
from toollatch.cli._app_config import validate
from toollatch.mcp import McpServer, parse_server_spec, source_from_config
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

ROOT = Path(__file__).resolve().parents[1]


def toollatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def script() -> Script:
    note = json.dumps({"name": "cli", "text": "from the model"})
    first = Turn(
        items=(
            Text(text="Writing it down."),
            Call(call_id="c1", name="ex__write_note", arguments=note),
            Call(call_id="c2", name="web__echo", arguments='{"text": "hi"}'),
        ),
        delay_ms=0,
    )
    return Script(turns=(first, Turn(items=(Text(text="Done."),), delay_ms=0)))


def stdio_spec(tmp: Path, name: str) -> str:
    argv = [*SERVER, "--log", str(tmp / f"{name}.log"), "--notes", str(tmp)]
    return "stdio:" + shlex.join(argv)


def test_run_with_a_stdio_and_an_http_mcp_server_end_to_end(tmp_path):
    # both servers have echo and write_note: their names are namespaced by server name
    config = tmp_path / "c.yaml"
    with http_server(tmp_path, "web") as url, ScriptedServer({"m": script()}) as model:
        config.write_text(
            json.dumps(
                {
                    "mcp": {
                        "servers": [
                            {"name": "ex", "command": shlex.split(stdio_spec(tmp_path, "ex")[6:])},
                            {"name": "web", "url": url, "deny": ["crash"]},
                        ]
                    }
                }
            )
        )
        done = toollatch(
            "run",
            "--json",
            "--config",
            str(config),
            "--base-url",
            model.base_url("openai_chat"),
            "--model",
            "m",
        )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    last = events[-1]
    assert last["type"] == "run_ended" and last["error"] is None
    assert [(c["id"], c["is_error"]) for c in last["calls"]] == [("c1", False), ("c2", False)]
    assert calls_of(tmp_path, "ex") == [("write_note", {"name": "cli", "text": "from the model"})]
    assert calls_of(tmp_path, "web") == [("echo", {"text": "hi"})]
    assert (tmp_path / "cli.txt").read_text() == "from the model\n"


def test_run_mcp_flag_replaces_the_examples_and_runs_the_server_tools(tmp_path):
    turn = Turn(items=(Call(call_id="c1", name="echo", arguments='{"text": "flag"}'),), delay_ms=0)
    with ScriptedServer({"m": Script(turns=(turn,))}) as model:
        done = toollatch(
            "run",
            "--json",
            "--base-url",
            model.base_url("anthropic"),
            "--provider",
            "anthropic",
            "--model",
            "m",
            "--mcp",
            stdio_spec(tmp_path, "flag"),
        )
        offered = [t["name"] for t in model.requests[0].body["tools"]]
    assert done.returncode == 0, done.stderr
    assert "echo" in offered and "get_weather" not in offered
    assert calls_of(tmp_path, "flag") == [("echo", {"text": "flag"})]


def test_run_with_an_unreachable_mcp_server_is_a_usage_error(tmp_path):
    done = toollatch("run", "--json", "--mcp", "http://127.0.0.1:9/mcp")
    assert done.returncode == 2
    assert "toollatch: error:" in done.stderr and "127_0_0_1_9" in done.stderr
    done = toollatch("run", "--json", "--mcp", "ftp://x")
    assert done.returncode == 2 and "stdio:COMMAND" in done.stderr


def test_specs_and_config_servers_get_names_and_policies():
    assert parse_server_spec("stdio:/usr/bin/my-server --x 'a b'") == McpServer(
        name="my-server", command=("/usr/bin/my-server", "--x", "a b")
    )
    assert parse_server_spec("http://localhost:8080/mcp").name == "localhost_8080"
    config = validate(
        {
            "mcp": {
                "servers": [
                    {"command": ["srv"], "eager": ["read_*"], "timeout_s": 5, "max_concurrency": 2},
                    {"command": ["srv"], "allow": ["a"]},
                ]
            }
        }
    )
    servers = config.mcp_servers()
    assert [s.name for s in servers] == ["srv", "srv_2"]
    assert servers[0].eager == ("read_*",) and servers[0].timeout_s == 5.0
    source = source_from_config(config, ["stdio:srv"])
    assert source is not None and [s.name for s in source.servers] == ["srv", "srv_2", "srv_3"]
    assert source_from_config(None) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"servers": [{"name": "x"}]},
        {"servers": [{"command": ["a"], "url": "http://h/mcp"}]},
        {"servers": [{"command": ["a"], "max_concurrency": 0}]},
        {"servers": [{"url": "ftp://h"}]},
        {"servers": [{"name": "a", "command": ["a"]}, {"name": "a", "command": ["b"]}]},
        {"servers": [{"command": ["a"], "unknown": 1}]},
    ],
)
def test_bad_mcp_config_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        validate({"mcp": bad}).mcp_servers()
