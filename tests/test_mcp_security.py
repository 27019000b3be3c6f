"""MCP servers as untrusted processes: what a stdio server is given (its environment) and
what it may put in front of the model (schemas, descriptions). A real stdio server on the
SDK (tests/mcp_hostile_server.py) reports its environment and serves oversized tools."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from mcp_helpers import chat_round
from toollatch import ConfigError
from toollatch.cli._app_config import validate
from toollatch.mcp import McpServer, McpToolSource
from toollatch.runtime import Dispatcher

HOSTILE = str(Path(__file__).with_name("mcp_hostile_server.py"))
KEY_VAR = "TOOLLATCH_TEST_PROVIDER_KEY"
KEY = "k-" + "0123456789abcdef" * 2


def hostile(*options: str, **policy: object) -> McpServer:
    return McpServer(name="h", command=(sys.executable, HOSTILE, *options), **policy)  # type: ignore[arg-type]


async def server_environment(server: McpServer) -> dict[str, str]:
    async with McpToolSource([server]) as source:
        d = Dispatcher(source.snapshot())
        (result,) = await d.run(chat_round(d.specs, [("c1", "environment", {})]))
    assert not result.is_error, result.content
    env: dict[str, str] = json.loads(str(result.content))
    return env


async def test_a_stdio_server_gets_a_minimal_environment_and_its_own_env(monkeypatch):
    monkeypatch.setenv(KEY_VAR, KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = await server_environment(hostile(env={"NOTES_TOKEN": "given"}))
    assert KEY_VAR not in env
    assert "OPENAI_API_KEY" not in env
    assert KEY not in json.dumps(env)
    assert env["NOTES_TOKEN"] == "given"  # what the configuration passes, explicitly
    assert env["LC_ALL"] == "C.UTF-8"  # the locale
    for name in ("PATH", "HOME"):  # the SDK's default list
        if name in __import__("os").environ:
            assert name in env
    allowed = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LANGUAGE", "TZ"}
    allowed |= {"TMPDIR", "NOTES_TOKEN"}
    # (the interpreter itself may add a few of its own, e.g. LC_CTYPE on macOS)
    extra = {n for n in env if n not in allowed and not n.startswith("LC_")}
    assert extra <= {"PYTHONIOENCODING", "__CF_USER_TEXT_ENCODING"}, extra


async def test_inherit_env_passes_everything_when_asked(monkeypatch):
    monkeypatch.setenv(KEY_VAR, KEY)
    env = await server_environment(hostile(inherit_env=True, env={"EXTRA": "1"}))
    assert env[KEY_VAR] == KEY
    assert env["EXTRA"] == "1"


def test_the_config_default_is_the_minimal_environment():
    config = validate({"mcp": {"servers": [{"command": ["srv"], "env": {"A": "1"}}]}})
    (server,) = config.mcp_servers()
    assert server.inherit_env is False
    assert dict(server.env) == {"A": "1"}
    assert McpServer(name="s", command=("srv",)).inherit_env is False


async def test_a_huge_or_deep_schema_leaves_its_tool_out_with_a_warning(caplog):
    caplog.set_level(logging.WARNING, logger="toollatch.mcp")
    server = hostile("--schema-bytes", str(5_200_000), "--schema-depth", "60")
    async with McpToolSource([server]) as source:
        tools = {t.name: t for t in source.snapshot()}
    assert "fine" in tools
    assert "environment" in tools
    assert "huge" not in tools
    assert "deep" not in tools
    size = sum(len(json.dumps(t.spec.parameters)) for t in tools.values())
    assert size < 10_000
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'h'" in w and "'huge'" in w and "max_schema_bytes 65536" in w for w in warnings), (
        warnings
    )
    assert any("'h'" in w and "'deep'" in w and "max_schema_depth 32" in w for w in warnings)


async def test_schema_limits_are_per_server_and_a_schema_within_them_is_kept():
    server = hostile("--schema-bytes", "200000", "--schema-depth", "40",
                     max_schema_bytes=400_000, max_schema_depth=128)  # fmt: skip
    async with McpToolSource([server]) as source:
        tools = {t.name: t for t in source.snapshot()}
    assert {"huge", "deep"} <= tools.keys()


async def test_a_long_description_is_cut_with_a_warning(caplog):
    caplog.set_level(logging.WARNING, logger="toollatch.mcp")
    async with McpToolSource([hostile("--description-chars", "100000")]) as source:
        tools = {t.name: t for t in source.snapshot()}
    assert len(tools["chatty"].spec.description) == 4096
    assert tools["fine"].spec.description == "Return the text."
    assert any(
        "'h'" in r.getMessage() and "'chatty'" in r.getMessage() and "100000" in r.getMessage()
        for r in caplog.records
    )
    async with McpToolSource([hostile("--description-chars", "500",
                                      max_description_chars=100)]) as source:  # fmt: skip
        assert len({t.name: t for t in source.snapshot()}["chatty"].spec.description) == 100


@pytest.mark.parametrize(
    "option",
    [{"max_schema_bytes": 0}, {"max_schema_depth": True}, {"max_description_chars": -1}],
)
def test_bad_limits_are_config_errors(option):
    with pytest.raises(ConfigError, match=next(iter(option))):
        McpServer(name="s", command=("srv",), **option)  # type: ignore[arg-type]
