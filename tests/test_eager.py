"""Eager start, decided in the core: a call of an eager tool is committed (``CallReady``) as
soon as the provider has moved on from it, never from a closed last block alone; and the
consumer notices of ``observe=True``.

Each transcript is fed one native event at a time, both as SSE bytes and as a dict, and the
tests assert *at which event* a notice appears, per provider.
"""

from __future__ import annotations

from typing import Any

import pytest

from chat_chunks import chunk, tc
from toollatch import CallState, ErrorCode, RunBudget, StreamParser, ToolSpec
from toollatch.stages import AnomalyKind, CallAnnounced, CallComplete, CallReady, TextReceived
from toollatch.testing import sse

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
EAGER = [ToolSpec(name="get_weather", parameters=CITY, eager=True), ToolSpec(name="write_file")]
BATCH = [ToolSpec(name="get_weather", parameters=CITY), ToolSpec(name="write_file")]


def fed(provider: str, natives: list[Any], *, tools=EAGER, way: str = "bytes", **kw: Any):
    """(index of the native event, notice) for every notice, and the Round."""
    parser = StreamParser(provider, tools=tools, **kw)
    found = []
    for i, native in enumerate(natives):
        if way == "bytes":
            if provider == "anthropic":
                data = sse(native, named=True)
            elif isinstance(native, str):
                data = f"data: {native}\n\n".encode()
            else:
                data = sse(native)
            notices = parser.feed(data)
        else:
            notices = [] if isinstance(native, str) else parser.feed_event(native)
        found += [(i, n) for n in notices]
    round_ = parser.finish()
    found += [(len(natives), n) for n in parser.finish_notices]
    return found, round_


def ready(found) -> list[tuple[int, str]]:
    return [(i, n.call.call_id) for i, n in found if isinstance(n, CallReady)]


WAYS = pytest.mark.parametrize("way", ["bytes", "dict"])


# -- Anthropic -------------------------------------------------------------------------------


def a_start(index: int, call_id: str, name: str = "get_weather") -> dict[str, Any]:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return {"type": "content_block_start", "index": index, "content_block": block}


def a_args(index: int, text: str) -> dict[str, Any]:
    delta = {"type": "input_json_delta", "partial_json": text}
    return {"type": "content_block_delta", "index": index, "delta": delta}


def a_text(index: int, text: str) -> list[dict[str, Any]]:
    start = {
        "type": "content_block_start",
        "index": index,
        "content_block": {"type": "text", "text": ""},
    }
    delta = {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }
    return [start, delta, {"type": "content_block_stop", "index": index}]


def a_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


A_START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "usage": {"input_tokens": 3},
    },
}


def a_end(reason: str) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]


def a_call(index: int, call_id: str, text: str, name: str = "get_weather"):
    return [
        a_start(index, call_id, name),
        a_args(index, text[:5]),
        a_args(index, text[5:]),
        a_stop(index),
    ]


@WAYS
def test_anthropic_a_closed_block_is_ready_when_the_next_block_starts(way):
    natives = [
        A_START,
        *a_call(0, "tu_1", '{"city": "Oslo"}'),
        *a_call(1, "tu_2", '{"city": "Rome"}'),
        *a_end("tool_use"),
    ]
    found, round_ = fed("anthropic", natives, way=way)
    # tu_1: not at its own stop (event 4), but when block 1 starts (event 5); tu_2 at the
    # round's normal end (message_stop, event 10: the adapter's end of a round)
    assert ready(found) == [(5, "tu_1"), (10, "tu_2")]
    assert [(c.state, c.early) for c in round_.calls] == [(CallState.COMMITTED, True)] * 2
    assert [c.committed for c in round_.calls] == [n.call for _, n in found]


@WAYS
def test_anthropic_a_closed_last_block_cut_by_max_tokens_never_starts(way):
    natives = [A_START, *a_call(0, "tu_1", '{"city": "Oslo"}'), *a_end("max_tokens")]
    found, round_ = fed("anthropic", natives, way=way)
    assert ready(found) == []
    assert round_.calls[0].state is CallState.FAILED
    assert round_.calls[0].error is ErrorCode.TRUNCATED


def test_anthropic_the_call_before_a_truncated_one_ran_early_and_stays_committed():
    natives = [
        A_START,
        *a_call(0, "tu_1", '{"city": "Oslo"}'),
        a_start(1, "tu_2"),
        a_args(1, '{"ci'),
        *a_end("max_tokens"),
    ]
    found, round_ = fed("anthropic", natives)
    assert ready(found) == [(5, "tu_1")]
    first, second = round_.calls
    assert (first.state, first.early) == (CallState.COMMITTED, True)
    assert (second.state, second.error) == (CallState.FAILED, ErrorCode.TRUNCATED)
    assert round_.committed() == (first.committed,)


def test_anthropic_text_after_a_call_is_moving_on():
    natives = [
        A_START,
        *a_call(0, "tu_1", '{"city": "Oslo"}'),
        *a_text(1, "Done."),
        *a_end("end_turn"),
    ]
    found, _ = fed("anthropic", natives)
    assert ready(found) == [(6, "tu_1")]  # the text delta, not the empty text block start


def test_a_tool_that_is_not_eager_waits_for_the_round():
    natives = [
        A_START,
        *a_call(0, "tu_1", '{"city": "Oslo"}'),
        *a_call(1, "tu_2", '{"city": "Rome"}'),
        *a_end("tool_use"),
    ]
    found, round_ = fed("anthropic", natives, tools=BATCH)
    assert found == []  # a consumer that asks for nothing gets nothing
    assert [(c.state, c.early) for c in round_.calls] == [(CallState.COMMITTED, False)] * 2


def test_eager_names_given_to_the_parser_count_as_eager():
    natives = [
        A_START,
        *a_call(0, "tu_1", '{"city": "Oslo"}'),
        *a_call(1, "tu_2", '{"city": "Rome"}'),
        *a_end("tool_use"),
    ]
    found, _ = fed("anthropic", natives, tools=BATCH, eager=["get_weather"])
    assert ready(found) == [(5, "tu_1"), (10, "tu_2")]


def test_the_gate_runs_in_full_at_the_early_commit():
    natives = [
        A_START,
        *a_call(0, "tu_1", '{"town": "Oslo"}'),
        *a_call(1, "tu_2", '{"city": "Rome"}'),
        *a_call(2, "tu_3", '{"city": "Bern"}'),
        *a_end("tool_use"),
    ]
    found, round_ = fed("anthropic", natives, budget=RunBudget(1))
    early = [(i, type(n).__name__, getattr(n, "code", None)) for i, n in found]
    assert early == [
        (5, "CallFailed", ErrorCode.SCHEMA_VIOLATION),  # tu_1: checked when block 1 starts
        (9, "CallReady", None),  # tu_2 takes the budget of one
        (14, "CallFailed", ErrorCode.BUDGET_EXCEEDED),  # tu_3, at the round's normal end
    ]
    assert [c.state for c in round_.calls] == [
        CallState.FAILED,
        CallState.COMMITTED,
        CallState.FAILED,
    ]


def test_an_interrupted_stream_keeps_the_early_call_committed():
    natives = [
        A_START,
        *a_call(0, "tu_1", '{"city": "Oslo"}'),
        a_start(1, "tu_2"),
        a_args(1, '{"city"'),
    ]  # no message_stop: interrupted
    found, round_ = fed("anthropic", natives)
    assert ready(found) == [(5, "tu_1")]
    assert round_.ended == "interrupted"
    assert [c.state for c in round_.calls] == [CallState.COMMITTED, CallState.FAILED]
    cancelled = StreamParser("anthropic", tools=EAGER)
    for native in natives:
        cancelled.feed(sse(native, named=True))
    assert [c.state for c in cancelled.cancel().calls] == [CallState.COMMITTED, CallState.CANCELLED]


# -- OpenAI chat -----------------------------------------------------------------------------


def c_call(index: int, call_id: str, text: str, name: str = "get_weather"):
    return [chunk(tc(index, call_id, name, text[:6])), chunk(tc(index, args=text[6:]))]


@WAYS
def test_chat_a_complete_call_is_ready_when_a_later_index_opens(way):
    natives = [
        *c_call(0, "call_1", '{"city": "Oslo"}'),
        *c_call(1, "call_2", '{"city": "Rome"}'),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    found, round_ = fed("openai_chat", natives, way=way)
    assert ready(found) == [(2, "call_1"), (4, "call_2")]
    assert [c.early for c in round_.calls] == [True, True]


def test_chat_an_incomplete_text_is_not_ready_when_a_later_index_opens():
    # fragments of parallel calls may interleave: call_1 is not one complete object yet
    natives = [
        chunk(tc(0, "call_1", "get_weather", '{"city": ')),
        chunk(tc(1, "call_2", "get_weather", '{"city": "Rome"}')),
        chunk(tc(0, args='"Oslo"}')),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    found, round_ = fed("openai_chat", natives)
    assert ready(found) == [(3, "call_1"), (3, "call_2")]  # both at finish_reason
    assert [c.arguments for c in round_.calls] == [{"city": "Oslo"}, {"city": "Rome"}]


def test_chat_a_fragment_after_an_early_commit_is_recorded_and_the_call_stays_committed():
    natives = [
        *c_call(0, "call_1", '{"city": "Oslo"}'),
        *c_call(1, "call_2", '{"city": "Rome"}'),
        chunk(tc(0, args=" ")),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    found, round_ = fed("openai_chat", natives)
    assert ready(found)[0] == (2, "call_1")
    assert round_.calls[0].state is CallState.COMMITTED
    kinds = [(a.kind, a.key) for a in round_.anomalies]
    assert (AnomalyKind.FRAGMENT_AFTER_CLOSE, round_.calls[0].key) in kinds


def test_chat_length_never_settles_the_last_call():
    natives = [*c_call(0, "call_1", '{"city": "Oslo"}'), chunk(finish="length"), "[DONE]"]
    found, round_ = fed("openai_chat", natives)
    assert ready(found) == []
    assert round_.calls[0].error is ErrorCode.TRUNCATED


# -- OpenAI Responses ------------------------------------------------------------------------


def r_item(item_id: str, call_id: str, status: str, arguments: str = "") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": "get_weather",
        "arguments": arguments,
        "status": status,
    }


def r_call(n: int, item_id: str, call_id: str, text: str, status: str = "completed"):
    return [
        {
            "type": "response.output_item.added",
            "output_index": n,
            "item": r_item(item_id, call_id, "in_progress"),
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": item_id,
            "output_index": n,
            "delta": text,
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": item_id,
            "output_index": n,
            "arguments": text,
        },
        {
            "type": "response.output_item.done",
            "output_index": n,
            "item": r_item(item_id, call_id, status, text),
        },
    ]


@WAYS
def test_responses_a_completed_item_is_ready_at_once(way):
    natives = [
        *r_call(0, "fc_1", "call_1", '{"city": "Oslo"}'),
        {"type": "response.completed", "response": {"status": "completed"}},
    ]
    found, round_ = fed("openai_responses", natives, way=way)
    assert ready(found) == [(3, "call_1")]  # its output_item.done, before response.completed
    assert round_.calls[0].early


def test_responses_an_incomplete_item_never_starts():
    natives = [
        *r_call(0, "fc_1", "call_1", '{"city": "Oslo"}', status="incomplete"),
        {"type": "response.incomplete", "response": {"status": "incomplete"}},
    ]
    found, round_ = fed("openai_responses", natives)
    assert ready(found) == []
    assert round_.calls[0].error is ErrorCode.TRUNCATED


# -- Gemini and Bedrock ----------------------------------------------------------------------


def g_chunk(*parts: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate]}


G_CALL = {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}


def test_gemini_a_call_part_is_ready_at_the_next_part():
    natives = [g_chunk(G_CALL), g_chunk({"text": "Checking."}), g_chunk(finish="STOP")]
    found, round_ = fed("gemini", natives)
    assert [i for i, _ in ready(found)] == [1]
    assert round_.calls[0].early


def test_gemini_a_call_part_with_max_tokens_never_starts():
    natives = [g_chunk(G_CALL, finish="MAX_TOKENS")]
    found, round_ = fed("gemini", natives)
    assert ready(found) == []
    assert round_.calls[0].error is ErrorCode.TRUNCATED


def test_bedrock_a_closed_block_is_ready_when_the_next_block_starts():
    def start(i, cid):
        return {
            "contentBlockStart": {
                "contentBlockIndex": i,
                "start": {"toolUse": {"toolUseId": cid, "name": "get_weather"}},
            }
        }

    def args(i, text):
        return {
            "contentBlockDelta": {"contentBlockIndex": i, "delta": {"toolUse": {"input": text}}}
        }

    def stop(i):
        return {"contentBlockStop": {"contentBlockIndex": i}}

    natives = [
        {"messageStart": {"role": "assistant"}},
        start(0, "tu_1"),
        args(0, '{"city": "Oslo"}'),
        stop(0),
        start(1, "tu_2"),
        args(1, '{"city": "Rome"}'),
        stop(1),
        {"messageStop": {"stopReason": "tool_use"}},
    ]
    found, _ = fed("bedrock", natives, way="dict")
    assert ready(found) == [(4, "tu_1"), (7, "tu_2")]
    found, _ = fed(
        "bedrock", [*natives[:4], {"messageStop": {"stopReason": "max_tokens"}}], way="dict"
    )
    assert ready(found) == []


# -- observe=True ----------------------------------------------------------------------------


def test_observe_gives_text_call_opened_and_closed_in_stream_order():
    natives = [
        A_START,
        *a_text(0, "Let me check."),
        *a_call(1, "tu_1", '{"city": "Oslo"}'),
        *a_end("tool_use"),
    ]
    found, _ = fed("anthropic", natives, tools=BATCH, observe=True)
    seen = [(i, type(n).__name__) for i, n in found]
    assert seen == [(2, "TextReceived"), (4, "CallAnnounced"), (7, "CallComplete")]
    text, opened, closed = (n for _, n in found)
    assert isinstance(text, TextReceived) and text.text == "Let me check."
    assert isinstance(opened, CallAnnounced)
    assert (opened.call_id, opened.name) == ("tu_1", "get_weather")
    assert isinstance(closed, CallComplete) and closed.key == opened.key


def test_observe_announces_an_identity_learnt_after_the_open():
    # Kimi-style: the id comes after the arguments began
    natives = [
        chunk(tc(0, None, "get_weather", '{"city": "Oslo"}')),
        chunk(tc(0, "call_9")),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    found, _ = fed("openai_chat", natives, tools=BATCH, observe=True)
    announced = [(i, n.call_id, n.name) for i, n in found if isinstance(n, CallAnnounced)]
    assert announced == [(0, None, "get_weather"), (1, "call_9", "get_weather")]
    assert [type(n) for i, n in found if i == 2] == [CallComplete]
