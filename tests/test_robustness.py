"""Bad input always gets a typed outcome: no crash, no hang, no silent commit.

The two commit properties run on provider-shaped streams (one to three calls, built by
``test_hostile.BUILDERS``), so that the commit asserts see calls: damaged bytes (cut, a byte
flipped, junk spliced in) in random reads, and native events with one field set to a value of
another JSON type. Each leaves some examples undamaged, which must commit every call;
``test_most_examples_carry_calls`` draws each property's examples deterministically and checks
how many carry calls and commit some (Hypothesis's ``event`` statistics show the same split
per example kind with ``--hypothesis-show-statistics``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from test_adapter_bedrock import es_message
from test_hostile import BUILDERS, Stream, _calls
from toollatch import CallState, Limits, Round, RoundEnd, StreamParser, UsageError
from toollatch.stages import (
    AnomalyKind,
    EventStreamDecoder,
    JSONLinesDecoder,
    SSEDecoder,
    error_results,
)
from toollatch.testing import sse

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"]
FRAMINGS = ["sse", "jsonl", "eventstream"]
SHAPED = [(p, f) for p in PROVIDERS for f in ("sse", "jsonl")] + [("bedrock", "eventstream")]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "index",
                    "id",
                    "name",
                    "delta",
                    "choices",
                    "tool_calls",
                    "function",
                    "arguments",
                    "finish_reason",
                    "content_block",
                    "partial_json",
                    "candidates",
                    "content",
                    "parts",
                    "functionCall",
                    "args",
                    "item",
                    "item_id",
                    "contentBlockDelta",
                    "messageStop",
                    "stopReason",
                    "stop_reason",
                    "usage",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


def _expected(calls: list[tuple[str, str, list[str]]]) -> set[tuple[str, str]]:
    """(name, canonical arguments) of every call a stream was built with."""
    return {(name, json.dumps(json.loads(text), sort_keys=True)) for name, text, _ in calls}


def _committed(round_: Round) -> list[tuple[str, str]]:
    return [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in round_.committed()]


def _check_outcomes(round_: Round) -> None:
    """What holds for every round, whatever came in."""
    for call in round_.calls:
        assert call.state in (CallState.COMMITTED, CallState.FAILED, CallState.CANCELLED)
        assert (call.state is CallState.COMMITTED) == (call.committed is not None)
        if call.state is CallState.COMMITTED:
            assert round_.choices[call.key.choice].ended is RoundEnd.NORMAL
    assert len(error_results(round_)) == sum(c.committed is None for c in round_.calls)


# -- damaged bytes ---------------------------------------------------------------------------


def _wire(stream: Stream, framing: str) -> tuple[bytes, list[int]]:
    """The stream's bytes in ``framing``, and the offset where each event's bytes end."""
    out, ends = b"", []
    for text, name in zip(stream.texts, stream.names, strict=True):
        if framing == "eventstream":
            ((key, inner),) = json.loads(text).items()
            out += es_message(key, orjson.dumps(inner))
        elif framing == "jsonl":
            out += text.encode() + b"\n"
        else:
            out += (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()
        ends.append(len(out))
    return out, ends


def _end_event(stream: Stream, framing: str) -> int:
    """Index of the event whose arrival ends the round normally (replayed prefix by prefix)."""
    wire, ends = _wire(stream, framing)
    for index, end in enumerate(ends):
        parser = StreamParser(stream.provider, framing=framing)
        parser.feed(wire[:end])
        if parser.finish().ended is RoundEnd.NORMAL:
            return index
    raise AssertionError("the undamaged stream never ends normally")


@st.composite
def damaged_bytes(draw: st.DrawFn, provider: str, framing: str) -> dict[str, Any]:
    calls = draw(_calls())
    stream = BUILDERS[provider](calls)
    wire, ends = _wire(stream, framing)
    end_index = _end_event(stream, framing)
    # The last byte of the ending event's JSON text (SSE: before "\n\n"; JSON Lines: before
    # "\n"; event stream: its message CRC); cut before it, the event cannot be read whole.
    tail = {"sse": 2, "jsonl": 1, "eventstream": 0}[framing]
    last = ends[end_index] - tail - 1
    how = draw(st.sampled_from(["none", "cut", "flip", "splice"]))
    at = draw(st.integers(0, len(wire) - 1))
    if how == "cut":
        at = min(at, last)
        wire = wire[:at]
    elif how == "flip":
        wire = wire[:at] + bytes([wire[at] ^ draw(st.integers(1, 255))]) + wire[at + 1 :]
    elif how == "splice":
        wire = wire[:at] + draw(st.binary(min_size=1, max_size=16)) + wire[at:]
    cuts = draw(st.lists(st.integers(0, len(wire)), max_size=6))
    return {
        "provider": provider,
        "framing": framing,
        "calls": calls,
        "stream": stream,
        "how": how,
        "at": at,
        "last": last,
        "wire": wire,
        "cuts": cuts,
    }


def _run_bytes(case: dict[str, Any]) -> Round:
    """The property for one damaged stream, fed in random reads; returns its round."""
    parser = StreamParser(case["provider"], framing=case["framing"])
    wire = case["wire"]
    for a, b in itertools.pairwise([0, *sorted(case["cuts"]), len(wire)]):
        parser.feed(wire[a:b])
    round_ = parser.finish()
    _check_outcomes(round_)
    how, committed = case["how"], _committed(round_)
    if how == "none":
        assert sorted(committed) == sorted(_expected(case["calls"]))
    elif how == "cut":
        # A stream cut before the end of its ending event never commits anything.
        assert committed == []
        assert round_.ended is not RoundEnd.NORMAL
    elif how == "flip" and case["framing"] == "eventstream" and case["at"] <= case["last"]:
        assert committed == []  # (every message is CRC-checked)
    return round_


@pytest.mark.parametrize(("provider", "framing"), SHAPED)
@given(data=st.data())
def test_damaged_bytes_never_raise_and_commit_only_after_the_end(provider, framing, data):
    case = data.draw(damaged_bytes(provider, framing))
    round_ = _run_bytes(case)
    event(f"{case['how']}: {'a call committed' if round_.committed() else 'nothing committed'}")


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("provider", PROVIDERS)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_bytes_never_raise_and_never_commit(provider, framing, chunks):
    # Noise: no call can be spelled by chance, so nothing commits (and nothing raises).
    parser = StreamParser(provider, framing=framing, limits=Limits(max_line_bytes=256))
    for chunk in chunks:
        parser.feed(chunk)
    round_ = parser.finish()
    _check_outcomes(round_)
    assert round_.committed() == ()


# -- native events with a field of another type ------------------------------------------------


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every member path in ``value``, leaving out Gemini's ``args`` (the model's own value:
    whatever it holds, the model sent it)."""
    found = []
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        if key == "args":
            continue
        found.append((*path, key))
        if isinstance(child, (dict, list)):
            found += _paths(child, (*path, key))
    return found


def _json_type(value: Any) -> str:
    return type(value).__name__


def _guarded(provider: str, path: tuple[Any, ...]) -> bool:
    """Whether the property covers a retyped ``path``: every path, for every provider."""
    return True


@st.composite
def retyped_events(draw: st.DrawFn, provider: str) -> dict[str, Any]:
    calls = draw(_calls())
    stream = BUILDERS[provider](calls)
    natives = [json.loads(t) for t in stream.texts if t != "[DONE]"]
    how = draw(st.sampled_from(["none", "retype", "retype"]))
    if how == "retype":
        at = draw(st.integers(0, len(natives) - 1))
        paths = [p for p in _paths(natives[at]) if _guarded(provider, p)]
        if not paths:
            return draw(retyped_events(provider))  # (an event with no covered member)
        path = draw(st.sampled_from(paths))
        parent = natives[at]
        for key in path[:-1]:
            parent = parent[key]
        old = parent[path[-1]]
        value = json_values.filter(lambda v: _json_type(v) != _json_type(old))
        if provider == "openai_chat" and path[-1] == "tool_calls":
            # The one documented residual: a delta's "tool_calls": null reads as "not sent"
            # (the official SDK's objects dump every unset member of a delta as None).
            value = value.filter(lambda v: v is not None)
        parent[path[-1]] = draw(value)
    return {"provider": provider, "calls": calls, "stream": stream, "how": how, "natives": natives}


def _run_retyped(case: dict[str, Any]) -> Round:
    parser = StreamParser(case["provider"])
    for native in case["natives"]:
        parser.feed_event(native)
    round_ = parser.finish()
    _check_outcomes(round_)
    committed, expected = _committed(round_), _expected(case["calls"])
    if case["how"] == "none":
        assert sorted(committed) == sorted(expected)
    # A value of the wrong type is never read as another value: whatever commits is a call
    # the model made, with its arguments. The one reading by rule: chat arguments retyped to
    # an object, alone in their call, are that call's whole arguments (rule object_arguments,
    # quirk Q9: llama.cpp, TGI, Ollama), recorded as an object_arguments anomaly.
    assert set(committed) <= expected | _object_arguments(case, round_)
    return round_


def _object_arguments(case: dict[str, Any], round_: Round) -> set[tuple[str, str]]:
    """(name, arguments) a chat call may commit from arguments sent as a JSON object."""
    if case["provider"] != "openai_chat" or not any(
        a.kind is AnomalyKind.OBJECT_ARGUMENTS for a in round_.anomalies
    ):
        return set()
    objects = [
        entry["function"]["arguments"]
        for native in case["natives"]
        for choice in native.get("choices") or []
        if isinstance(choice, dict) and isinstance(choice.get("delta"), dict)
        for entry in choice["delta"].get("tool_calls") or []
        if isinstance(entry, dict)
        and isinstance(entry.get("function"), dict)
        and isinstance(entry["function"].get("arguments"), dict)
    ]
    names = {name for name, _, _ in case["calls"]}
    return {(n, json.dumps(o, sort_keys=True)) for n in names for o in objects}


@pytest.mark.parametrize("provider", PROVIDERS)
@given(data=st.data())
def test_a_field_of_another_type_never_commits_other_arguments(provider, data):
    case = data.draw(retyped_events(provider))
    round_ = _run_retyped(case)
    event(f"{case['how']}: {'a call committed' if round_.committed() else 'nothing committed'}")


@pytest.mark.parametrize("provider", PROVIDERS)
@given(events=st.lists(json_values, max_size=12))
def test_arbitrary_json_events_never_raise(provider, events):
    data = sse(*(json.dumps(e) for e in events))
    parser = StreamParser(provider)
    parser.feed(data)
    _check_outcomes(parser.finish())


# -- the properties see calls --------------------------------------------------------------------


def _draw_rounds(strategy: st.SearchStrategy[dict[str, Any]], run: Any, n: int) -> list[Round]:
    rounds: list[Round] = []

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate])
    @given(case=strategy)
    def collect(case: dict[str, Any]) -> None:
        rounds.append(run(case))

    collect()
    return rounds


@pytest.mark.parametrize(
    ("name", "make", "run"),
    [
        ("damaged bytes", lambda p: damaged_bytes(p, "sse"), _run_bytes),
        ("retyped events", retyped_events, _run_retyped),
    ],
)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_most_examples_carry_calls(provider, name, make, run):
    rounds = _draw_rounds(make(provider), run, 100)
    with_calls = sum(bool(r.calls) for r in rounds)
    committing = sum(bool(r.committed()) for r in rounds)
    assert with_calls >= 0.75 * len(rounds), (name, with_calls, len(rounds))
    assert committing >= 0.25 * len(rounds), (name, committing, len(rounds))


# -- OpenAI chat: unreadable members of a chunk are lost events (rule "unreadable_is_lost") ------

_HEAD = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": ""}}
_FRAGMENT = {
    "choices": [
        {
            "index": 0,
            "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "a"}'}}]},
        }
    ]
}
_FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}


def _chat_round(*natives: dict[str, Any]) -> Round:
    parser = StreamParser("openai_chat")
    for native in natives:
        parser.feed_event(native)
    return parser.finish()


@pytest.mark.parametrize("index", [None, [0], 0.5, {"i": 0}])
def test_a_call_whose_index_is_unreadable_does_not_commit_without_its_fragments(index):
    # The head's index is junk, so the call is keyed as "no index" (Q1); the fragment at
    # index 0 opens another call (failed: no name) and the first commits {}.
    round_ = _chat_round(
        {"choices": [{"index": 0, "delta": {"tool_calls": [{**_HEAD, "index": index}]}}]},
        _FRAGMENT,
        _FINISH,
    )
    assert [c.arguments for c in round_.committed()] in ([], [{"path": "a"}])


@pytest.mark.parametrize(
    "unreadable",
    [
        {"choices": "x"},
        {"choices": [None]},
        {"choices": [{"index": 0, "delta": 3}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": {"index": 0}}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [[0]]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]},
    ],
)
def test_a_chunk_with_an_unreadable_part_fails_the_pending_call(unreadable):
    # It may have carried the open call's only fragment (a lost event); it is skipped like a
    # usage-only chunk (Q21) and the call commits {}.
    head = {"choices": [{"index": 0, "delta": {"tool_calls": [_HEAD]}}]}
    round_ = _chat_round(head, unreadable, _FINISH)
    assert round_.committed() == ()


# -- fixed cases ---------------------------------------------------------------------------------


def test_an_over_long_line_fails_the_stream_with_a_typed_reason():
    parser = StreamParser("openai_chat", limits=Limits(max_line_bytes=1000))
    parser.feed(
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a",'
        b' "function": {"name": "f", "arguments": ""}}]}}]}\n\n'
    )
    parser.feed(b"data: " + b"x" * 5000)
    round_ = parser.finish()
    assert round_.ended is RoundEnd.INTERRUPTED
    assert [a.kind.value for a in round_.anomalies] == ["framing_error"]
    assert round_.calls[0].error.value == "stream_interrupted"
    with pytest.raises(UsageError):  # feeding after finish() is misuse (issue 12)
        parser.feed(b"data: more\n\n")


def test_corrupt_eventstream_frame_is_a_framing_error_not_a_crash():
    parser = StreamParser("bedrock", framing="eventstream")
    parser.feed(b"\x00\x00\x00\x20\x00\x00\x00\x00" + b"\xff" * 40)
    round_ = parser.finish()
    assert round_.ended is RoundEnd.INTERRUPTED
    assert round_.anomalies[0].kind.value == "framing_error"


# -- finish() twice, on each stage ---------------------------------------------------------------


@pytest.mark.parametrize(
    "decoder", [SSEDecoder, JSONLinesDecoder, EventStreamDecoder], ids=lambda d: d.__name__
)
def test_a_decoder_finished_twice_raises_usage_error(decoder):
    stage = decoder()
    assert stage.finish() == []
    with pytest.raises(UsageError):
        stage.finish()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_adapter_finished_twice_raises_usage_error(provider):
    adapter = StreamParser(provider).adapter
    adapter.finish()
    with pytest.raises(UsageError):
        adapter.finish()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_assembler_and_the_parser_finished_twice_return_the_same_round(provider):
    stream = BUILDERS[provider]([("f0", '{"n": 1}', ['{"n": ', "1}"])])
    wire, _ = _wire(stream, stream.framing)
    parser = StreamParser(provider, framing=stream.framing)
    parser.feed(wire)
    first = parser.finish()
    assert [c.arguments for c in first.committed()] == [{"n": 1}]
    assert parser.finish() == first
    assert parser.assembler.finish() == first
    cancelled = StreamParser(provider, framing=stream.framing)
    cancelled.feed(wire[: len(wire) // 2])
    round_ = cancelled.cancel()
    assert cancelled.finish() == round_  # (cancel decided the round: finish returns it)


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "bedrock"])
def test_an_error_payload_nested_too_deep_to_print_is_a_failed_stream(provider):
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    parser = StreamParser(provider)
    parser.feed_event({"type": "error", "error": {"type": "overloaded", "message": deep}})
    parser.feed(
        b'event: error\ndata: {"error": {"message": ' + b"[" * 5000 + b"]" * 5000 + b"}}\n\n"
    )
    round_ = parser.finish()
    assert round_.committed() == ()
