"""OpenAIResponsesAdapter: hand-written transcripts per rule, then the recorded corpus."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapter_doubles import counting, general_only
from toollatch import CallState, ErrorCode, Round, RoundEnd, StreamParser, UsageError
from toollatch.stages import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallClosed,
    CallIdentified,
    CallKey,
    CallOpened,
    CallSettled,
    Frame,
    OpenAIResponsesAdapter,
    ReasoningBlock,
    RoundEnded,
    ServerToolBlock,
    SSEDecoder,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
    error_results,
)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"


def run(native: Iterable[Mapping[str, Any]], *, finish: bool = True) -> list[StreamEvent]:
    adapter = OpenAIResponsesAdapter()
    events: list[StreamEvent] = []
    for event in native:
        events += adapter.feed(event)
    if finish:
        events += adapter.finish()
    return events


def key(part: int | str) -> CallKey:
    return CallKey(0, 0, part)


def fc_item(item_id: str | None, call_id: str, name: str, arguments: str = "", **extra: Any):
    item: dict[str, Any] = {"type": "function_call", "call_id": call_id, "name": name}
    if item_id is not None:
        item["id"] = item_id
    return {**item, "arguments": arguments, "status": "in_progress", **extra}


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    item = {**item, "status": "completed"}
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def delta(item_id: str | None, index: int, text: str) -> dict[str, Any]:
    event = {"type": "response.function_call_arguments.delta", "output_index": index}
    return {**event, "delta": text} | ({"item_id": item_id} if item_id else {})


def args_done(item_id: str | None, index: int, text: str) -> dict[str, Any]:
    event = {"type": "response.function_call_arguments.done", "output_index": index}
    return {**event, "arguments": text} | ({"item_id": item_id} if item_id else {})


USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
COMPLETED = {"type": "response.completed", "response": {"status": "completed", "usage": USAGE}}
NORMAL_END = [
    UsageReported(usage=USAGE),
    RoundEnded(ending=RoundEnd.NORMAL, stop_reason="completed"),
]


# -- function calls ------------------------------------------------------------------------


def test_single_call_streamed_then_closed_once() -> None:
    item = fc_item("fc_1", "call_1", "get_weather")
    events = run(
        [
            {"type": "response.created", "response": {"status": "in_progress"}},
            added(0, item),
            delta("fc_1", 0, '{"city":'),
            delta("fc_1", 0, '"Paris"}'),
            args_done("fc_1", 0, '{"city":"Paris"}'),
            done(0, {**item, "arguments": '{"city":"Paris"}'}),
            COMPLETED,
        ]
    )
    assert events == [
        CallOpened(key=key("fc_1"), call_id="call_1", name="get_weather"),
        ArgsDelta(key=key("fc_1"), fragment='{"city":'),
        ArgsDelta(key=key("fc_1"), fragment='"Paris"}'),
        CallClosed(key=key("fc_1"), arguments='{"city":"Paris"}'),
        CallSettled(key=key("fc_1")),  # its item done, completed
        *NORMAL_END,
    ]


def test_interleaved_deltas_of_two_items_are_keyed_by_item_id() -> None:
    # microsoft/agent-framework#8337: fragments of parallel calls interleave.
    a, b = fc_item("fc_a", "call_a", "search"), fc_item("fc_b", "call_b", "search")
    events = run(
        [
            added(0, a),
            added(1, b),
            delta("fc_a", 0, '{"q":'),
            delta("fc_b", 1, '{"q":'),
            delta("fc_b", 1, '"B"}'),
            delta("fc_a", 0, '"A"}'),
            args_done("fc_b", 1, '{"q":"B"}'),
            args_done("fc_a", 0, '{"q":"A"}'),
            done(0, {**a, "arguments": '{"q":"A"}'}),
            done(1, {**b, "arguments": '{"q":"B"}'}),
            COMPLETED,
        ]
    )
    assert events == [
        CallOpened(key=key("fc_a"), call_id="call_a", name="search"),
        CallOpened(key=key("fc_b"), call_id="call_b", name="search"),
        ArgsDelta(key=key("fc_a"), fragment='{"q":'),
        ArgsDelta(key=key("fc_b"), fragment='{"q":'),
        ArgsDelta(key=key("fc_b"), fragment='"B"}'),
        ArgsDelta(key=key("fc_a"), fragment='"A"}'),
        CallClosed(key=key("fc_b"), arguments='{"q":"B"}'),
        CallClosed(key=key("fc_a"), arguments='{"q":"A"}'),
        CallSettled(key=key("fc_a")),  # each item done, completed, in turn
        CallSettled(key=key("fc_b")),
        *NORMAL_END,
    ]


def test_done_only_without_deltas_lm_studio() -> None:
    # compat_lmstudio/responses_no_argument_deltas.jsonl: no argument deltas at all.
    item = fc_item("fc_z", "call_2025306790300011", "weather")
    text = '{"location":"San Francisco"}'
    events = run([added(2, item), args_done("fc_z", 2, text), done(2, {**item, "arguments": text})])
    assert events[:2] == [
        CallOpened(key=key("fc_z"), call_id="call_2025306790300011", name="weather"),
        CallClosed(key=key("fc_z"), arguments=text),
    ]


def test_done_text_that_disagrees_is_passed_on_for_the_assembler() -> None:
    item = fc_item("fc_1", "call_1", "f")
    events = run([added(0, item), delta("fc_1", 0, '{"a":1}'), args_done("fc_1", 0, '{"a":2}')])
    assert events[2] == CallClosed(key=key("fc_1"), arguments='{"a":2}')


def test_item_done_closes_when_arguments_done_never_came() -> None:
    item = fc_item("fc_1", "call_1", "f")
    events = run([added(0, item), delta("fc_1", 0, "{}"), done(0, {**item, "arguments": "{}"})])
    assert events[2] == CallClosed(key=key("fc_1"), arguments="{}")


def test_incomplete_item_fails_truncated_and_the_round_is_truncated() -> None:
    item = fc_item("fc_1", "call_1", "write", '{"text":"abc', status="incomplete")
    response = {"incomplete_details": {"reason": "max_output_tokens"}}
    events = run(
        [
            added(0, fc_item("fc_1", "call_1", "write")),
            delta("fc_1", 0, '{"text":"abc'),
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.incomplete", "response": response},
        ]
    )
    assert events == [
        CallOpened(key=key("fc_1"), call_id="call_1", name="write"),
        ArgsDelta(key=key("fc_1"), fragment='{"text":"abc'),
        Anomaly(
            kind=AnomalyKind.INCOMPLETE_ITEM,
            detail="the provider marked the function_call item incomplete",
            key=key("fc_1"),
            fails_call=True,
            code=ErrorCode.TRUNCATED,
        ),
        RoundEnded(ending=RoundEnd.TRUNCATED, stop_reason="max_output_tokens"),
    ]


def test_whole_call_only_at_item_done_is_opened_and_closed() -> None:
    item = fc_item("fc_1", "call_1", "f", "{}")
    events = run([done(0, item), COMPLETED])
    assert events == [
        CallOpened(key=key("fc_1"), call_id="call_1", name="f"),
        CallClosed(key=key("fc_1"), arguments="{}"),
        CallSettled(key=key("fc_1")),  # its item done, completed
        *NORMAL_END,
    ]


def test_arguments_already_in_the_added_item() -> None:
    item = fc_item("fc_1", "call_1", "f", '{"a":')
    events = run([added(0, item), delta("fc_1", 0, "1}")], finish=False)
    assert events == [
        CallOpened(key=key("fc_1"), call_id="call_1", name="f"),
        ArgsDelta(key=key("fc_1"), fragment='{"a":'),
        ArgsDelta(key=key("fc_1"), fragment="1}"),
    ]


def test_missing_item_id_falls_back_to_output_index() -> None:
    item = fc_item(None, "call_1", "f")
    events = run([added(3, item), delta(None, 3, "{}"), args_done(None, 3, "{}")], finish=False)
    assert events == [
        CallOpened(key=key(3), call_id="call_1", name="f"),
        ArgsDelta(key=key(3), fragment="{}"),
        CallClosed(key=key(3), arguments="{}"),
    ]


def test_delta_without_item_id_is_routed_by_output_index() -> None:
    item = fc_item("fc_1", "call_1", "f")
    events = run([added(0, item), delta(None, 0, "{}")], finish=False)
    assert events[1] == ArgsDelta(key=key("fc_1"), fragment="{}")


def test_repeated_added_item_identifies_instead_of_reopening() -> None:
    item = fc_item("fc_1", "call_1", "f")
    events = run([added(0, item), added(0, item)], finish=False)
    assert events[1] == CallIdentified(key=key("fc_1"), call_id="call_1", name="f")


def test_object_arguments_are_serialized_once_with_an_anomaly() -> None:
    item = fc_item("fc_1", "call_1", "f")
    events = run([added(0, item), args_done("fc_1", 0, {"b": 1, "a": "é"})], finish=False)  # type: ignore[arg-type]
    assert events[1] == CallClosed(key=key("fc_1"), arguments='{"b":1,"a":"é"}')
    assert isinstance(events[2], Anomaly)
    assert events[2].kind is AnomalyKind.OBJECT_ARGUMENTS


def test_unserializable_object_arguments_fail_the_call() -> None:
    item = fc_item("fc_1", "call_1", "f")
    bad = {"x": float("nan")}
    events = run([added(0, item), args_done("fc_1", 0, bad)], finish=False)  # type: ignore[arg-type]
    assert events[1] == CallClosed(key=key("fc_1"), arguments=None)
    assert isinstance(events[2], Anomaly)
    assert events[2].fails_call


# -- text, reasoning, hosted tools ---------------------------------------------------------


def test_text_deltas_carry_the_output_index_as_block() -> None:
    events = run(
        [
            added(1, {"type": "message", "id": "msg_1", "role": "assistant", "content": []}),
            {"type": "response.content_part.added", "output_index": 1, "item_id": "msg_1"},
            {"type": "response.output_text.delta", "output_index": 1, "delta": "Hel"},
            {"type": "response.output_text.delta", "output_index": 1, "delta": "lo"},
            {"type": "response.output_text.done", "output_index": 1, "text": "Hello"},
            done(1, {"type": "message", "id": "msg_1", "content": []}),
        ],
        finish=False,
    )
    assert events == [TextDelta(text="Hel", block=1), TextDelta(text="lo", block=1)]


def test_reasoning_item_is_kept_whole_from_item_done() -> None:
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA..."}
    events = run(
        [
            added(0, {**item, "encrypted_content": None}),
            {"type": "response.reasoning_summary_part.added", "output_index": 0},
            {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "x"},
            {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "y"},
            done(0, item),
        ],
        finish=False,
    )
    assert events == [ReasoningBlock(block=0, data={**item, "status": "completed"})]


@pytest.mark.parametrize(
    "item_type",
    ["web_search_call", "tool_search_call", "tool_search_output", "file_search_call", "mcp_call"],
)
def test_hosted_tool_items_are_server_blocks_never_calls(item_type: str) -> None:
    item = {"type": item_type, "id": "x_1", "arguments": {"paths": ["f"]}, "call_id": None}
    phases = ("in_progress", "searching", "completed") if item_type.endswith("_call") else ()
    progress = [{"type": f"response.{item_type}.{p}", "output_index": 0} for p in phases]
    events = run([added(0, item), *progress, done(0, item), COMPLETED])
    assert events == [ServerToolBlock(block=0, data={**item, "status": "completed"}), *NORMAL_END]


def test_client_executed_custom_tool_item_is_recorded_with_an_anomaly() -> None:
    item = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "input": "ls"}
    events = run([added(0, item), done(0, item)], finish=False)
    assert events[0] == ServerToolBlock(block=0, data={**item, "status": "completed"})
    assert isinstance(events[1], Anomaly)
    assert events[1].kind is AnomalyKind.UNKNOWN_EVENT


# -- round end -----------------------------------------------------------------------------


def test_completed_without_usage_ends_normally() -> None:
    events = run([{"type": "response.completed", "response": {"usage": None}}])
    assert events == [RoundEnded(ending=RoundEnd.NORMAL, stop_reason="completed")]


@pytest.mark.parametrize(
    ("details", "ending", "reason"),
    [
        ({"reason": "max_output_tokens"}, RoundEnd.TRUNCATED, "max_output_tokens"),
        ({"reason": "content_filter"}, RoundEnd.INTERRUPTED, "content_filter"),
        (None, RoundEnd.TRUNCATED, "incomplete"),
    ],
)
def test_incomplete(details: object, ending: RoundEnd, reason: str) -> None:
    response = {"status": "incomplete", "incomplete_details": details, "usage": USAGE}
    events = run([{"type": "response.incomplete", "response": response}])
    assert events == [UsageReported(usage=USAGE), RoundEnded(ending=ending, stop_reason=reason)]


def test_failed_is_a_stream_failure_with_the_provider_message() -> None:
    error = {"code": "server_error", "message": "The model failed."}
    response = {"status": "failed", "error": error, "usage": None}
    events = run([{"type": "response.failed", "response": response}])
    assert events == [StreamFailed(detail="server_error: The model failed.")]


def test_failed_without_error_object() -> None:
    events = run([{"type": "response.failed", "response": {"error": None}}])
    assert events == [StreamFailed(detail="response.failed")]


def test_error_event_ends_the_stream() -> None:
    error = {"type": "error", "code": "rate_limit_exceeded", "message": "Slow down", "param": None}
    events = run([error])
    assert events == [StreamFailed(detail="rate_limit_exceeded: Slow down")]


def test_error_event_with_nested_error_object() -> None:
    events = run([{"type": "error", "error": {"type": "invalid_request_error", "message": "m"}}])
    assert events == [StreamFailed(detail="invalid_request_error: m")]


def test_sse_error_frame_ends_the_stream_once() -> None:
    adapter = OpenAIResponsesAdapter()
    data = '{"type":"error","code":"server_error","message":"boom"}'
    events = adapter.feed_frame(Frame(event="error", data=data))
    assert len(events) == 1
    assert isinstance(events[0], StreamFailed)
    assert adapter.finish() == []


def test_no_terminal_event_is_a_stream_failure() -> None:
    item = fc_item("fc_1", "call_1", "f")
    events = run([added(0, item), delta("fc_1", 0, "{}"), args_done("fc_1", 0, "{}")])
    assert events[-1] == StreamFailed(detail="stream ended without a terminal response event")


def test_events_after_the_terminal_event_are_anomalies_and_terminals_go_on() -> None:
    # A second terminal event goes on to the assembler, whose sticky rule decides.
    events = run([COMPLETED, {"type": "response.output_text.delta", "delta": "x"}, COMPLETED])
    assert events == [
        *NORMAL_END,
        Anomaly(
            kind=AnomalyKind.EVENT_AFTER_END,
            detail="response.output_text.delta after the terminal event; ignored",
        ),
        RoundEnded(ending=RoundEnd.NORMAL, stop_reason="completed"),
    ]


# -- event types ---------------------------------------------------------------------------


def test_known_harmless_events_are_silent() -> None:
    harmless = [
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.done",
        "response.web_search_call.searching",
        "response.file_search_call.completed",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call.interpreting",
        "response.mcp_call_arguments.delta",
        "response.mcp_list_tools.in_progress",
        "response.image_generation_call.partial_image",
    ]
    assert run([{"type": t} for t in harmless], finish=False) == []


def test_unknown_event_type_is_reported_once_per_type() -> None:
    events = run(
        [{"type": "response.teleport.delta"}, {"type": "response.teleport.delta"}, {"type": "x"}],
        finish=False,
    )
    assert [(e.kind, "teleport" in e.detail) for e in events if isinstance(e, Anomaly)] == [
        (AnomalyKind.UNKNOWN_EVENT, True),
        (AnomalyKind.UNKNOWN_EVENT, False),
    ]
    assert len(events) == 2


def test_payload_type_wins_over_the_sse_event_name() -> None:
    adapter = OpenAIResponsesAdapter()
    data = json.dumps({"type": "response.output_text.delta", "output_index": 0, "delta": "hi"})
    assert adapter.feed_frame(Frame(event="response.completed", data=data)) == [
        TextDelta(text="hi", block=0)
    ]


def test_sse_event_name_is_used_when_the_payload_has_no_type() -> None:
    adapter = OpenAIResponsesAdapter()
    data = json.dumps({"output_index": 0, "delta": "hi"})
    frame = Frame(event="response.output_text.delta", data=data)
    assert adapter.feed_frame(frame) == [TextDelta(text="hi", block=0)]


def test_event_without_any_type_is_invalid() -> None:
    [event] = run([{"delta": "x"}], finish=False)
    assert isinstance(event, Anomaly)
    assert event.kind is AnomalyKind.INVALID_PAYLOAD


def test_feed_after_finish_is_caller_misuse() -> None:
    adapter = OpenAIResponsesAdapter()
    adapter.finish()
    with pytest.raises(UsageError):
        adapter.feed(COMPLETED)


def test_attempt_is_part_of_the_key() -> None:
    adapter = OpenAIResponsesAdapter(attempt=2)
    [opened] = adapter.feed(added(0, fc_item("fc_1", "call_1", "f")))
    assert opened == CallOpened(key=CallKey(2, 0, "fc_1"), call_id="call_1", name="f")


# -- properties ----------------------------------------------------------------------------


def _pieces(text: str) -> st.SearchStrategy[list[str]]:
    cuts = st.lists(st.integers(0, len(text)), max_size=6).map(sorted)
    return cuts.map(lambda c: [text[i:j] for i, j in zip([0, *c], [*c, len(text)], strict=True)])


@given(st.data())
def test_any_interleaving_of_two_calls_folds_to_both_texts(data: st.DataObject) -> None:
    texts = {"fc_a": '{"path":"a/ü.txt","n":1}', "fc_b": '{"q":"🙂 b","deep":{"x":[1,2]}}'}
    queues = {item_id: data.draw(_pieces(text)) for item_id, text in texts.items()}
    native: list[dict[str, Any]] = [
        added(i, fc_item(item_id, f"call_{item_id}", "f")) for i, item_id in enumerate(texts)
    ]
    while any(queues.values()):
        item_id = data.draw(st.sampled_from([k for k, q in queues.items() if q]))
        native.append(delta(item_id, list(texts).index(item_id), queues[item_id].pop(0)))
    native += [args_done(k, i, t) for i, (k, t) in enumerate(texts.items())]
    calls = fold(run([*native, COMPLETED]))
    assert [c["raw"] for c in calls] == list(texts.values())


_GeneralOnly = general_only(OpenAIResponsesAdapter)


_DELTA = "response.function_call_arguments.delta"
_RESPONSES_EVENTS = st.one_of(
    st.sampled_from(
        [
            added(0, fc_item("fc_1", "call_1", "f")),
            added(1, fc_item(None, "call_2", "g")),  # keyed by its output index
            added(2, {"type": "message", "id": "msg_1"}),
            args_done("fc_1", 0, '{"a":1}'),
            done(0, fc_item("fc_1", "call_1", "f", '{"a":1}')),
            done(3, fc_item("fc_3", "call_3", "h", "{}")),  # opened at its done
            {"type": "response.output_text.delta", "output_index": 2, "delta": "hi"},
            COMPLETED,
            {"type": "error", "code": "server_error", "message": "boom"},
            {"item_id": "fc_1", "output_index": 0, "delta": "x"},  # type from the SSE name
            {"type": _DELTA, "item_id": "fc_1", "output_index": 0},
            {"type": _DELTA, "item_id": "fc_1", "output_index": 0, "delta": 5},
        ]
    ),
    st.builds(
        lambda item_id, index, text: (
            {"type": _DELTA, "item_id": item_id, "output_index": index}
            | ({"delta": text} if text is not None else {})
        ),
        st.sampled_from(["fc_1", "fc_3", "fc_9", "", None, 0, 1, ["fc_1"]]),
        st.sampled_from([0, 1, True, None, "0"]),
        st.sampled_from(["", "{", "é", None]),
    ),
)


@settings(max_examples=300)
@given(st.lists(_RESPONSES_EVENTS, max_size=12))
def test_fast_path_gives_what_the_general_path_gives(natives: list[dict[str, Any]]) -> None:
    """Frame by frame, the same events (same reprs) as the general path, for every delta the
    fast path takes and its near misses: unknown, empty or non-string item ids, items keyed
    by their output index, missing or non-string deltas, after the terminal event."""
    fast, general = OpenAIResponsesAdapter(), _GeneralOnly()
    for native in [added(0, fc_item("fc_1", "call_1", "f")), *natives]:
        frame = Frame(event=native.get("type", _DELTA), data=json.dumps(native))
        assert repr(fast.feed_frame(frame)) == repr(general.feed_frame(frame))
    assert fast.finish() == general.finish()


_Counting = counting(OpenAIResponsesAdapter)


def test_fast_path_takes_every_argument_fragment() -> None:
    natives = [
        added(0, fc_item("fc_1", "call_1", "f")),
        delta("fc_1", 0, '{"a"'),
        delta("fc_1", 0, ""),
        delta("fc_1", 0, ":1}"),
        args_done("fc_1", 0, '{"a":1}'),
        COMPLETED,
    ]
    adapter = _Counting()
    events: list[StreamEvent] = []
    for native in natives:
        events += adapter.feed_frame(Frame(event=native["type"], data=json.dumps(native)))
    # output_item.added, the empty delta (dropped by the general path), arguments.done, completed
    assert adapter.general == 4
    assert events + adapter.finish() == run(natives)


# -- issue 11: every path to a wrong commit, through StreamParser ------------------------

Native = Mapping[str, Any] | str
"""A native event, or its exact JSON text (for payloads a dict cannot spell)."""


def sse(natives: Iterable[Native]) -> list[bytes]:
    """One SSE event per native event (the event name is its type, when that is a string)."""
    out = []
    for native in natives:
        data = native if isinstance(native, str) else json.dumps(native, ensure_ascii=False)
        etype = None if isinstance(native, str) else native.get("type")
        head = f"event: {etype}\n" if isinstance(etype, str) and "\n" not in etype else ""
        out.append(f"{head}data: {data}\n\n".encode())
    return out


def parse(events: list[bytes], chunk: int | None) -> Round:
    """The round for these SSE events fed in ``chunk``-byte reads (None: one read per event,
    the pipeline's one-event path)."""
    parser = StreamParser("openai_responses")
    if chunk is None:
        for event in events:
            parser.feed(event)
    else:
        raw = b"".join(events)
        for i in range(0, len(raw), chunk):
            parser.feed(raw[i : i + chunk])
    return parser.finish()


CHUNKS = (None, 1, 7, 1 << 20)


def outcome(round_: Round) -> tuple[Any, ...]:
    calls = tuple((c.call_id, c.state, c.error, c.arguments_text) for c in round_.calls)
    return round_.ended, calls


def rounds(natives: Iterable[Native]) -> Round:
    """The round of a whole stream, the same at every read size; error results paired."""
    events = sse(natives)
    results = [parse(events, chunk) for chunk in CHUNKS]
    for other in results[1:]:
        assert outcome(other) == outcome(results[0])
    round_ = results[0]
    failed = [c.call_id for c in round_.calls if c.state is not CallState.COMMITTED]
    assert [r.tool_call_id for r in error_results(round_)] == failed
    assert all(r.is_error for r in error_results(round_))
    return round_


def states(round_: Round) -> list[tuple[str | None, CallState, ErrorCode | None]]:
    return [(c.call_id, c.state, c.error) for c in round_.calls]


def kinds(round_: Round) -> list[AnomalyKind]:
    return [a.kind for a in round_.anomalies]


def whole_call(item_id: str, index: int, text: str, *, name: str = "f") -> list[Native]:
    """A well-formed call: added, two deltas, arguments.done, output_item.done."""
    item = fc_item(item_id, f"call_{item_id}", name)
    cut = len(text) // 2
    return [
        added(index, item),
        delta(item_id, index, text[:cut]),
        delta(item_id, index, text[cut:]),
        args_done(item_id, index, text),
        done(index, {**item, "arguments": text}),
    ]


OK = CallState.COMMITTED, None
PV = CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION
TR = CallState.FAILED, ErrorCode.TRUNCATED
SI = CallState.FAILED, ErrorCode.STREAM_INTERRUPTED
SAFE, EVIL = '{"path":"/safe"}', '{"path":"/safe/../../etc/passwd"}'


def test_well_formed_calls_commit_at_every_read_size() -> None:
    round_ = rounds([*whole_call("fc_a", 0, SAFE), *whole_call("fc_b", 1, '{"q":1}'), COMPLETED])
    assert states(round_) == [("call_fc_a", *OK), ("call_fc_b", *OK)]
    assert round_.anomalies == ()


# 1. lost events: an event that cannot be read or matched fails every pending call


def _open_two() -> list[Native]:
    return [
        added(0, fc_item("fc_a", "call_fc_a", "f")),
        added(1, fc_item("fc_b", "call_fc_b", "f")),
    ]


def _close_two() -> list[Native]:
    return [
        args_done("fc_a", 0, SAFE),
        done(0, fc_item("fc_a", "call_fc_a", "f", SAFE)),
        args_done("fc_b", 1, "{}"),
        done(1, fc_item("fc_b", "call_fc_b", "f", "{}")),
        COMPLETED,
    ]


_DELTA_TYPE = "response.function_call_arguments.delta"
LOST_EVENTS: list[tuple[str, Native]] = [
    ("unknown item id", delta("fc_zz", 0, "/../../etc/passwd")),
    ("output_index a string", {"type": _DELTA_TYPE, "output_index": "0", "delta": "x"}),
    ("output_index a bool", {"type": _DELTA_TYPE, "output_index": True, "delta": "x"}),
    ("output_index a float", {"type": _DELTA_TYPE, "output_index": 0.0, "delta": "x"}),
    ("output_index huge", {"type": _DELTA_TYPE, "output_index": 2**80, "delta": "x"}),
    ("no item id or index", {"type": _DELTA_TYPE, "delta": "x"}),
    ("item id a list", {"type": _DELTA_TYPE, "item_id": ["fc_a"], "output_index": 0, "delta": "x"}),
    ("item id an int", {"type": _DELTA_TYPE, "item_id": 7, "output_index": 0, "delta": "x"}),
    ("no type at all", {"item_id": "fc_a", "delta": "x"}),
    ("type null", {"type": None, "item_id": "fc_a", "delta": "x"}),
    ("type a number", {"type": 5, "item_id": "fc_a", "delta": "x"}),
    ("type an object", {"type": {"t": _DELTA_TYPE}, "item_id": "fc_a", "delta": "x"}),
    ("type a list", {"type": [_DELTA_TYPE], "item_id": "fc_a", "delta": "x"}),
    ("not JSON", '{"type":"' + _DELTA_TYPE + '","item_id":"fc_a","delta":"x"'),
    # (an escaped lone surrogate, "\\ud800", is no longer lost: read with U+FFFD, issue 28)
    ("JSON array", "[1, 2]"),
    ("unknown call event", {"type": "response.function_call_arguments.append", "delta": "x"}),
    ("added, item a list", {"type": "response.output_item.added", "output_index": 2, "item": []}),
    ("added, item type a dict", added(2, {**fc_item("fc_c", "c", "f", "{"), "type": {}})),
    ("done, item type a list", done(2, {**fc_item("fc_c", "c", "f", "{}"), "type": ["x"]})),
    ("done, no item", {"type": "response.output_item.done", "output_index": 2}),
    ("call item without id or index", added(2, fc_item(None, "c", "f")) | {"output_index": None}),
    ("arguments.done for no call", args_done("fc_zz", 5, "{}")),
]


@pytest.mark.parametrize(("what", "lost"), LOST_EVENTS, ids=[w for w, _ in LOST_EVENTS])
def test_a_lost_event_while_calls_are_open_fails_every_pending_call(
    what: str, lost: Native
) -> None:
    round_ = rounds([*_open_two(), delta("fc_a", 0, SAFE), lost, *_close_two()])
    assert states(round_) == [("call_fc_a", *PV), ("call_fc_b", *PV)]
    assert any(a.fails_pending for a in round_.anomalies)


def test_a_lost_event_between_calls_fails_the_closed_ones_not_later_ones() -> None:
    # Closed but undecided calls are pending too; a call opened later is not affected.
    round_ = rounds(
        [*whole_call("fc_a", 0, SAFE), {"type": 5}, *whole_call("fc_b", 1, "{}"), COMPLETED]
    )
    assert states(round_) == [("call_fc_a", *PV), ("call_fc_b", *OK)]


def test_a_delta_that_is_not_a_string_fails_its_own_call() -> None:
    bad = {"type": _DELTA_TYPE, "item_id": "fc_a", "output_index": 0, "delta": ["/.."]}
    round_ = rounds([*_open_two(), delta("fc_a", 0, SAFE), bad, *_close_two()])
    assert states(round_) == [("call_fc_a", *PV), ("call_fc_b", *OK)]


def test_a_bool_output_index_is_not_routed_to_output_one() -> None:
    item = fc_item(None, "call_1", "f")
    bad = {"type": _DELTA_TYPE, "output_index": True, "delta": "{}"}
    round_ = rounds([added(1, item), bad, done(1, {**item, "arguments": "{}"}), COMPLETED])
    assert states(round_) == [("call_1", *PV)]


def test_an_sse_event_name_stands_in_only_for_an_absent_type() -> None:
    # A payload without "type" uses the SSE name (compatible servers); one whose type is
    # not a string cannot be read, whatever the name says.
    item = fc_item("fc_a", "call_fc_a", "f")
    name = b"event: response.function_call_arguments.delta\n"
    no_type = name + b'data: {"item_id":"fc_a","delta":"{}"}\n\n'
    wrong = name + b'data: {"type":1,"item_id":"fc_a","delta":"{}"}\n\n'
    tail = sse([args_done("fc_a", 0, "{}"), done(0, {**item, "arguments": "{}"}), COMPLETED])
    for middle, expected in ((no_type, OK), (wrong, PV)):
        events = [*sse([added(0, item)]), middle, *tail]
        assert {states(parse(events, chunk))[0][1:] for chunk in CHUNKS} == {expected}


# 2. a call never closed by its own end signal


def test_a_call_without_any_done_event_fails_at_response_completed() -> None:
    # Strict rule: only function_call_arguments.done / output_item.done close a call; the
    # item that response.completed lists (status completed, same arguments) does not.
    item = fc_item("fc_a", "call_fc_a", "f")
    listed = {**item, "arguments": SAFE, "status": "completed"}
    completed = {
        "type": "response.completed",
        "response": {"status": "completed", "output": [listed]},
    }
    round_ = rounds([added(0, item), delta("fc_a", 0, SAFE), completed])
    assert states(round_) == [("call_fc_a", *PV)]
    assert AnomalyKind.NEVER_CLOSED in kinds(round_)


def test_an_unclosed_call_fails_while_a_closed_one_commits() -> None:
    item = fc_item("fc_b", "call_fc_b", "f")
    round_ = rounds(
        [*whole_call("fc_a", 0, SAFE), added(1, item), delta("fc_b", 1, "{}"), COMPLETED]
    )
    assert states(round_) == [("call_fc_a", *OK), ("call_fc_b", *PV)]


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ({"status": "completed", "arguments": SAFE}, OK),
        ({"arguments": SAFE}, OK),
        ({"status": "incomplete", "arguments": SAFE}, TR),
        ({"status": "in_progress", "arguments": SAFE}, PV),
        ({"status": "completed", "arguments": EVIL}, PV),
        ({"status": ["completed"]}, PV),
    ],
)
def test_the_items_response_completed_lists_can_only_fail_a_call(
    listed: dict[str, Any], expected: tuple[CallState, ErrorCode | None]
) -> None:
    item = {k: v for k, v in fc_item("fc_a", "call_fc_a", "f").items() if k != "status"}
    item |= listed
    completed = {"type": "response.completed", "response": {"output": [3, {"type": []}, item]}}
    round_ = rounds([*whole_call("fc_a", 0, SAFE), completed])
    assert states(round_) == [("call_fc_a", *expected)]


# 3. an item the provider marked incomplete, or not completed


def _done_with(status: object, *, args_done_first: bool) -> list[Native]:
    item = fc_item("fc_a", "call_fc_a", "f")
    closed = {
        "type": "response.output_item.done",
        "output_index": 0,
        "item": {**item, "arguments": SAFE, "status": status},
    }
    first = [args_done("fc_a", 0, SAFE)] if args_done_first else []
    return [added(0, item), delta("fc_a", 0, SAFE), *first, closed]


@pytest.mark.parametrize("args_done_first", [False, True])
def test_an_incomplete_item_fails_truncated_even_when_completed_follows(
    args_done_first: bool,
) -> None:
    round_ = rounds(
        [
            *_done_with("incomplete", args_done_first=args_done_first),
            *whole_call("fc_b", 1, "{}"),
            COMPLETED,
        ]
    )
    assert round_.ended is RoundEnd.NORMAL
    assert states(round_) == [("call_fc_a", *TR), ("call_fc_b", *OK)]


@pytest.mark.parametrize("status", ["in_progress", "failed", "", "COMPLETED", 1, ["completed"], {}])
def test_an_item_done_with_another_status_than_completed_fails(status: object) -> None:
    round_ = rounds([*_done_with(status, args_done_first=True), COMPLETED])
    assert states(round_) == [("call_fc_a", *PV)]


@pytest.mark.parametrize("status", [None, "completed"])
def test_an_item_done_with_status_completed_or_none_commits(status: object) -> None:
    round_ = rounds([*_done_with(status, args_done_first=False), COMPLETED])
    assert states(round_) == [("call_fc_a", *OK)]


# 4. a truncating or failing terminal reason sticks, whatever the order

INCOMPLETE = {
    "type": "response.incomplete",
    "response": {"incomplete_details": {"reason": "max_output_tokens"}},
}
FAILED = {
    "type": "response.failed",
    "response": {"error": {"code": "server_error", "message": "x"}},
}
ERROR = {"type": "error", "code": "server_error", "message": "boom"}


@pytest.mark.parametrize(
    ("terminals", "ending", "code"),
    [
        ([INCOMPLETE, COMPLETED], RoundEnd.TRUNCATED, ErrorCode.TRUNCATED),
        ([COMPLETED, INCOMPLETE], RoundEnd.TRUNCATED, ErrorCode.TRUNCATED),
        ([FAILED, COMPLETED], RoundEnd.INTERRUPTED, ErrorCode.STREAM_INTERRUPTED),
        ([COMPLETED, FAILED], RoundEnd.INTERRUPTED, ErrorCode.STREAM_INTERRUPTED),
        ([COMPLETED, ERROR], RoundEnd.INTERRUPTED, ErrorCode.STREAM_INTERRUPTED),
        ([ERROR, COMPLETED], RoundEnd.INTERRUPTED, ErrorCode.STREAM_INTERRUPTED),
        ([COMPLETED, COMPLETED], RoundEnd.NORMAL, None),
    ],
)
def test_a_truncating_or_failing_reason_sticks(
    terminals: list[Native], ending: RoundEnd, code: ErrorCode | None
) -> None:
    round_ = rounds([*whole_call("fc_a", 0, SAFE), *terminals])
    assert round_.ended is ending
    state = CallState.COMMITTED if code is None else CallState.FAILED
    assert states(round_) == [("call_fc_a", state, code)]


def test_an_sse_error_frame_after_completed_sticks() -> None:
    events = [*sse([*whole_call("fc_a", 0, SAFE), COMPLETED]), b"event: error\ndata: {}\n\n"]
    assert {states(parse(events, chunk))[0][1:] for chunk in CHUNKS} == {SI}


@pytest.mark.parametrize(
    ("status", "ending"),
    [
        ("incomplete", RoundEnd.TRUNCATED),
        ("failed", RoundEnd.INTERRUPTED),
        ("in_progress", RoundEnd.INTERRUPTED),
        (3, RoundEnd.INTERRUPTED),
    ],
)
def test_response_completed_with_another_status_is_not_normal(
    status: object, ending: RoundEnd
) -> None:
    completed = {"type": "response.completed", "response": {"status": status}}
    round_ = rounds([*whole_call("fc_a", 0, SAFE), completed])
    assert round_.ended is ending
    assert states(round_)[0][1] is CallState.FAILED


# 5. a fragment after its call's end, or after the round's


def test_a_delta_after_arguments_done_fails_the_call() -> None:
    item = fc_item("fc_a", "call_fc_a", "f")
    round_ = rounds(
        [
            added(0, item),
            delta("fc_a", 0, SAFE),
            args_done("fc_a", 0, SAFE),
            delta("fc_a", 0, "/../../etc/passwd"),
            done(0, {**item, "arguments": SAFE}),
            COMPLETED,
        ]
    )
    assert states(round_) == [("call_fc_a", *PV)]
    assert AnomalyKind.FRAGMENT_AFTER_CLOSE in kinds(round_)


@pytest.mark.parametrize(
    "late",
    [
        delta("fc_a", 0, "x"),
        delta(None, 0, "x"),
        args_done("fc_a", 0, EVIL),
        done(0, fc_item("fc_a", "call_fc_a", "f", EVIL)),
        added(0, fc_item("fc_a", "call_fc_a", "f", "x")),
    ],
)
def test_a_call_event_after_response_completed_fails_the_call(late: Native) -> None:
    round_ = rounds([*whole_call("fc_a", 0, SAFE), *whole_call("fc_b", 1, "{}"), COMPLETED, late])
    assert states(round_) == [("call_fc_a", *PV), ("call_fc_b", *OK)]
    assert AnomalyKind.EVENT_AFTER_END in kinds(round_)


@pytest.mark.parametrize(
    "late",
    [
        delta("fc_zz", 0, "x"),
        {"type": _DELTA_TYPE, "delta": "x"},
        added(5, fc_item("fc_z", "z", "f")),
        {"type": "response.output_item.done", "item": 3},
    ],
)
def test_a_call_event_after_the_end_that_names_no_call_fails_them_all(late: Native) -> None:
    round_ = rounds([*whole_call("fc_a", 0, SAFE), *whole_call("fc_b", 1, "{}"), COMPLETED, late])
    assert states(round_) == [("call_fc_a", *PV), ("call_fc_b", *PV)]


def test_text_and_hosted_items_after_the_end_are_only_recorded() -> None:
    late = [
        {"type": "response.output_text.delta", "delta": "x"},
        done(4, {"type": "web_search_call", "id": "ws_1"}),
    ]
    round_ = rounds([*whole_call("fc_a", 0, SAFE), COMPLETED, *late])
    assert states(round_) == [("call_fc_a", *OK)]


def test_the_two_done_texts_must_agree() -> None:
    item = fc_item("fc_a", "call_fc_a", "f")
    round_ = rounds(
        [
            added(0, item),
            args_done("fc_a", 0, SAFE),
            done(0, {**item, "arguments": EVIL}),
            COMPLETED,
        ]
    )
    assert states(round_) == [("call_fc_a", *PV)]
    assert AnomalyKind.ARGUMENTS_MISMATCH in kinds(round_)


def test_arguments_done_without_text_leaves_the_close_to_the_item() -> None:
    item = fc_item("fc_a", "call_fc_a", "f")
    no_text = {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_a",
        "output_index": 0,
    }
    head = [added(0, item), delta("fc_a", 0, SAFE), delta("fc_a", 0, SAFE), no_text]
    assert states(rounds([*head, done(0, {**item, "arguments": SAFE}), COMPLETED])) == [
        ("call_fc_a", *PV)  # the item's text shows the repeated fragment
    ]
    assert states(rounds([*head, COMPLETED])) == [("call_fc_a", *PV)]  # never closed


def test_a_repeated_added_item_with_other_arguments_fails_the_call() -> None:
    first, second = (
        fc_item("fc_a", "call_fc_a", "f", '{"path":'),
        fc_item("fc_a", "call_fc_a", "f", '"/x"}'),
    )
    item = fc_item("fc_a", "call_fc_a", "f")
    text = '{"path":"/safe"}'
    round_ = rounds(
        [
            added(0, first),
            added(0, second),
            delta("fc_a", 0, '"/safe"}'),
            args_done("fc_a", 0, text),
            done(0, {**item, "arguments": text}),
            COMPLETED,
        ]
    )
    assert states(round_) == [("call_fc_a", *PV)]
    same = rounds(
        [
            added(0, first),
            added(0, first),
            delta("fc_a", 0, '"/safe"}'),
            args_done("fc_a", 0, text),
            done(0, {**item, "arguments": text}),
            COMPLETED,
        ]
    )
    assert states(same) == [("call_fc_a", *OK)]


def test_an_item_done_naming_another_call_id_fails_the_call() -> None:
    item = fc_item("fc_a", "call_fc_a", "f")
    round_ = rounds(
        [
            added(0, item),
            args_done("fc_a", 0, "{}"),
            done(0, {**item, "call_id": "call_other", "arguments": "{}"}),
            COMPLETED,
        ]
    )
    assert states(round_)[0][1:] == PV


# 6. duplicate keys in object-typed arguments (QUIRKS Q9)


def _object_args(where: str, args_text: str) -> list[Native]:
    item = fc_item("fc_a", "call_fc_a", "f")
    item_text = json.dumps(item)[:-1]  # (no closing brace)
    added_ev = json.dumps(added(0, item))
    done_ev = (
        '{"type":"response.output_item.done","output_index":0,"item":'
        + item_text.replace('"arguments": ""', '"arguments": ' + args_text).replace(
            '"in_progress"', '"completed"'
        )
        + "}}"
    )
    args_ev = (
        '{"type":"response.function_call_arguments.done","item_id":"fc_a",'
        '"output_index":0,"arguments":' + args_text + "}"
    )
    if where == "arguments.done":
        return [added_ev, args_ev, COMPLETED]
    return [done_ev, COMPLETED] if where == "item.done only" else [added_ev, done_ev, COMPLETED]


@pytest.mark.parametrize("where", ["arguments.done", "item.done only", "item.done"])
def test_object_arguments_that_repeat_a_key_fail_the_call(where: str) -> None:
    round_ = rounds(_object_args(where, '{"cmd":"ls","cmd":"rm -rf /"}'))
    assert states(round_) == [("call_fc_a", *PV)]
    assert AnomalyKind.DUPLICATE_KEY in kinds(round_)
    nested = rounds(_object_args(where, '{"a":{"x":1,"x":2}}'))
    assert states(nested) == [("call_fc_a", *PV)]


@pytest.mark.parametrize("where", ["arguments.done", "item.done only", "item.done"])
def test_object_arguments_without_repeats_commit_serialized(where: str) -> None:
    round_ = rounds(_object_args(where, '{"cmd":"ls","n":[1,{"a":2}]}'))
    assert states(round_) == [("call_fc_a", *OK)]
    assert round_.calls[0].arguments == {"cmd": "ls", "n": [1, {"a": 2}]}
    assert AnomalyKind.DUPLICATE_KEY not in kinds(round_)


def test_a_repeated_key_in_the_added_item_arguments_fails_the_call() -> None:
    item = json.dumps(fc_item("fc_a", "call_fc_a", "f")).replace(
        '"arguments": ""', '"arguments": {"cmd":"ls","cmd":"rm"}'
    )
    added_ev = '{"type":"response.output_item.added","output_index":0,"item":' + item + "}"
    round_ = rounds([added_ev, COMPLETED])
    assert states(round_) == [("call_fc_a", *PV)]


# crashes: no exception leaves feed/finish, whatever the field types

_WEIRD: list[object] = [None, True, 0, -1, 2**70, 1.5, "", "fc_b", [], ["fc_a"], {}, {"a": 1}]
_BASE: list[dict[str, Any]] = [
    *whole_call("fc_a", 0, SAFE),  # type: ignore[list-item]
    *whole_call("fc_b", 1, '{"q":"é"}'),  # type: ignore[list-item]
    {"type": "response.output_text.delta", "output_index": 2, "delta": "hi"},
    done(3, {"type": "reasoning", "id": "rs_1", "summary": []}),
    COMPLETED,
]
INTENDED = {"fc_a": SAFE, "fc_b": '{"q":"é"}', 0: SAFE, 1: '{"q":"é"}'}


def _mutations() -> list[tuple[int, tuple[str, ...]]]:
    paths = []
    for i, native in enumerate(_BASE):
        for field, value in native.items():
            paths.append((i, (field,)))
            if isinstance(value, dict):
                paths += [(i, (field, sub)) for sub in value]
    return paths


def _mutate(native: Mapping[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    copy = json.loads(json.dumps(native))
    target = copy
    for field in path[:-1]:
        target = target[field]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return copy  # type: ignore[no-any-return]


_DELETE = object()


def assert_no_wrong_commit(round_: Round) -> None:
    for call in round_.calls:
        if call.state is CallState.COMMITTED:
            assert call.arguments_text == INTENDED.get(call.key.part), call


@pytest.mark.parametrize(("index", "path"), _mutations())
def test_wrong_types_anywhere_never_raise_nor_commit_other_arguments(
    index: int, path: tuple[str, ...]
) -> None:
    for value in [*_WEIRD, _DELETE]:
        natives = list(_BASE)
        natives[index] = _mutate(natives[index], path, value)
        events = sse(natives)
        for chunk in (None, 5):
            assert_no_wrong_commit(parse(events, chunk))


@st.composite
def _responses_stream(draw: st.DrawFn) -> tuple[list[Native], dict[int | str, str]]:
    """One to three calls, each with at least two witnesses of its text (deltas, the
    arguments.done text, the item's text), interleaved; then response.completed."""
    texts = {"fc_a": SAFE, "fc_b": '{"q":"é"}', "fc_c": "{}"}
    ids = draw(st.lists(st.sampled_from(sorted(texts)), min_size=1, max_size=3, unique=True))
    queues: list[list[Native]] = []
    for index, item_id in enumerate(ids):
        text = texts[item_id]
        item = fc_item(item_id, f"call_{item_id}", "f")
        witnesses = draw(st.sampled_from([(1, 1, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1)]))
        queue: list[Native] = [added(index, item)]
        if witnesses[0]:
            queue += [delta(item_id, index, p) for p in draw(_pieces(text)) if p]
        if witnesses[1]:
            queue.append(args_done(item_id, index, text))
        if witnesses[2]:
            queue.append(done(index, {**item, "arguments": text}))
        queues.append(queue)
    stream: list[Native] = []
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues if q]))
        stream.append(queue.pop(0))
    intended: dict[int | str, str] = {i: texts[k] for i, k in enumerate(ids)}
    return [*stream, COMPLETED], intended | {k: texts[k] for k in ids}


_WRONG = st.sampled_from([*_WEIRD, _DELETE, "response.output_text.delta", _DELTA_TYPE, "{}"])


@settings(max_examples=400, deadline=None)
@given(_responses_stream(), st.data())
def test_one_event_dropped_duplicated_or_corrupted_never_commits_other_arguments(
    drawn: tuple[list[Native], dict[int | str, str]], data: st.DataObject
) -> None:
    stream, intended = drawn
    at = data.draw(st.integers(0, len(stream) - 1))
    how = data.draw(st.sampled_from(["drop", "duplicate", "corrupt", "swap", "none"]))
    if how == "drop":
        del stream[at]
    elif how == "duplicate":
        stream.insert(at, stream[at])
    elif how == "swap" and at + 1 < len(stream):
        stream[at], stream[at + 1] = stream[at + 1], stream[at]
    elif how == "corrupt":
        native = stream[at]
        assert isinstance(native, Mapping)
        paths = [(f,) for f in native] + [
            (f, sub) for f, v in native.items() if isinstance(v, dict) for sub in v
        ]
        stream[at] = _mutate(native, data.draw(st.sampled_from(paths)), data.draw(_WRONG))
    chunk = data.draw(st.sampled_from([None, 1, 3, 64]))
    round_ = parse(sse(stream), chunk)
    for call in round_.calls:
        if call.state is CallState.COMMITTED:
            assert call.arguments_text == intended.get(call.key.part), (how, call)
    if how == "none":
        assert all(c.state is CallState.COMMITTED for c in round_.calls)
    failed = [c.call_id for c in round_.calls if c.state is not CallState.COMMITTED]
    assert [r.tool_call_id for r in error_results(round_)] == failed


# -- recorded corpus -----------------------------------------------------------------------


def fold(events: Iterable[StreamEvent]) -> list[dict[str, Any]]:
    """Calls in opening order: id, name, parsed arguments (None if never closed), raw text."""
    calls: dict[CallKey, dict[str, Any]] = {}
    fragments: dict[CallKey, list[str]] = {}
    for event in events:
        match event:
            case CallOpened(key=k, call_id=call_id, name=name):
                calls[k] = {"id": call_id, "name": name, "arguments": None, "raw": None}
                fragments[k] = []
            case ArgsDelta(key=k, fragment=fragment):
                fragments[k].append(fragment)
            case CallClosed(key=k, arguments=final):
                streamed = "".join(fragments[k])
                raw = streamed if fragments[k] else final
                assert final is None or final == streamed or not fragments[k], "mismatch"
                calls[k].update(raw=raw, arguments=json.loads(raw or "null"))
    return list(calls.values())


def corpus() -> Path:
    if not FIXTURES.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared corpus missing at {FIXTURES}")
        pytest.skip("shared corpus not present")
    return FIXTURES


RESPONSES_FILES = [
    "openai_responses/single_function_call.sse",
    "openai_responses/two_function_calls.sse",
    "openai_responses/text_then_function_call_phase.sse",
    "openai_responses/reasoning_then_function_call.sse",
    "openai_responses/tool_search_then_function_call.sse",
    "openai_responses/function_call_llm_cli.sse",
    "compat_azure/responses_function_call.jsonl",
    "compat_bedrock_mantle/responses_call_id_call_0.sse",
    "compat_deepseek/responses_api_function_call.sse",
    "compat_lmstudio/responses_no_argument_deltas.jsonl",
]
REPLAYS = [(n, None) for n in RESPONSES_FILES] + [
    (n, 7) for n in RESPONSES_FILES if n.endswith(".sse")
]


def replay(path: Path, chunk: int | None) -> list[StreamEvent]:
    adapter = OpenAIResponsesAdapter()
    events: list[StreamEvent] = []
    raw = path.read_bytes()
    if path.suffix == ".jsonl":
        for line in raw.splitlines():
            if line.strip():
                events += adapter.feed(orjson.loads(line))
    else:
        decoder = SSEDecoder()
        size = chunk or len(raw)
        frames = [f for i in range(0, len(raw), size) for f in decoder.feed(raw[i : i + size])]
        for frame in [*frames, *decoder.finish()]:
            events += adapter.feed_frame(frame)
    return events + adapter.finish()


@pytest.mark.corpus
@pytest.mark.parametrize(("name", "chunk"), REPLAYS)
def test_recorded_stream_replays_to_expected_calls(name: str, chunk: int | None) -> None:
    root = corpus()
    path = root / name
    expected = json.loads((root / "expected.json").read_text(encoding="utf-8"))[name]
    assert expected["format"] == "openai_responses"
    events = replay(path, chunk)
    calls = fold(events)
    assert [{k: c[k] for k in ("id", "name", "arguments")} for c in calls] == expected["calls"]
    assert [e for e in events if isinstance(e, Anomaly | StreamFailed)] == []
    assert isinstance(events[-1], RoundEnded)
    assert events[-1].ending is RoundEnd.NORMAL


@pytest.mark.corpus
def test_corpus_list_covers_every_responses_recording() -> None:
    root = corpus()
    expected = json.loads((root / "expected.json").read_text(encoding="utf-8"))
    listed = {k for k, v in expected.items() if v["format"] == "openai_responses"}
    assert listed == set(RESPONSES_FILES)
