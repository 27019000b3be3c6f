"""The assembler driven directly with stream events (no adapter): identity, limits, anomalies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toollatch import CallFailed, CallState, ErrorCode, Limits, PreviewPolicy, RoundEnd, UsageError
from toollatch.core._buffer import JOIN_BYTES
from toollatch.stages import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    Assembler,
    CallClosed,
    CallIdentified,
    CallKey,
    CallOpened,
    ReasoningBlock,
    RoundEnded,
    RoundOver,
    ServerToolBlock,
    StreamFailed,
    TextDelta,
    error_results,
)

K0, K1, K2 = (CallKey(0, 0, i) for i in range(3))
END = RoundEnded(ending=RoundEnd.NORMAL, stop_reason="tool_use")


def run(*events, **kwargs):
    asm = Assembler(provider="anthropic", **kwargs)
    notices = [n for e in events for n in asm.feed(e)]
    return asm.finish(), notices


def test_closed_call_commits_only_at_a_normal_round_end():
    asm = Assembler()
    for e in (
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{}"),
        CallClosed(key=K0),
    ):
        assert asm.feed(e) == []
    r = asm.finish()  # no RoundEnded: the stream never said it ended
    assert r.ended is RoundEnd.INTERRUPTED
    assert r.calls[0].error is ErrorCode.STREAM_INTERRUPTED


def test_fragment_after_close_is_a_protocol_violation():
    r, notices = run(
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{}"),
        CallClosed(key=K0),
        ArgsDelta(key=K0, fragment=" "),
        END,
    )
    assert r.calls[0].error is ErrorCode.PROTOCOL_VIOLATION
    assert [n.code for n in notices] == [ErrorCode.PROTOCOL_VIOLATION]
    assert [a.kind for a in r.anomalies] == [AnomalyKind.FRAGMENT_AFTER_CLOSE]


def test_fragment_for_an_unknown_key_fails_every_pending_call():
    # A fragment that matches no call may have been meant for any of them (a lost event).
    r, notices = run(
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{"),
        CallOpened(key=K2, call_id="c", name="f"),
        ArgsDelta(key=K2, fragment="{}"),
        CallClosed(key=K2),
        ArgsDelta(key=K1, fragment='"x":1'),
        ArgsDelta(key=K0, fragment="}"),
        CallClosed(key=K0),
        END,
    )
    assert [(c.state, c.error) for c in r.calls] == [
        (CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION)
    ] * 2
    assert [n.key for n in notices] == [K0, K2]
    assert [a.kind for a in r.anomalies] == [AnomalyKind.UNKNOWN_KEY]


def test_a_lost_event_fails_pending_calls_but_not_decided_ones():
    lost = Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail="not JSON", fails_pending=True)
    r, _ = run(
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{}"),
        lost,
        CallClosed(key=K0),
        END,
        lost,
    )
    assert r.calls[0].error is ErrorCode.PROTOCOL_VIOLATION
    assert "not JSON" in r.calls[0].detail
    r, _ = run(
        lost,
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{}"),
        CallClosed(key=K0),
        END,
    )
    assert r.calls[0].state is CallState.COMMITTED  # nothing was pending when it was lost


def test_a_call_never_closed_fails_at_a_normal_end():
    r, _ = run(CallOpened(key=K0, call_id="a", name="f"), ArgsDelta(key=K0, fragment="{}"), END)
    assert (r.ended, r.calls[0].error) == (RoundEnd.NORMAL, ErrorCode.PROTOCOL_VIOLATION)
    assert [a.kind for a in r.anomalies] == [AnomalyKind.NEVER_CLOSED]
    assert [e.tool_call_id for e in error_results(r)] == ["a"]


def test_an_anomaly_with_a_code_fails_its_call_with_that_code():
    incomplete = Anomaly(
        kind=AnomalyKind.INVALID_PAYLOAD,
        detail="status incomplete",
        key=K0,
        fails_call=True,
        code=ErrorCode.TRUNCATED,
    )
    r, _ = run(
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{}"),
        CallClosed(key=K0),
        incomplete,
        END,
    )
    assert r.calls[0].error is ErrorCode.TRUNCATED


def test_a_different_id_on_an_open_call_fails_it():
    r, _ = run(CallOpened(key=K0, call_id="a", name="f"), CallIdentified(key=K0, call_id="b"), END)
    assert r.calls[0].error is ErrorCode.PROTOCOL_VIOLATION
    assert r.calls[0].call_id == "a"
    assert [a.kind for a in r.anomalies] == [AnomalyKind.ID_CHANGED]


def test_identity_may_arrive_after_the_arguments():
    # Q7: gateways that send arguments before the name.
    r, _ = run(
        CallOpened(key=K0),
        ArgsDelta(key=K0, fragment='{"a":1}'),
        CallIdentified(key=K0, call_id="a"),
        CallIdentified(key=K0, name="f"),
        CallClosed(key=K0),
        END,
    )
    assert (r.calls[0].call_id, r.calls[0].name, r.calls[0].state) == (
        "a",
        "f",
        CallState.COMMITTED,
    )


def test_call_without_id_or_name_fails_missing_id_or_name():
    r, _ = run(
        CallOpened(key=K0, name="f"),
        CallOpened(key=K1, call_id="b"),
        CallClosed(key=K0),
        CallClosed(key=K1),
        END,
    )
    assert [c.error for c in r.calls] == [ErrorCode.MISSING_ID_OR_NAME] * 2
    assert "id" in r.calls[0].detail and "name" in r.calls[1].detail


def test_duplicate_call_id_fails_the_later_call():
    r, notices = run(
        CallOpened(key=K0, call_id="same", name="f"),
        CallOpened(key=K1, call_id="same", name="f"),
        CallClosed(key=K0),
        END,
    )
    assert [c.state for c in r.calls] == [CallState.COMMITTED, CallState.FAILED]
    assert r.calls[1].error is ErrorCode.DUPLICATE_CALL_ID
    assert [(n.key, n.code) for n in notices] == [(K1, ErrorCode.DUPLICATE_CALL_ID)]


def test_final_text_is_used_when_nothing_streamed_and_compared_otherwise():
    # LM Studio sends only the .done text; a disagreement is a protocol violation.
    r, _ = run(
        CallOpened(key=K0, call_id="a", name="f"),
        CallClosed(key=K0, arguments='{"x":1}'),
        CallOpened(key=K1, call_id="b", name="f"),
        ArgsDelta(key=K1, fragment='{"x":1}'),
        CallClosed(key=K1, arguments='{"x":2}'),
        END,
    )
    assert r.calls[0].arguments == {"x": 1}
    assert r.calls[1].error is ErrorCode.PROTOCOL_VIOLATION
    assert [a.kind for a in r.anomalies] == [AnomalyKind.ARGUMENTS_MISMATCH]


def test_final_text_over_the_limit_fails():
    r, _ = run(
        CallOpened(key=K0, call_id="a", name="f"),
        CallClosed(key=K0, arguments='{"x":"' + "y" * 100 + '"}'),
        END,
        limits=Limits(max_argument_bytes=50),
    )
    assert r.calls[0].error is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES


def test_anomaly_that_fails_a_call():
    r, notices = run(
        CallOpened(key=K0, call_id="a", name="f"),
        Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail="bad path", key=K0, fails_call=True),
        END,
    )
    assert r.calls[0].error is ErrorCode.PROTOCOL_VIOLATION and r.calls[0].detail == "bad path"
    assert isinstance(notices[0], CallFailed)


def test_stream_failure_code_is_passed_on():
    r, _ = run(
        CallOpened(key=K0, call_id="a", name="f"),
        StreamFailed(code=ErrorCode.IDLE_TIMEOUT, detail="no bytes for 30 s"),
    )
    assert r.ended is RoundEnd.INTERRUPTED and r.calls[0].error is ErrorCode.IDLE_TIMEOUT
    assert r.error == "no bytes for 30 s"


def test_truncation_fails_even_calls_that_were_closed():
    r, _ = run(
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{}"),
        CallClosed(key=K0),
        CallOpened(key=K1, call_id="b", name="f"),
        ArgsDelta(key=K1, fragment='{"x'),
        CallClosed(key=K1),
        RoundEnded(ending=RoundEnd.TRUNCATED, stop_reason="max_tokens"),
    )
    assert [c.error for c in r.calls] == [ErrorCode.TRUNCATED] * 2


def test_content_order_and_opaque_blocks_are_kept():
    think = ReasoningBlock(block=0, data={"type": "thinking", "thinking": "t", "signature": "s"})
    server = ServerToolBlock(block=2, data={"type": "server_tool_use", "id": "s1"})
    r, _ = run(
        think,
        TextDelta(text="a", block=1),
        TextDelta(text="b", block=1),
        server,
        TextDelta(text="c", block=3),
        CallOpened(key=K2, call_id="x", name="f"),
        END,
    )
    kinds = [type(s).__name__ for s in r.choices[0].content]
    assert kinds == ["ReasoningBlock", "TextRun", "ServerToolBlock", "TextRun", "CallRecord"]
    assert r.text == "abc" and r.blocks == (think, server)


def test_text_limit_drops_the_rest_with_one_anomaly():
    r, _ = run(*(TextDelta(text="x" * 10) for _ in range(5)), END, limits=Limits(max_text_bytes=25))
    assert r.text == "x" * 20
    assert [a.kind for a in r.anomalies] == [AnomalyKind.TEXT_TOO_LARGE]


def test_second_round_end_is_an_anomaly_and_the_first_normal_one_wins():
    r, _ = run(END, RoundEnded(ending=RoundEnd.NORMAL, stop_reason="end_turn"))
    assert (r.ended, r.stop_reason) == (RoundEnd.NORMAL, "tool_use")
    assert [a.kind for a in r.anomalies] == [AnomalyKind.EVENT_AFTER_END]


@pytest.mark.parametrize("bad", [RoundEnd.TRUNCATED, RoundEnd.INTERRUPTED])
def test_a_truncating_or_failing_reason_sticks_whatever_the_order(bad):
    call = (
        CallOpened(key=K0, call_id="a", name="f"),
        ArgsDelta(key=K0, fragment="{}"),
        CallClosed(key=K0),
    )
    stop = RoundEnded(ending=bad, stop_reason="max_tokens")
    for order, kind in (
        ((stop, END), AnomalyKind.REASON_OVERRIDDEN),
        ((END, stop), AnomalyKind.EVENT_AFTER_END),
    ):
        r, _ = run(*call, *order)
        assert (r.ended, r.stop_reason) == (bad, "max_tokens")
        assert r.calls[0].state is CallState.FAILED
        assert [a.kind for a in r.anomalies] == [kind]


def test_misuse_raises_usage_error():
    asm = Assembler()
    r = asm.finish()
    assert asm.finish() is r and asm.cancel() is r
    with pytest.raises(UsageError):
        asm.feed(END)


def test_empty_round_has_one_choice_without_calls():
    r, _ = run()
    assert len(r.choices) == 1 and r.calls == () and r.ended is RoundEnd.INTERRUPTED


def test_cancel_after_commit_keeps_committed_calls():
    asm = Assembler()
    asm.feed(CallOpened(key=K0, call_id="a", name="f"))
    asm.feed(CallClosed(key=K0))
    asm.feed(END)
    r = asm.finish()
    assert asm.cancel() is r and r.calls[0].state is CallState.COMMITTED


@given(st.lists(st.integers(0, 2), max_size=60), st.lists(st.text(max_size=5), max_size=60))
def test_buffers_never_mix_whatever_the_interleaving(order, texts):
    keys = [K0, K1, K2]
    events = [CallOpened(key=k, call_id=f"id{i}", name="f") for i, k in enumerate(keys)]
    expected = dict.fromkeys(keys, "")
    for i, t in zip(order, texts, strict=False):
        events.append(ArgsDelta(key=keys[i], fragment=t))
        expected[keys[i]] += t
    r, _ = run(*events, END, tools=None)
    assert {c.key: c.arguments_text for c in r.calls} == expected


_LONG_TEXT = st.text(st.sampled_from("ab\u00e9\u4e2d\U0001f600"), min_size=1, max_size=8)


def _long_arguments(pieces: list[str]) -> str:
    """About 40 KiB of JSON (three joins of the assembler's 16 KiB runs), mixed-width text."""
    return '{"content": "' + "".join(pieces) * (40_000 // len("".join(pieces).encode()) + 1) + '"}'


@given(
    pieces=st.lists(_LONG_TEXT, min_size=1, max_size=20),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=50),
    with_previews=st.booleans(),
)
def test_long_arguments_are_joined_in_runs_and_come_out_whole(pieces, cuts, with_previews):
    """The fragments of a long call are joined into one string every 16 KiB (so a call holds
    a few large strings, not one object per fragment); the text that reaches the gate is
    still exactly the fragments in order, with or without previews."""
    text = _long_arguments(pieces)
    asm = Assembler(previews=PreviewPolicy() if with_previews else None)
    asm.feed(CallOpened(key=K0, call_id="a", name="f"))
    at, held, step = 0, 0, 0
    while at < len(text):
        size = cuts[step % len(cuts)]
        asm.feed(ArgsDelta(key=K0, fragment=text[at : at + size]))
        at, step = at + size, step + 1
        held = max(held, len(asm._buffers[K0].fragments))
    assert held < step / 2  # without the joins, every fragment would still be held
    # Each join takes only the fragments since the previous one (a run is at most 16 KiB and
    # one fragment): the text is copied once more in all, not once per join.
    assert max(map(len, asm._buffers[K0].fragments)) <= JOIN_BYTES + max(cuts)
    asm.feed(CallClosed(key=K0))
    asm.feed(END)
    call = asm.finish().calls[0]
    assert call.state is CallState.COMMITTED
    assert call.arguments_text == text


@given(
    limit=st.integers(16_000, 50_000),
    char=st.sampled_from(["a", "\u00e9", "\u4e2d", "\U0001f600"]),
    cuts=st.lists(st.integers(1, 700), min_size=1, max_size=20),
)
def test_the_byte_limit_holds_exactly_across_the_joins(limit, char, cuts):
    """The failure comes with the first fragment that takes the call past the limit, wherever
    the limit falls between two 16 KiB joins, and not one fragment earlier."""
    asm = Assembler(limits=Limits(max_argument_bytes=limit))
    asm.feed(CallOpened(key=K0, call_id="a", name="f"))
    total, step = 0, 0
    while True:
        fragment = char * cuts[step % len(cuts)]
        step += 1
        total += len(fragment.encode())
        notices = asm.feed(ArgsDelta(key=K0, fragment=fragment))
        if total > limit:
            # (and the round is over: nothing else is open; see test_round_over.py)
            assert [type(n) for n in notices] == [CallFailed, RoundOver]
            assert notices[0].code is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES
            break
        assert notices == []
    asm.feed(END)
    assert asm.finish().calls[0].error is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES


def test_calls_past_twice_the_limit_fail_the_stream_and_are_not_kept():
    limits = Limits(max_calls_per_round=3)
    events = []
    for i in range(1000):
        key = CallKey(0, 0, i)
        events += [
            CallOpened(key=key, call_id=f"c{i}", name="f"),
            ArgsDelta(key=key, fragment="{}"),
            CallClosed(key=key),
        ]
    asm = Assembler(provider="anthropic", limits=limits)
    steps = [(e, asm.feed(e), asm.sealed) for e in events]
    sealing = [(e, n) for e, n, sealed in steps if sealed and n]
    assert sealing[0][0] == CallOpened(key=CallKey(0, 0, 6), call_id="c6", name="f")
    assert [n.code for n in sealing[0][1]] == [ErrorCode.STREAM_INTERRUPTED] * 3
    asm.feed(END)
    r = asm.finish()
    assert len(r.calls) == 6  # 3 that may run, 3 paired placeholders, then nothing kept
    assert [c.error for c in r.calls] == [ErrorCode.STREAM_INTERRUPTED] * 3 + [
        ErrorCode.TOO_MANY_TOOL_CALLS
    ] * 3
    assert r.ended is RoundEnd.INTERRUPTED
    assert [e.tool_call_id for e in error_results(r)] == [f"c{i}" for i in range(6)]
    assert len(r.anomalies) == 4  # three placeholders, one overflow


def test_choices_past_the_limit_fail_the_stream_and_are_not_kept():
    events = [TextDelta(choice=i, text="x") for i in range(50)]
    r, _ = run(
        CallOpened(key=K0, call_id="a", name="f"),
        CallClosed(key=K0),
        *events,
        END,
        limits=Limits(max_choices=4),
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.ended is RoundEnd.INTERRUPTED and r.calls[0].error is ErrorCode.STREAM_INTERRUPTED
    assert [a.kind for a in r.anomalies] == [AnomalyKind.TOO_MANY_CHOICES]


def test_a_call_record_carries_the_bytes_counted_as_it_streamed():
    from toollatch import StreamParser
    from toollatch.testing import sse

    head = {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"t": "Zü'},
                        }
                    ]
                },
            }
        ]
    }
    tail = {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'rich ☕"}'}}]},
                "finish_reason": "tool_calls",
            }
        ]
    }
    parser = StreamParser("openai_chat")
    parser.feed(sse(head, tail, done=True))
    call = parser.finish().calls[0]
    assert call.argument_bytes == len(call.arguments_text.encode()) == 20
