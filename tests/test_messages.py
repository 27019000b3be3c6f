"""History builders for every provider: a finalized Round (+ results) -> the next request.

Rounds are built by replaying small hand-written transcripts through the real pipeline
(``toollatch.testing``), never by constructing ``Round`` objects, so what is checked is what a
user gets. For each provider: a committed call, a failed call (its history arguments are an
empty object and its error result says why), a truncated call, a cancelled round, reasoning
blocks and signatures byte-for-byte, server-tool blocks kept, and the ``UsageError`` cases of
``tool_results_messages``. The recorded corpus (../shared/fixtures) is replayed last: every
assistant message must be well-formed JSON in its provider's shape, carry every signature the
stream carried, and every call in it must get exactly one paired result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CORPUS, corpus_dir
from toollatch import CallState, ErrorCode, Round, RoundEnd, StreamParser, ToolResult, UsageError
from toollatch.cli import replay_bytes
from toollatch.stages import (
    AnomalyKind,
    Choice,
    assistant_messages,
    error_results,
    tool_results_messages,
)
from toollatch.testing import chunkings, jsonl, replay, sse

PROVIDERS = ("openai_chat", "anthropic", "openai_responses", "gemini", "bedrock")
FRAMING: dict[str, Literal["sse", "jsonl"]] = {"bedrock": "jsonl"}
INVALID = '{"city": }'
"""Argument text that is complete (the protocol closed the call) but not JSON."""


def play(provider: str, data: bytes) -> Round:
    return replay(data, provider, framing=FRAMING.get(provider, "sse"))


def message_of(round_: Round) -> Any:
    """The assistant's history entry: the one message, or for Responses the list of items."""
    entries = assistant_messages(round_)
    if round_.provider == "openai_responses":
        return entries
    (message,) = entries  # one message for every other provider
    return message


# -- transcripts: per provider, the same scenarios ----------------------------------------------
# good:      text "Let me check." then get_weather {"city": "Paris"}, normal end
# invalid:   get_weather {"city": "Paris"} (commits) then a second call that fails
# truncated: one call cut by the token limit
# open:      one complete call and one still streaming (for cancel)


def chat(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}


def chat_call(index: int, args: str, call_id: str | None = None, name: str | None = None):
    call: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return chat({"tool_calls": [call]})


CHAT = {
    "good": sse(
        chat({"role": "assistant", "content": "Let me check."}),
        chat_call(0, '{"city": ', "call_1", "get_weather"),
        chat_call(0, '"Paris"}'),
        chat(finish="tool_calls"),
        done=True,
    ),
    "invalid": sse(
        chat_call(0, '{"city": "Paris"}', "call_1", "get_weather"),
        chat_call(1, INVALID, "call_2", "get_weather"),
        chat(finish="tool_calls"),
        done=True,
    ),
    "truncated": sse(
        chat_call(0, '{"city": "Pa', "call_1", "get_weather"), chat(finish="length"), done=True
    ),
    "open": sse(
        chat_call(0, '{"city": "Paris"}', "call_1", "get_weather"),
        chat_call(1, '{"ci', "call_2", "get_weather"),
    ),
}


def ant_start() -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-x",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def ant_block(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def ant_delta(index: int, **delta: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def ant_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def ant_end(reason: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]


def ant_tool(index: int, call_id: str, *fragments: str, stop: bool = True) -> list[dict[str, Any]]:
    events = [
        ant_block(index, {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {}})
    ]
    events += [ant_delta(index, type="input_json_delta", partial_json=f) for f in fragments]
    return events + ([ant_stop(index)] if stop else [])


def ant_text(index: int, text: str) -> list[dict[str, Any]]:
    return [
        ant_block(index, {"type": "text", "text": ""}),
        ant_delta(index, type="text_delta", text=text),
        ant_stop(index),
    ]


def ant(*events: dict[str, Any]) -> bytes:
    return sse(*events, named=True)


ANTHROPIC = {
    "good": ant(
        ant_start(),
        *ant_text(0, "Let me check."),
        *ant_tool(1, "toolu_1", '{"city": ', '"Paris"}'),
        *ant_end("tool_use"),
    ),
    "invalid": ant(
        ant_start(),
        *ant_tool(0, "toolu_1", '{"city": "Paris"}'),
        *ant_tool(1, "toolu_2", INVALID),
        *ant_end("tool_use"),
    ),
    "truncated": ant(
        ant_start(), *ant_tool(0, "toolu_1", '{"city": "Pa', stop=False), *ant_end("max_tokens")
    ),
    "open": ant(
        ant_start(),
        *ant_tool(0, "toolu_1", '{"city": "Paris"}'),
        *ant_tool(1, "toolu_2", '{"ci', stop=False),
    ),
}


def resp_call_added(index: int, item_id: str, call_id: str) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": "get_weather",
        "arguments": "",
        "status": "in_progress",
    }
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def resp_args(index: int, item_id: str, fragment: str) -> dict[str, Any]:
    return {
        "type": "response.function_call_arguments.delta",
        "item_id": item_id,
        "output_index": index,
        "delta": fragment,
    }


def resp_call_done(index: int, item_id: str, call_id: str, args: str) -> list[dict[str, Any]]:
    item = {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": "get_weather",
        "arguments": args,
        "status": "completed",
    }
    return [
        {
            "type": "response.function_call_arguments.done",
            "item_id": item_id,
            "output_index": index,
            "arguments": args,
        },
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def resp_call(index: int, item_id: str, call_id: str, *fragments: str) -> list[dict[str, Any]]:
    events = [resp_call_added(index, item_id, call_id)]
    events += [resp_args(index, item_id, f) for f in fragments]
    return events + resp_call_done(index, item_id, call_id, "".join(fragments))


def resp_item_done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def resp_text(index: int, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": index,
        "content_index": 0,
        "delta": text,
    }


RESP_COMPLETED = {
    "type": "response.completed",
    "response": {"id": "resp_1", "status": "completed", "usage": {"total_tokens": 9}},
}
RESP_INCOMPLETE = {
    "type": "response.incomplete",
    "response": {
        "id": "resp_1",
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    },
}

RESPONSES = {
    "good": sse(
        resp_text(0, "Let me check."),
        *resp_call(1, "fc_1", "call_1", '{"city": ', '"Paris"}'),
        RESP_COMPLETED,
    ),
    "invalid": sse(
        *resp_call(0, "fc_1", "call_1", '{"city": "Paris"}'),
        *resp_call(1, "fc_2", "call_2", INVALID),
        RESP_COMPLETED,
    ),
    "truncated": sse(
        resp_call_added(0, "fc_1", "call_1"), resp_args(0, "fc_1", '{"city": "Pa'), RESP_INCOMPLETE
    ),
    "open": sse(
        *resp_call(0, "fc_1", "call_1", '{"city": "Paris"}'),
        resp_call_added(1, "fc_2", "call_2"),
        resp_args(1, "fc_2", '{"ci'),
    ),
}


def gem(*parts: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "modelVersion": "gemini-x"}


def gem_call(args: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"functionCall": {"name": "get_weather", "args": args}, **extra}


GEM_STOP = gem({"text": ""}, finish="STOP")
GEM_BAD_STREAMED_CALL = [  # Vertex partialArgs with a jsonPath outside the supported subset
    gem({"functionCall": {"name": "get_weather", "willContinue": True}}),
    gem(
        {
            "functionCall": {
                "partialArgs": [{"jsonPath": "$.city[", "stringValue": "x"}],
                "willContinue": True,
            }
        }
    ),
    gem({"functionCall": {}}),
]

GEMINI = {
    "good": sse(gem({"text": "Let me check."}), gem(gem_call({"city": "Paris"})), GEM_STOP),
    "invalid": sse(gem(gem_call({"city": "Paris"})), *GEM_BAD_STREAMED_CALL, GEM_STOP),
    "truncated": sse(gem(gem_call({"city": "Paris"})), gem({"text": ""}, finish="MAX_TOKENS")),
    "open": sse(
        gem(gem_call({"city": "Paris"})),
        gem({"functionCall": {"name": "get_weather", "willContinue": True}}),
    ),
}


def br_tool_start(index: int, call_id: str) -> dict[str, Any]:
    start = {"toolUse": {"toolUseId": call_id, "name": "get_weather"}}
    return {"contentBlockStart": {"contentBlockIndex": index, "start": start}}


def br_delta(index: int, **delta: Any) -> dict[str, Any]:
    return {"contentBlockDelta": {"contentBlockIndex": index, "delta": delta}}


def br_stop(index: int) -> dict[str, Any]:
    return {"contentBlockStop": {"contentBlockIndex": index}}


def br_tool(index: int, call_id: str, *fragments: str, stop: bool = True) -> list[dict[str, Any]]:
    events = [br_tool_start(index, call_id)]
    events += [br_delta(index, toolUse={"input": f}) for f in fragments]
    return events + ([br_stop(index)] if stop else [])


def br_end(reason: str) -> list[dict[str, Any]]:
    usage = {"inputTokens": 3, "outputTokens": 9, "totalTokens": 12}
    return [
        {"messageStop": {"stopReason": reason}},
        {"metadata": {"usage": usage, "metrics": {"latencyMs": 5}}},
    ]


BR_START = {"messageStart": {"role": "assistant"}}

BEDROCK = {
    "good": jsonl(
        BR_START,
        br_delta(0, text="Let me check."),
        br_stop(0),
        *br_tool(1, "tooluse_1", '{"city": ', '"Paris"}'),
        *br_end("tool_use"),
    ),
    "invalid": jsonl(
        BR_START,
        *br_tool(0, "tooluse_1", '{"city": "Paris"}'),
        *br_tool(1, "tooluse_2", INVALID),
        *br_end("tool_use"),
    ),
    "truncated": jsonl(BR_START, *br_tool(0, "tooluse_1", '{"city": "Pa'), *br_end("max_tokens")),
    "open": jsonl(
        BR_START,
        *br_tool(0, "tooluse_1", '{"city": "Paris"}'),
        *br_tool(1, "tooluse_2", '{"ci', stop=False),
    ),
}

TRANSCRIPTS = {
    "openai_chat": CHAT,
    "anthropic": ANTHROPIC,
    "openai_responses": RESPONSES,
    "gemini": GEMINI,
    "bedrock": BEDROCK,
}

# -- reading the provider formats back ---------------------------------------------------------
# (call id or None, name, arguments object) / (result id or None, name or None, content, error?)

Call = tuple[str | None, str, dict[str, Any]]
Result = tuple[str | None, str | None, str, bool | None]


def calls_in(provider: str, message: dict[str, Any]) -> list[Call]:
    """The client tool calls of an assistant message, read in the provider's own format."""
    match provider:
        case "openai_chat":
            return [
                (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in message.get("tool_calls", [])
            ]
        case "anthropic":
            return [
                (b["id"], b["name"], b["input"])
                for b in message["content"]
                if b["type"] == "tool_use"
            ]
        case "openai_responses":
            return [
                (i["call_id"], i["name"], json.loads(i["arguments"]))
                for i in message
                if i["type"] == "function_call"
            ]
        case "gemini":
            return [
                (p["functionCall"].get("id"), p["functionCall"]["name"], p["functionCall"]["args"])
                for p in message["parts"]
                if "functionCall" in p
            ]
        case "bedrock":
            return [
                (b["toolUse"]["toolUseId"], b["toolUse"]["name"], b["toolUse"]["input"])
                for b in message["content"]
                if "toolUse" in b and b["toolUse"].get("type") != "server_tool_use"
            ]
    raise AssertionError(provider)


def results_in(provider: str, messages: list[dict[str, Any]]) -> list[Result]:
    """The tool results of the result message(s), read in the provider's own format."""
    match provider:
        case "openai_chat":
            assert all(m["role"] == "tool" for m in messages)
            return [(m["tool_call_id"], None, m["content"], None) for m in messages]
        case "anthropic":
            assert [m["role"] for m in messages] == ["user"] * len(messages)
            assert len(messages) <= 1
            return [
                (b["tool_use_id"], None, b["content"], b["is_error"])
                for m in messages
                for b in m["content"]
            ]
        case "openai_responses":
            assert all(m["type"] == "function_call_output" for m in messages)
            return [(m["call_id"], None, m["output"], None) for m in messages]
        case "gemini":
            assert [m["role"] for m in messages] == ["user"] * len(messages)
            assert len(messages) <= 1
            out: list[Result] = []
            for part in (p for m in messages for p in m["parts"]):
                fr = part["functionResponse"]
                ((key, content),) = fr["response"].items()
                out.append((fr.get("id"), fr["name"], content, key == "error"))
            return out
        case "bedrock":
            assert [m["role"] for m in messages] == ["user"] * len(messages)
            assert len(messages) <= 1
            out = []
            for block in (b["toolResult"] for m in messages for b in m["content"]):
                ((text,),) = [[c["text"] for c in block["content"]]]
                out.append((block["toolUseId"], None, text, block["status"] == "error"))
            return out
    raise AssertionError(provider)


def assert_paired(provider: str, message: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """Every call of the assistant message has exactly one result, in call order."""
    calls, got = calls_in(provider, message), results_in(provider, results)
    assert [c[0] for c in calls] == [r[0] for r in got]
    if provider == "gemini":  # Gemini pairs by order and name when there is no id
        assert [c[1] for c in calls] == [r[1] for r in got]


def flag(provider: str, is_error: bool = False) -> bool | None:
    """The error flag a result carries in the provider's format (Chat Completions and
    Responses have none: the content says it)."""
    return None if provider in ("openai_chat", "openai_responses") else is_error


def all_results(round_: Round, output: str = '{"temp_c": 18}') -> list[ToolResult]:
    """Error results for failed calls plus a fake output for each committed one (shuffled:
    the builders must restore call order)."""
    outputs = [
        ToolResult(tool_call_id=c.call_id, name=c.name or "", content=output)
        for c in round_.calls
        if c.committed is not None
    ]
    return list(reversed(error_results(round_) + outputs))


# -- the shared rules, for every provider -------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_committed_call_and_its_result(provider):
    r = play(provider, TRANSCRIPTS[provider]["good"])
    assert [c.state for c in r.calls] == [CallState.COMMITTED]
    message = message_of(r)
    ((call_id, name, args),) = calls_in(provider, message)
    assert (name, args) == ("get_weather", {"city": "Paris"})
    assert "Let me check." in json.dumps(message)
    results = tool_results_messages(r, all_results(r))
    assert [x[2:] for x in results_in(provider, results)] == [('{"temp_c": 18}', flag(provider))]
    assert_paired(provider, message, results)
    if provider != "gemini":
        assert call_id == r.calls[0].call_id


@pytest.mark.parametrize("provider", PROVIDERS)
def test_failed_call_is_written_with_empty_arguments_and_an_explaining_error(provider):
    r = play(provider, TRANSCRIPTS[provider]["invalid"])
    assert [c.state for c in r.calls] == [CallState.COMMITTED, CallState.FAILED]
    code = ErrorCode.PROTOCOL_VIOLATION if provider == "gemini" else ErrorCode.INVALID_JSON
    assert r.calls[1].error is code
    message = message_of(r)
    assert [c[1:] for c in calls_in(provider, message)] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {}),
    ]
    if provider == "openai_chat":  # the exact text, or "{}" when it is not an object
        args = [c["function"]["arguments"] for c in message["tool_calls"]]
        assert args == ['{"city": "Paris"}', "{}"]
    if provider == "openai_responses":
        args = [i["arguments"] for i in message if i["type"] == "function_call"]
        assert args == ['{"city": "Paris"}', "{}"]
    (error,) = error_results(r)
    assert error.is_error
    assert error.code is code
    assert error.tool_call_id == r.calls[1].call_id
    assert error.content.startswith(f"{code}: ")
    assert error.content.endswith("The tool was not run.")
    assert INVALID not in error.content  # never the raw arguments
    results = tool_results_messages(r, all_results(r))
    assert_paired(provider, message, results)
    contents = [x[2] for x in results_in(provider, results)]
    assert contents == ['{"temp_c": 18}', error.content]
    flags = [x[3] for x in results_in(provider, results)]
    assert flags == [flag(provider, False), flag(provider, True)]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_truncated_call_gets_a_truncated_error_result(provider):
    r = play(provider, TRANSCRIPTS[provider]["truncated"])
    assert r.ended is RoundEnd.TRUNCATED
    (call,) = r.calls
    assert (call.state, call.error) == (CallState.FAILED, ErrorCode.TRUNCATED)
    message = message_of(r)
    ((_, name, args),) = calls_in(provider, message)
    assert name == "get_weather"
    # A partial text is never replayed; Gemini's call arrived whole, so its object is kept.
    assert args == ({"city": "Paris"} if provider == "gemini" else {})
    (error,) = error_results(r)
    assert error.content.startswith("truncated: ")
    results = tool_results_messages(r, [error])
    assert_paired(provider, message, results)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cancelled_round_pairs_every_call_with_a_cancelled_result(provider):
    parser = StreamParser(provider, framing=FRAMING.get(provider, "sse"))
    parser.feed(TRANSCRIPTS[provider]["open"])
    r = parser.cancel("user pressed stop")
    assert r.ended is RoundEnd.CANCELLED
    assert [(c.state, c.error) for c in r.calls] == [(CallState.CANCELLED, ErrorCode.CANCELLED)] * 2
    message = message_of(r)
    assert [c[2] for c in calls_in(provider, message)] == [{"city": "Paris"}, {}]
    errors = error_results(r)
    assert all(e.content.startswith("cancelled: user pressed stop") for e in errors)
    results = tool_results_messages(r, errors)
    assert_paired(provider, message, results)
    assert len(results_in(provider, results)) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_missing_result_is_a_usage_error(provider):
    r = play(provider, TRANSCRIPTS[provider]["invalid"])
    with pytest.raises(UsageError, match="no result for call"):
        tool_results_messages(r, error_results(r))  # the committed call has none


@pytest.mark.parametrize("provider", PROVIDERS)
def test_duplicate_result_is_a_usage_error(provider):
    r = play(provider, TRANSCRIPTS[provider]["good"])
    (result,) = all_results(r)
    with pytest.raises(UsageError, match="two results"):
        tool_results_messages(r, [result, result])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_result_for_an_unknown_call_id_is_a_usage_error(provider):
    r = play(provider, TRANSCRIPTS[provider]["good"])
    stray = ToolResult(tool_call_id="not_a_call", name="get_weather", content="x")
    with pytest.raises(UsageError, match="unknown call ids"):
        tool_results_messages(r, [*all_results(r), stray])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_no_calls_means_no_result_messages(provider):
    r = play(provider, TRANSCRIPTS[provider]["good"])
    empty = Choice(index=0, ended=RoundEnd.NORMAL, stop_reason="stop", calls=(), content=())
    stripped = Round(
        provider=r.provider,
        attempt=r.attempt,
        usage=None,
        anomalies=(),
        error=None,
        choices=(empty,),
    )
    assert tool_results_messages(stripped, []) == []
    assert calls_in(provider, message_of(stripped)) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_history_does_not_depend_on_chunking(provider):
    data = TRANSCRIPTS[provider]["good"]
    framing = FRAMING.get(provider, "sse")
    expected = message_of(replay(data, provider, framing=framing))
    for pieces in chunkings(data, seed=len(data), random_splits=2):
        assert message_of(replay(pieces, provider, framing=framing)) == expected


@settings(max_examples=20)
@given(provider=st.sampled_from(PROVIDERS), data=st.data())
def test_results_come_back_in_call_order_whatever_order_they_are_given(provider, data):
    r = play(provider, TRANSCRIPTS[provider]["invalid"])
    results = data.draw(st.permutations(all_results(r)))
    got = results_in(provider, tool_results_messages(r, results))
    assert [x[2] for x in got] == ['{"temp_c": 18}', error_results(r)[0].content]


def test_unknown_provider_has_no_builder():
    r = play("openai_chat", CHAT["good"])
    alien = Round(
        provider="nope", attempt=0, choices=r.choices, usage=None, anomalies=(), error=None
    )
    with pytest.raises(UsageError, match="no history builder"):
        message_of(alien)


# -- exact shapes, one per provider -----------------------------------------------------------


def test_openai_chat_exact_shape():
    r = play("openai_chat", CHAT["good"])
    assert message_of(r) == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert tool_results_messages(r, all_results(r)) == [
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'}
    ]


def test_anthropic_exact_shape():
    r = play("anthropic", ANTHROPIC["good"])
    assert message_of(r) == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
    }
    assert tool_results_messages(r, all_results(r)) == [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": '{"temp_c": 18}',
                    "is_error": False,
                }
            ],
        }
    ]


def test_openai_responses_history_is_the_list_of_input_items():
    r = play("openai_responses", RESPONSES["good"])
    assert assistant_messages(r) == [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me check."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "id": "fc_1",
        },
    ]
    assert tool_results_messages(r, all_results(r)) == [
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 18}'}
    ]


def test_gemini_exact_shape():
    r = play("gemini", GEMINI["good"])
    assert message_of(r) == {
        "role": "model",
        "parts": [
            {"text": "Let me check."},
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
        ],
    }
    assert tool_results_messages(r, all_results(r)) == [
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "get_weather",
                        "response": {"output": '{"temp_c": 18}'},
                    }
                }
            ],
        }
    ]


def test_bedrock_exact_shape():
    r = play("bedrock", BEDROCK["good"])
    assert message_of(r) == {
        "role": "assistant",
        "content": [
            {"text": "Let me check."},
            {
                "toolUse": {
                    "toolUseId": "tooluse_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            },
        ],
    }
    assert tool_results_messages(r, all_results(r)) == [
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "tooluse_1",
                        "content": [{"text": '{"temp_c": 18}'}],
                        "status": "success",
                    }
                }
            ],
        }
    ]
    truncated = play("bedrock", BEDROCK["truncated"])
    (message,) = tool_results_messages(truncated, error_results(truncated))
    assert message["content"][0]["toolResult"]["status"] == "error"


# -- reasoning and server-tool blocks, byte-for-byte --------------------------------------------

SIG = "EqQBCkgIARABGAIiQH+/=="  # base64-looking, with characters JSON could escape


def test_openai_chat_reasoning_content_is_kept():
    data = sse(
        chat({"reasoning_content": "Think "}),
        chat({"reasoning_content": "twice."}),
        chat_call(0, '{"city": "Paris"}', "call_1", "get_weather"),
        chat(finish="tool_calls"),
    )
    message = message_of(play("openai_chat", data))
    assert message["reasoning_content"] == "Think twice."


def test_anthropic_thinking_signature_and_redacted_thinking_are_kept_byte_for_byte():
    data = ant(
        ant_start(),
        ant_block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        ant_delta(0, type="thinking_delta", thinking="Paris is "),
        ant_delta(0, type="thinking_delta", thinking="in France."),
        ant_delta(0, type="signature_delta", signature=SIG),
        ant_stop(0),
        ant_block(1, {"type": "redacted_thinking", "data": "RkFLRQ=="}),
        ant_stop(1),
        *ant_tool(2, "toolu_1", '{"city": "Paris"}'),
        *ant_end("tool_use"),
    )
    content = message_of(play("anthropic", data))["content"]
    assert content[:2] == [
        {"type": "thinking", "thinking": "Paris is in France.", "signature": SIG},
        {"type": "redacted_thinking", "data": "RkFLRQ=="},
    ]
    assert content[2]["type"] == "tool_use"


def test_anthropic_server_tool_blocks_are_kept_and_never_paired():
    result_block = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": [
            {
                "type": "web_search_result",
                "url": "https://example.org",
                "title": "Weather",
                "encrypted_content": "RU5D",
                "page_age": None,
            }
        ],
    }
    data = ant(
        ant_start(),
        ant_block(
            0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
        ),
        ant_delta(0, type="input_json_delta", partial_json='{"query": "paris weather"}'),
        ant_stop(0),
        ant_block(1, result_block),
        ant_stop(1),
        *ant_tool(2, "toolu_1", '{"city": "Paris"}'),
        *ant_end("tool_use"),
    )
    r = play("anthropic", data)
    content = message_of(r)["content"]
    assert content[:2] == [
        {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {"query": "paris weather"},
        },
        result_block,
    ]
    assert [c.call_id for c in r.calls] == ["toolu_1"]  # only the client call needs a result
    assert_paired("anthropic", message_of(r), tool_results_messages(r, all_results(r)))


def test_openai_responses_reasoning_and_hosted_items_are_passed_back_verbatim():
    reasoning = {
        "id": "rs_1",
        "type": "reasoning",
        "encrypted_content": "gAAAAB" + SIG,
        "summary": [{"type": "summary_text", "text": "Looked it up."}],
    }
    search = {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "paris weather"},
    }
    data = sse(
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []},
        },
        resp_item_done(0, reasoning),
        resp_item_done(1, search),
        resp_text(2, "Let me check."),
        *resp_call(3, "fc_1", "call_1", '{"city": "Paris"}'),
        RESP_COMPLETED,
    )
    r = play("openai_responses", data)
    items = message_of(r)
    assert items[:2] == [reasoning, search]
    assert [i["type"] for i in items] == [
        "reasoning",
        "web_search_call",
        "message",
        "function_call",
    ]
    assert_paired("openai_responses", message_of(r), tool_results_messages(r, all_results(r)))


def test_openai_responses_call_without_item_id_has_no_id():
    added = resp_call_added(0, "fc_1", "call_1")
    del added["item"]["id"]
    data = sse(
        added,
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{}"},
        {"type": "response.function_call_arguments.done", "output_index": 0, "arguments": "{}"},
        RESP_COMPLETED,
    )
    (item,) = message_of(play("openai_responses", data))
    assert item == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": "{}",
    }


def test_gemini_signatures_go_back_on_the_parts_that_carried_them():
    thought = {"text": "The user wants weather.", "thought": True, "thoughtSignature": "VFNJRw=="}
    data = sse(
        gem(thought),
        gem(gem_call({"city": "Paris"}, thoughtSignature=SIG), gem_call({"city": "Lyon"})),
        gem({"text": "Checking "}),
        gem({"text": "both.", "thoughtSignature": "VFhU"}),
        gem({"thoughtSignature": "QkFSRQ=="}),
        GEM_STOP,
    )
    r = play("gemini", data)
    assert message_of(r) == {
        "role": "model",
        "parts": [
            thought,
            {
                "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                "thoughtSignature": SIG,
            },
            {"functionCall": {"name": "get_weather", "args": {"city": "Lyon"}}},
            {"text": "Checking both.", "thoughtSignature": "VFhU"},
            {"thoughtSignature": "QkFSRQ=="},
        ],
    }


def test_gemini_signature_on_an_empty_text_part_after_a_call_stays_a_part():
    data = sse(
        gem(gem_call({"city": "Paris"})), gem({"text": "", "thoughtSignature": SIG}), GEM_STOP
    )
    parts = message_of(play("gemini", data))["parts"]
    assert parts[1] == {"text": "", "thoughtSignature": SIG}


def test_gemini_streamed_call_keeps_the_signature_of_its_first_part():
    data = sse(
        gem(
            {"functionCall": {"name": "get_weather", "willContinue": True}, "thoughtSignature": SIG}
        ),
        gem(
            {
                "functionCall": {
                    "partialArgs": [{"jsonPath": "$.city", "stringValue": "Paris"}],
                    "willContinue": True,
                }
            }
        ),
        gem({"functionCall": {}}),
        GEM_STOP,
    )
    r = play("gemini", data)
    assert message_of(r)["parts"] == [
        {
            "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
            "thoughtSignature": SIG,
        }
    ]


def test_gemini_id_less_calls_pair_by_synthesized_ids_that_are_never_sent():
    r = play("gemini", sse(gem(gem_call({"city": "Paris"}), gem_call({"city": "Lyon"})), GEM_STOP))
    synthesized = {a.key for a in r.anomalies if a.kind is AnomalyKind.SYNTHESIZED_ID}
    assert {c.key for c in r.calls} == synthesized
    ids = [c.call_id for c in r.calls]
    assert len(set(ids)) == 2
    assert all(ids)
    results = [
        ToolResult(tool_call_id=ids[1], name="get_weather", content="rain"),
        ToolResult(tool_call_id=ids[0], name="get_weather", content="sun"),
    ]
    messages = tool_results_messages(r, results)
    text = json.dumps([message_of(r), messages])
    assert not any(i in text for i in ids)
    assert messages[0]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"output": "sun"}}},
        {"functionResponse": {"name": "get_weather", "response": {"output": "rain"}}},
    ]


def test_gemini_provider_ids_are_sent_back_on_call_and_response():
    r = play(
        "gemini",
        sse(
            gem({"functionCall": {"id": "fc-9", "name": "get_weather", "args": {"city": "Paris"}}}),
            GEM_STOP,
        ),
    )
    assert calls_in("gemini", message_of(r)) == [("fc-9", "get_weather", {"city": "Paris"})]
    (message,) = tool_results_messages(r, all_results(r))
    assert message["parts"][0]["functionResponse"]["id"] == "fc-9"


def test_gemini_error_results_use_the_error_key():
    r = play("gemini", GEMINI["truncated"])
    (message,) = tool_results_messages(r, error_results(r))
    response = message["parts"][0]["functionResponse"]["response"]
    assert list(response) == ["error"]
    assert response["error"].startswith("truncated: ")


def test_gemini_server_parts_are_kept():
    code = {"executableCode": {"language": "PYTHON", "code": "print(6 * 7)"}}
    outcome = {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "42\n"}}
    r = play("gemini", sse(gem(code), gem(outcome), gem({"text": "It is 42."}), GEM_STOP))
    assert message_of(r)["parts"] == [code, outcome, {"text": "It is 42."}]
    assert r.calls == ()


def test_bedrock_reasoning_with_signature_and_server_tool_blocks_are_kept():
    result = {
        "toolUseId": "tooluse_srv",
        "type": "nova_code_interpreter_result",
        "status": "success",
    }
    data = jsonl(
        BR_START,
        br_delta(0, reasoningContent={"text": "Compute "}),
        br_delta(0, reasoningContent={"text": "first."}),
        br_delta(0, reasoningContent={"signature": SIG}),
        br_stop(0),
        {
            "contentBlockStart": {
                "contentBlockIndex": 1,
                "start": {
                    "toolUse": {
                        "toolUseId": "tooluse_srv",
                        "name": "nova_code_interpreter",
                        "type": "server_tool_use",
                    }
                },
            }
        },
        br_delta(1, toolUse={"input": '{"snippet": "6 * 7"}'}),
        br_stop(1),
        {"contentBlockStart": {"contentBlockIndex": 2, "start": {"toolResult": result}}},
        br_delta(2, toolResult=[{"json": {"stdOut": "42"}}]),
        br_stop(2),
        br_delta(3, text="   "),
        br_stop(3),
        *br_tool(4, "tooluse_1", '{"city": "Paris"}'),
        *br_end("tool_use"),
    )
    r = play("bedrock", data)
    content = message_of(r)["content"]
    assert content == [
        {"reasoningContent": {"reasoningText": {"text": "Compute first.", "signature": SIG}}},
        {
            "toolUse": {
                "toolUseId": "tooluse_srv",
                "name": "nova_code_interpreter",
                "type": "server_tool_use",
                "input": {"snippet": "6 * 7"},
            }
        },
        {"toolResult": {**result, "content": [{"json": {"stdOut": "42"}}]}},
        # the whitespace-only text block is left out: Converse rejects blank text
        {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Paris"}}},
    ]
    assert_paired("bedrock", message_of(r), tool_results_messages(r, all_results(r)))


def test_nameless_call_is_left_out_and_needs_no_result():
    data = sse(
        chat_call(0, '{"city": "Paris"}', "call_1", "get_weather"),
        chat(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"arguments": "{}"},
                    }
                ]
            }
        ),
        chat(finish="tool_calls"),
    )
    r = play("openai_chat", data)
    assert [c.name for c in r.calls] == ["get_weather", None]
    assert [c[0] for c in calls_in("openai_chat", message_of(r))] == ["call_1"]
    committed = [x for x in all_results(r) if x.tool_call_id == "call_1"]
    assert len(tool_results_messages(r, committed)) == 1


# -- the recorded corpus -----------------------------------------------------------------------


def _expected() -> dict[str, Any]:
    path = CORPUS / "expected.json"
    return json.loads(path.read_text()) if path.is_file() else {}


EXPECTED = _expected()
FILES = sorted(EXPECTED) or ["<corpus absent>"]
_SIGNATURE = re.compile(
    r'"(thoughtSignature|signature|encrypted_content)"\s*:\s*"((?:[^"\\]|\\.)+)"'
)
_BEDROCK_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _strings(value: object) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value)) if value else set()
    return set()


def _object_text(text: str) -> bool:
    return isinstance(json.loads(text), dict)


def _well_formed_openai_chat(m: dict[str, Any]) -> None:
    assert m["role"] == "assistant"
    assert set(m) <= {"role", "content", "tool_calls", "reasoning_content"}
    assert m["content"] is None or isinstance(m["content"], str)
    for c in m.get("tool_calls", []):
        assert c["id"]
        assert c["type"] == "function"
        assert c["function"]["name"]
        assert _object_text(c["function"]["arguments"])


def _well_formed_anthropic(m: dict[str, Any]) -> None:
    assert m["role"] == "assistant"
    assert set(m) == {"role", "content"}
    for b in m["content"]:
        if b["type"] == "text":
            assert b["text"]
        elif b["type"] == "tool_use":
            assert b["id"]
            assert b["name"]
            assert isinstance(b["input"], dict)
        elif b["type"] == "thinking":
            assert isinstance(b["signature"], str)
            assert isinstance(b["thinking"], str)
        else:
            assert b["type"] in {
                "redacted_thinking",
                "server_tool_use",
                "mcp_tool_use",
                "mcp_tool_result",
            } or b["type"].endswith("_tool_result")


def _well_formed_openai_responses(m: list[dict[str, Any]]) -> None:
    assert isinstance(m, list)
    for item in m:
        if item["type"] == "function_call":
            assert item["call_id"]
            assert item["name"]
            assert _object_text(item["arguments"])
        elif item["type"] == "message":
            assert item["role"] == "assistant"
            assert [c["type"] for c in item["content"]] == ["output_text"]
        else:
            assert item["type"] not in ("function_call_output", "")
            assert item.get("id")  # passed back verbatim, as the provider sent it


def _well_formed_gemini(m: dict[str, Any]) -> None:
    assert m["role"] == "model"
    assert set(m) == {"role", "parts"}
    for part in m["parts"]:
        assert part
        assert set(part) <= {
            "text",
            "thought",
            "thoughtSignature",
            "functionCall",
            "executableCode",
            "codeExecutionResult",
        }
        if "functionCall" in part:
            fc = part["functionCall"]
            assert set(fc) <= {"name", "args", "id"}
            assert fc["name"]
            assert isinstance(fc["args"], dict)


def _well_formed_bedrock(m: dict[str, Any]) -> None:
    assert m["role"] == "assistant"
    assert set(m) == {"role", "content"}
    for block in m["content"]:
        (member,) = block
        assert member in {"text", "reasoningContent", "toolUse", "toolResult"}
        if member == "text":
            assert block["text"].strip()
        if member == "toolUse":
            assert _BEDROCK_ID.match(block["toolUse"]["toolUseId"])
            assert block["toolUse"]["name"]
            assert isinstance(block["toolUse"]["input"], dict)


WELL_FORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "openai_chat": _well_formed_openai_chat,
    "anthropic": _well_formed_anthropic,
    "openai_responses": _well_formed_openai_responses,
    "gemini": _well_formed_gemini,
    "bedrock": _well_formed_bedrock,
}


@pytest.mark.corpus
@pytest.mark.parametrize("rel", FILES)
def test_recorded_stream_history_is_well_formed_and_fully_paired(rel):
    root = corpus_dir()
    raw = (root / rel).read_bytes()
    r = replay_bytes(raw, name=Path(rel).name)
    message = message_of(r)
    json.dumps(message, allow_nan=False)  # sendable as is
    WELL_FORMED[r.provider](message)
    results = tool_results_messages(r, all_results(r))
    json.dumps(results, allow_nan=False)
    assert_paired(r.provider, message, results)
    # every named call of choice 0 is in the message, with its committed arguments
    named = [c for c in r.calls if c.name]
    assert len(calls_in(r.provider, message)) == len(named) == len(results_in(r.provider, results))
    for call, (_, name, args) in zip(named, calls_in(r.provider, message), strict=True):
        assert name == call.name
        if call.arguments is not None:
            assert args == call.arguments


def _signed_files() -> list[str]:
    """Recordings whose bytes carry a signature or encrypted reasoning (binary ones excluded:
    their JSON twin is checked)."""
    signed = [
        rel
        for rel in sorted(EXPECTED)
        if not rel.endswith(".eventstream")
        and _SIGNATURE.search((CORPUS / rel).read_bytes().decode())
    ]
    return signed or ["<corpus absent>"]


@pytest.mark.corpus
@pytest.mark.parametrize("rel", _signed_files())
def test_recorded_stream_signatures_reach_history_byte_for_byte(rel):
    """Every non-empty signature / encrypted reasoning value in the raw bytes is in the message
    (found by a regex on the recording, independently of the adapters).

    The Responses API re-encrypts a reasoning item's ``encrypted_content`` in every event that
    repeats it (``output_item.added``, ``.done`` and ``response.completed`` carry three different
    values in ``reasoning_then_function_call.sse``); the finished item's value is the one kept.
    """
    root = corpus_dir()
    raw = (root / rel).read_bytes()
    lines = raw.decode().splitlines()
    if EXPECTED[rel]["format"] == "openai_responses":
        lines = [line for line in lines if '"response.output_item.done"' in line]
    found = {json.loads(f'"{m.group(2)}"') for m in _SIGNATURE.finditer("\n".join(lines))}
    assert found
    r = replay_bytes(raw, name=Path(rel).name)
    assert found <= _strings(message_of(r))
