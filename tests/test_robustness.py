"""Bad input always gets a typed outcome: no crash, no hang, no silent commit."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toollatch import CallState, RoundEnd, Limits, StreamParser
from toollatch._errors import UsageError
from toollatch.testing import sse
from toollatch.messages import error_results

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"]
FRAMINGS = ["sse", "jsonl", "eventstream"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "index", "id", "name", "delta", "choices", "tool_calls",
                         "function", "arguments", "finish_reason", "content_block",
                         "partial_json", "candidates", "content", "parts", "functionCall",
                         "args", "item", "item_id", "contentBlockDelta", "messageStop",
                         "stopReason", "stop_reason", "usage"]),
        inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("provider", PROVIDERS)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_bytes_never_raise_and_never_commit(provider, framing, chunks):
    parser = StreamParser(provider, framing=framing, limits=Limits(max_line_bytes=256))
    for chunk in chunks:
        parser.feed(chunk)
    round_ = parser.finish()
    assert round_.committed() == () or round_.ended is RoundEnd.NORMAL


@pytest.mark.parametrize("provider", PROVIDERS)
@given(events=st.lists(json_values, max_size=12))
def test_arbitrary_json_events_never_raise(provider, events):
    data = sse(*(json.dumps(e) for e in events))
    parser = StreamParser(provider)
    parser.feed(data)
    round_ = parser.finish()
    for call in round_.calls:
        assert call.state in (CallState.COMMITTED, CallState.FAILED, CallState.CANCELLED)
        assert (call.state is CallState.COMMITTED) == (call.committed is not None)
        if call.state is CallState.COMMITTED:
            assert round_.choices[call.key.choice].ended is RoundEnd.NORMAL
    assert len(error_results(round_)) == sum(c.committed is None for c in round_.calls)


def test_an_over_long_line_fails_the_stream_with_a_typed_reason():
    parser = StreamParser("openai_chat", limits=Limits(max_line_bytes=1000))
    parser.feed(b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a",'
                b' "function": {"name": "f", "arguments": ""}}]}}]}\n\n')
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
    assert round_.ended is RoundEnd.INTERRUPTED and round_.anomalies[0].kind.value == "framing_error"
