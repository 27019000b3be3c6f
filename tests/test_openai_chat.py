"""OpenAI Chat Completions end to end: wire bytes -> Round, every scenario at every chunking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter_doubles import counting, general_only
from chat_chunks import USAGE, WEATHER_TOOLS, chunk, fragments, tc
from toollatch import CallState, ErrorCode, Limits, RoundEnd, StreamParser
from toollatch.stages import Frame, OpenAIChatAdapter, assistant_messages, error_results
from toollatch.testing import chunkings, replay, split_at, sse, summary

CITY = '{"city": "Paris", "days": 3}'

SINGLE = sse(
    chunk({"role": "assistant", "content": None, **tc(0, "call_A", "get_weather", "")}),
    *fragments(0, CITY, 4),
    chunk(finish="tool_calls"),
    USAGE,
    done=True,
)

PARALLEL = sse(
    chunk(tc(0, "call_A", "get_weather", "")),
    *fragments(0, CITY, 5),
    chunk(tc(1, "call_B", "get_time", "")),
    *fragments(1, "{}", 1),
    chunk(finish="tool_calls"),
    done=True,
)

# bifrost#1829 / vercel/ai#18333: fragments of parallel calls interleaved 0,1,0,1.
_a, _b = fragments(0, CITY, 3), fragments(1, '{"city": "Rome"}', 3)
INTERLEAVED = sse(
    chunk(tc(0, "call_A", "get_weather", "")),
    chunk(tc(1, "call_B", "get_weather", "")),
    *[c for pair in zip(_a, _b + [chunk()] * len(_a), strict=False) for c in pair],
    *_b[len(_a) :],
    chunk(finish="tool_calls"),
    done=True,
)

NO_ARGS = sse(chunk(tc(0, "call_T", "get_time", "")), chunk(finish="tool_calls"), done=True)

TRUNCATED = sse(
    chunk(tc(0, "call_A", "get_weather", "")),
    *fragments(0, '{"city": "Pa', 3),
    chunk(finish="length"),
    done=True,
)

INTERRUPTED = sse(chunk(tc(0, "call_A", "get_weather", "")), *fragments(0, CITY, 4))

INVALID = sse(
    chunk(tc(0, "call_A", "get_weather", "")),
    *fragments(0, '{"city": "Paris",}', 4),
    chunk(finish="tool_calls"),
    done=True,
)

SCENARIOS = {
    "single": SINGLE,
    "parallel": PARALLEL,
    "interleaved": INTERLEAVED,
    "no_args": NO_ARGS,
    "truncated": TRUNCATED,
    "interrupted": INTERRUPTED,
    "invalid": INVALID,
}


def states(round_):
    return [(c.call_id, c.name, c.state, c.error) for c in round_.calls]


def test_single_call_commits_with_parsed_arguments():
    r = replay(SINGLE, "openai_chat", tools=WEATHER_TOOLS)
    assert r.ended is RoundEnd.NORMAL and r.stop_reason == "tool_calls"
    assert states(r) == [("call_A", "get_weather", CallState.COMMITTED, None)]
    assert r.calls[0].arguments == {"city": "Paris", "days": 3}
    assert r.calls[0].arguments_text == CITY
    assert r.usage == USAGE["usage"]
    assert error_results(r) == []
    assert [c.call_id for c in r.committed()] == ["call_A"]


def test_parallel_calls_keep_their_own_buffers():
    r = replay(PARALLEL, "openai_chat", tools=WEATHER_TOOLS)
    assert states(r) == [
        ("call_A", "get_weather", CallState.COMMITTED, None),
        ("call_B", "get_time", CallState.COMMITTED, None),
    ]
    assert [c.arguments for c in r.calls] == [{"city": "Paris", "days": 3}, {}]


def test_interleaved_fragments_are_not_mixed():
    r = replay(INTERLEAVED, "openai_chat", tools=WEATHER_TOOLS)
    assert [c.arguments for c in r.calls] == [{"city": "Paris", "days": 3}, {"city": "Rome"}]


def test_no_argument_call_means_empty_object():
    r = replay(NO_ARGS, "openai_chat", tools=WEATHER_TOOLS)
    assert r.calls[0].state is CallState.COMMITTED and r.calls[0].arguments == {}


def test_truncated_round_fails_every_call_even_if_text_would_parse():
    # vercel/ai#19063: tools must not run after a `length` finish reason.
    r = replay(TRUNCATED, "openai_chat")
    assert r.ended is RoundEnd.TRUNCATED
    assert states(r) == [("call_A", "get_weather", CallState.FAILED, ErrorCode.TRUNCATED)]
    [result] = error_results(r)
    assert result.tool_call_id == "call_A" and result.is_error
    assert result.content.startswith("truncated: ")
    assert '"Pa' not in result.content  # never echoes the argument text


def test_parsable_prefix_is_not_an_end():
    # vercel/ai#13137: '{"query": "test"}' is valid JSON while "limit" is still streaming.
    data = sse(chunk(tc(0, "c1", "search", "")), chunk(tc(0, args='{"query": "test"}')))
    parser = StreamParser("openai_chat")
    assert parser.feed(data) == []
    r = parser.finish()
    assert r.ended is RoundEnd.INTERRUPTED
    assert r.calls[0].state is CallState.FAILED
    assert r.calls[0].error is ErrorCode.STREAM_INTERRUPTED


def test_interrupted_stream_fails_with_stream_interrupted():
    r = replay(INTERRUPTED, "openai_chat")
    assert r.ended is RoundEnd.INTERRUPTED
    assert r.calls[0].error is ErrorCode.STREAM_INTERRUPTED
    assert r.error and "finish_reason" in r.error


def test_invalid_json_fails_and_is_never_repaired():
    r = replay(INVALID, "openai_chat", tools=WEATHER_TOOLS)
    assert states(r) == [("call_A", "get_weather", CallState.FAILED, ErrorCode.INVALID_JSON)]
    assert r.calls[0].arguments is None


@pytest.mark.parametrize("reason", ["tool_calls", "stop"])
def test_tool_calls_and_stop_both_end_normally(reason):
    # vllm#25054: OpenAI itself sends "stop" for a forced tool_choice.
    data = sse(chunk(tc(0, "c", "get_time", "{}")), chunk(finish=reason), done=True)
    r = replay(data, "openai_chat")
    assert r.ended is RoundEnd.NORMAL and r.calls[0].state is CallState.COMMITTED


def test_finish_reason_on_the_same_chunk_as_the_last_fragment():
    # Q13 (rust-genai#164, vllm#36944): the delta is applied before the finish reason.
    data = sse(
        chunk(tc(0, "c", "get_weather", '{"city":')), chunk(tc(0, args='"Oslo"}'), "tool_calls")
    )
    r = replay(data, "openai_chat")
    assert r.calls[0].arguments == {"city": "Oslo"}


@pytest.mark.parametrize(
    ("reason", "ending", "code"),
    [
        ("length", RoundEnd.TRUNCATED, ErrorCode.TRUNCATED),
        ("content_filter", RoundEnd.INTERRUPTED, ErrorCode.STREAM_INTERRUPTED),
        ("something_new", RoundEnd.INTERRUPTED, ErrorCode.STREAM_INTERRUPTED),
    ],
)
def test_other_finish_reasons_never_commit(reason, ending, code):
    data = sse(chunk(tc(0, "c", "get_time", "{}")), chunk(finish=reason), done=True)
    r = replay(data, "openai_chat")
    assert r.ended is ending and r.stop_reason == reason
    assert r.calls[0].error is code


def test_done_without_finish_reason_ends_normally_with_an_anomaly():
    data = sse(chunk(tc(0, "c", "get_time", "{}")), done=True)
    r = replay(data, "openai_chat")
    assert r.ended is RoundEnd.NORMAL and r.calls[0].state is CallState.COMMITTED
    assert [a.kind.value for a in r.anomalies] == ["done_without_finish_reason"]


def test_usage_only_and_empty_object_chunks_are_ignored():
    # Q21: Azure async content filter chunks have an empty "object" and no choices.
    azure = {
        "id": "",
        "object": "",
        "created": 0,
        "model": "",
        "choices": [],
        "prompt_filter_results": [{"prompt_index": 0}],
    }
    data = sse(
        azure,
        chunk(tc(0, "c", "get_time", "{}")),
        {"choices": []},
        chunk(finish="stop"),
        USAGE,
        done=True,
    )
    r = replay(data, "openai_chat")
    assert r.calls[0].state is CallState.COMMITTED and r.anomalies == ()


def test_repeated_identical_id_and_name_are_no_ops():
    # Q3 langchain4j#4544, Q5 langchain#40044 / llama.cpp#13800: never "get_timeget_time".
    data = sse(
        chunk(tc(0, "c", "get_weather", '{"city"')),
        chunk(tc(0, "c", "get_weather", ': "Oslo"}')),
        chunk(finish="tool_calls"),
    )
    r = replay(data, "openai_chat", tools=WEATHER_TOOLS)
    assert states(r) == [("c", "get_weather", CallState.COMMITTED, None)]
    assert r.anomalies == ()


def test_a_different_name_on_an_open_call_is_a_protocol_violation():
    data = sse(
        chunk(tc(0, "c", "get_weather", '{"city"')),
        chunk(tc(0, None, "get_time", ': "Oslo"}')),
        chunk(finish="tool_calls"),
    )
    r = replay(data, "openai_chat")
    assert r.calls[0].error is ErrorCode.PROTOCOL_VIOLATION
    assert [a.kind.value for a in r.anomalies] == ["name_changed"]


def test_oversized_arguments_fail_and_stop_buffering():
    # the call before the oversized one is still open (chat closes calls at the round's end),
    # so the round goes on and it commits; the oversized call's text is not kept
    big = '{"content": "' + "x" * 5000 + '"}'
    data = sse(
        chunk(tc(0, "d", "get_time", "{}")),
        chunk(tc(1, "c", "write_file", "")),
        *fragments(1, big, 97),
        chunk(finish="tool_calls"),
    )
    parser = StreamParser("openai_chat", limits=Limits(max_argument_bytes=1024))
    notices = parser.feed(data)
    assert [(n.call_id, n.code) for n in notices] == [("c", ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES)]
    r = parser.finish()
    assert r.ended is RoundEnd.NORMAL
    assert r.calls[0].state is CallState.COMMITTED
    assert states(r)[1][3] is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES
    assert r.calls[1].arguments_text == ""  # the buffer was released, not kept growing


def test_an_oversized_call_with_nothing_else_open_ends_the_round_limited():
    # nothing else can commit once the only call failed for its size: the round is over
    # there (RoundOver), and what follows (here a later call) is not read
    big = '{"content": "' + "x" * 5000 + '"}'
    data = sse(
        chunk(tc(0, "c", "write_file", "")),
        *fragments(0, big, 97),
        chunk(tc(1, "d", "get_time", "{}")),
        chunk(finish="tool_calls"),
    )
    parser = StreamParser("openai_chat", limits=Limits(max_argument_bytes=1024))
    notices = parser.feed(data)
    assert [type(n).__name__ for n in notices] == ["CallFailed", "RoundOver"]
    assert parser.over
    r = parser.finish()
    assert r.ended is RoundEnd.LIMITED and r.stop_reason is None
    assert [(c.call_id, c.error) for c in r.calls] == [("c", ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES)]
    assert r.calls[0].arguments_text == ""


def test_byte_limit_counts_utf8_bytes_not_characters():
    text = '{"s": "' + "é" * 600 + '"}'  # 1211 bytes, 611 characters
    data = sse(chunk(tc(0, "c", "f", text)), chunk(finish="stop"))
    r = replay(data, "openai_chat", limits=Limits(max_argument_bytes=1000))
    assert r.calls[0].error is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES
    r = replay(data, "openai_chat", limits=Limits(max_argument_bytes=1211))
    assert r.calls[0].state is CallState.COMMITTED


def test_too_many_calls_get_failed_placeholders_never_dropped():
    calls = [chunk(tc(i, f"c{i}", "get_time", "{}")) for i in range(5)]
    r = replay(
        sse(*calls, chunk(finish="tool_calls")), "openai_chat", limits=Limits(max_calls_per_round=3)
    )
    assert [c.state for c in r.calls] == [CallState.COMMITTED] * 3 + [CallState.FAILED] * 2
    assert {c.error for c in r.calls[3:]} == {ErrorCode.TOO_MANY_TOOL_CALLS}
    assert [res.tool_call_id for res in error_results(r)] == ["c3", "c4"]


def test_depth_limit():
    deep = '{"a": ' + "[" * 10 + "]" * 10 + "}"
    data = sse(chunk(tc(0, "c", "f", deep)), chunk(finish="stop"))
    assert replay(data, "openai_chat", limits=Limits(max_json_depth=5)).calls[0].error is (
        ErrorCode.DEPTH_EXCEEDED
    )
    assert replay(data, "openai_chat", limits=Limits(max_json_depth=11)).calls[0].arguments


def test_same_call_id_on_two_keys_fails_the_later_call():
    data = sse(
        chunk(tc(0, "dup", "get_time", "{}")),
        chunk(tc(1, "x", "get_time", "{}")),
        chunk({"tool_calls": [{"index": 2, "id": "dup", "function": {"name": "get_time"}}]}),
        chunk(finish="tool_calls"),
    )
    r = replay(data, "openai_chat")
    # A present index wins over a known id: index 2 is a second call reusing "dup".
    assert [(c.call_id, c.state, c.error) for c in r.calls] == [
        ("dup", CallState.COMMITTED, None),
        ("x", CallState.COMMITTED, None),
        ("dup", CallState.FAILED, ErrorCode.DUPLICATE_CALL_ID),
    ]


def test_event_error_mid_stream_interrupts():
    data = sse(chunk(tc(0, "c", "get_time", "{}"))) + (
        b'event: error\ndata: {"error": {"message": "overloaded", "code": "503"}}\n\n'
    )
    r = replay(data, "openai_chat")
    assert r.ended is RoundEnd.INTERRUPTED and r.calls[0].error is ErrorCode.STREAM_INTERRUPTED
    assert "overloaded" in (r.error or "")


def test_text_content_and_reasoning_are_kept():
    data = sse(
        chunk({"reasoning_content": "think "}),
        chunk({"reasoning_content": "more"}),
        chunk({"content": "Let me "}),
        chunk({"content": "check."}),
        chunk(tc(0, "c", "get_time", "{}")),
        chunk(finish="tool_calls"),
    )
    r = replay(data, "openai_chat")
    assert r.text == "Let me check."
    assert [dict(b.data) for b in r.blocks] == [{"reasoning_content": "think more"}]
    msg = assistant_messages(r)[0]
    assert msg["content"] == "Let me check." and msg["reasoning_content"] == "think more"


def test_cancel_mid_stream_cancels_every_call():
    parser = StreamParser("openai_chat")
    parser.feed(sse(chunk(tc(0, "a", "get_time", "{}")), chunk(tc(1, "b", "get_weather", '{"ci'))))
    r = parser.cancel("user pressed stop")
    assert r.ended is RoundEnd.CANCELLED
    assert [(c.state, c.error) for c in r.calls] == [(CallState.CANCELLED, ErrorCode.CANCELLED)] * 2
    results = error_results(r)
    assert [x.tool_call_id for x in results] == ["a", "b"]
    assert all(x.content.startswith("cancelled: user pressed stop") for x in results)
    assert parser.finish() is r


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_is_identical_at_every_standard_chunking(name):
    data = SCENARIOS[name]
    expected = summary(replay(data, "openai_chat", tools=WEATHER_TOOLS))
    for pieces in chunkings(data, seed=len(data)):
        assert summary(replay(pieces, "openai_chat", tools=WEATHER_TOOLS)) == expected


@given(name=st.sampled_from(sorted(SCENARIOS)), data=st.data())
def test_every_scenario_is_identical_at_random_splits(name, data):
    raw = SCENARIOS[name]
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=40))
    expected = summary(replay(raw, "openai_chat", tools=WEATHER_TOOLS))
    assert summary(replay(split_at(raw, cuts), "openai_chat", tools=WEATHER_TOOLS)) == expected


@given(text=st.text(min_size=1, max_size=30), data=st.data())
def test_multibyte_arguments_survive_any_split(text, data):
    # Q18 / kekzl/imp#1554: a code point split across reads must come out intact.
    args = json.dumps({"s": text + "杭州😀"}, ensure_ascii=False)
    raw = sse(chunk(tc(0, "c", "f", args)), chunk(finish="stop"))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=20))
    r = replay(split_at(raw, cuts), "openai_chat")
    assert r.calls[0].arguments == {"s": text + "杭州😀"}


# -- the adapter's fast path -------------------------------------------------------------------


_GeneralOnly = general_only(OpenAIChatAdapter)

# Some compatible servers repeat every field on a continuation, null or empty (OpenAI itself
# sends only "index" and "function.arguments"): still a plain continuation.
_PADDED_CONTINUATION = {
    "role": None,
    "content": None,
    "tool_calls": [
        {"index": 0, "id": None, "type": "function", "function": {"name": "", "arguments": "y"}}
    ],
}


_CHAT_CHUNKS = st.one_of(
    st.sampled_from(
        [
            chunk(tc(0, "call_A", "get_weather", "")),
            chunk(tc(1, "call_B", "get_time", "{")),
            chunk(tc(None, None, None, "x")),  # Q1: no index, no id: the open call
            chunk(tc(0, "call_Z", None, "y")),  # another id on an open index
            chunk(tc(0, None, "other", "y")),  # a name on a continuation
            chunk(tc(0, None, None, "y", extra_content={"google": {"thought_signature": "s"}})),
            chunk({"content": "hi", **tc(0, None, None, "y")}),
            chunk({"reasoning_content": "r", **tc(0, None, None, "y")}),
            chunk(tc(0, None, None, "y"), finish="tool_calls"),
            chunk(tc(0, None, None, "y"), usage={"total_tokens": 1}),
            chunk(tc(0, None, None, "y"), index=1),  # another choice
            chunk(tc(7, None, None, "y")),  # an index never opened
            chunk(tc(0, None, None, {"a": 1})),  # object arguments (Q-rule)
            chunk(_PADDED_CONTINUATION),  # a continuation with its optional fields null
            chunk(finish="tool_calls"),
            {"choices": [], "usage": {"total_tokens": 3}},
            "[DONE]",
        ]
    ),
    st.builds(
        lambda index, text: chunk(tc(index, None, None, text)),
        st.sampled_from([0, 1, True, "0", 1.0]),
        st.sampled_from(["", "{", "é", None, 5]),
    ),
)


@given(st.lists(_CHAT_CHUNKS, max_size=12))
def test_fast_path_gives_what_the_general_path_gives(natives):
    """Chunk by chunk, the same events (same reprs) as the general path, for every continuation
    the fast path takes and its near misses (ids, names, content, finish, usage, other
    choices, unknown or odd indexes, empty or non-string arguments, after [DONE])."""
    fast, general = OpenAIChatAdapter(), _GeneralOnly()
    for native in [chunk(tc(0, "call_A", "get_weather", "")), *natives]:
        data = native if isinstance(native, str) else json.dumps(native)
        frame = Frame(event="message", data=data)
        assert repr(fast.feed_frame(frame)) == repr(general.feed_frame(frame))
    assert repr(fast.finish()) == repr(general.finish())


def test_fast_path_takes_plain_continuations():
    adapter = counting(OpenAIChatAdapter)()
    natives = [chunk(tc(0, "call_A", "get_weather", "")), *fragments(0, CITY, 4)]
    natives += [chunk(_PADDED_CONTINUATION)] * 2
    for native in natives:
        adapter.feed_frame(Frame(event="message", data=json.dumps(native)))
    assert adapter.general == 1  # only the opener took the general path
