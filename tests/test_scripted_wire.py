"""Scripted server wire encoders (pure): every turn they encode assembles through
``StreamParser(provider)`` at every chunking, with the right ids, names, arguments and ends."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toollatch import CallState, ErrorCode, RoundEnd, StreamParser
from toollatch.scripted import Call, Reasoning, Text, Turn, demo_script
from toollatch.scripted._wire import WireEvent, anthropic_events, chat_events
from toollatch.scripted._wire_gemini import gemini_events
from toollatch.scripted._wire_responses import responses_events
from toollatch.testing import chunkings, split_at

Encoder = Callable[[Turn], list[WireEvent]]

ENCODERS: dict[str, Encoder] = {
    "openai_chat": lambda t: chat_events(t, model="m", response_id="r1", include_usage=True),
    "openai_responses": lambda t: responses_events(t, model="m", response_id="r1"),
    "anthropic": lambda t: anthropic_events(t, model="m", response_id="r1"),
    "gemini": lambda t: gemini_events(t, model="m", response_id="r1"),
}
NORMAL_STOP = {
    "openai_chat": ("tool_calls", "stop"),
    "openai_responses": ("completed", "completed"),
    "anthropic": ("tool_use", "end_turn"),
    "gemini": ("STOP", "STOP"),
}
TRUNCATED_STOP = {
    "openai_chat": "length",
    "openai_responses": "max_output_tokens",
    "anthropic": "max_tokens",
    "gemini": "MAX_TOKENS",
}


def body_of(provider: str, turn: Turn) -> bytes:
    return b"".join(e.data for e in ENCODERS[provider](turn))


def parse(provider: str, chunks: list[bytes]):  # type: ignore[no-untyped-def]
    parser = StreamParser(provider)
    for chunk in chunks:
        parser.feed(chunk)
    return parser.finish()


def expected_id(provider: str, call: Call, position: int) -> str:
    # Gemini sends no ids (it pairs by position); the adapter makes a stable one up.
    return f"gemini:0:{position}" if provider == "gemini" else call.call_id


@pytest.mark.parametrize("provider", ENCODERS)
@pytest.mark.parametrize("turn_index", [0, 1, 2])
def test_demo_turns_assemble_at_every_chunking(provider: str, turn_index: int) -> None:
    turn = demo_script().turns[turn_index]
    body = body_of(provider, turn)
    texts = "".join(i.text for i in turn.items if isinstance(i, Text))
    for chunks in chunkings(body, seed=turn_index, random_splits=4):
        round_ = parse(provider, chunks)
        assert round_.ended is RoundEnd.NORMAL
        assert round_.stop_reason == NORMAL_STOP[provider][0 if turn.calls else 1]
        assert round_.text == texts
        got = [(c.call_id, c.name, c.state, dict(c.arguments or {})) for c in round_.calls]
        want = [
            (expected_id(provider, c, n), c.name, CallState.COMMITTED, json.loads(c.arguments))
            for n, c in enumerate(turn.calls)
        ]
        assert got == want


def test_demo_script_is_the_documented_conversation() -> None:
    first, second, third = demo_script().turns
    assert [(c.name, json.loads(c.arguments)) for c in first.calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_weather", {"city": "Zürich", "unit": "c"}),
    ]
    assert all(c.fragment_chars < len(c.arguments) for c in first.calls)  # small fragments
    (write,) = second.calls
    assert write.name == "write_file"
    assert json.loads(write.arguments)["path"] == "notes/weather.md"
    assert third.calls == () and third.stop == "normal"


TRUNCATED = Turn(
    items=(
        Text(text="Writing."),
        Call(call_id="c1", name="first", arguments='{"a": 1}', fragment_chars=3),
        Call(call_id="c2", name="second", arguments='{"path": "x", "content": "long"}'),
    ),
    stop="max_tokens",
)


@pytest.mark.parametrize("provider", ENCODERS)
def test_max_tokens_cuts_the_last_call_and_sends_the_truncation_reason(provider: str) -> None:
    for chunks in chunkings(body_of(provider, TRUNCATED), seed=1):
        round_ = parse(provider, chunks)
        assert round_.ended is RoundEnd.TRUNCATED
        assert round_.stop_reason == TRUNCATED_STOP[provider]
        assert round_.committed() == ()
        assert {c.error for c in round_.calls} == {ErrorCode.TRUNCATED}
        if provider == "gemini":  # a Gemini call arrives whole or not at all
            assert [c.name for c in round_.calls] == ["first"]
        else:
            cut = round_.calls[-1]
            assert cut.name == "second"
            assert cut.arguments_text == '{"path": "x", "content": "long"}'[:16]


def test_anthropic_truncated_block_has_no_stop_like_the_recorded_stream() -> None:
    # shared/fixtures/anthropic/max_tokens_truncated_tool_use.sse: no content_block_stop
    # for the cut block, message_delta max_tokens right after its last fragment.
    events = [json.loads(e.data.split(b"data: ", 1)[1]) for e in ENCODERS["anthropic"](TRUNCATED)]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1]
    kinds = [e["type"] for e in events]
    assert kinds[-3:] == ["content_block_delta", "message_delta", "message_stop"]


def test_responses_events_are_named_and_numbered() -> None:
    turn = demo_script().turns[0]
    events = ENCODERS["openai_responses"](turn)
    numbers = []
    for event in events:
        head, data = event.data.decode().split("\n", 1)
        payload = json.loads(data.removeprefix("data: "))
        assert head == f"event: {payload['type']}"
        numbers.append(payload["sequence_number"])
    assert numbers == list(range(len(events)))
    first = json.loads(events[0].data.decode().split("data: ", 1)[1])
    assert first["type"] == "response.created"


def test_chat_usage_only_when_asked() -> None:
    turn = demo_script().turns[2]
    with_usage = chat_events(turn, model="m", response_id="r", include_usage=True)
    without = chat_events(turn, model="m", response_id="r", include_usage=False)
    assert len(with_usage) == len(without) + 1
    last_chunk = json.loads(with_usage[-2].data.decode().removeprefix("data: "))
    assert last_chunk["choices"] == [] and last_chunk["usage"]["total_tokens"] > 0
    assert b'"usage"' not in b"".join(e.data for e in without)
    assert without[-1].data == b"data: [DONE]\n\n"


def test_gemini_uses_crlf_and_puts_the_finish_reason_on_the_last_chunk() -> None:
    events = ENCODERS["gemini"](demo_script().turns[0])
    assert all(e.data.endswith(b"\r\n\r\n") and b"\n\n" not in e.data for e in events)
    payloads = [json.loads(e.data.decode().removeprefix("data: ")) for e in events]
    reasons = [p["candidates"][0].get("finishReason") for p in payloads]
    assert reasons == [None] * (len(events) - 1) + ["STOP"]
    assert "usageMetadata" in payloads[-1]


REASONING = Turn(
    items=(
        Reasoning(text="The user wants Oslo."),
        Text(text="Checking."),
        Call(call_id="r1", name="get_weather", arguments='{"city": "Oslo"}'),
    )
)


@pytest.mark.parametrize("provider", ENCODERS)
def test_reasoning_is_kept_as_a_block_and_the_call_still_commits(provider: str) -> None:
    for chunks in chunkings(body_of(provider, REASONING), seed=2, random_splits=2):
        round_ = parse(provider, chunks)
        assert round_.ended is RoundEnd.NORMAL
        assert len(round_.blocks) == 1
        assert round_.text == "Checking."
        assert [c.state for c in round_.calls] == [CallState.COMMITTED]


@pytest.mark.parametrize("provider", ENCODERS)
def test_invalid_and_oversized_arguments_reach_the_gate_as_written(provider: str) -> None:
    big = json.dumps({"content": "x" * 300_000})
    turn = Turn(
        items=(
            Call(call_id="bad", name="t", arguments='{"city": "Os'),
            Call(call_id="big", name="t", arguments=big, fragment_chars=4096),
        )
    )
    round_ = parse(provider, [body_of(provider, turn)])
    assert round_.ended is RoundEnd.NORMAL
    bad, large = round_.calls
    assert bad.state is CallState.FAILED
    expected = ErrorCode.ARGUMENTS_NOT_OBJECT if provider == "gemini" else ErrorCode.INVALID_JSON
    assert bad.error is expected
    assert large.state is CallState.FAILED and large.error is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES


@pytest.mark.parametrize("provider", ENCODERS)
def test_stall_default_position_is_inside_the_arguments(provider: str) -> None:
    events = ENCODERS[provider](demo_script().turns[0])
    flagged = [n for n, e in enumerate(events) if e.in_arguments]
    assert flagged, "every provider marks its argument events"
    for n in flagged:
        data = events[n].data
        marker = b"functionCall" if provider == "gemini" else b"arguments"
        if provider == "anthropic":
            marker = b"partial_json"
        elif provider == "openai_responses":
            marker = b"function_call_arguments.delta"
        assert marker in data


JSON_LEAF = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
    st.integers(-(2**31), 2**31),
    st.booleans(),
    st.none(),
)
ARGUMENTS = st.dictionaries(
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=6),
    st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=3), max_leaves=6),
    max_size=4,
)


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    items: list[Text | Call] = []
    if draw(st.booleans()):
        items.append(
            Text(
                text=draw(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=30)),
                chunk_chars=draw(st.integers(1, 8)),
            )
        )
    for n in range(draw(st.integers(1, 3))):
        arguments = json.dumps(draw(ARGUMENTS), ensure_ascii=draw(st.booleans()))
        items.append(
            Call(
                call_id=f"c{n}",
                name=f"tool_{n}",
                arguments=arguments,
                fragment_chars=draw(st.integers(1, 9)),
            )
        )
    return Turn(items=tuple(items))


@pytest.mark.parametrize("provider", ENCODERS)
@given(turn=turns(), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_any_turn_assembles_exactly_at_any_cutting(
    provider: str, turn: Turn, cuts: list[int]
) -> None:
    body = body_of(provider, turn)
    round_ = parse(provider, split_at(body, sorted(c % (len(body) + 1) for c in cuts)))
    assert round_.ended is RoundEnd.NORMAL
    assert round_.text == "".join(i.text for i in turn.items if isinstance(i, Text))
    assert [(c.name, c.arguments) for c in round_.calls] == [
        (c.name, json.loads(c.arguments)) for c in turn.calls
    ]
    if provider != "gemini":  # Gemini sends arguments as an object, not as text
        assert [c.arguments_text for c in round_.calls] == [c.arguments for c in turn.calls]
