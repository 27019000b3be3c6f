"""BedrockAdapter: hand-written ConverseStream transcripts (exact event lists) and the corpus."""

from __future__ import annotations

import base64
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
    ArgsDelta,
    BedrockAdapter,
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
    error_results,
)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"

# -- transcript builders (the boto3 shape: one key naming the event) --------------------------

MESSAGE_START = {"messageStart": {"role": "assistant"}}
USAGE = {"inputTokens": 5, "outputTokens": 9, "totalTokens": 14}
METADATA = {"metadata": {"usage": USAGE, "metrics": {"latencyMs": 12}}}


def tool_start(index: int, call_id: str, name: str, **extra: Any) -> dict[str, Any]:
    tool_use = {"toolUseId": call_id, "name": name, **extra}
    return {"contentBlockStart": {"contentBlockIndex": index, "start": {"toolUse": tool_use}}}


def delta(index: int, **member: Any) -> dict[str, Any]:
    return {"contentBlockDelta": {"contentBlockIndex": index, "delta": member}}


def args(index: int, text: str) -> dict[str, Any]:
    return delta(index, toolUse={"input": text})


def stop(index: int) -> dict[str, Any]:
    return {"contentBlockStop": {"contentBlockIndex": index}}


def message_stop(reason: str) -> dict[str, Any]:
    return {"messageStop": {"stopReason": reason}}


def run(natives: list[dict[str, Any]], *, attempt: int = 0) -> list[StreamEvent]:
    adapter = BedrockAdapter(attempt=attempt)
    out: list[StreamEvent] = []
    for native in natives:
        out += adapter.feed(native)
    return out + adapter.finish()


def as_frames(natives: list[dict[str, Any]]) -> list[Frame]:
    """What the event-stream decoder yields: the name in a header, the payload unwrapped."""
    return [Frame(event=name, data=json.dumps(body)) for n in natives for name, body in n.items()]


def run_frames(natives: list[dict[str, Any]]) -> list[StreamEvent]:
    adapter = BedrockAdapter()
    out: list[StreamEvent] = []
    for frame in as_frames(natives):
        out += adapter.feed_frame(frame)
    return out + adapter.finish()


def key(index: int, attempt: int = 0) -> CallKey:
    return CallKey(attempt, 0, index)


def ended(reason: str, ending: RoundEnd = RoundEnd.NORMAL) -> list[StreamEvent]:
    return [RoundEnded(ending=ending, stop_reason=reason), UsageReported(usage=USAGE)]


# -- calls ------------------------------------------------------------------------------------


def test_text_without_block_start_then_one_call() -> None:
    # nova_text_then_tool_use.jsonl: the text block begins with a delta.
    events = run(
        [
            MESSAGE_START,
            delta(0, text="Checking"),
            delta(0, text=" Paris."),
            stop(0),
            tool_start(1, "tooluse_1", "get_temperature"),
            args(1, '{"city":'),
            args(1, '"Paris"}'),
            stop(1),
            message_stop("tool_use"),
            METADATA,
        ]
    )
    assert events == [
        TextDelta(text="Checking", block=0),
        TextDelta(text=" Paris.", block=0),
        CallOpened(key=key(1), call_id="tooluse_1", name="get_temperature"),
        ArgsDelta(key=key(1), fragment='{"city":'),
        ArgsDelta(key=key(1), fragment='"Paris"}'),
        CallClosed(key=key(1)),
        *ended("tool_use"),
    ]


def test_two_calls_keyed_by_block_index_and_attempt() -> None:
    events = run(
        [
            MESSAGE_START,
            tool_start(0, "tooluse_a", "lookup", type="tool_use"),
            tool_start(1, "tooluse_b", "lookup"),
            args(1, '{"q": 2}'),
            args(0, '{"q": 1}'),
            stop(0),
            stop(1),
            message_stop("tool_use"),
            METADATA,
        ],
        attempt=2,
    )
    assert events == [
        CallOpened(key=key(0, 2), call_id="tooluse_a", name="lookup"),
        CallOpened(key=key(1, 2), call_id="tooluse_b", name="lookup"),
        ArgsDelta(key=key(1, 2), fragment='{"q": 2}'),
        ArgsDelta(key=key(0, 2), fragment='{"q": 1}'),
        CallClosed(key=key(0, 2)),
        CallClosed(key=key(1, 2)),
        *ended("tool_use"),
    ]


def test_no_argument_call_has_no_delta() -> None:
    events = run([MESSAGE_START, tool_start(0, "t", "now"), stop(0), message_stop("tool_use")])
    assert events == [
        CallOpened(key=key(0), call_id="t", name="now"),
        CallClosed(key=key(0)),
        RoundEnded(ending=RoundEnd.NORMAL, stop_reason="tool_use"),
    ]


# -- reasoning --------------------------------------------------------------------------------


def test_reasoning_text_and_signature_kept_byte_for_byte() -> None:
    events = run(
        [
            MESSAGE_START,
            delta(0, reasoningContent={"text": "Let me think"}),
            delta(0, reasoningContent={"text": ""}),
            delta(0, reasoningContent={"text": " é 🙂"}),
            delta(0, reasoningContent={"signature": "EqoB+/=="}),
            stop(0),
            message_stop("end_turn"),
            METADATA,
        ]
    )
    data = {
        "reasoningContent": {
            "reasoningText": {"text": "Let me think é 🙂", "signature": "EqoB+/=="}
        }
    }
    assert events == [ReasoningBlock(block=0, data=data), *ended("end_turn")]


def test_reasoning_without_signature_has_no_signature_key() -> None:
    events = run([delta(0, reasoningContent={"text": "x"}), stop(0)])
    assert events[0] == ReasoningBlock(
        block=0, data={"reasoningContent": {"reasoningText": {"text": "x"}}}
    )


def test_redacted_reasoning_bytes_from_boto3() -> None:
    events = run([delta(0, reasoningContent={"redactedContent": b"\x00\xff"}), stop(0)])
    assert events[0] == ReasoningBlock(
        block=0, data={"reasoningContent": {"redactedContent": b"\x00\xff"}}
    )


def test_redacted_reasoning_base64_pieces_are_joined_as_bytes() -> None:
    pieces = [base64.b64encode(b"\x01").decode(), base64.b64encode(b"\x02\x03").decode()]
    natives = [delta(0, reasoningContent={"redactedContent": p}) for p in pieces]
    events = run([*natives, stop(0)])
    joined = base64.b64encode(b"\x01\x02\x03").decode()
    assert events[0] == ReasoningBlock(
        block=0, data={"reasoningContent": {"redactedContent": joined}}
    )


# -- server tools -----------------------------------------------------------------------------


def test_server_tool_use_and_result_are_blocks_never_calls() -> None:
    # nova_server_tool_then_tool_use.jsonl: toolUse type server_tool_use, then a toolResult.
    result_start = {"toolUseId": "tooluse_s", "type": "code_result", "status": "success"}
    events = run(
        [
            MESSAGE_START,
            tool_start(0, "tooluse_s", "code_interpreter", type="server_tool_use"),
            args(0, '{"snippet":'),
            args(0, '"1+1"}'),
            stop(0),
            {"contentBlockStart": {"contentBlockIndex": 1, "start": {"toolResult": result_start}}},
            delta(1, toolResult=[{"text": "out: "}]),
            delta(1, toolResult=[{"text": "2"}, {"json": {"exitCode": 0}}]),
            stop(1),
            message_stop("end_turn"),
            METADATA,
        ]
    )
    use = {
        "toolUseId": "tooluse_s",
        "name": "code_interpreter",
        "type": "server_tool_use",
        "input": {"snippet": "1+1"},
    }
    result = {**result_start, "content": [{"text": "out: 2"}, {"json": {"exitCode": 0}}]}
    assert events == [
        ServerToolBlock(block=0, data={"toolUse": use}),
        ServerToolBlock(block=1, data={"toolResult": result}),
        *ended("end_turn"),
    ]


def test_server_tool_input_that_is_not_json_is_recorded_with_empty_input() -> None:
    events = run([tool_start(0, "s", "x", type="server_tool_use"), args(0, "{"), stop(0)])
    assert events[:2] == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0: server tool input is not JSON",
        ),
        ServerToolBlock(
            block=0,
            data={
                "toolUse": {"toolUseId": "s", "name": "x", "type": "server_tool_use", "input": {}}
            },
        ),
    ]


# -- round ends -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "ending"),
    [
        ("tool_use", RoundEnd.NORMAL),
        ("end_turn", RoundEnd.NORMAL),
        ("stop_sequence", RoundEnd.NORMAL),
        ("max_tokens", RoundEnd.TRUNCATED),
        ("model_context_window_exceeded", RoundEnd.TRUNCATED),
        ("guardrail_intervened", RoundEnd.INTERRUPTED),
        ("content_filtered", RoundEnd.INTERRUPTED),
        ("malformed_model_output", RoundEnd.INTERRUPTED),
        ("malformed_tool_use", RoundEnd.INTERRUPTED),
    ],
)
def test_stop_reasons(reason: str, ending: RoundEnd) -> None:
    assert run([MESSAGE_START, message_stop(reason), METADATA]) == ended(reason, ending)


def test_unknown_stop_reason_is_not_trusted() -> None:
    assert run([message_stop("new_reason")]) == [
        Anomaly(
            kind=AnomalyKind.UNKNOWN_EVENT,
            detail="unknown stopReason 'new_reason'; not trusted, nothing commits",
        ),
        RoundEnded(ending=RoundEnd.INTERRUPTED, stop_reason="new_reason"),
    ]


def test_message_stop_without_stop_reason_is_interrupted() -> None:
    assert run([{"messageStop": {}}]) == [
        Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail="the message ended without a stopReason"),
        RoundEnded(ending=RoundEnd.INTERRUPTED),
    ]


@pytest.mark.parametrize("block_stopped", [True, False])
def test_max_tokens_with_or_without_the_cut_blocks_stop(block_stopped: bool) -> None:
    # LibreChat-AI/agents#280: a truncated Bedrock call must never run.
    natives = [tool_start(0, "t", "create_file"), args(0, '{"content": "ab')]
    natives += [stop(0)] if block_stopped else []
    assert run([*natives, message_stop("max_tokens"), METADATA]) == [
        CallOpened(key=key(0), call_id="t", name="create_file"),
        ArgsDelta(key=key(0), fragment='{"content": "ab'),
        *([CallClosed(key=key(0))] if block_stopped else []),
        *ended("max_tokens", RoundEnd.TRUNCATED),
    ]


def test_missing_message_stop_fails_the_stream() -> None:
    events = run([MESSAGE_START, tool_start(0, "t", "n"), args(0, "{}"), stop(0), METADATA])
    assert events[-2:] == [
        UsageReported(usage=USAGE),
        StreamFailed(detail="stream ended without messageStop"),
    ]


def test_metadata_after_message_stop_is_normal_but_content_is_not() -> None:
    adapter = BedrockAdapter()
    adapter.feed(message_stop("end_turn"))
    assert adapter.feed(METADATA) == [UsageReported(usage=USAGE)]
    # Text after the end, for a block never seen: the same text block, or a lost one? Unknown.
    lost = Anomaly(
        kind=AnomalyKind.INVALID_PAYLOAD,
        detail="contentBlockDelta after the message ended",
        fails_pending=True,
    )
    assert adapter.feed(delta(0, text="late")) == [lost]
    late = Anomaly(
        kind=AnomalyKind.EVENT_AFTER_END, detail="contentBlockStart after the message ended"
    )
    assert adapter.feed(tool_start(1, "t", "n")) == [late]
    assert adapter.feed(tool_start(2, "t", "n")) == []
    assert adapter.finish() == []


# -- exceptions -------------------------------------------------------------------------------

EXCEPTIONS = [
    "internalServerException",
    "modelStreamErrorException",
    "validationException",
    "throttlingException",
    "serviceUnavailableException",
]


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_exception_event_mid_stream_fails_and_ends_it(name: str) -> None:
    events = run(
        [
            tool_start(0, "t", "n"),
            args(0, '{"a"'),
            {name: {"message": "Try again"}},
            args(0, "}"),
        ]
    )
    assert events == [
        CallOpened(key=key(0), call_id="t", name="n"),
        ArgsDelta(key=key(0), fragment='{"a"'),
        StreamFailed(detail=f"{name}: Try again"),
        Anomaly(
            kind=AnomalyKind.EVENT_AFTER_END,
            detail="content block 0 (call): delta after the message ended",
            key=key(0),
            fails_call=True,
        ),
    ]


@pytest.mark.parametrize(
    ("frame", "detail"),
    [
        (
            Frame(event="throttlingException", data='{"message":"Slow down"}'),
            "throttlingException: Slow down",
        ),
        (Frame(event="modelStreamErrorException", data=""), "modelStreamErrorException"),
        (Frame(event="newFancyException", data='{"message":"x"}'), "newFancyException: x"),
        (Frame(event="error", data="boom"), "boom"),
    ],
)
def test_exception_frames_fail_the_stream_once(frame: Frame, detail: str) -> None:
    adapter = BedrockAdapter()
    assert adapter.feed_frame(frame) == [StreamFailed(detail=detail)]
    assert adapter.finish() == []


def test_exception_after_message_stop_is_only_recorded() -> None:
    adapter = BedrockAdapter()
    adapter.feed(message_stop("end_turn"))
    assert adapter.feed({"internalServerException": {"message": "late"}}) == [
        Anomaly(
            kind=AnomalyKind.STREAM_ERROR,
            detail="after messageStop: internalServerException: late",
        )
    ]


# -- protocol misbehaviour --------------------------------------------------------------------


def test_unknown_event_reported_once() -> None:
    adapter = BedrockAdapter()
    anomaly = Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail="unknown event 'surprise'")
    assert adapter.feed({"surprise": {"x": 1}}) == [anomaly]
    assert adapter.feed({"surprise": {"x": 2}}) == []


def test_an_event_that_is_not_one_key_is_invalid() -> None:
    assert BedrockAdapter().feed({"contentBlockIndex": 0, "delta": {"text": "x"}}) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="expected a one-key ConverseStream event, got 2 keys",
            fails_pending=True,
        )
    ]


def test_tool_input_for_a_block_that_never_started() -> None:
    adapter = BedrockAdapter()
    assert adapter.feed(args(3, "{}")) == [
        Anomaly(
            kind=AnomalyKind.UNKNOWN_KEY,
            detail="toolUse delta for block 3, never started",
            fails_pending=True,
        )
    ]
    assert adapter.feed(stop(3)) == [
        Anomaly(
            kind=AnomalyKind.UNKNOWN_KEY,
            detail="contentBlockStop for block 3, never started",
            fails_pending=True,
        )
    ]


def test_fragment_and_stop_after_a_calls_stop_fail_the_call() -> None:
    adapter = BedrockAdapter()
    adapter.feed(tool_start(0, "t", "n"))
    adapter.feed(stop(0))
    assert adapter.feed(args(0, "{}")) == [
        Anomaly(
            kind=AnomalyKind.FRAGMENT_AFTER_CLOSE,
            detail="content block 0 (call): delta after stop",
            key=key(0),
            fails_call=True,
        )
    ]
    assert adapter.feed(stop(0)) == [
        Anomaly(
            kind=AnomalyKind.FRAGMENT_AFTER_CLOSE,
            detail="content block 0 (call): stopped twice",
            key=key(0),
            fails_call=True,
        )
    ]


def test_wrong_or_malformed_delta_on_a_call_fails_it() -> None:
    adapter = BedrockAdapter()
    adapter.feed(tool_start(0, "t", "n"))
    assert adapter.feed(delta(0, text="hi")) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0 (call): text delta",
            key=key(0),
            fails_call=True,
        )
    ]
    assert adapter.feed(delta(0, toolUse={"input": 5})) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0 (call): malformed toolUse delta",
            key=key(0),
            fails_call=True,
        )
    ]
    assert adapter.feed(tool_start(0, "u", "m")) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="content block 0 started twice",
            fails_pending=True,
        )
    ]


def test_image_blocks_and_unknown_deltas_are_reported_once() -> None:
    adapter = BedrockAdapter()
    image = {"contentBlockStart": {"contentBlockIndex": 0, "start": {"image": {"format": "png"}}}}
    assert adapter.feed(image) == [
        Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail="block start 'image'")
    ]
    assert adapter.feed(delta(0, image={"source": {}})) == [
        Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail="delta 'image'")
    ]
    assert adapter.feed(delta(0, image={"source": {}})) == []
    assert adapter.feed(stop(0)) == []


def test_citation_deltas_are_accepted_and_not_kept() -> None:
    adapter = BedrockAdapter()
    assert adapter.feed(delta(0, text="Cited")) == [TextDelta(text="Cited", block=0)]
    assert adapter.feed(delta(0, citation={"title": "doc"})) == []


def test_delta_members_are_picked_by_name() -> None:
    adapter = BedrockAdapter()
    assert adapter.feed(delta(0, text="x", p="pad")) == [TextDelta(text="x", block=0)]
    assert adapter.feed(delta(1, text="x", toolUse={"input": "{}"})) == [
        Anomaly(
            kind=AnomalyKind.INVALID_PAYLOAD,
            detail="contentBlockDelta without an integer index and one delta member",
            fails_pending=True,
        )
    ]


def test_feed_after_finish_raises() -> None:
    adapter = BedrockAdapter()
    adapter.finish()
    with pytest.raises(UsageError):
        adapter.feed(MESSAGE_START)


# -- properties -------------------------------------------------------------------------------

TRANSCRIPT = [
    MESSAGE_START,
    delta(0, reasoningContent={"text": "hmm"}),
    delta(0, reasoningContent={"signature": "sig"}),
    stop(0),
    delta(1, text="Calling."),
    stop(1),
    tool_start(2, "tooluse_1", "f"),
    args(2, '{"a": 1}'),
    stop(2),
    message_stop("tool_use"),
    METADATA,
]


def test_raw_frames_and_boto3_dicts_give_the_same_events() -> None:
    assert run_frames(TRANSCRIPT) == run(TRANSCRIPT)


@given(st.lists(st.text(max_size=30), min_size=len(TRANSCRIPT), max_size=len(TRANSCRIPT)))
def test_random_padding_field_changes_nothing(pads: list[str]) -> None:
    # Every recorded payload carries a random "p" padding field (nova_*.jsonl).
    padded = [
        {name: {**body, "p": pad} for name, body in native.items()}
        for native, pad in zip(TRANSCRIPT, pads, strict=True)
    ]
    assert run(padded) == run(TRANSCRIPT)
    assert run_frames(padded) == run(TRANSCRIPT)


_GeneralOnly = general_only(BedrockAdapter)


_Counting = counting(BedrockAdapter)


_BEDROCK_EVENTS = st.one_of(
    st.sampled_from(
        [
            MESSAGE_START,
            tool_start(0, "tooluse_0", "f"),
            tool_start(1, "tooluse_1", "g"),
            tool_start(2, "srv", "web", type="server_tool_use"),
            delta(1, text="hi"),
            delta(0, toolUse={"input": "x"}, text="y"),  # two members
            delta(0, toolUse={"input": "x"}, p="pad"),  # an unknown second key
            delta(0, toolUse="x"),
            delta(0, toolUse={"input": 5}),
            delta(0, toolUse={}),
            {"contentBlockDelta": {"contentBlockIndex": 0}},
            {"contentBlockDelta": "x"},
            {"contentBlockDelta": {"contentBlockIndex": 0, "delta": []}},
            {"contentBlockStop": {"contentBlockIndex": 0, "delta": {"toolUse": {"input": "x"}}}},
            stop(0),
            stop(1),
            message_stop("tool_use"),
            METADATA,
            {"throttlingException": {"message": "slow down"}},
        ]
    ),
    st.builds(args, st.sampled_from([0, 1, 2, 3, True, 1.0, "0", None]), st.just("{")),
)


def _frame_shapes(native: dict[str, Any]) -> list[Frame]:
    """The event as a JSON line, as an event-stream frame (name in the header, payload
    unwrapped), and wrapped under a header naming another event."""
    ((name, body),) = native.items()
    return [
        Frame(event="message", data=json.dumps(native)),
        Frame(event=name, data=json.dumps(body)),
        Frame(event="contentBlockDelta", data=json.dumps(native)),
    ]


@settings(max_examples=300)
@given(st.lists(_BEDROCK_EVENTS, max_size=10), st.integers(0, 2))
def test_fast_path_gives_what_the_general_path_gives(
    natives: list[dict[str, Any]], shape: int
) -> None:
    """Frame by frame, the same events (same reprs: an index of True is not the key of
    block 1) as the general path, for every delta the fast path takes and its near misses,
    in each frame shape."""
    fast, general = BedrockAdapter(), _GeneralOnly()
    for native in [MESSAGE_START, tool_start(0, "tooluse_0", "f"), *natives]:
        frame = _frame_shapes(native)[shape]
        assert repr(fast.feed_frame(frame)) == repr(general.feed_frame(frame))
    assert fast.finish() == general.finish()


@pytest.mark.parametrize("shape", [0, 1])
def test_fast_path_takes_every_argument_fragment(shape: int) -> None:
    natives = [MESSAGE_START, tool_start(0, "t", "f"), args(0, '{"a"'), args(0, ":1}"), stop(0)]
    adapter = _Counting()
    events = [e for n in natives for e in adapter.feed_frame(_frame_shapes(n)[shape])]
    assert adapter.general == 3  # messageStart, contentBlockStart, contentBlockStop
    assert events == [
        CallOpened(key=key(0), call_id="t", name="f"),
        ArgsDelta(key=key(0), fragment='{"a"'),
        ArgsDelta(key=key(0), fragment=":1}"),
        CallClosed(key=key(0)),
    ]


# -- recorded corpus --------------------------------------------------------------------------


def corpus() -> Path:
    if not FIXTURES.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared corpus missing at {FIXTURES}")
        pytest.skip("shared corpus not present")
    return FIXTURES


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
            case ServerToolBlock(block=index, data={"toolUse": use}):
                found[index] = {
                    "id": use["toolUseId"],
                    "name": use["name"],
                    "arguments": use["input"],
                    "kind": use["type"],
                }
    for part, joined in text.items():
        complete = part in closed and ending is RoundEnd.NORMAL
        found[part]["arguments"] = json.loads("".join(joined) or "{}") if complete else None
    return [found[part] for part in sorted(found)]


def bedrock_files() -> list[str]:
    if not FIXTURES.is_dir():
        return ["<missing>"]
    return sorted(p.name for p in (FIXTURES / "bedrock").glob("*.jsonl"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()  # the last line may lack a newline
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.corpus
@pytest.mark.parametrize("name", bedrock_files())
@pytest.mark.parametrize("via", ["dicts", "frames"])
def test_recorded_stream_matches_expected(name: str, via: str) -> None:
    root = corpus()
    expected = json.loads((root / "expected.json").read_text(encoding="utf-8"))
    natives = read_jsonl(root / "bedrock" / name)
    events = run(natives) if via == "dicts" else run_frames(natives)
    assert not [e for e in events if isinstance(e, (Anomaly, StreamFailed))]
    assert isinstance(events[-1], UsageReported)  # metadata comes after messageStop
    assert fold(events) == expected[f"bedrock/{name}"]["calls"]


@pytest.mark.corpus
def test_recorded_binary_event_stream_gives_the_jsonl_events() -> None:
    # Frames from the raw decoder carry the name in a header and an unwrapped payload.
    eventstream = pytest.importorskip("toollatch.core._eventstream")
    root = corpus()
    raw = (root / "bedrock" / "nova_text_then_tool_use.eventstream").read_bytes()
    decoder = eventstream.EventStreamDecoder()
    adapter = BedrockAdapter()
    events: list[StreamEvent] = []
    for start in range(0, len(raw), 7):
        for frame in decoder.feed(raw[start : start + 7]):
            events += adapter.feed_frame(frame)
    for frame in decoder.finish():
        events += adapter.feed_frame(frame)
    events += adapter.finish()
    assert events == run(read_jsonl(root / "bedrock" / "nova_text_then_tool_use.jsonl"))


# -- issue 11 end to end: no wrong commit, whatever the read size ------------------------------
# Whole streams through StreamParser, as JSON Lines (the boto3 shape) and as the binary event
# stream (name in the header, payload unwrapped), at every standard chunking.

import struct  # noqa: E402
import zlib  # noqa: E402

from toollatch import CallState, ErrorCode, StreamParser  # noqa: E402
from toollatch.testing import chunkings  # noqa: E402

FILE_TOOLS = [
    {
        "name": "read_file",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
PATH_PARTS = ['{"path":"/safe', "/../../etc/passwd", '"}']


def es_message(name: str, payload: bytes) -> bytes:
    """One AWS event-stream message (prelude, CRCs: the layout documented at
    https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream),
    carrying ``:event-type`` (or ``:exception-type``) and ``:message-type`` string headers."""
    kind = "exception" if name.endswith("Exception") else "event"
    headers = b""
    for hname, value in ((f":{kind}-type", name), (":message-type", kind)):
        raw = value.encode()
        headers += bytes([len(hname)]) + hname.encode() + b"\x07" + struct.pack(">H", len(raw))
        headers += raw
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def wire(natives: list[Any], framing: str) -> bytes:
    """``natives`` as bytes: dicts encoded, str items sent verbatim (a JSON Lines line, or an
    event-stream payload for a ``(name, payload)`` pair)."""
    out = b""
    for native in natives:
        if framing == "jsonl":
            out += (native if isinstance(native, str) else json.dumps(native)).encode() + b"\n"
        elif isinstance(native, tuple):
            out += es_message(native[0], native[1].encode())
        else:
            ((name, body),) = native.items()
            out += es_message(name, json.dumps(body).encode())
    return out


def outcomes(
    natives: list[Any], framing: str, tools: Any = FILE_TOOLS
) -> tuple[list[tuple[Any, ...]], list[str], Any]:
    """(id, state, code) per call, the error results' ids and the Round: the same at every
    chunking."""
    data = wire(natives, framing)
    expected: tuple[Any, ...] | None = None
    for pieces in chunkings(data, seed=5):
        parser = StreamParser("bedrock", framing=framing, tools=tools)  # type: ignore[arg-type]
        for piece in pieces:
            parser.feed(piece)
        r = parser.finish()
        got = (
            [(c.call_id, c.state, c.error) for c in r.calls],
            [e.tool_call_id for e in error_results(r)],
            r,
        )
        if expected is None:
            expected = got
        assert got[:2] == expected[:2]
    assert expected is not None
    return expected[0], expected[1], expected[2]


def path_call(middle: Any = None, index: int = 1) -> list[Any]:
    events: list[Any] = [tool_start(index, "t_path", "read_file")]
    for i, part in enumerate(PATH_PARTS):
        events.append(middle if i == 1 and middle is not None else args(index, part))
    return [*events, stop(index)]


def first_call() -> list[Any]:
    return [tool_start(0, "t_ok", "read_file"), args(0, '{"path": "/tmp/a"}'), stop(0)]


def _middle(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"contentBlockIndex": 1, "delta": {"toolUse": {"input": "/x"}}}
    payload["delta"]["toolUse"]["input"] = PATH_PARTS[1]
    payload.update(changes)
    return {"contentBlockDelta": payload}


_FRAMINGS = ["jsonl", "eventstream"]
_LOST = {
    "index string": _middle(contentBlockIndex="1"),
    "index float": _middle(contentBlockIndex=1.0),
    "index bool": _middle(contentBlockIndex=True),
    "index list": _middle(contentBlockIndex=[1]),
    "index null": _middle(contentBlockIndex=None),
    "index never started": _middle(contentBlockIndex=9),
    "index of a text block": _middle(contentBlockIndex=2),
    "delta not an object": _middle(delta=PATH_PARTS[1]),
    "two delta members": _middle(delta={"toolUse": {"input": PATH_PARTS[1]}, "text": "x"}),
    "unknown event name": {"contentBlockDeltaV2": _middle()["contentBlockDelta"]},
}
_LOST_RAW = {  # verbatim: (JSON Lines line, event-stream payload of a contentBlockDelta)
    "not JSON": ('{"contentBlockDelta":{"contentBlockIndex":1,', '{"contentBlockIndex":1,'),
    # (an escaped lone surrogate, "\\ud800", is no longer lost: read with U+FFFD, issue 28)
    "JSON but not an object": ('["/../../etc/passwd"]', '["/../../etc/passwd"]'),
}


def _lost_middle(name: str, framing: str) -> Any:
    if name in _LOST:
        return _LOST[name]
    line, payload = _LOST_RAW[name]
    return line if framing == "jsonl" else ("contentBlockDelta", payload)


@pytest.mark.parametrize("framing", _FRAMINGS)
@pytest.mark.parametrize("name", sorted([*_LOST, *_LOST_RAW]))
def test_e2e_a_lost_fragment_event_fails_every_pending_call(name: str, framing: str) -> None:
    # issue 11 class 1: {"path":"/safe/../../etc/passwd"} sent, {"path":"/safe"} must not commit;
    # t_ok, closed before, fails too: the lost event may have been its fragment.
    natives = [
        MESSAGE_START,
        *first_call(),
        delta(2, text="reading"),  # block 2: an (implicitly started) text block, open
        *path_call(_lost_middle(name, framing)),
        stop(2),
        message_stop("tool_use"),
        METADATA,
    ]
    calls, paired, r = outcomes(natives, framing)
    assert calls == [
        ("t_ok", CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION),
        ("t_path", CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION),
    ]
    assert paired == ["t_ok", "t_path"] and list(r.committed()) == []


@pytest.mark.parametrize("framing", _FRAMINGS)
def test_e2e_the_unmodified_path_stream_commits_what_was_sent(framing: str) -> None:
    natives = [MESSAGE_START, *first_call(), *path_call(), message_stop("tool_use"), METADATA]
    calls, paired, r = outcomes(natives, framing)
    assert [c[1] for c in calls] == [CallState.COMMITTED] * 2 and paired == []
    assert r.calls[1].arguments == {"path": "/safe/../../etc/passwd"}


@pytest.mark.parametrize("framing", _FRAMINGS)
@pytest.mark.parametrize(
    "middle",
    [
        delta(1, toolUse={"input": 5}),
        delta(1, text="x"),
        delta(1, toolUsf={"input": PATH_PARTS[1]}),  # an unknown member on the call's block
    ],
)
def test_e2e_a_refused_delta_on_a_calls_block_fails_that_call(middle: Any, framing: str) -> None:
    natives = [MESSAGE_START, *first_call(), *path_call(middle), message_stop("tool_use")]
    calls, paired, _ = outcomes(natives, framing)
    assert calls == [
        ("t_ok", CallState.COMMITTED, None),
        ("t_path", CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION),
    ]
    assert paired == ["t_path"]


@pytest.mark.parametrize("framing", _FRAMINGS)
def test_e2e_a_call_without_its_content_block_stop_does_not_commit(framing: str) -> None:
    # issue 11 class 2: messageStop tool_use, but block 0 never got its contentBlockStop.
    natives = [MESSAGE_START, *first_call()[:2], message_stop("tool_use"), METADATA]
    calls, paired, r = outcomes(natives, framing)
    assert calls == [("t_ok", CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION)]
    assert paired == ["t_ok"] and "never_closed" in [a.kind.value for a in r.anomalies]


@pytest.mark.parametrize("framing", _FRAMINGS)
@pytest.mark.parametrize(
    "reasons",
    [
        ("max_tokens", "tool_use"),
        ("tool_use", "max_tokens"),
        ("guardrail_intervened", "end_turn"),
        ("end_turn", "guardrail_intervened"),
    ],
)
def test_e2e_a_truncating_or_failing_reason_sticks(reasons: tuple[str, str], framing: str) -> None:
    # issue 11 class 4: messageStop twice; the truncating or failing one wins in either order.
    natives = [MESSAGE_START, *first_call(), *map(message_stop, reasons), METADATA]
    calls, paired, r = outcomes(natives, framing)
    bad = reasons[0] if reasons[1] in ("tool_use", "end_turn") else reasons[1]
    code = ErrorCode.TRUNCATED if bad == "max_tokens" else ErrorCode.STREAM_INTERRUPTED
    assert calls == [("t_ok", CallState.FAILED, code)] and paired == ["t_ok"]
    assert r.stop_reason == bad


@pytest.mark.parametrize("framing", _FRAMINGS)
@pytest.mark.parametrize("where", ["after its stop", "after messageStop"])
def test_e2e_a_fragment_after_the_end_fails_the_call(where: str, framing: str) -> None:
    # issue 11 class 5: the late fragment used to be dropped and the call committed.
    late = args(0, ', "x": 1')
    tail = [message_stop("tool_use"), METADATA]
    body = (
        [*first_call(), late, *tail] if where == "after its stop" else [*first_call(), *tail, late]
    )
    calls, paired, _ = outcomes([MESSAGE_START, *body], framing)
    assert calls == [("t_ok", CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION)]
    assert paired == ["t_ok"]


# -- issue 11: the property ------------------------------------------------------------------
# One event of a ConverseStream-shaped stream dropped, duplicated or corrupted, the bytes cut at
# random: nothing raises, and a call that commits has exactly the text the model sent. Out of
# scope (no reader can tell: no sequence numbers): a whole non-empty fragment event dropped or
# repeated, a change inside a fragment's text in JSON Lines. In the binary event stream any
# byte may flip: the CRCs catch it.

_WRONG_INDEXES: list[Any] = ["1", 1.5, True, [1], None, {"i": 1}, 99, -1]
_SENT = {"t_a": ['{"path":', ' "/safe', "/../../etc", '/passwd"}'], "t_b": ['{"path": "/b"}']}


def _base_stream() -> list[Any]:
    events: list[Any] = [MESSAGE_START, delta(0, text="Reading."), stop(0)]
    for index, (cid, parts) in enumerate(_SENT.items(), start=1):
        events += [tool_start(index, cid, "read_file"), *(args(index, p) for p in parts)]
        events.append(stop(index))
    return [*events, message_stop("tool_use"), METADATA]


def _is_fragment(event: Any) -> bool:
    payload = event.get("contentBlockDelta") if isinstance(event, dict) else None
    tool_use = payload.get("delta", {}).get("toolUse") if isinstance(payload, dict) else None
    return isinstance(tool_use, dict) and tool_use.get("input") not in (None, "")


def _corrupt(event: dict[str, Any], how: str, value: Any, framing: str) -> Any:
    """One envelope change that a reader can see (never the fragment's own text)."""
    ((name, payload),) = event.items()
    if how == "index" and "contentBlockIndex" in payload:
        return {name: {**payload, "contentBlockIndex": value}}
    if how == "name":
        return {f"{name}V2": payload}
    if how == "delta member" and isinstance(payload.get("delta"), dict):
        return {name: {**payload, "delta": {f"{k}X": v for k, v in payload["delta"].items()}}}
    if how == "no delta" and "delta" in payload:
        return {name: {k: v for k, v in payload.items() if k != "delta"}}
    text = json.dumps(event if framing == "jsonl" else payload)
    # "surrogate": an escaped lone surrogate added; "cut": not JSON
    text = text[:-1] + ',"x":"\\ud800"}' if how == "surrogate" else text[: max(1, len(text) // 2)]
    return text if framing == "jsonl" else (name, text)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), framing=st.sampled_from(_FRAMINGS))
def test_one_lost_duplicated_or_corrupted_event_never_commits_other_text(
    data: st.DataObject, framing: str
) -> None:
    events = _base_stream()
    i = data.draw(st.integers(0, len(events) - 1), label="event")
    ops = ["corrupt"] if _is_fragment(events[i]) else ["drop", "duplicate", "corrupt"]
    if framing == "eventstream":
        ops.append("flip a byte")
    op = data.draw(st.sampled_from(ops), label="op")
    if op == "drop":
        events = events[:i] + events[i + 1 :]
    elif op == "duplicate":
        events = events[: i + 1] + events[i:]
    elif op == "corrupt":
        how = data.draw(
            st.sampled_from(["index", "name", "delta member", "no delta", "surrogate", "cut"])
        )
        events[i] = _corrupt(events[i], how, data.draw(st.sampled_from(_WRONG_INDEXES)), framing)
    raw = bytearray(wire(events, framing))
    if op == "flip a byte":
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at] ^= data.draw(st.integers(1, 255), label="mask")
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12), label="cuts")
    parser = StreamParser("bedrock", framing=framing, tools=FILE_TOOLS)  # type: ignore[arg-type]
    pieces = [
        bytes(raw[a:b]) for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(raw)], strict=True)
    ]
    for piece in pieces:
        parser.feed(piece)
    r = parser.finish()
    sent = {cid: "".join(parts) for cid, parts in _SENT.items()}
    for record in r.calls:
        if record.state is CallState.COMMITTED:
            assert record.arguments_text == sent[record.call_id or ""]
    assert [c.call_id for c in r.calls if c.state is not CallState.COMMITTED] == [
        e.tool_call_id for e in error_results(r)
    ]


@pytest.mark.parametrize("framing", _FRAMINGS)
def test_the_property_stream_commits_both_calls_unmodified(framing: str) -> None:
    """The property's control: its stream, untouched, commits both calls."""
    calls, _, r = outcomes(_base_stream(), framing)
    assert [c[1] for c in calls] == [CallState.COMMITTED] * 2
    assert {c.call_id: c.arguments_text for c in r.calls} == {
        cid: "".join(parts) for cid, parts in _SENT.items()
    }


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


_SWEPT = [
    *_base_stream(),
    delta(5, reasoningContent={"text": "r"}),
    delta(6, toolResult=[{"text": 5}, {"text": "a"}, {"json": {}}]),
    {"contentBlockStart": {"contentBlockIndex": 7, "start": {"toolResult": {"toolUseId": "s"}}}},
    delta(7, toolResult=[{"text": 5}, {"text": "a"}]),
    stop(7),
]


def test_a_wrong_type_anywhere_in_any_event_raises_nothing() -> None:
    """Every field of every event (at every depth) set to each hostile value, fed as a dict
    and as an event-stream frame's payload among the other events: only stream events."""
    run([{1: {}}, {(1, 2): {"x": 1}}, {"contentBlockDelta": {1: 2}}])  # (keys not text)
    for i, event in enumerate(_SWEPT):
        for path in _paths(event):
            for new in _HOSTILE:
                natives = [*_SWEPT[:i], _replaced(event, path, new), *_SWEPT[i + 1 :]]
                run(natives)
                # (a frame's event name is always text: the decoder reads it from a header)
                if all(isinstance(n, dict) and list(map(type, n)) == [str] for n in natives):
                    adapter = BedrockAdapter()
                    for frame in as_frames(natives):
                        adapter.feed_frame(frame)
                    adapter.finish()
