"""MCP tools in the agent loop: the scripted model server (loopback HTTP) streams the calls,
the example MCP server (a real process on stdio) runs them. The server's own log of the
``tools/call`` requests it received proves what reached it and when."""

from __future__ import annotations

import json

import pytest

from mcp_helpers import calls_of, log_of, stdio_server, wait_for_log
from toollatch import Agent, ErrorCode, RetryPolicy, RunLimits, model_client
from toollatch.mcp import McpToolSource
from toollatch.scripted import Call, Faults, Script, ScriptedServer, Text, Turn
from toollatch.scripted._server import _encode

DONE = Turn(items=(Text(text="ok"),), delay_ms=0)


def call(call_id: str, name: str, arguments: object) -> Call:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Call(call_id=call_id, name=name, arguments=text, fragment_chars=5)


async def play(server, source, provider="openai_chat", *, limits=None, **kw):
    client = model_client(
        provider, model="s", base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
    )
    async with client:
        agent = Agent(client, [], tool_source=source, run_limits=limits, **kw)
        run = agent.run("go")
        events = [e.to_json() async for e in run]
    return events, run


def order(events, *types):
    return [(e["type"], e.get("id")) for e in events if e["type"] in types]


async def test_truncated_and_invalid_calls_never_reach_the_server_even_when_eager(tmp_path):
    note = {"name": "n", "text": "valid"}
    first = Turn(
        items=(
            call("ok", "write_note", note),
            call("bad_schema", "write_note", {"name": 5, "text": "x"}),
            call("bad_json", "write_note", '{"name": "n", "text": "x"'),
            call("missing", "write_note", {"text": "no name"}),
        ),
        delay_ms=0,
    )
    cut = Turn(
        items=(call("cut", "write_note", {"name": "n", "text": "cut-off"}),),
        stop="max_tokens",
        delay_ms=0,
    )
    server_ = stdio_server(tmp_path, "ex", eager=("write_note",))
    async with (
        McpToolSource([server_]) as source,
        ScriptedServer({"s": Script(turns=(first, cut, DONE))}) as model,
    ):
        events, _ = await play(model, source, eager_start=True)
        assert [r.status for r in model.requests] == [200, 200, 200]
    failed = {e["id"]: e["error"] for e in events if e["type"] == "call_failed"}
    assert failed == {
        "bad_schema": "schema_violation",
        "bad_json": "invalid_json",
        "missing": "schema_violation",
        "cut": "truncated",
    }
    assert calls_of(tmp_path, "ex") == [("write_note", note)]
    assert (tmp_path / "n.txt").read_text() == "valid\n"


async def test_an_interrupted_stream_sends_nothing_to_the_server(tmp_path):
    items = (Text(text="Writing."), call("c1", "write_note", {"name": "n", "text": "x" * 40}))
    wire = _encode("openai_chat", Turn(items=items), model="s", body={}, response_id="r")
    mid_arguments = [n for n, e in enumerate(wire) if e.in_arguments][3]
    turn = Turn(items=items, delay_ms=0, faults=Faults(drop_after_events=mid_arguments))
    async with (
        McpToolSource([stdio_server(tmp_path, "ex", eager=("*",))]) as source,
        ScriptedServer({"s": Script(turns=(turn, DONE))}) as model,
    ):
        events, _ = await play(model, source, eager_start=True)
    assert next(e["ended"] for e in events if e["type"] == "round_ended") == "interrupted"
    assert [e["error"] for e in events if e["type"] == "call_failed"] == ["stream_interrupted"]
    assert calls_of(tmp_path, "ex") == []


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
async def test_eager_allow_listed_tools_start_before_the_round_ends_others_after(
    provider, tmp_path
):
    items = (
        call("c1", "echo", {"text": "early"}),
        call("c2", "write_note", {"name": "n", "text": "late"}),
        call("c3", "echo", {"text": "last"}),
    )
    wire = _encode(provider, Turn(items=items), model="s", body={}, response_id="r")
    moved_on = next(n for n, e in enumerate(wire) if b'"c2"' in e.data)
    turn = Turn(
        items=items, delay_ms=0, faults=Faults(stall_ms=600, stall_after_events=moved_on + 1)
    )
    async with (
        McpToolSource([stdio_server(tmp_path, "ex", eager=("echo",))]) as source,
        ScriptedServer({"s": Script(turns=(turn, DONE))}) as model,
    ):
        events, run = await play(model, source, provider, eager_start=True)
    seen = order(events, "tool_started", "call_committed", "round_ended")
    early = {e["id"]: e["early"] for e in events if e["type"] == "call_committed"}
    assert early == {"c1": True, "c2": False, "c3": True}
    # c1 ran while the model was still streaming c2; write_note only after the stream ended
    assert seen.index(("tool_started", "c1")) < seen.index(("call_committed", "c2"))
    assert seen.index(("tool_started", "c2")) > seen.index(("call_committed", "c2"))
    assert seen.index(("tool_started", "c2")) > seen.index(("tool_started", "c3"))
    assert calls_of(tmp_path, "ex")[0] == ("echo", {"text": "early"})
    assert [r.tool_call_id for r in run.results[0]] == ["c1", "c2", "c3"]


async def test_eager_is_off_for_mcp_tools_unless_the_server_lists_them(tmp_path):
    items = (call("c1", "echo", {"text": "a"}), call("c2", "echo", {"text": "b"}))
    async with (
        McpToolSource([stdio_server(tmp_path, "ex")]) as source,
        ScriptedServer({"s": Script(turns=(Turn(items=items, delay_ms=0), DONE))}) as model,
    ):
        events, _ = await play(model, source, eager_start=True)
    assert [e["early"] for e in events if e["type"] == "call_committed"] == [False, False]


async def test_results_arrive_in_call_order_when_the_first_call_finishes_last(tmp_path):
    items = (call("c1", "slow", {"seconds": 0.6}), call("c2", "echo", {"text": "fast"}))
    async with (
        McpToolSource([stdio_server(tmp_path, "ex")]) as source,
        ScriptedServer({"s": Script(turns=(Turn(items=items, delay_ms=0), DONE))}) as model,
    ):
        events, run = await play(model, source)
        tool_messages = [m for m in model.requests[1].body["messages"] if m["role"] == "tool"]
    assert [r.content for r in run.results[0]] == ["slept 0.6 s", "fast"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2"]
    finished = [e["id"] for e in events if e["type"] == "tool_finished"]
    assert finished == ["c2", "c1"]  # (the order they finished in is not the result order)


async def test_a_tool_the_server_adds_is_offered_and_runs_in_the_next_round(tmp_path):
    script = Script(
        turns=(
            Turn(items=(call("c1", "add_tool", {}),), delay_ms=0),
            Turn(items=(call("c2", "extra_1", {"value": "v"}),), delay_ms=0),
            DONE,
        )
    )
    async with (
        McpToolSource([stdio_server(tmp_path, "ex")]) as source,
        ScriptedServer({"s": script}) as model,
    ):
        _events, run = await play(model, source)
        offered = [[t["function"]["name"] for t in r.body["tools"]] for r in model.requests]
    assert "extra_1" not in offered[0] and "extra_1" in offered[1]
    assert run.results[1][0].content == "extra_1: v" and not run.results[1][0].is_error
    assert calls_of(tmp_path, "ex") == [("add_tool", {}), ("extra_1", {"value": "v"})]


async def test_a_denied_tool_fails_policy_denied_and_never_reaches_the_server(tmp_path):
    items = (
        call("c1", "write_note", {"name": "n", "text": "x"}),
        call("c2", "echo", {"text": "ok"}),
    )
    server_ = stdio_server(tmp_path, "ex", deny=("write_*",))
    async with (
        McpToolSource([server_]) as source,
        ScriptedServer({"s": Script(turns=(Turn(items=items, delay_ms=0), DONE))}) as model,
    ):
        _events, run = await play(model, source)
    assert run.results[0][0].code is ErrorCode.POLICY_DENIED
    assert calls_of(tmp_path, "ex") == [("echo", {"text": "ok"})]


async def test_a_server_dying_mid_call_is_outcome_unknown_in_the_next_request(tmp_path):
    items = (call("c1", "crash", {}),)
    async with (
        McpToolSource([stdio_server(tmp_path, "ex")]) as source,
        ScriptedServer({"s": Script(turns=(Turn(items=items, delay_ms=0), DONE))}) as model,
    ):
        _events, run = await play(model, source, limits=RunLimits(max_rounds=2))
        sent = [m for m in model.requests[1].body["messages"] if m["role"] == "tool"]
    assert run.results[0][0].code is ErrorCode.OUTCOME_UNKNOWN
    assert sent[0]["content"].startswith("outcome_unknown:")
    assert [e["event"] for e in log_of(tmp_path, "ex")] == ["call", "crashing"]


async def test_cancelling_the_run_mid_call_sends_the_server_a_cancellation(tmp_path):
    items = (call("c1", "slow", {"seconds": 30}),)
    async with (
        McpToolSource([stdio_server(tmp_path, "ex")]) as source,
        ScriptedServer({"s": Script(turns=(Turn(items=items, delay_ms=0), DONE))}) as model,
    ):
        client = model_client(
            "openai_chat",
            model="s",
            base_url=model.base_url("openai_chat"),
            retry=RetryPolicy(attempts=1),
        )
        async with client:
            run = Agent(client, [], tool_source=source).run("go")
            events = []
            async for event in run:
                events.append(event.to_json())
                if events[-1]["type"] == "tool_started":
                    # mid-call: once the server runs it (a cancel sent with the request
                    # itself may reach the server before the tool starts: then it never does)
                    await wait_for_log(tmp_path, "ex", "slow_started")
                    run.cancel()
        cancelled = await wait_for_log(tmp_path, "ex", "cancelled")
        await wait_for_log(tmp_path, "ex", "slow_cancelled")
    assert cancelled["reason"] == "caller cancelled"
    assert events[-1]["type"] == "run_ended"
    assert [c["error"] for c in events[-1]["calls"]] == ["cancelled"]
    assert "slow_done" not in [e["event"] for e in log_of(tmp_path, "ex")]
