"""Anthropic Messages end to end: wire bytes -> Round, every scenario at every chunking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toollatch import CallState, Ending, ErrorCode, Limits, StreamParser
from toollatch.testing import chunkings, replay, split_at, sse, summary

TOOLS = [
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}},
    {"name": "get_time", "input_schema": {"type": "object"}},
]
START = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                              "content": [], "usage": {"input_tokens": 5}}}


def tool(index, cid, name, text, chunk=5, stop=True):
    events = [{"type": "content_block_start", "index": index,
               "content_block": {"type": "tool_use", "id": cid, "name": name, "input": {}}},
              {"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": ""}}]
    events += [{"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": text[i:i + chunk]}}
               for i in range(0, len(text), chunk)]
    return events + ([{"type": "content_block_stop", "index": index}] if stop else [])


def text_block(index, text):
    return [{"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}},
            {"type": "content_block_stop", "index": index}]


def thinking_block(index):
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
            {"type": "content_block_delta", "index": index,
             "delta": {"type": "thinking_delta", "thinking": "Need the "}},
            {"type": "content_block_delta", "index": index,
             "delta": {"type": "thinking_delta", "thinking": "weather."}},
            {"type": "content_block_delta", "index": index,
             "delta": {"type": "signature_delta", "signature": "c2lnbmF0dXJl/+=="}},
            {"type": "content_block_stop", "index": index}]


def end(reason="tool_use"):
    return [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
             "usage": {"output_tokens": 20}}, {"type": "message_stop"}]


def wire(*events):
    return sse(*events, named=True)


SCENARIOS = {
    "single": wire(START, *text_block(0, "Checking."), *tool(1, "t1", "get_weather", '{"city": "Kyoto"}'),
                   {"type": "ping"}, *end()),
    "parallel": wire(START, *tool(0, "t1", "get_weather", '{"city": "A"}'),
                     *tool(1, "t2", "get_time", "{}"), *end()),
    "no_args": wire(START, *tool(0, "t1", "get_time", ""), *end()),
    "thinking": wire(START, *thinking_block(0), *tool(1, "t1", "get_weather", '{"city": "Oslo"}'), *end()),
    "truncated": wire(START, *tool(0, "t1", "get_weather", '{"city": "Ky', stop=False), *end("max_tokens")),
    "truncated_stopped": wire(START, *tool(0, "t1", "get_weather", '{"city": "Kyoto"}'), *end("max_tokens")),
    "interrupted": wire(START, *tool(0, "t1", "get_weather", '{"city": "Kyoto"}')),
    "invalid": wire(START, *tool(0, "t1", "get_weather", '{"city": Kyoto}'), *end()),
    "error_event": wire(START, *tool(0, "t1", "get_weather", '{"city": "A"}')) + (
        b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
        b'"message": "Overloaded"}}\n\n'),
}


def outcome(r):
    return [(c.call_id, c.state, c.error, c.arguments) for c in r.calls]


def test_single_call_with_text():
    r = replay(SCENARIOS["single"], "anthropic", tools=TOOLS)
    assert r.ended is Ending.NORMAL and r.stop_reason == "tool_use" and r.text == "Checking."
    assert outcome(r) == [("t1", CallState.COMMITTED, None, {"city": "Kyoto"})]


def test_parallel_and_no_argument_calls():
    r = replay(SCENARIOS["parallel"], "anthropic", tools=TOOLS)
    assert outcome(r) == [("t1", CallState.COMMITTED, None, {"city": "A"}),
                          ("t2", CallState.COMMITTED, None, {})]
    r = replay(SCENARIOS["no_args"], "anthropic", tools=TOOLS)
    assert outcome(r) == [("t1", CallState.COMMITTED, None, {})]


def test_thinking_block_and_signature_kept_byte_for_byte_in_history():
    r = replay(SCENARIOS["thinking"], "anthropic", tools=TOOLS)
    message = r.assistant_message()
    assert message["content"][0] == {"type": "thinking", "thinking": "Need the weather.",
                                     "signature": "c2lnbmF0dXJl/+=="}
    assert message["content"][1] == {"type": "tool_use", "id": "t1", "name": "get_weather",
                                     "input": {"city": "Oslo"}}


@pytest.mark.parametrize("name", ["truncated", "truncated_stopped"])
def test_max_tokens_fails_the_call_even_when_its_block_was_stopped(name):
    # Anthropic sends content_block_stop for a block cut by max_tokens: the stop reason decides.
    r = replay(SCENARIOS[name], "anthropic", tools=TOOLS)
    assert r.ended is Ending.TRUNCATED
    assert outcome(r) == [("t1", CallState.FAILED, ErrorCode.TRUNCATED, None)]
    [result] = r.tool_results_messages(r.error_results())[0]["content"]
    assert result["tool_use_id"] == "t1" and result["is_error"] is True


def test_interrupted_and_error_event():
    for name in ("interrupted", "error_event"):
        r = replay(SCENARIOS[name], "anthropic", tools=TOOLS)
        assert r.ended is Ending.INTERRUPTED
        assert outcome(r) == [("t1", CallState.FAILED, ErrorCode.STREAM_INTERRUPTED, None)]
    assert "Overloaded" in replay(SCENARIOS["error_event"], "anthropic").error


def test_invalid_json_fails_only_that_call():
    # anthropic-sdk-python#1265: malformed input JSON must not kill the stream.
    data = wire(START, *tool(0, "t1", "get_weather", '{"city": Kyoto}'),
                *tool(1, "t2", "get_time", "{}"), *end())
    r = replay(data, "anthropic", tools=TOOLS)
    assert [(c.state, c.error) for c in r.calls] == [
        (CallState.FAILED, ErrorCode.INVALID_JSON), (CallState.COMMITTED, None)]


def test_oversized_and_cancel():
    big = '{"city": "' + "k" * 4000 + '"}'
    r = replay(wire(START, *tool(0, "t1", "get_weather", big, chunk=50), *end()), "anthropic",
               limits=Limits(max_argument_bytes=1000))
    assert r.calls[0].error is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES
    parser = StreamParser("anthropic")
    parser.feed(wire(START, *tool(0, "t1", "get_time", "{}"), *tool(1, "t2", "get_time", "{")))
    r = parser.cancel()
    assert [(c.state, c.error) for c in r.calls] == [(CallState.CANCELLED, ErrorCode.CANCELLED)] * 2
    messages = r.tool_results_messages(r.error_results())
    assert [b["tool_use_id"] for b in messages[0]["content"]] == ["t1", "t2"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_is_identical_at_every_standard_chunking(name):
    expected = summary(replay(SCENARIOS[name], "anthropic", tools=TOOLS))
    for pieces in chunkings(SCENARIOS[name], seed=7):
        assert summary(replay(pieces, "anthropic", tools=TOOLS)) == expected


@given(name=st.sampled_from(sorted(SCENARIOS)), data=st.data())
def test_every_scenario_is_identical_at_random_splits(name, data):
    raw = SCENARIOS[name]
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=40))
    assert summary(replay(split_at(raw, cuts), "anthropic", tools=TOOLS)) == summary(
        replay(raw, "anthropic", tools=TOOLS))


@given(st.text(min_size=1, max_size=20), st.data())
def test_multibyte_input_survives_any_split(text, data):
    import json

    raw = wire(START, *tool(0, "t1", "get_weather", json.dumps({"city": text + "東京"}, ensure_ascii=False), chunk=3), *end())
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=20))
    assert replay(split_at(raw, cuts), "anthropic").calls[0].arguments == {"city": text + "東京"}
