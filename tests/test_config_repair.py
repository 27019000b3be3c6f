"""drop_with_protocol_repair: a failed call leaves the history with its result, and the next
request passes the scripted server's history validation (400 for an invalid history), for
each provider over loopback HTTP."""

from __future__ import annotations

import httpx
import pytest

from scripted_helpers import PROVIDERS, first_history, post, request
from toollatch import (
    Agent,
    ErrorCode,
    RetryPolicy,
    RunLimits,
    StreamParser,
    ToolResult,
    model_client,
    tool,
)
from toollatch.cli._app_config import validate
from toollatch.scripted import Call, Reasoning, Script, ScriptedServer, Text, Turn
from toollatch.stages import (
    assistant_messages,
    drop_failed_calls,
    error_results,
    repaired_history,
    tool_results_messages,
)

EVERY_PROVIDER = pytest.mark.parametrize("provider", PROVIDERS)
BROKEN = '{"city": "Oslo"}}'  # trailing data: invalid_json


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def mixed_script() -> Script:
    return Script(
        turns=(
            Turn(
                items=(
                    Text(text="Checking."),
                    Reasoning(text="two cities"),
                    Call(call_id="call_bad", name="get_weather", arguments=BROKEN),
                    Reasoning(text="now the good one"),
                    Call(call_id="call_good", name="get_weather", arguments='{"city": "Rome"}'),
                ),
                delay_ms=0,
            ),
            Turn(items=(Text(text="Rome is sunny."),), delay_ms=0),
        )
    )


def only_broken_script() -> Script:
    return Script(
        turns=(
            Turn(
                items=(Call(call_id="call_only", name="get_weather", arguments=BROKEN),), delay_ms=0
            ),
        )
    )


async def play(server, provider, model, *, drop, max_rounds=4):
    client = model_client(
        provider, model=model, base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
    )
    async with client:
        agent = Agent(
            client, [get_weather], run_limits=RunLimits(max_rounds=max_rounds), drop_failed=drop
        )
        run = agent.run("weather?")
        events = [e.to_json() async for e in run]
    return events, run


def call_ids(history) -> set[str]:
    text = repr(history)
    return {i for i in ("call_bad", "call_good", "call_only") if i in text}


@EVERY_PROVIDER
async def test_a_dropped_call_and_its_result_leave_a_history_the_server_accepts(provider):
    drop = validate({"agent_stream_assemble": {"on_invalid_json": "drop_with_protocol_repair"}})
    async with ScriptedServer({"mixed": mixed_script()}, delay_scale=0) as server:
        events, run = await play(server, provider, "mixed", drop=drop.dropped_codes())
        statuses = [r.status for r in server.requests]
    assert run.error is None and statuses == [200, 200]
    failed = [e["error"] for e in events if e["type"] == "call_failed"]
    assert failed == ["arguments_not_object" if provider == "gemini" else "invalid_json"]
    ids = {c["id"] for c in events[-1]["calls"]}
    assert events[-1]["rounds"] == 2 and len(ids) == 2  # the run still reports the call
    if provider != "gemini":  # Gemini's ids are made up, never sent
        assert call_ids(run.history) == {"call_good"}
    assert "invalid_json" not in repr(run.history)
    assert "sunny in Rome" in repr(run.history)
    if provider == "openai_responses":  # the reasoning item before the dropped call goes too
        assert "two cities" not in repr(run.history) and "now the good one" in repr(run.history)


@EVERY_PROVIDER
async def test_without_repair_the_failed_call_goes_back_with_its_error_result(provider):
    async with ScriptedServer({"mixed": mixed_script()}, delay_scale=0) as server:
        _, run = await play(server, provider, "mixed", drop=())
        assert [r.status for r in server.requests] == [200, 200]
    assert "invalid_json" in repr(run.history) or "arguments_not_object" in repr(run.history)


@EVERY_PROVIDER
async def test_a_turn_left_empty_is_not_written_and_the_model_is_asked_again(provider):
    codes = validate(
        {"agent_stream_assemble": {"on_invalid_json": "drop_with_protocol_repair"}}
    ).dropped_codes()
    async with ScriptedServer({"only": only_broken_script()}, delay_scale=0) as server:
        events, run = await play(server, provider, "only", drop=codes, max_rounds=2)
        statuses = [r.status for r in server.requests]
    assert run.error is None and statuses == [200, 200]
    assert run.history == first_history(provider, "weather?")
    assert [e["type"] for e in events].count("call_failed") == 2


@EVERY_PROVIDER
def test_the_server_refuses_a_result_whose_call_was_dropped(provider):
    """The check the repair is tested against is real: dropping only the call is a 400."""
    with ScriptedServer({"mixed": mixed_script()}, delay_scale=0) as server, httpx.Client() as c:
        history = first_history(provider)
        path, body = request(provider, history, "mixed")
        parser = StreamParser(provider)
        with c.stream("POST", server.url + path, json=body) as response:
            for chunk in response.iter_raw():
                parser.feed(chunk)
        round_ = parser.finish()
        results = [
            *error_results(round_),
            *(
                ToolResult(tool_call_id=x.call_id, name=x.name, content="sunny")
                for x in round_.committed()
            ),
        ]
        codes = {ErrorCode.INVALID_JSON, ErrorCode.ARGUMENTS_NOT_OBJECT}
        repaired = drop_failed_calls(round_, codes)
        assert [x.call_id for x in repaired.calls] == [round_.calls[1].call_id]
        half = [*history, *assistant_messages(repaired), *tool_results_messages(round_, results)]
        assert post(c, server, provider, half, "mixed").status_code == 400
        whole = [*history, *repaired_history(round_, results, codes)]
        assert post(c, server, provider, whole, "mixed").status_code == 200


def test_only_listed_codes_are_dropped_and_a_round_without_them_is_unchanged():
    parser = StreamParser("openai_chat")
    parser.feed(
        b'data: {"choices":[{"index":0,"delta":{"content":"hi"},'
        b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    round_ = parser.finish()
    assert drop_failed_calls(round_, {ErrorCode.INVALID_JSON}) is round_
    with ScriptedServer({"mixed": mixed_script()}, delay_scale=0) as server, httpx.Client() as c:
        path, body = request("openai_chat", first_history("openai_chat"), "mixed")
        parser = StreamParser("openai_chat")
        parser.feed(c.post(server.url + path, json=body).content)
        mixed = parser.finish()
    kept = drop_failed_calls(mixed, {ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES})
    assert [x.call_id for x in kept.calls] == ["call_bad", "call_good"]
