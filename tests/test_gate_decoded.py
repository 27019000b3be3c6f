"""The gate's two input forms: argument text (one strict parse) and a value the stream
already decoded (``DecodedArguments``, Gemini's ``args`` object). For any value and its
canonical text, both forms give the same committed call or the same rejection code."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import ErrorCode, Limits, RoundEnd, StreamParser, UsageError
from toollatch.stages import (
    ArgsDelta,
    Assembler,
    CallClosed,
    CallKey,
    CallOpened,
    DecodedArguments,
    Frame,
    Gate,
    GeminiAdapter,
    Rejection,
    RoundEnded,
)

KEY = CallKey(0, 0, 0)
SCHEMA_TOOLS = [{"name": "f", "input_schema": {"type": "object", "maxProperties": 3}}]

# Exact JSON types, and what a parse of text never yields in a string: lone surrogates.
_LEAVES = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["\ud800", "a\udfffb", "é\U0001f600", "\x00\u2028"]),
    st.integers(),
    st.sampled_from([2**64, -(2**70), 10**600, 2**53 + 1]),
    st.floats(),  # NaN and infinities included: neither form may let them through
    st.sampled_from([-0.0, 1e-05, 1e16, 5e-324]),
    st.booleans(),
    st.none(),
)
TREES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3) | st.sampled_from(["\ud800", "k"]), inner, max_size=3)
    ),
    max_leaves=12,
)


def _typed(value: Any) -> Any:
    """``value`` with its types and key order spelled out (``==`` ignores both)."""
    if isinstance(value, dict):
        return ("dict", [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


def _verdict(gate: Gate, text: str, decoded: DecodedArguments | None) -> Any:
    verdict = gate.check(key=KEY, position=0, call_id="c1", name="f", text=text, decoded=decoded)
    if isinstance(verdict, Rejection):
        return ("rejected", verdict.code)
    return ("committed", _typed(verdict.arguments), verdict.arguments_text, verdict.name)


def _canonical(value: Any) -> str:
    """The text an adapter writes for a value (NaN spelled out: the text route refuses it)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _decoded(value: Any, text: str) -> DecodedArguments:
    return DecodedArguments(value=value, nbytes=len(text.encode("utf-8", "surrogatepass")))


@settings(max_examples=500)
@given(TREES, st.integers(1, 5), st.booleans())
def test_the_decoded_value_and_its_text_get_the_same_verdict(
    value: Any, depth: int, schema: bool
) -> None:
    try:
        text = _canonical(value)
    except ValueError:  # an int over the digits Python writes: no adapter has a text
        return
    gate = Gate(SCHEMA_TOOLS if schema else None, limits=Limits(max_json_depth=depth))
    assert _verdict(gate, text, _decoded(value, text)) == _verdict(gate, text, None)


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ({"a": math.nan}, ErrorCode.INVALID_JSON),
        ({"a": [math.inf]}, ErrorCode.INVALID_JSON),
        ({"a": "\ud800"}, ErrorCode.INVALID_JSON),
        ({"\udc00": 1}, ErrorCode.INVALID_JSON),
        ({"a": {"b": {"c": {}}}}, ErrorCode.DEPTH_EXCEEDED),  # depth 3 over a limit of 2
        ([1], ErrorCode.ARGUMENTS_NOT_OBJECT),
    ],
)
def test_each_strict_rule_holds_for_a_decoded_value(value: Any, code: ErrorCode) -> None:
    text = _canonical(value)
    gate = Gate(limits=Limits(max_json_depth=2))
    assert _verdict(gate, text, _decoded(value, text)) == ("rejected", code)
    assert _verdict(gate, text, None) == ("rejected", code)


class _Str(str):
    pass


@pytest.mark.parametrize(
    "value",
    [{"a": _Str("x")}, {1: 2}, {"a": (1, 2)}, {"a": b"x"}, {"a": {"b": {1.5: None}}}],
)
def test_a_decoded_value_no_parse_could_give_is_refused(value: Any) -> None:
    """What the adapter's contract rules out is still refused, never committed."""
    verdict = Gate().check(
        key=KEY, position=0, call_id="c1", name="f", text="{}", decoded=_decoded(value, "{}")
    )
    assert isinstance(verdict, Rejection)
    assert verdict.code is ErrorCode.INVALID_JSON


def test_only_decoded_arguments_are_taken() -> None:
    with pytest.raises(UsageError, match="DecodedArguments"):
        Gate().check(key=KEY, position=0, call_id="c", name="f", text="{}", decoded={})  # type: ignore[arg-type]


def _round(*fragments: ArgsDelta) -> Any:
    asm = Assembler()
    asm.feed(CallOpened(key=KEY, call_id="c1", name="f"))
    for delta in fragments:
        asm.feed(delta)
    asm.feed(CallClosed(key=KEY))
    asm.feed(RoundEnded(ending=RoundEnd.NORMAL, stop_reason="STOP"))
    return asm.finish()


def test_the_assembler_hands_the_decoded_value_to_the_gate() -> None:
    value = {"path": "a.md", "n": [1, 2.5]}
    text = _canonical(value)
    decoded = _decoded(value, text)
    (call,) = _round(ArgsDelta(key=KEY, fragment=text, decoded=decoded)).calls
    assert call.committed is not None
    assert call.arguments is value  # not parsed again
    assert call.arguments_text == text
    assert call.argument_bytes == decoded.nbytes
    # An empty fragment after it leaves the text as it was: the value still stands for it.
    (call,) = _round(
        ArgsDelta(key=KEY, fragment=text, decoded=decoded), ArgsDelta(key=KEY, fragment="")
    ).calls
    assert call.arguments is value


def test_a_decoded_value_does_not_stand_for_text_appended_to_it() -> None:
    value = {"a": 1}
    text = _canonical(value)
    # The text then reads {"a":1}} : what the gate parses is the whole text, never the value.
    (call,) = _round(
        ArgsDelta(key=KEY, fragment=text, decoded=_decoded(value, text)),
        ArgsDelta(key=KEY, fragment="}"),
    ).calls
    assert call.committed is None
    assert call.error is ErrorCode.INVALID_JSON
    # Text before it: the value is not the call's first text, so it is not kept.
    (call,) = _round(
        ArgsDelta(key=KEY, fragment=" "),
        ArgsDelta(key=KEY, fragment=text, decoded=_decoded(value, text)),
    ).calls
    assert call.committed is not None
    assert call.arguments == value
    assert call.arguments is not value


def _gemini_stream(args: Any) -> bytes:
    """A Gemini ``alt=sse`` stream with one whole ``functionCall`` (lone surrogates escaped,
    as json writes them: the adapter reads those as U+FFFD)."""
    part = {"functionCall": {"name": "f", "id": "c1", "args": args}}
    chunks = [
        {"candidates": [{"content": {"parts": [part], "role": "model"}, "index": 0}]},
        {"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}]},
    ]
    return b"".join(
        b"data: " + json.dumps(c, allow_nan=False).encode() + b"\r\n\r\n" for c in chunks
    )


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=3), TREES, max_size=4), st.integers(1, 5))
def test_gemini_calls_commit_as_their_text_would(args: dict[str, Any], depth: int) -> None:
    """Through the real adapter (which hands the gate its decoded ``args``): the call's
    verdict is the one the gate gives its canonical text alone."""
    try:
        data = _gemini_stream(args)
    except ValueError:  # NaN and the like: json.dumps writes them, no model sends them
        return
    limits = Limits(max_json_depth=depth)
    parser = StreamParser("gemini", limits=limits)
    parser.feed(data)
    calls = parser.finish().calls
    if not calls:  # orjson refuses ints over 64 bits: the chunk is lost, no call is made
        assert any(type(v) is int and v.bit_length() > 64 for v in _leaves(args))
        return
    (call,) = calls
    text_route = Gate(limits=limits).check(
        key=call.key, position=0, call_id="c1", name="f", text=call.arguments_text
    )
    if call.committed is None:
        assert isinstance(text_route, Rejection)
        assert text_route.code is call.error
    else:
        assert not isinstance(text_route, Rejection)
        assert _typed(call.arguments) == _typed(text_route.arguments)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in (k, *_leaves(v))]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def test_gemini_hands_on_only_a_value_it_decoded_itself() -> None:
    """A caller's dict may change after ``feed``: its arguments go on as text only. The
    adapter's own decode of a frame goes on decoded, with the text's UTF-8 size."""
    args = {"path": "é.md", "n": [1, 2]}
    chunk = {
        "candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": args}}]}}]
    }
    (given,) = [e for e in GeminiAdapter().feed(chunk) if isinstance(e, ArgsDelta)]
    assert given.decoded is None
    frame = Frame("message", json.dumps(chunk))
    (own,) = [e for e in GeminiAdapter().feed_frame(frame) if isinstance(e, ArgsDelta)]
    assert own.decoded is not None
    assert own.decoded.value == args
    assert own.decoded.value is not args
    assert own.decoded.nbytes == len(own.fragment.encode())
    assert own == given  # (the value is not compared: it is what the text says)


def test_a_cycle_or_a_shared_container_in_a_decoded_value() -> None:
    """No hang: a cycle has no JSON text (json.dumps refuses it) and fails as too deep; a
    container shared by two members is written twice and parsed as two: it commits alike."""
    cycle: dict[str, Any] = {}
    cycle["a"] = [cycle]
    verdict = Gate().check(
        key=KEY, position=0, call_id="c1", name="f", text="{}", decoded=_decoded(cycle, "{}")
    )
    assert isinstance(verdict, Rejection)
    assert verdict.code is ErrorCode.DEPTH_EXCEEDED
    shared = [1, {"b": None}]
    value = {"x": shared, "y": shared}
    text = _canonical(value)
    assert _verdict(Gate(), text, _decoded(value, text)) == _verdict(Gate(), text, None)


def test_a_wrong_byte_size_does_not_get_past_the_limit() -> None:
    """``nbytes`` spares the assembler a count, never its limit: a size no UTF-8 text of
    that length has is measured again."""
    value = {"a": "x" * 100}
    text = _canonical(value)
    asm = Assembler(limits=Limits(max_argument_bytes=50))
    asm.feed(CallOpened(key=KEY, call_id="c1", name="f"))
    asm.feed(ArgsDelta(key=KEY, fragment=text, decoded=DecodedArguments(value=value, nbytes=1)))
    asm.feed(CallClosed(key=KEY))
    asm.feed(RoundEnded(ending=RoundEnd.NORMAL, stop_reason="STOP"))
    (call,) = asm.finish().calls
    assert call.committed is None
    assert call.error is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES
