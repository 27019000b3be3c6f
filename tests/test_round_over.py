"""Issue 28: the round that ends at a size limit (R1, the core's side), the run's default
deadline (R1, the runtime's), and N chat calls in one read costing O(N) work (R8)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toollatch import (
    CallFailed,
    CallState,
    ErrorCode,
    Limits,
    RoundEnd,
    RunLimits,
    StreamParser,
    model_client,
)
from toollatch.cli import build_parser, main, round_json
from toollatch.cli._app_config import validate
from toollatch.cli._run_command import _agent
from toollatch.runtime._run_setup import DEFAULT_DEADLINE_S
from toollatch.stages import (
    ArgsDelta,
    Assembler,
    CallClosed,
    CallKey,
    CallOpened,
    CallReady,
    RoundEnded,
    RoundOver,
    TextDelta,
    error_results,
)
from toollatch.testing import chunkings, sse

LIMIT = 1024
BIG = '{"path": "a", "content": "' + "x" * 3000 + '"}'


def block_start(index: int, call_id: str, name: str) -> dict[str, Any]:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return {"type": "content_block_start", "index": index, "content_block": block}


def json_delta(index: int, text: str) -> dict[str, Any]:
    delta = {"type": "input_json_delta", "partial_json": text}
    return {"type": "content_block_delta", "index": index, "delta": delta}


def text_delta(index: int, text: str) -> dict[str, Any]:
    delta = {"type": "text_delta", "text": text}
    return {"type": "content_block_delta", "index": index, "delta": delta}


START = {"type": "message_start", "message": {"id": "m", "content": [], "model": "x"}}
TEXT_START = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "text", "text": ""},
}
END = [
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}},
    {"type": "message_stop"},
]


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def pieces(index: int, text: str, size: int = 100) -> list[dict[str, Any]]:
    return [json_delta(index, text[i : i + size]) for i in range(0, len(text), size)]


def play(data: bytes, reads: list[bytes] | None = None, **options: Any):
    parser = StreamParser("anthropic", limits=Limits(max_argument_bytes=LIMIT), **options)
    notices = [n for read in reads or [data] for n in parser.feed(read)]
    return parser, notices, parser.finish()


# -- R1, the core: when the round is over --------------------------------------------------


def test_the_only_call_over_the_limit_ends_the_round_limited_at_every_chunking():
    later = [stop(0), block_start(1, "t2", "get_time"), json_delta(1, "{}"), stop(1), *END]
    data = sse(START, block_start(0, "t1", "write_file"), *pieces(0, BIG), *later, named=True)
    rounds = []
    for reads in chunkings(data):
        parser, notices, round_ = play(data, reads)
        assert [type(n) for n in notices] == [CallFailed, RoundOver]
        assert notices[1].detail == f"arguments exceed {LIMIT} bytes"
        assert parser.over
        rounds.append(round_)
    round_ = rounds[0]
    assert all(r == round_ for r in rounds)  # what follows the end is never read
    assert round_.ended is RoundEnd.LIMITED
    assert round_.stop_reason is None
    assert [(c.call_id, c.error) for c in round_.calls] == [
        ("t1", ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES)
    ]
    [result] = error_results(round_)  # paired
    assert result.tool_call_id == "t1"
    assert result.content.startswith("arguments_exceed_max_bytes")
    assert round_json("f", round_)["ended"] == "limited"


def test_a_closed_call_waiting_for_the_round_end_keeps_the_round_going():
    # t1 is complete and waits for the round's end: the round is not over when t2 fails
    # for its size, so t1 commits as before
    data = sse(
        START,
        block_start(0, "t1", "get_time"),
        json_delta(0, "{}"),
        stop(0),
        block_start(1, "t2", "write_file"),
        *pieces(1, BIG),
        stop(1),
        *END,
        named=True,
    )
    parser, notices, round_ = play(data)
    assert [type(n) for n in notices] == [CallFailed]
    assert not parser.over
    assert round_.ended is RoundEnd.NORMAL
    assert [c.state for c in round_.calls] == [CallState.COMMITTED, CallState.FAILED]


def test_an_eager_call_committed_early_leaves_nothing_to_wait_for():
    data = sse(
        START,
        block_start(0, "t1", "get_time"),
        json_delta(0, "{}"),
        stop(0),
        block_start(1, "t2", "write_file"),
        *pieces(1, BIG),
        stop(1),
        *END,
        named=True,
    )
    _, notices, round_ = play(data, eager=["get_time"])
    assert [type(n) for n in notices] == [CallReady, CallFailed, RoundOver]
    assert round_.ended is RoundEnd.LIMITED
    assert [(c.state, c.early) for c in round_.calls] == [
        (CallState.COMMITTED, True),
        (CallState.FAILED, False),
    ]


def test_text_past_the_cap_ends_the_round_and_later_calls_are_not_read():
    text = [text_delta(0, "y" * 100) for _ in range(30)]
    data = sse(
        START,
        TEXT_START,
        *text,
        stop(0),
        block_start(1, "t1", "get_time"),
        json_delta(1, "{}"),
        stop(1),
        *END,
        named=True,
    )
    for reads in chunkings(data):
        parser = StreamParser("anthropic", limits=Limits(max_text_bytes=1000))
        notices = [n for read in reads for n in parser.feed(read)]
        assert [type(n) for n in notices] == [RoundOver]
        round_ = parser.finish()
        assert round_.ended is RoundEnd.LIMITED
        assert round_.text == "y" * 1000
        assert round_.calls == ()


def test_text_past_the_cap_while_a_call_is_open_lets_the_call_finish():
    text_start = {**TEXT_START, "index": 1}
    data = sse(
        START,
        block_start(0, "t1", "get_time"),
        json_delta(0, "{"),
        text_start,
        text_delta(1, "y" * 2000),
        json_delta(0, "}"),
        stop(0),
        *END,
        named=True,
    )
    parser = StreamParser("anthropic", limits=Limits(max_text_bytes=1000))
    assert parser.feed(data) == []
    round_ = parser.finish()
    assert round_.ended is RoundEnd.NORMAL
    assert round_.calls[0].state is CallState.COMMITTED


def test_the_assembler_ignores_events_after_its_round_is_over():
    key0, key1 = CallKey(0, 0, 0), CallKey(0, 0, 1)
    asm = Assembler(limits=Limits(max_argument_bytes=4))
    asm.feed(CallOpened(key=key0, call_id="a", name="f"))
    notices = asm.feed(ArgsDelta(key=key0, fragment="{'x': 1}"))
    assert [type(n) for n in notices] == [CallFailed, RoundOver]
    assert asm.over
    after = [
        CallOpened(key=key1, call_id="b", name="f"),
        ArgsDelta(key=key1, fragment="{}"),
        TextDelta(text="more"),
        CallClosed(key=key1),
        RoundEnded(ending=RoundEnd.NORMAL, stop_reason="tool_calls"),
    ]
    assert [asm.feed(e) for e in after] == [[]] * len(after)
    round_ = asm.finish()
    assert round_.ended is RoundEnd.LIMITED
    assert [c.call_id for c in round_.calls] == ["a"]
    assert round_.text == ""


def test_a_round_that_already_ended_is_not_ended_again():
    key0 = CallKey(0, 0, 0)
    asm = Assembler(limits=Limits(max_argument_bytes=4, max_text_bytes=3))
    asm.feed(CallOpened(key=key0, call_id="a", name="f"))
    asm.feed(ArgsDelta(key=key0, fragment="{}"))
    asm.feed(CallClosed(key=key0))
    asm.feed(RoundEnded(ending=RoundEnd.NORMAL, stop_reason="stop"))
    assert asm.feed(TextDelta(text="late text")) == []
    assert not asm.over
    assert asm.finish().ended is RoundEnd.NORMAL


def test_replay_json_reports_limited(tmp_path, capsys):
    data = sse(
        START, block_start(0, "t1", "write_file"), *pieces(0, BIG), stop(0), *END, named=True
    )
    path = tmp_path / "runaway.sse"
    path.write_bytes(data)
    assert main(["replay", "--format", "json", "--max-args-bytes", str(LIMIT), str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    out = out[0] if isinstance(out, list) else out
    assert out["ended"] == "limited"
    assert [r["tool_call_id"] for r in out["error_results"]] == ["t1"]


# -- R1, the runtime: a finite default deadline -------------------------------------------


def test_a_run_has_a_finite_default_deadline_that_config_and_flags_change():
    assert RunLimits().deadline_s == DEFAULT_DEADLINE_S == 900.0
    assert validate({}).run_limits().deadline_s == 900.0
    assert validate({"relay": {"deadline_s": None}}).run_limits().deadline_s is None
    assert validate({"relay": {"deadline_s": 60}}).run_limits().deadline_s == 60
    client = model_client("openai_chat", model="m", base_url="http://127.0.0.1:9")
    parser = build_parser()
    for flags, config, expected in [
        ([], None, 900.0),
        (["--deadline", "12.5"], None, 12.5),
        (["--deadline", "0"], None, None),
        ([], validate({"relay": {"deadline_s": 30}}), 30),
        (["--deadline", "5"], validate({"relay": {"deadline_s": 30}}), 5),
        (["--deadline", "0"], validate({"relay": {"deadline_s": 30}}), None),
    ]:
        args = parser.parse_args(["run", *flags])
        agent = _agent(args, client, [], config)
        assert agent.run_limits.deadline_s == expected, flags


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "soon"])
def test_a_bad_deadline_flag_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", "--deadline", bad])
    assert exc.value.code == 2
    assert "--deadline" in capsys.readouterr().err


def test_the_deadline_flag_is_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    assert "--deadline SECONDS" in capsys.readouterr().out


# -- R8: N complete chat calls in one read ---------------------------------------------------


def chat_calls(n: int) -> bytes:
    def call(i: int) -> dict[str, Any]:
        entry = {
            "index": i,
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "f", "arguments": "{}"},
        }
        return {"choices": [{"index": 0, "delta": {"tool_calls": [entry]}, "finish_reason": None}]}

    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    return sse(*(call(i) for i in range(n)), end, done=True)


def events_of(n: int, limits: Limits | None = None) -> int:
    """Stream events the assembler is fed for ``n`` calls in one read, through the
    per-event step (the bulk path), counted at the assembler."""
    parser = StreamParser("openai_chat", limits=limits)
    count = 0
    feed = parser.assembler.feed

    def counting(event: Any) -> Any:
        nonlocal count
        count += 1
        return feed(event)

    parser.assembler.feed = counting  # type: ignore[method-assign]
    parser.feed(chat_calls(n))
    parser.finish()
    return count


@pytest.mark.parametrize("limits", [None, Limits(max_calls_per_round=10_000)])
def test_n_chat_calls_in_one_read_cost_linear_events(limits):
    # Each opening used to settle every earlier call again: N**2 / 2 events (2,000 calls:
    # two million). Now each call costs a bounded number, past the call limit or not.
    small, big = events_of(200, limits), events_of(2000, limits)
    assert big <= 10 * small + 100
    assert big <= 8 * 2000


def test_a_chat_call_reached_again_is_settled_again_in_call_order():
    # the earlier calls that changed since the last opening (and only they) are settled
    # again, in call order, so an eager call whose text became complete late still commits
    def delta(i: int, args: str, call_id: str | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {"index": i, "function": {"arguments": args}}
        if call_id:
            entry.update(id=call_id, type="function")
            entry["function"]["name"] = "get_time"
        return {"choices": [{"index": 0, "delta": {"tool_calls": [entry]}, "finish_reason": None}]}

    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    data = sse(
        delta(0, "{", "a"),
        delta(1, "{", "b"),
        delta(0, "}"),
        delta(1, "}"),
        delta(2, "{}", "c"),
        end,
        done=True,
    )
    parser = StreamParser("openai_chat", eager=["get_time"], keep_events=True)
    ready = [n.call.call_id for n in parser.feed(data) if isinstance(n, CallReady)]
    assert ready == ["a", "b", "c"]  # (a and b at c's opening, c at the normal end)
    settled = [type(e).__name__ for e in parser.events or [] if type(e).__name__ == "CallSettled"]
    assert len(settled) == 3  # a at b's opening; a and b at c's
