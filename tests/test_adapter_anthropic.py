"""AnthropicAdapter: hand-written transcripts (exact event lists) and the recorded corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapter_doubles import counting, general_only
from toollatch import RoundEnd, UsageError
from toollatch.stages import (
    Anomaly,
    AnomalyKind,
    AnthropicAdapter,
    ArgsDelta,
    CallClosed,
    CallKey,
    CallOpened,
    Frame,
    ReasoningBlock,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"

# -- transcript builders ----------------------------------------------------------------------

START_USAGE = {"input_tokens": 10, "output_tokens": 1}
MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "usage": START_USAGE,
    },
}
MESSAGE_STOP = {"type": "message_stop"}
PING = {"type": "ping"}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def tool_start(index: int, call_id: str, name: str) -> dict[str, Any]:
    return block_start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}})


def delta(index: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, **fields}}


def args(index: int, text: str) -> dict[str, Any]:
    return delta(index, "input_json_delta", partial_json=text)


def text(index: int, value: str) -> dict[str, Any]:
    return delta(index, "text_delta", text=value)


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(reason: str | None, output_tokens: int = 7) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


def run(natives: list[dict[str, Any]], *, attempt: int = 0) -> list[StreamEvent]:
    adapter = AnthropicAdapter(attempt=attempt)
    out: list[StreamEvent] = []
    for native in natives:
        out += adapter.feed(native)
    return out + adapter.finish()


def key(index: int, attempt: int = 0) -> CallKey:
    return CallKey(attempt, 0, index)


USAGE_START = UsageReported(usage=START_USAGE)
END_USAGE = UsageReported(usage={**START_USAGE, "output_tokens": 7})  # start's input kept


def ended(reason: str, ending: RoundEnd = RoundEnd.NORMAL) -> list[StreamEvent]:
    return [END_USAGE, RoundEnded(ending=ending, stop_reason=reason)]


# -- calls ------------------------------------------------------------------------------------


def test_single_call() -> None:
    events = run(
        [
            MESSAGE_START,
            tool_start(0, "toolu_1", "get_weather"),
            args(0, ""),
            args(0, '{"city": "Pa'),
            args(0, 'ris"}'),
            stop(0),
            message_delta("tool_use"),
            MESSAGE_STOP,
        ]
    )
    assert events == [
        USAGE_START,
        CallOpened(key=key(0), call_id="toolu_1", name="get_weather"),
        ArgsDelta(key=key(0), fragment=""),
        ArgsDelta(key=key(0), fragment='{"city": "Pa'),
        ArgsDelta(key=key(0), fragment='ris"}'),
        CallClosed(key=key(0)),
        *ended("tool_use"),
    ]


def test_text_then_two_calls_keyed_by_block_index_and_attempt() -> None:
    events = run(
        [
            MESSAGE_START,
            block_start(0, {"type": "text", "text": ""}),
            text(0, "Two lookups."),
            stop(0),
            tool_start(1, "toolu_a", "lookup"),
            args(1, '{"q": 1}'),
            stop(1),
            tool_start(2, "toolu_b", "lookup"),
            args(2, '{"q": 2}'),
            stop(2),
            message_delta("tool_use"),
            MESSAGE_STOP,
        ],
        attempt=3,
    )
    assert events == [
        USAGE_START,
        TextDelta(text="Two lookups.", block=0),
        CallOpened(key=key(1, 3), call_id="toolu_a", name="lookup"),
        ArgsDelta(key=key(1, 3), fragment='{"q": 1}'),
        CallClosed(key=key(1, 3)),
        CallOpened(key=key(2, 3), call_id="toolu_b", name="lookup"),
        ArgsDelta(key=key(2, 3), fragment='{"q": 2}'),
        CallClosed(key=key(2, 3)),
        *ended("tool_use"),
    ]


def test_no_argument_call_streams_one_empty_fragment() -> None:
    # parallel_empty_input_padded.sse: partial_json "" is the whole input (means {}).
    events = run(
        [
            MESSAGE_START,
            tool_start(0, "toolu_1", "now"),
            args(0, ""),
            stop(0),
            message_delta("tool_use"),
            MESSAGE_STOP,
        ]
    )
    assert events == [
        USAGE_START,
        CallOpened(key=key(0), call_id="toolu_1", name="now"),
        ArgsDelta(key=key(0), fragment=""),
        CallClosed(key=key(0)),
        *ended("tool_use"),
    ]


def test_empty_start_input_adds_no_fragment() -> None:
    start = block_start(0, {"type": "tool_use", "id": "t", "name": "n", "input": {}})
    assert AnthropicAdapter().feed(start) == [CallOpened(key=key(0), call_id="t", name="n")]


def test_non_empty_start_input_is_the_arguments_sent_as_an_object() -> None:
    # Rule "input in the start": the non-streamed shape inside a stream is not dropped.
    start = block_start(0, {"type": "tool_use", "id": "t", "name": "n", "input": {"x": 1}})
    assert AnthropicAdapter().feed(start) == [
        CallOpened(key=key(0), call_id="t", name="n"),
        Anomaly(
            kind=AnomalyKind.OBJECT_ARGUMENTS,
            detail="tool_use start carries its input as an object; serialized once",
            key=key(0),
        ),
        ArgsDelta(key=key(0), fragment='{"x":1}', whole=True),
    ]
    bad = block_start(0, {"type": "tool_use", "id": "t", "name": "n", "input": [1]})
    assert AnthropicAdapter().feed(bad)[1:] == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="tool_use start input is a list, not a JSON object",
            key=key(0),
            fails_call=True,
        )
    ]


def test_duplicate_keys_in_a_start_input_fail_the_call() -> None:
    data = (
        '{"type":"content_block_start","index":0,"content_block":{"type":"tool_use",'
        '"id":"t","name":"n","input":{"cmd":"ls","cmd":"rm -rf /"}}}'
    )
    events = AnthropicAdapter().feed_frame(Frame(event="content_block_start", data=data))
    assert (
        Anomaly(
            kind=AnomalyKind.DUPLICATE_KEY,
            detail="the event repeats a key in an object: which value was meant is unknown",
            key=key(0),
            fails_call=True,
        )
        in events
    )


# -- reasoning --------------------------------------------------------------------------------


def test_thinking_and_signature_kept_byte_for_byte() -> None:
    # thinking_then_tool_use_empty_input.sse: an empty thinking_delta, then one signature_delta.
    events = run(
        [
            MESSAGE_START,
            block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            delta(0, "thinking_delta", thinking="Let me think\n1"),
            PING,
            delta(0, "thinking_delta", thinking=". é 🙂 done"),
            delta(0, "thinking_delta", thinking=""),
            delta(0, "signature_delta", signature="EoQD+/=="),
            stop(0),
            message_delta("end_turn"),
            MESSAGE_STOP,
        ]
    )
    data = {"type": "thinking", "thinking": "Let me think\n1. é 🙂 done", "signature": "EoQD+/=="}
    assert events == [USAGE_START, ReasoningBlock(block=0, data=data), *ended("end_turn")]


def test_redacted_thinking_kept_as_received() -> None:
    block = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"}
    events = run([MESSAGE_START, block_start(0, block), stop(0), message_delta("end_turn")])
    assert events[1] == ReasoningBlock(block=0, data=block)


# -- server tools -----------------------------------------------------------------------------


def test_server_tool_use_and_results_are_blocks_never_calls() -> None:
    use = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    result = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": [{"type": "web_search_result", "url": "https://example.com"}],
    }
    mcp = {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "ask", "server_name": "wiki"}
    mcp_result = {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False}
    events = run(
        [
            MESSAGE_START,
            block_start(0, use),
            args(0, ""),
            args(0, '{"query": "ne'),
            args(0, 'ws"}'),
            stop(0),
            block_start(1, result),
            stop(1),
            block_start(2, {**mcp, "input": {}}),
            args(2, '{"q": [1, 2]}'),
            stop(2),
            block_start(3, mcp_result),
            stop(3),
            message_delta("end_turn"),
            MESSAGE_STOP,
        ]
    )
    assert events == [
        USAGE_START,
        ServerToolBlock(block=0, data={**use, "input": {"query": "news"}}),
        ServerToolBlock(block=1, data=result),
        ServerToolBlock(block=2, data={**mcp, "input": {"q": [1, 2]}}),
        ServerToolBlock(block=3, data=mcp_result),
        *ended("end_turn"),
    ]


def test_server_tool_input_that_is_not_json_is_recorded_with_empty_input() -> None:
    use = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    adapter = AnthropicAdapter()
    events = [
        *adapter.feed(block_start(0, use)),
        *adapter.feed(args(0, '{"query": ')),
        *adapter.feed(stop(0)),
    ]
    assert events == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0: server tool input is not JSON",
        ),
        ServerToolBlock(block=0, data=use),
    ]


def test_server_tool_without_deltas_keeps_its_start_input() -> None:
    use = {"type": "server_tool_use", "id": "s", "name": "x", "input": {"a": 1}}
    adapter = AnthropicAdapter()
    assert adapter.feed(block_start(0, use)) == []
    assert adapter.feed(stop(0)) == [ServerToolBlock(block=0, data=use)]


# -- round ends -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "ending"),
    [
        ("tool_use", RoundEnd.NORMAL),
        ("end_turn", RoundEnd.NORMAL),
        ("stop_sequence", RoundEnd.NORMAL),
        ("pause_turn", RoundEnd.NORMAL),
        ("max_tokens", RoundEnd.TRUNCATED),
        ("model_context_window_exceeded", RoundEnd.TRUNCATED),
        ("refusal", RoundEnd.INTERRUPTED),
    ],
)
def test_stop_reasons(reason: str, ending: RoundEnd) -> None:
    events = run([MESSAGE_START, message_delta(reason), MESSAGE_STOP])
    assert events == [USAGE_START, *ended(reason, ending)]


def test_unknown_stop_reason_is_not_trusted() -> None:
    events = run([MESSAGE_START, message_delta("new_reason"), MESSAGE_STOP])
    assert events == [
        USAGE_START,
        END_USAGE,
        Anomaly(
            kind=AnomalyKind.UNKNOWN_EVENT,
            detail="unknown stop_reason 'new_reason'; not trusted, nothing commits",
        ),
        RoundEnded(ending=RoundEnd.INTERRUPTED, stop_reason="new_reason"),
    ]


def test_message_stop_without_stop_reason_is_interrupted() -> None:
    events = run([MESSAGE_START, MESSAGE_STOP])
    assert events == [
        USAGE_START,
        Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail="the message ended without a stop_reason"),
        RoundEnded(ending=RoundEnd.INTERRUPTED),
    ]


@pytest.mark.parametrize("block_stopped", [True, False])
def test_max_tokens_with_or_without_the_cut_blocks_stop(block_stopped: bool) -> None:
    # Anthropic may stop a cut block (pydantic-ai#3118) or not (max_tokens_truncated_tool_use.sse):
    # the stop reason decides either way.
    natives = [MESSAGE_START, tool_start(0, "toolu_1", "make_file"), args(0, '{"lines": ["a')]
    natives += [stop(0)] if block_stopped else []
    events = run([*natives, message_delta("max_tokens"), MESSAGE_STOP])
    assert events == [
        USAGE_START,
        CallOpened(key=key(0), call_id="toolu_1", name="make_file"),
        ArgsDelta(key=key(0), fragment='{"lines": ["a'),
        *([CallClosed(key=key(0))] if block_stopped else []),
        *ended("max_tokens", RoundEnd.TRUNCATED),
    ]


def test_max_tokens_without_message_stop_is_still_truncated() -> None:
    events = run(
        [MESSAGE_START, tool_start(0, "t", "n"), args(0, "{"), message_delta("max_tokens")]
    )
    assert events[-2:] == [
        END_USAGE,
        RoundEnded(ending=RoundEnd.TRUNCATED, stop_reason="max_tokens"),
    ]


@pytest.mark.parametrize(
    ("tail", "detail"),
    [
        ([], "stream ended without message_stop"),
        ([message_delta("tool_use")], "stream ended without message_stop (stop_reason 'tool_use')"),
    ],
)
def test_missing_message_stop_fails_the_stream(tail: list[dict[str, Any]], detail: str) -> None:
    natives = [MESSAGE_START, tool_start(0, "t", "n"), args(0, "{}"), stop(0), *tail]
    assert run(natives)[-1] == StreamFailed(detail=detail)


# -- errors -----------------------------------------------------------------------------------

OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_error_event_mid_stream_fails_and_ends_it() -> None:
    events = run(
        [MESSAGE_START, tool_start(0, "t", "n"), args(0, '{"a"'), OVERLOADED, args(0, "}")]
    )
    assert events == [
        USAGE_START,
        CallOpened(key=key(0), call_id="t", name="n"),
        ArgsDelta(key=key(0), fragment='{"a"'),
        StreamFailed(detail="overloaded_error: Overloaded"),
        Anomaly(
            kind=AnomalyKind.EVENT_AFTER_END,
            detail="content block 0 (tool_use): delta after the message ended",
            key=key(0),
            fails_call=True,
        ),
    ]


def test_sse_error_frame_fails_the_stream_once() -> None:
    adapter = AnthropicAdapter()
    adapter.feed(MESSAGE_START)
    frame = Frame(event="error", data=json.dumps(OVERLOADED))
    assert adapter.feed_frame(frame) == [StreamFailed(detail="overloaded_error: Overloaded")]
    assert adapter.finish() == []


def test_error_after_message_stop_is_only_recorded() -> None:
    adapter = AnthropicAdapter()
    for native in (MESSAGE_START, message_delta("end_turn"), MESSAGE_STOP):
        adapter.feed(native)
    assert adapter.feed(OVERLOADED) == [
        Anomaly(
            kind=AnomalyKind.STREAM_ERROR, detail="after message end: overloaded_error: Overloaded"
        )
    ]
    assert adapter.finish() == []


# -- protocol misbehaviour --------------------------------------------------------------------


def test_unknown_event_type_reported_once() -> None:
    adapter = AnthropicAdapter()
    anomaly = Anomaly(
        kind=AnomalyKind.UNKNOWN_EVENT, detail="unknown event type 'surprise' ignored"
    )
    assert adapter.feed({"type": "surprise"}) == [anomaly]
    assert adapter.feed({"type": "surprise", "n": 2}) == []


def test_events_after_message_stop_are_anomalies_once_per_type() -> None:
    adapter = AnthropicAdapter()
    for native in (MESSAGE_START, message_delta("end_turn"), MESSAGE_STOP):
        adapter.feed(native)
    late = Anomaly(
        kind=AnomalyKind.EVENT_AFTER_END, detail="content_block_start after the message ended"
    )
    assert adapter.feed(tool_start(0, "t", "n")) == [late]
    assert adapter.feed(tool_start(1, "u", "n")) == []
    assert adapter.feed(PING) == []


def test_fragment_for_a_block_that_never_started() -> None:
    adapter = AnthropicAdapter()
    assert adapter.feed(args(4, "{}")) == [
        Anomaly(
            kind=AnomalyKind.UNKNOWN_KEY,
            detail="content_block_delta for block 4, never started",
            fails_pending=True,
        )
    ]
    assert adapter.feed(stop(4)) == [
        Anomaly(
            kind=AnomalyKind.UNKNOWN_KEY,
            detail="content_block_stop for block 4, never started",
            fails_pending=True,
        )
    ]


def test_fragment_and_stop_after_a_calls_stop_fail_the_call() -> None:
    adapter = AnthropicAdapter()
    adapter.feed(tool_start(0, "t", "n"))
    adapter.feed(stop(0))
    assert adapter.feed(args(0, "{}")) == [
        Anomaly(
            kind=AnomalyKind.FRAGMENT_AFTER_CLOSE,
            detail="content block 0 (tool_use): delta after stop",
            key=key(0),
            fails_call=True,
        )
    ]
    assert adapter.feed(stop(0)) == [
        Anomaly(
            kind=AnomalyKind.FRAGMENT_AFTER_CLOSE,
            detail="content block 0 (tool_use): stopped twice",
            key=key(0),
            fails_call=True,
        )
    ]


def test_a_block_started_twice_is_a_lost_event() -> None:
    adapter = AnthropicAdapter()
    adapter.feed(block_start(0, {"type": "text", "text": ""}))
    assert adapter.feed(tool_start(0, "u", "m")) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0 started twice",
            fails_pending=True,
        )
    ]


def test_a_delta_of_the_wrong_kind_fails_the_call() -> None:
    adapter = AnthropicAdapter()
    adapter.feed(tool_start(0, "t", "n"))
    assert adapter.feed(text(0, "hi")) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0 (tool_use): bad text_delta",
            key=key(0),
            fails_call=True,
        )
    ]
    assert adapter.feed(delta(0, "input_json_delta")) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0 (tool_use): bad input_json_delta",
            key=key(0),
            fails_call=True,
        )
    ]


def test_unknown_delta_type_is_reported_once() -> None:
    adapter = AnthropicAdapter()
    adapter.feed(block_start(0, {"type": "text", "text": ""}))
    anomaly = Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail="unknown delta 'sparkle_delta'")
    assert adapter.feed(delta(0, "sparkle_delta", x=1)) == [anomaly]
    assert adapter.feed(delta(0, "sparkle_delta", x=2)) == []


def test_unknown_block_type_is_reported_once_and_dropped() -> None:
    adapter = AnthropicAdapter()
    anomaly = Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail="unknown content block 'hologram'")
    assert adapter.feed(block_start(0, {"type": "hologram"})) == [anomaly]
    assert adapter.feed(block_start(1, {"type": "hologram"})) == []
    assert adapter.feed(delta(0, "hologram_delta", x=1)) == []
    assert adapter.feed(stop(0)) == []


def test_citations_delta_is_accepted_and_not_kept() -> None:
    # server_web_search_with_citations.sse: text blocks carry citations_delta events.
    adapter = AnthropicAdapter()
    adapter.feed(block_start(0, {"citations": [], "type": "text", "text": ""}))
    assert adapter.feed(delta(0, "citations_delta", citation={"type": "x"})) == []
    assert adapter.feed(text(0, "cited")) == [TextDelta(text="cited", block=0)]


def test_text_already_in_the_block_start_is_forwarded() -> None:
    start = block_start(0, {"type": "text", "text": "Hi"})
    assert AnthropicAdapter().feed(start) == [TextDelta(text="Hi", block=0)]


def test_malformed_envelopes_are_anomalies() -> None:
    adapter = AnthropicAdapter()
    assert adapter.feed({"type": "content_block_start", "index": "0"}) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content_block_start without an integer index and a content_block",
            fails_pending=True,
        )
    ]
    assert adapter.feed({"type": "message_start"}) == [
        Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail="message_start without a message object")
    ]
    assert adapter.feed({"no": "type"}) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="an event without a readable type (None)",
            fails_pending=True,
        )
    ]


def test_message_identity_is_kept() -> None:
    adapter = AnthropicAdapter()
    adapter.feed(MESSAGE_START)
    assert (adapter.message_id, adapter.model) == ("msg_1", "claude-test")


def test_sdk_objects_are_duck_typed() -> None:
    class SdkEvent:
        def __init__(self, data: dict[str, Any]) -> None:
            self.data = data

        def to_dict(self, mode: str = "python", exclude_unset: bool = False) -> dict[str, Any]:
            return self.data

    adapter = AnthropicAdapter()
    assert adapter.feed(SdkEvent(tool_start(0, "t", "n"))) == [
        CallOpened(key=key(0), call_id="t", name="n")
    ]


def test_feed_after_finish_raises() -> None:
    """Every entry point refuses a finished adapter, naming itself; a fragment of a call that
    was open at the end is refused too (the fast check must not answer first)."""
    adapter = AnthropicAdapter()
    adapter.feed(tool_start(0, "t", "n"))
    adapter.finish()
    fragment = delta(0, "input_json_delta", partial_json="{}")
    calls = [
        ("feed", lambda: adapter.feed(PING)),
        ("feed_frame", lambda: adapter.feed_frame(Frame(event="ping", data=json.dumps(PING)))),
        ("feed_decoded", lambda: adapter.feed_decoded(PING)),
        ("feed_decoded", lambda: adapter.feed_decoded(fragment)),
    ]
    for method, call in calls:
        with pytest.raises(UsageError, match=rf"AnthropicAdapter\.{method}\(\) called after"):
            call()


# -- properties -------------------------------------------------------------------------------

TRANSCRIPT = [
    MESSAGE_START,
    block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, "thinking_delta", thinking="hmm"),
    delta(0, "signature_delta", signature="sig"),
    stop(0),
    block_start(1, {"type": "text", "text": ""}),
    text(1, "Calling."),
    stop(1),
    tool_start(2, "toolu_1", "f"),
    args(2, ""),
    args(2, '{"a": 1}'),
    stop(2),
    message_delta("tool_use"),
    MESSAGE_STOP,
]


@given(st.lists(st.integers(0, len(TRANSCRIPT)), max_size=20))
def test_pings_anywhere_change_nothing(positions: list[int]) -> None:
    natives = list(TRANSCRIPT)
    for position in sorted(positions, reverse=True):
        natives.insert(position, PING)
    assert run(natives) == run(TRANSCRIPT)


def test_frames_and_dicts_give_the_same_events() -> None:
    adapter = AnthropicAdapter()
    events: list[StreamEvent] = []
    for native in TRANSCRIPT:
        # Anthropic pads its JSON with spaces (parallel_empty_input_padded.sse).
        events += adapter.feed_frame(Frame(event=native["type"], data=json.dumps(native) + "   "))
    assert events + adapter.finish() == run(TRANSCRIPT)


_GeneralOnly = general_only(AnthropicAdapter)


_INDEXES = st.sampled_from([0, 1, 2, True, 1.0, "0", None])
_NEAR_FRAGMENTS = st.sampled_from(
    [
        args(0, ""),
        args(0, '{"a"'),
        args(1, "x"),
        delta(0, "input_json_delta", partial_json=5),
        delta(0, "input_json_delta"),
        delta(0, "text_delta", partial_json="x"),
        {"type": "content_block_delta", "index": 0, "delta": "x"},
        {"type": "content_block_delta", "index": 0},
        {"index": 0, "delta": {"type": "input_json_delta", "partial_json": "x"}},  # SSE name
    ]
)
_ANTHROPIC_EVENTS = st.one_of(
    st.sampled_from(
        [
            MESSAGE_START,
            PING,
            tool_start(0, "toolu_0", "f"),
            tool_start(1, "toolu_1", "g"),
            block_start(1, {"type": "text", "text": ""}),
            block_start(2, {"type": "server_tool_use", "id": "srv", "name": "web_search"}),
            block_start(2, {"type": "thinking", "thinking": "", "signature": ""}),
            text(1, "hi"),
            stop(0),
            stop(1),
            stop(2),
            message_delta("tool_use"),
            MESSAGE_STOP,
            {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
        ]
    ),
    _NEAR_FRAGMENTS,
    st.builds(args, _INDEXES, st.sampled_from(["", "{", "é"])),
)


@settings(max_examples=300)
@given(st.lists(_ANTHROPIC_EVENTS, max_size=12))
def test_fast_path_gives_what_the_general_path_gives(natives: list[dict[str, Any]]) -> None:
    """Frame by frame, the same events (same reprs: an index of True is not the key of
    block 1) as the general path, for every event the fast path takes and its near misses:
    other indexes, wrong or missing fields, stopped or unknown blocks, after message_stop."""
    fast, general = AnthropicAdapter(), _GeneralOnly()
    for native in [MESSAGE_START, tool_start(0, "toolu_0", "f"), *natives]:
        frame = Frame(event=native.get("type", "content_block_delta"), data=json.dumps(native))
        assert repr(fast.feed_frame(frame)) == repr(general.feed_frame(frame))
    assert fast.finish() == general.finish()


_Counting = counting(AnthropicAdapter)


def test_fast_path_takes_every_argument_fragment() -> None:
    adapter = _Counting()
    events: list[StreamEvent] = []
    for native in TRANSCRIPT:
        events += adapter.feed_frame(Frame(event=native["type"], data=json.dumps(native)))
    assert adapter.general == len(TRANSCRIPT) - 2  # all but the two input_json_deltas
    assert events + adapter.finish() == run(TRANSCRIPT)


# -- recorded corpus --------------------------------------------------------------------------


def corpus() -> Path:
    if not FIXTURES.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared corpus missing at {FIXTURES}")
        pytest.skip("shared corpus not present")
    return FIXTURES


def sse_frames(raw: str) -> list[Frame]:
    """Minimal SSE framing for the recorded files (event:/data: lines, blank-line separated)."""
    frames = []
    for chunk in raw.replace("\r\n", "\n").split("\n\n"):
        event, data = "message", []
        for line in chunk.split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        if data:
            frames.append(Frame(event=event, data="\n".join(data)))
    return frames


def replay(path: Path) -> list[StreamEvent]:
    adapter = AnthropicAdapter()
    events: list[StreamEvent] = []
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".sse":
        for frame in sse_frames(raw):
            events += adapter.feed_frame(frame)
    else:
        for line in raw.splitlines():
            if line.strip():
                events += adapter.feed(json.loads(line))
    return events + adapter.finish()


def fold(events: list[StreamEvent]) -> list[dict[str, Any]]:
    """Calls and server tool uses in block order, as ``expected.json`` lists them."""
    ending = next(e.ending for e in events if isinstance(e, RoundEnded))
    found: dict[Any, dict[str, Any]] = {}
    text: dict[Any, list[str]] = {}
    closed = set()
    for event in events:
        match event:
            case CallOpened(key=k, call_id=call_id, name=name):
                found[k.part] = {"id": call_id, "name": name}
                text[k.part] = []
            case ArgsDelta(key=k, fragment=fragment):
                text[k.part].append(fragment)
            case CallClosed(key=k):
                closed.add(k.part)
            case ServerToolBlock(block=index, data=data) if "input" in data:
                found[index] = {
                    "id": data["id"],
                    "name": data["name"],
                    "arguments": data["input"],
                    "kind": data["type"],
                }
    for part, joined in text.items():
        complete = part in closed and ending is RoundEnd.NORMAL
        found[part]["arguments"] = json.loads("".join(joined) or "{}") if complete else None
    return [found[part] for part in sorted(found)]


def anthropic_files() -> list[str]:
    if not FIXTURES.is_dir():
        return ["<missing>"]
    return sorted(p.name for p in (FIXTURES / "anthropic").iterdir())


@pytest.mark.corpus
@pytest.mark.parametrize("name", anthropic_files())
def test_recorded_stream_matches_expected(name: str) -> None:
    root = corpus()
    expected = json.loads((root / "expected.json").read_text(encoding="utf-8"))
    events = replay(root / "anthropic" / name)
    assert not [e for e in events if isinstance(e, (Anomaly, StreamFailed))]
    assert fold(events) == expected[f"anthropic/{name}"]["calls"]


@pytest.mark.corpus
def test_recorded_truncation_ends_truncated_without_closing_the_call() -> None:
    events = replay(corpus() / "anthropic" / "max_tokens_truncated_tool_use.sse")
    assert events[-1] == RoundEnded(ending=RoundEnd.TRUNCATED, stop_reason="max_tokens")
    assert not [e for e in events if isinstance(e, CallClosed)]


@pytest.mark.corpus
def test_recorded_thinking_signature_is_exact() -> None:
    root = corpus()
    raw = (root / "anthropic" / "thinking_then_mcp_tool_use.sse").read_text(encoding="utf-8")
    signature = "".join(
        json.loads(f.data)["delta"]["signature"]
        for f in sse_frames(raw)
        if '"signature_delta"' in f.data
    )
    (block,) = [
        e
        for e in replay(root / "anthropic" / "thinking_then_mcp_tool_use.sse")
        if isinstance(e, ReasoningBlock)
    ]
    assert block.data["signature"] == signature
    assert block.data["thinking"].startswith("The user is asking about the pydantic/pydantic-ai")


# -- issue 11: no exception on any input -------------------------------------------------------

_HOSTILE: list[Any] = [None, True, 1.5, 2**70, -1, "x", "\ud800", [], [1], {}, {"a": [1]}, {1: 2}]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if not isinstance(value, dict):
        return [path]
    return [path, *(p for k, v in value.items() for p in _paths(v, (*path, k)))]


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    return {**value, path[0]: _replaced(value[path[0]], path[1:], new)}


def test_a_wrong_type_anywhere_in_any_event_raises_nothing() -> None:
    """Every field of every event of a transcript (at every depth) set to each hostile value,
    fed as a dict after the transcript's other events: only stream events come out."""
    for i, event in enumerate(TRANSCRIPT):
        for path in _paths(event):
            for new in _HOSTILE:
                adapter = AnthropicAdapter()
                for other in TRANSCRIPT[:i]:
                    adapter.feed(other)
                adapter.feed(_replaced(event, path, new))
                for other in TRANSCRIPT[i + 1 :]:
                    adapter.feed(other)
                adapter.finish()
