"""The MCP tool source against the example MCP server as a real process, over stdio and
over streamable HTTP on loopback: listing, names, results, errors, cancellation, list
changes. The server's own log (what it received) is the evidence of what reached it."""

from __future__ import annotations

import asyncio

import pytest

from mcp_helpers import calls_of, chat_round, http, http_server, log_of, stdio_server, wait_for_log
from toollatch import ConfigError, Deny, ErrorCode
from toollatch.mcp import McpToolSource
from toollatch.mcp._example_server import FAKE_SECRET
from toollatch.runtime import Dispatcher


@pytest.fixture(params=["stdio", "http"])
def server(request, tmp_path):
    """One example server named ``ex`` (stdio) or ``web`` (HTTP); yields (factory, name)."""
    if request.param == "stdio":
        yield (lambda **policy: stdio_server(tmp_path, "ex", **policy)), "ex"
    else:
        with http_server(tmp_path, "web") as url:
            yield (lambda **policy: http(tmp_path, url, "web", **policy)), "web"


async def run_calls(source, calls, **kw):
    d = Dispatcher(source.snapshot(), **kw)
    round_ = chat_round(d.specs, calls)
    return await d.run(round_), round_


async def test_tools_are_listed_with_their_input_schema_and_calls_reach_the_server(
    server, tmp_path
):
    make, name = server
    async with McpToolSource([make()]) as source:
        tools = {t.name: t for t in source.snapshot()}
        assert {"echo", "write_note", "slow", "crash", "image", "add_tool"} <= tools.keys()
        assert tools["echo"].spec.parameters["required"] == ["text"]
        assert source.origin("echo") == (name, "echo")
        results, _ = await run_calls(
            source,
            [("c1", "echo", {"text": "hi"}), ("c2", "write_note", {"name": "n", "text": "x"})],
        )
    assert [r.content for r in results] == ["hi", "appended 1 characters to n"]
    assert not any(r.is_error for r in results)
    assert (tmp_path / "n.txt").read_text() == "x\n"
    assert calls_of(tmp_path, name) == [
        ("echo", {"text": "hi"}),
        ("write_note", {"name": "n", "text": "x"}),
    ]


async def test_content_blocks_map_to_text_and_errors_to_tool_error(server, tmp_path):
    make, _name = server
    async with McpToolSource([make()]) as source:
        d = Dispatcher(source.snapshot())
        round_ = chat_round(
            d.specs,
            [
                ("i", "image", {}),
                ("r", "resource", {}),
                ("f", "fail", {"reason": "nope"}),
                ("w", "weather", {"city": "Oslo"}),
                ("s", "secret", {}),
                ("b", "big", {"size": 300_000}),
            ],
        )
        async with d.round() as r:
            results = await r.finish(round_)
            ui = dict(r.ui)
    image, resource, fail, weather, secret, big = results
    assert image.content == "[image image/png, 70 bytes, not shown]" and not image.is_error
    assert ui["i"]["images"][0]["mime_type"] == "image/png"
    assert resource.content == "[resource note://example (text/plain)]\nresource text"
    assert fail.is_error and fail.code is ErrorCode.TOOL_ERROR and "nope" in fail.content
    assert '"temp_c": 4' in weather.content and ui["w"]["structured_content"]["temp_c"] == 4
    assert FAKE_SECRET in secret.content  # (masking is the result path's redaction hook)
    # sizing is the result path's: the dispatcher's default budget (64 KiB) cuts it
    assert big.truncated_from == 300_000 and len(big.content.encode()) <= 65536
    assert big.content.startswith("0123456789") and not big.is_error


async def test_a_hanging_server_gives_tool_timeout_and_is_told_to_cancel(server, tmp_path):
    make, name = server
    async with McpToolSource([make(timeout_s=0.5)]) as source:
        results, _ = await run_calls(source, [("c1", "slow", {"seconds": 30})])
        assert results[0].code is ErrorCode.TOOL_TIMEOUT
        cancelled = await wait_for_log(tmp_path, name, "cancelled")
        await wait_for_log(tmp_path, name, "slow_cancelled")
    assert cancelled["reason"] == "caller cancelled"
    assert [e["event"] for e in log_of(tmp_path, name)].count("slow_done") == 0


async def test_a_cancelled_call_reaches_the_server_as_a_cancellation(server, tmp_path):
    make, name = server
    async with McpToolSource([make()]) as source:
        d = Dispatcher(source.snapshot())
        round_ = chat_round(d.specs, [("c1", "slow", {"seconds": 30})])
        async with d.round() as r:
            task = asyncio.ensure_future(r.finish(round_))
            await wait_for_log(tmp_path, name, "slow_started")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            results = await r.abort(round_)
        await wait_for_log(tmp_path, name, "cancelled")
        await wait_for_log(tmp_path, name, "slow_cancelled")
    assert results[0].code is ErrorCode.CANCELLED


async def test_a_server_that_dies_mid_call_gives_outcome_unknown_and_no_later_send(tmp_path):
    async with McpToolSource([stdio_server(tmp_path, "ex")]) as source:
        results, _ = await run_calls(source, [("c1", "crash", {})])
        assert results[0].code is ErrorCode.OUTCOME_UNKNOWN, results[0].content
        assert "may have had its effect" in results[0].content
        later, _ = await run_calls(source, [("c2", "echo", {"text": "after"})])
    assert later[0].code is ErrorCode.TOOL_ERROR and "not run" in later[0].content
    assert calls_of(tmp_path, "ex") == [("crash", {})]


async def test_an_http_server_that_dies_mid_call_gives_outcome_unknown(tmp_path):
    with http_server(tmp_path, "web") as url:
        async with McpToolSource([http(tmp_path, url, "web", timeout_s=20)]) as source:
            results, _ = await run_calls(source, [("c1", "crash", {})])
    assert results[0].code is ErrorCode.OUTCOME_UNKNOWN, results[0].content
    assert calls_of(tmp_path, "web") == [("crash", {})]


async def test_one_call_id_is_one_tools_call_across_rounds(server, tmp_path):
    make, name = server
    async with McpToolSource([make()]) as source:
        d = Dispatcher(source.snapshot())
        round_ = chat_round(d.specs, [("c1", "write_note", {"name": "once", "text": "x"})])
        first = await d.run(round_)
        again = await d.run(
            chat_round(d.specs, [("c1", "write_note", {"name": "once", "text": "x"})])
        )
    assert first == again
    assert calls_of(tmp_path, name) == [("write_note", {"name": "once", "text": "x"})]
    assert (tmp_path / "once.txt").read_text() == "x\n"


async def test_colliding_names_are_namespaced_and_each_call_reaches_its_server(tmp_path):
    with http_server(tmp_path, "web") as url:
        servers = [stdio_server(tmp_path, "ex"), http(tmp_path, url, "web")]
        async with McpToolSource(servers, reserved=["big"]) as source:
            names = source.names
            assert names["ex__echo"] == ("ex", "echo") and names["web__echo"] == ("web", "echo")
            assert "echo" not in names
            assert names["ex__big"] == ("ex", "big")  # a reserved name is never taken
            results, _ = await run_calls(
                source, [("a", "ex__echo", {"text": "one"}), ("b", "web__echo", {"text": "two"})]
            )
    assert [r.content for r in results] == ["one", "two"]
    assert calls_of(tmp_path, "ex") == [("echo", {"text": "one"})]
    assert calls_of(tmp_path, "web") == [("echo", {"text": "two"})]


async def test_a_list_change_is_taken_in_by_refresh_and_names_stay(server, tmp_path):
    make, _name = server
    async with McpToolSource([make()]) as source:
        before = {t.name: t for t in source.snapshot()}
        await run_calls(source, [("c1", "add_tool", {})])
        after = {t.name: t for t in await source.refresh()}
        assert after.keys() - before.keys() == {"extra_1"}
        assert after["echo"] is before["echo"]  # unchanged tools keep their object
        results, _ = await run_calls(source, [("c2", "extra_1", {"value": "v"})])
    assert results[0].content == "extra_1: v"


async def test_allow_and_deny_lists_deny_in_the_gate(tmp_path):
    server = stdio_server(tmp_path, "ex", allow=("echo", "w*"), deny=("write_note",))
    async with McpToolSource([server]) as source:
        assert source.check("echo", {}) is not None and not isinstance(
            source.check("echo", {}), Deny
        )
        assert isinstance(source.check("write_note", {}), Deny)
        assert isinstance(source.check("crash", {}), Deny)
        assert not isinstance(source.check("weather", {}), Deny)
        assert source.check("not_mcp", {}) is None


async def test_a_server_that_cannot_start_is_a_config_error(tmp_path):
    from toollatch.mcp import McpServer

    bad = McpServer(name="bad", command=("/nonexistent/program",), connect_timeout_s=5)
    with pytest.raises(ConfigError, match="bad"):
        async with McpToolSource([bad]):
            pass


def test_without_the_sdk_connecting_names_the_extra(monkeypatch):
    import sys

    from toollatch.mcp._connection import require_sdk

    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ConfigError, match=r'pip install "toollatch\[mcp\]"'):
        require_sdk()


@pytest.mark.parametrize(("limit", "overlap"), [(1, False), (4, True)])
async def test_max_concurrency_bounds_the_calls_running_on_one_server(limit, overlap, tmp_path):
    async with McpToolSource([stdio_server(tmp_path, "ex", max_concurrency=limit)]) as source:
        results, _ = await run_calls(
            source, [("a", "slow", {"seconds": 0.4}), ("b", "slow", {"seconds": 0.4})]
        )
    assert [r.content for r in results] == ["slept 0.4 s"] * 2
    events = [e["event"] for e in log_of(tmp_path, "ex") if e["event"].startswith("slow")]
    serial = ["slow_started", "slow_done", "slow_started", "slow_done"]
    assert (events != serial) is overlap, events


async def test_a_server_that_never_answers_the_handshake_fails_within_its_connect_timeout(
    tmp_path, monkeypatch
):
    import sys

    from toollatch.mcp import McpServer
    from toollatch.mcp._connection import Connection

    # The fault this guards: giving up on a mute server only after the close grace (10 s)
    # meant for a server that answered. Checked by what the connection does, not by a clock:
    # a close that finds the mute server's owner still running must not grant it a grace
    # (the patched close then skips the wait, so a fault fails here rather than hangs).
    granted: list[float] = []
    real_close = Connection.close

    async def close(self: Connection, wait_s: float = 10.0) -> None:
        task = self._task
        if self.server.name == "mute" and task is not None and not task.done() and wait_s > 0:
            granted.append(wait_s)
            wait_s = 0
        await real_close(self, wait_s)

    monkeypatch.setattr(Connection, "close", close)
    mute = McpServer(
        name="mute",
        command=(sys.executable, "-c", "import time; time.sleep(60)"),
        connect_timeout_s=1,
    )
    good = stdio_server(tmp_path, "ex")
    async with asyncio.timeout(120):  # a hang guard, far above the 1 s connect timeout
        with pytest.raises(ConfigError, match="'mute': no answer within 1 s"):
            async with McpToolSource([good, mute]):
                pass
    assert granted == []
