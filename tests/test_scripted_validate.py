"""Scripted server history validation: what toollatch's builders write is accepted (round
trip over real HTTP), and the histories the real APIs refuse get 400 in the provider's shape."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from scripted_helpers import (
    PROVIDERS,
    assert_error_shape,
    first_history,
    next_history,
    post,
    request,
    stream_round,
)
from toollatch import CallState, RoundEnd
from toollatch.scripted import Call, Reasoning, Script, ScriptedServer, Text, Turn
from toollatch.scripted._validate import InvalidRequest, check_request


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(delay_scale=0) as s:
        yield s


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_whole_demo_round_trips_through_the_builders(
    http: httpx.Client, server: ScriptedServer, provider: str
) -> None:
    history = first_history(provider)
    first = stream_round(http, server, provider, history)
    assert [c.name for c in first.committed()] == ["get_weather", "get_weather"]
    history = next_history(history, first)
    second = stream_round(http, server, provider, history)
    assert [c.name for c in second.committed()] == ["write_file"]
    history = next_history(history, second)
    third = stream_round(http, server, provider, history)
    assert third.calls == () and "notes/weather.md" in third.text
    history = next_history(history, third)
    past_the_end = stream_round(http, server, provider, history)
    assert past_the_end.text == "done" and past_the_end.ended is RoundEnd.NORMAL
    mine = [r for r in server.requests if r.provider == provider]
    assert [r.turn for r in mine[-4:]] == [0, 1, 2, 3]


FAILING = Script(
    turns=(
        Turn(
            items=(
                Reasoning(text="Two cities; one call is broken."),
                Call(call_id="ok_1", name="get_weather", arguments='{"city": "Oslo"}'),
                Call(call_id="bad_1", name="get_weather", arguments='{"city": '),
            )
        ),
        Turn(
            items=(
                Text(text="Writing."),
                Call(call_id="cut_1", name="write_file", arguments='{"path": "a", "content": "b"}'),
            ),
            stop="max_tokens",
        ),
        Turn(items=(Text(text="noted"),)),
    )
)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_reasoning_failed_and_truncated_calls_round_trip(http: httpx.Client, provider: str) -> None:
    with ScriptedServer(scripts={"failing": FAILING}, delay_scale=0) as s:
        history = first_history(provider)
        round_ = stream_round(http, s, provider, history, model="failing")
        assert len(round_.blocks) == 1
        assert [c.state for c in round_.calls] == [CallState.COMMITTED, CallState.FAILED]
        history = next_history(history, round_)
        truncated = stream_round(http, s, provider, history, model="failing")
        assert truncated.ended is RoundEnd.TRUNCATED
        history = next_history(history, truncated)
        assert stream_round(http, s, provider, history, model="failing").text == "noted"
        assert [r.status for r in s.requests] == [200, 200, 200]


def demo_history(http: httpx.Client, server: ScriptedServer, provider: str) -> list[Any]:
    """A valid history after the demo's first turn (two calls, two results)."""
    history = first_history(provider)
    return next_history(history, stream_round(http, server, provider, history))


# --- broken histories, per provider: (name, mutation of a valid history) ---------------------

Mutation = Callable[[list[Any]], None]


def _chat_cases() -> list[tuple[str, Mutation]]:
    # [user, assistant(tool_calls x2), tool, tool]
    return [
        ("a result missing", lambda h: h.pop()),
        ("a result for an unknown id", lambda h: h[3].update(tool_call_id="call_nope")),
        ("two results for one id", lambda h: h[3].update(tool_call_id=h[2]["tool_call_id"])),
        ("a user turn before the results", lambda h: h.insert(2, {"role": "user", "content": "x"})),
        ("a tool message without tool_calls", lambda h: h.insert(1, dict(h[2]))),
        ("an unknown role", lambda h: h[0].update(role="robot")),
        ("a message that is not an object", lambda h: h.insert(0, "hi")),
        ("a tool message without tool_call_id", lambda h: h[3].pop("tool_call_id")),
        ("a call without a name", lambda h: h[1]["tool_calls"][0]["function"].pop("name")),
    ]


def _responses_cases() -> list[tuple[str, Mutation]]:
    # [user, message(assistant), function_call x2, function_call_output x2]
    return [
        ("an output missing", lambda h: h.pop()),
        ("an output for an unknown call", lambda h: h[-1].update(call_id="call_nope")),
        ("two outputs for one call", lambda h: h[-1].update(call_id=h[-2]["call_id"])),
        (
            "a user message before the outputs",
            lambda h: h.insert(4, {"role": "user", "content": "x"}),
        ),
        ("an output before its call", lambda h: h.insert(1, h.pop())),
        ("a function_call without call_id", lambda h: h[2].pop("call_id")),
        ("an item that is not an object", lambda h: h.append(7)),
        ("a message with a bad role", lambda h: h[0].update(role="robot")),
    ]


def _anthropic_cases() -> list[tuple[str, Mutation]]:
    # [user, assistant(text, tool_use x2), user(tool_result x2)]
    return [
        ("a result missing", lambda h: h[2]["content"].pop()),
        ("a result for an unknown id", lambda h: h[2]["content"][1].update(tool_use_id="toolu_x")),
        ("two results for one id", lambda h: h[2]["content"].append(dict(h[2]["content"][0]))),
        ("results not first", lambda h: h[2]["content"].insert(0, {"type": "text", "text": "x"})),
        ("results one message late", lambda h: h.insert(2, {"role": "user", "content": "x"})),
        ("no results at all", lambda h: h.pop()),
        ("the first message from the assistant", lambda h: h.pop(0)),
        ("a bad role", lambda h: h[2].update(role="tool")),
        ("a block without a type", lambda h: h[2]["content"][0].pop("type")),
    ]


def _gemini_cases() -> list[tuple[str, Mutation]]:
    # [user, model(text, functionCall x2), user(functionResponse x2)]
    return [
        ("a response missing", lambda h: h[2]["parts"].pop()),
        ("a response too many", lambda h: h[2]["parts"].append(dict(h[2]["parts"][0]))),
        (
            "a response with another name",
            lambda h: h[2]["parts"][1]["functionResponse"].update(name="x"),
        ),
        ("responses without a call turn", lambda h: h.insert(1, copy.deepcopy(h[2]))),
        ("a call turn first", lambda h: h.pop(0)),
        ("no responses", lambda h: h.pop()),
        ("a bad role", lambda h: h[1].update(role="assistant")),
        ("empty parts", lambda h: h[0].update(parts=[])),
    ]


CASES = {
    "openai_chat": _chat_cases(),
    "openai_responses": _responses_cases(),
    "anthropic": _anthropic_cases(),
    "gemini": _gemini_cases(),
}


@pytest.mark.parametrize(
    ("provider", "name"), [(p, name) for p, cases in CASES.items() for name, _ in cases]
)
def test_broken_histories_are_refused_with_400(
    http: httpx.Client, server: ScriptedServer, provider: str, name: str
) -> None:
    history = demo_history(http, server, provider)
    _, valid = request(provider, history)
    assert check_request(provider, valid) == 1
    mutate = dict(CASES[provider])[name]
    mutate(history)
    _, body = request(provider, history)
    with pytest.raises(InvalidRequest):
        check_request(provider, body)
    response = post(http, server, provider, history)
    assert response.status_code == 400
    assert_error_shape(provider, response.json(), 400)


def test_the_real_apis_messages_for_unpaired_ids() -> None:
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
        ],
    }
    with pytest.raises(InvalidRequest, match="did not have response messages: call_1"):
        check_request("openai_chat", chat)
    responses = {
        "model": "m",
        "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}],
    }
    with pytest.raises(
        InvalidRequest, match="No tool call found for function call output with call_id c9"
    ):
        check_request("openai_responses", responses)
    anthropic = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
            },
            {"role": "user", "content": "no results"},
        ],
    }
    with pytest.raises(
        InvalidRequest,
        match="`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1",
    ):
        check_request("anthropic", anthropic)


@pytest.mark.parametrize(
    ("provider", "body"),
    [
        ("openai_chat", {"messages": [{"role": "user", "content": "x"}]}),
        ("openai_chat", {"model": "m", "messages": []}),
        ("openai_responses", {"model": "m", "input": 5}),
        ("anthropic", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        (
            "anthropic",
            {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": 3}]},
        ),
        ("gemini", {"contents": "hi"}),
        (
            "gemini",
            {"contents": [{"role": "user", "parts": [{"functionCall": {"name": "f", "args": 1}}]}]},
        ),
        ("openai_chat", ["not", "an", "object"]),
    ],
)
def test_malformed_requests_are_refused(provider: str, body: Any) -> None:
    with pytest.raises(InvalidRequest):
        check_request(provider, body)


def test_a_plain_string_input_has_no_turns() -> None:
    assert check_request("openai_responses", {"model": "m", "input": "hi"}) == 0
