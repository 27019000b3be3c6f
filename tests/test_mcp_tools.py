"""The pieces under the MCP source, without a server: ``schema_tool`` (a Tool from a JSON
Schema and an async function), ``Dispatcher.replace_tools``, the name rule, the result
mapping, and one call id = one ``tools/call`` across dispatchers sharing a ledger."""

from __future__ import annotations

import base64
import re
from types import SimpleNamespace

import pytest

from mcp_helpers import calls_of, chat_round, stdio_server
from toollatch import ConfigError, ErrorCode, open_ledger, schema_tool, tool
from toollatch.mcp import McpToolSource
from toollatch.mcp._results import outcome_of
from toollatch.mcp._source import assign_names
from toollatch.runtime import Dispatcher

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


async def test_a_schema_tool_gets_the_mapping_and_never_raises_for_its_faults():
    seen = []

    async def double(arguments):
        seen.append(arguments)
        if arguments["n"] < 0:
            raise ValueError("negative")
        return {"twice": arguments["n"] * 2}

    t = schema_tool("double", SCHEMA, double, description="Twice n.", eager=True, timeout=2)
    assert (t.spec.parameters, t.spec.description, t.eager, t.timeout_s) == (
        SCHEMA,
        "Twice n.",
        True,
        2.0,
    )
    assert (await t.invoke({"n": 2})).content == '{"twice":4}'
    failed = await t.invoke({"n": -1})
    assert failed.is_error and failed.code is ErrorCode.TOOL_ERROR
    assert failed.content == "tool_error: ValueError: negative"
    assert seen == [{"n": 2}, {"n": -1}]


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "has space"},
        {"name": "x" * 65},
        {"parameters": {"type": 5}},
        {"timeout": 0},
        {"side_effects": "delete"},
        {"group": ""},
        {"fn": "not callable"},
    ],
)
def test_a_bad_schema_tool_is_a_config_error(bad):
    async def fn(arguments):
        return None

    options = {"name": "ok", "parameters": SCHEMA, "fn": fn, **bad}
    name, parameters, f = options.pop("name"), options.pop("parameters"), options.pop("fn")
    with pytest.raises(ConfigError):
        schema_tool(name, parameters, f, **options)


async def test_replace_tools_takes_a_new_set_and_refuses_duplicates_unchanged():
    @tool
    def a() -> str:
        return "a"

    @tool
    def b() -> str:
        return "b"

    d = Dispatcher([a], eager=["a"])
    d.replace_tools([a, b])
    assert list(d.tools) == ["a", "b"] and d.may_start_early("a")
    with pytest.raises(ConfigError, match="twice"):
        d.replace_tools([b, b])
    with pytest.raises(ConfigError):
        d.replace_tools(["b"])
    assert list(d.tools) == ["a", "b"]
    d.replace_tools([b])
    assert not d.may_start_early("a")  # (the eager name of a tool gone is ignored)
    results = await d.run(chat_round(d.specs, [("c1", "b", {})]))
    assert results[0].content == "b"


def test_names_are_kept_namespaced_on_collision_valid_and_sticky():
    keys = [
        ("fs", "read"),
        ("web", "read"),
        ("web", "files.list"),
        ("fs", "x" * 80),
        ("fs", "search"),
    ]
    names = assign_names(keys, {}, reserved=["search"])
    assert names[("fs", "read")] == "fs__read" and names[("web", "read")] == "web__read"
    assert names[("web", "files.list")] == "web__files_list"
    assert names[("fs", "search")] == "fs__search"
    long = names[("fs", "x" * 80)]
    assert len(long) == 64 and long.startswith("fs__xxx")
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n) for n in names.values())
    assert len(set(names.values())) == len(keys)
    # a later listing: the names given stay, a new colliding tool is namespaced
    later = assign_names([*keys, ("db", "read"), ("db", "query")], names, reserved=["search"])
    assert {k: later[k] for k in keys} == names
    assert later[("db", "read")] == "db__read" and later[("db", "query")] == "query"


def test_a_sole_tool_keeps_its_name_and_a_taken_namespaced_name_gets_a_suffix():
    names = assign_names([("a", "echo"), ("b", "b__echo"), ("b", "echo")], {}, reserved=[])
    assert names[("b", "b__echo")] == "b__echo"
    assert names[("a", "echo")] == "a__echo" and names[("b", "echo")] == "b__echo_2"
    assert assign_names([("a", "echo")], {}, reserved=[]) == {("a", "echo"): "echo"}


def test_every_content_kind_becomes_text_and_bytes_never_reach_the_model():
    png = base64.b64encode(b"\x89PNG" + b"\0" * 60).decode()
    blocks = [
        SimpleNamespace(type="text", text="hello"),
        SimpleNamespace(type="image", data=png, mime_type="image/png"),
        SimpleNamespace(type="audio", data="AAAA", mime_type="audio/wav"),
        SimpleNamespace(
            type="resource",
            resource=SimpleNamespace(uri="file:///a.txt", mime_type="text/plain", text="inside"),
        ),
        SimpleNamespace(
            type="resource",
            resource=SimpleNamespace(
                uri="file:///b.png", mime_type="image/png", text=None, blob=png
            ),
        ),
        SimpleNamespace(type="resource_link", uri="file:///c", name="c"),
    ]
    out = outcome_of(SimpleNamespace(content=blocks, structured_content=None, is_error=False))
    assert out.content.splitlines() == [
        "hello",
        "[image image/png, 64 bytes, not shown]",
        "[audio audio/wav, 3 bytes, not shown]",
        "[resource file:///a.txt (text/plain)]",
        "inside",
        "[resource file:///b.png (image/png), 64 bytes, not shown]",
        "[resource link file:///c (c)]",
    ]
    assert png not in out.content
    assert [i["data"] for i in out.ui["images"]] == [png, png]
    only = outcome_of(SimpleNamespace(content=[], structured_content={"a": 1}, is_error=True))
    assert only.content == '{"a":1}' and only.is_error and only.code is ErrorCode.TOOL_ERROR


async def test_one_call_id_is_one_tools_call_across_dispatchers_sharing_a_ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    async with McpToolSource([stdio_server(tmp_path, "ex")]) as source:
        results = []
        for worker in ("w1", "w2"):  # two dispatchers, as two processes would be
            ledger = open_ledger(url)
            d = Dispatcher(source.snapshot(), ledger=ledger, worker=worker)
            round_ = chat_round(d.specs, [("c1", "write_note", {"name": "n", "text": "x"})])
            async with d.round(session="run-1") as r:
                results.append(await r.finish(round_))
            await ledger.aclose()
    assert results[0][0].content == results[1][0].content == "appended 1 characters to n"
    assert calls_of(tmp_path, "ex") == [("write_note", {"name": "n", "text": "x"})]
    assert (tmp_path / "n.txt").read_text() == "x\n"


def test_the_runtime_imports_without_the_sdk_and_connecting_names_the_extra():
    import subprocess
    import sys

    code = """
import asyncio, sys
sys.modules["mcp"] = None  # as if the mcp extra were not installed
import toollatch.runtime, toollatch.cli._run_command
from toollatch import ConfigError
from toollatch.mcp import McpServer, McpToolSource
async def main():
    try:
        async with McpToolSource([McpServer(name="s", command=("true",))]):
            pass
    except ConfigError as exc:
        print(exc)
asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "toollatch[mcp]"' in done.stdout


def test_a_tool_with_an_unusable_schema_is_left_out_and_logged(caplog, tmp_path):
    source = McpToolSource([stdio_server(tmp_path, "ex")])  # (not entered: no process)
    source._listed = {
        "ex": [
            SimpleNamespace(name="good", input_schema={"type": "object"}, description="Good."),
            SimpleNamespace(name="bad", input_schema={"type": 5}, description=None),
        ]
    }
    source._rebuild()
    assert [t.name for t in source.snapshot()] == ["good"]
    assert source.snapshot()[0].spec.description == "Good."
    assert "tool 'bad' skipped" in caplog.text
