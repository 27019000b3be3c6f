"""The dispatcher: only committed calls, results in call order, dedupe by call id, session
and group exclusion, the concurrency limit, timeouts, errors, cancellation and events.

Committed calls come from the real gate: each test streams an OpenAI chat round through
StreamParser. Ordering is forced with asyncio.Event, never with sleeps."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import (
    ConfigError,
    ErrorCode,
    Round,
    StreamParser,
    Tool,
    ToolFinishedEvent,
    ToolOutcome,
    ToolResult,
    ToolSpec,
    ToolStartedEvent,
    UsageError,
    tool,
)
from toollatch.runtime import Dispatcher, example_tools
from toollatch.stages import assistant_messages, tool_results_messages


def chat_round(
    specs: Sequence[ToolSpec], calls: Sequence[tuple[str, str, Any]], finish: str = "tool_calls"
) -> Round:
    """A finalized round of ``calls`` (id, name, arguments: an object or raw text)."""
    parser = StreamParser("openai_chat", tools=specs)
    for i, (call_id, name, args) in enumerate(calls):
        text = args if isinstance(args, str) else json.dumps(args)
        delta = {"index": i, "id": call_id, "function": {"name": name, "arguments": text}}
        parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return parser.finish()


def assert_pairs(round_: Round, results: list[ToolResult]) -> None:
    """The results make a valid history (every call answered once, in call order)."""
    tool_results_messages(round_, results)
    assert [r.tool_call_id for r in results] == [c.call_id for c in round_.calls]


class Gates:
    """Named asyncio.Events a test opens, and a record of which tools started."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}
        self.running = 0
        self.max_running = 0
        self.runs: list[str] = []

    def gate(self, key: str) -> asyncio.Event:
        return self.events.setdefault(key, asyncio.Event())

    def began(self, key: str) -> asyncio.Event:
        return self.started.setdefault(key, asyncio.Event())


async def finish_or_abort(d: Dispatcher, round_: Round, got: list[ToolResult]) -> None:
    """An agent's round: ``finish``, and when cancelled, ``abort``'s results into ``got``."""
    async with d.round() as r:
        try:
            await r.finish(round_)
        except asyncio.CancelledError:
            got.extend(await r.abort(round_))
            raise


def make_tools(g: Gates, **options: Any) -> list[Tool[..., Any]]:
    @tool(**options)
    async def wait(key: str) -> str:
        """Wait until the test opens gate ``key``."""
        g.runs.append(key)
        g.running += 1
        g.max_running = max(g.max_running, g.running)
        g.began(key).set()
        try:
            await g.gate(key).wait()
        finally:
            g.running -= 1
        return f"done {key}"

    @tool(eager=True, side_effects="read")
    async def echo(text: str) -> str:
        g.runs.append(text)
        return text

    @tool
    def fail(message: str) -> None:
        raise RuntimeError(message)

    return [wait, echo, fail]


@pytest.fixture
def g() -> Gates:
    return Gates()


async def settle() -> None:
    """Let every ready task run until nothing more can happen without an event."""
    for _ in range(20):
        await asyncio.sleep(0)


# -- accepts only committed calls ------------------------------------------------------------


async def test_start_refuses_anything_but_a_committed_call(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"})])
    async with d.round() as r:
        with pytest.raises(UsageError, match="CommittedCall"):
            r.start(round_.calls[0])  # type: ignore[arg-type]  # a CallRecord, not committed
        with pytest.raises(UsageError, match="Round"):
            await r.finish(round_.committed())  # type: ignore[arg-type]
        assert_pairs(round_, await r.finish(round_))


async def test_start_needs_an_entered_round(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"})])
    with pytest.raises(UsageError, match="enter"):
        d.round().start(round_.committed()[0])


def test_config_errors(g):
    tools = make_tools(g)
    with pytest.raises(ConfigError, match="twice"):
        Dispatcher([*tools, tools[0]])
    with pytest.raises(ConfigError, match="eager"):
        Dispatcher(tools, eager=["nope"])
    with pytest.raises(ConfigError, match="max_concurrency"):
        Dispatcher(tools, max_concurrency=0)
    with pytest.raises(ConfigError, match="default_timeout_s"):
        Dispatcher(tools, default_timeout_s=-1)
    with pytest.raises(ConfigError, match="Tool"):
        Dispatcher([ToolSpec(name="x")])  # type: ignore[list-item]


# -- results ---------------------------------------------------------------------------------


async def test_results_are_in_call_order_whatever_the_completion_order(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(
        d.specs,
        [("c1", "wait", {"key": "a"}), ("c2", "wait", {"key": "b"}), ("c3", "echo", {"text": "z"})],
    )
    async with d.round() as r:
        finishing = asyncio.create_task(r.finish(round_))
        await g.began("a").wait()
        await g.began("b").wait()
        g.gate("b").set()  # b completes first...
        await settle()
        assert not finishing.done()
        g.gate("a").set()  # ...then a
        results = await finishing
    assert [r.content for r in results] == ["done a", "done b", "z"]
    assert_pairs(round_, results)


@settings(max_examples=40, deadline=None)
@given(order=st.permutations(range(5)), limit=st.integers(1, 5))
def test_any_completion_order_any_limit_gives_call_order_and_one_run_each(order, limit):
    async def scenario() -> None:
        g = Gates()
        d = Dispatcher(make_tools(g), max_concurrency=limit)
        keys = [f"k{i}" for i in range(5)]
        round_ = chat_round(d.specs, [(f"c{i}", "wait", {"key": k}) for i, k in enumerate(keys)])
        async with d.round() as r:
            finishing = asyncio.create_task(r.finish(round_))
            rank = {keys[i]: n for n, i in enumerate(order)}
            closed = set(keys)
            while closed:
                # wait until every call that can run does, then release the one of them
                # that comes first in ``order``
                running = {k for k in closed if g.began(k).is_set()}
                if len(running) < min(limit, len(closed)):
                    await asyncio.sleep(0)
                    continue
                first = min(running, key=rank.__getitem__)
                closed.discard(first)
                g.gate(first).set()
            results = await finishing
        assert [x.content for x in results] == [f"done {k}" for k in keys]
        assert sorted(g.runs) == keys
        assert g.max_running <= limit

    asyncio.run(scenario())


async def test_run_is_finish_in_a_round_of_its_own(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"}), ("c2", "echo", '{"x')])
    results = await d.run(round_, session="s1")
    assert [x.code for x in results] == [None, ErrorCode.INVALID_JSON]
    assert_pairs(round_, results)


async def test_an_error_outcome_the_tool_returns_is_a_tool_error_with_its_own_text():
    @tool
    def soft() -> ToolOutcome:
        return ToolOutcome(content="no such city", is_error=True)

    d = Dispatcher([soft])
    [result] = await d.run(chat_round(d.specs, [("c1", "soft", {})]))
    assert result == ToolResult(
        tool_call_id="c1",
        name="soft",
        content="no such city",
        is_error=True,
        code=ErrorCode.TOOL_ERROR,
    )


async def test_calls_that_did_not_commit_get_their_error_results(g):
    d = Dispatcher(make_tools(g))
    specs = [*d.specs, ToolSpec(name="ghost")]
    round_ = chat_round(
        specs, [("c1", "echo", {"text": "a"}), ("c2", "echo", '{"text": '), ("c3", "nope", {})]
    )
    async with d.round() as r:
        results = await r.finish(round_)
    assert [r.code for r in results] == [None, ErrorCode.INVALID_JSON, ErrorCode.UNKNOWN_TOOL]
    assert_pairs(round_, results)


async def test_a_tool_exception_is_a_tool_error_with_type_and_message(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "fail", {"message": "disk full"})])
    async with d.round() as r:
        [result] = await r.finish(round_)
    assert result == ToolResult(
        tool_call_id="c1",
        name="fail",
        content="tool_error: RuntimeError: disk full",
        is_error=True,
        code=ErrorCode.TOOL_ERROR,
    )
    assert "Traceback" not in result.content


async def test_a_committed_name_without_a_tool_is_unknown_tool(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round([*d.specs, ToolSpec(name="ghost")], [("c1", "ghost", {})])
    async with d.round() as r:
        [result] = await r.finish(round_)
    assert result.code is ErrorCode.UNKNOWN_TOOL
    assert result.content.startswith("unknown_tool: ")
    assert result.is_error


async def test_arguments_the_tool_refuses_are_a_schema_violation(g):
    d = Dispatcher(make_tools(g))
    loose = ToolSpec(name="echo")  # the gate lets any object through
    round_ = chat_round([loose], [("c1", "echo", {"text": 5})])
    async with d.round() as r:
        [result] = await r.finish(round_)
    assert result.code is ErrorCode.SCHEMA_VIOLATION
    assert result.content.startswith("schema_violation: text: ")


async def test_ui_payloads_are_kept_apart_from_the_results():
    @tool
    def chart() -> ToolOutcome:
        return ToolOutcome(content="3 points", ui={"points": [1, 2, 3]})

    d = Dispatcher([chart])
    round_ = chat_round(d.specs, [("c1", "chart", {})])
    async with d.round() as r:
        [result] = await r.finish(round_)
    assert result.content == "3 points"
    assert dict(r.ui) == {"c1": {"points": [1, 2, 3]}}


# -- dedupe ----------------------------------------------------------------------------------


async def test_a_call_id_runs_once_across_rounds(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"})])
    async with d.round() as r:
        first = await r.finish(round_)
    replay = chat_round(d.specs, [("c1", "echo", {"text": "a"})])  # a retried stream
    async with d.round() as r:
        second = await r.finish(replay)
    assert g.runs == ["a"]
    assert first == second


async def test_the_same_id_with_other_arguments_is_a_duplicate_and_does_not_run(g):
    d = Dispatcher(make_tools(g))
    async with d.round() as r:
        await r.finish(chat_round(d.specs, [("c1", "echo", {"text": "a"})]))
    other = chat_round(d.specs, [("c1", "echo", {"text": "b"}), ("c2", "echo", {"text": "c"})])
    async with d.round() as r:
        results = await r.finish(other)
    assert results[0].code is ErrorCode.DUPLICATE_CALL_ID
    assert results[0].content.startswith("duplicate_call_id: ")
    assert results[1].content == "c"
    assert g.runs == ["a", "c"]


async def test_argument_key_order_does_not_make_a_duplicate():
    runs = []

    @tool
    def pair(a: int, b: int) -> int:
        runs.append((a, b))
        return a + b

    d = Dispatcher([pair])
    async with d.round() as r:
        await r.finish(chat_round(d.specs, [("c1", "pair", '{"a": 1, "b": 2}')]))
    async with d.round() as r:
        [result] = await r.finish(chat_round(d.specs, [("c1", "pair", '{"b":2,"a":1}')]))
    assert result.content == "3"
    assert runs == [(1, 2)]


async def test_an_eager_start_is_not_started_again_at_finish(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"})])
    async with d.round() as r:
        r.start(round_.committed()[0])
        r.start(round_.committed()[0])  # starting twice is harmless
        results = await r.finish(round_)
    assert g.runs == ["a"]
    assert [x.content for x in results] == ["a"]


async def test_the_same_call_in_flight_in_two_rounds_runs_once(g):
    d = Dispatcher(make_tools(g))
    one = chat_round(d.specs, [("c1", "wait", {"key": "a"})])
    two = chat_round(d.specs, [("c1", "wait", {"key": "a"})])

    async def run(round_: Round, session: str) -> list[ToolResult]:
        async with d.round(session) as r:
            return await r.finish(round_)

    first = asyncio.create_task(run(one, "s1"))
    await g.began("a").wait()
    second = asyncio.create_task(run(two, "s1"))  # the same session: it joins the first run
    await settle()
    g.gate("a").set()
    assert await first == await second
    assert g.runs == ["a"]


async def test_the_same_call_id_in_another_session_is_another_call():
    # Dedupe is per session (a conversation): servers that number ids per response reuse
    # call_0 in every conversation, and one conversation must never get another's result.
    runs = []

    @tool
    def whoami(user: str) -> str:
        runs.append(user)
        return f"hello {user}"

    d = Dispatcher([whoami])
    alice = await d.run(
        chat_round(d.specs, [("call_0", "whoami", {"user": "alice"})]), session="alice"
    )
    bob = await d.run(chat_round(d.specs, [("call_0", "whoami", {"user": "bob"})]), session="bob")
    again = await d.run(
        chat_round(d.specs, [("call_0", "whoami", {"user": "alice"})]), session="alice"
    )
    assert [r.content for r in (*alice, *bob, *again)] == [
        "hello alice",
        "hello bob",
        "hello alice",
    ]
    assert runs == ["alice", "bob"]  # alice's repeat is answered from alice's memory


async def test_aborting_a_round_that_waits_for_another_rounds_run_leaves_that_run_alone(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "wait", {"key": "a"})])
    async with d.round("s1") as first:
        running = asyncio.create_task(first.finish(round_))
        await g.began("a").wait()
        async with d.round("s1") as third:
            also_joined = asyncio.create_task(third.finish(round_))
            async with d.round("s1") as second:
                joined = asyncio.create_task(second.finish(round_))
                await settle()
                joined.cancel()
                [aborted] = await second.abort(round_)
            assert aborted.code is ErrorCode.CANCELLED
            assert "outcome is unknown" in aborted.content  # the call did start, elsewhere
            g.gate("a").set()
            [result] = await running
            [joined_result] = await also_joined
    assert result.content == joined_result.content == "done a"
    assert g.runs == ["a"]


async def test_a_call_cancelled_before_it_started_may_run_later(g):
    d = Dispatcher(make_tools(g), max_concurrency=1)
    round_ = chat_round(d.specs, [("c1", "wait", {"key": "a"}), ("c2", "echo", {"text": "b"})])
    async with d.round() as r:
        finishing = asyncio.create_task(r.finish(round_))
        await g.began("a").wait()  # c2 waits for the only slot
        finishing.cancel()
        results = await r.abort(round_)
    assert "never started" not in results[0].content
    assert "before the tool started" in results[1].content
    async with d.round() as r:
        again = await r.finish(chat_round(d.specs, [("c2", "echo", {"text": "b"})]))
    assert again[0].content == "b"
    assert g.runs == ["a", "b"]


@pytest.mark.parametrize(("idempotent", "runs"), [(True, 2), (False, 1)])
async def test_an_unknown_outcome_reruns_only_for_idempotent_tools(idempotent, runs):
    count = []

    @tool(timeout=0.05, idempotent=idempotent)
    async def slow(n: int) -> int:
        count.append(n)
        await asyncio.Event().wait()
        return n

    d = Dispatcher([slow])
    for _ in range(2):
        async with d.round() as r:
            [result] = await r.finish(chat_round(d.specs, [("c1", "slow", {"n": 1})]))
        assert result.code is ErrorCode.TOOL_TIMEOUT
    assert len(count) == runs


async def test_the_memory_of_call_ids_is_bounded(g):
    d = Dispatcher(make_tools(g), max_remembered_calls=1)
    for call_id in ("c1", "c2", "c1"):
        async with d.round() as r:
            await r.finish(chat_round(d.specs, [(call_id, "echo", {"text": call_id})]))
    assert g.runs == ["c1", "c2", "c1"]  # c1 was forgotten when c2 came


# -- exclusion and limits --------------------------------------------------------------------


async def test_two_rounds_of_one_session_never_run_tools_at_once(g):
    d = Dispatcher(make_tools(g))

    async def run(key: str, session: str) -> list[ToolResult]:
        async with d.round(session) as r:
            return await r.finish(chat_round(d.specs, [(f"id-{key}", "wait", {"key": key})]))

    a = asyncio.create_task(run("a", "s1"))
    await g.began("a").wait()
    b = asyncio.create_task(run("b", "s1"))  # same session: must wait for a's round
    c = asyncio.create_task(run("c", "s2"))  # another session: runs now
    await g.began("c").wait()
    await settle()
    assert not g.began("b").is_set()
    g.gate("c").set()
    g.gate("a").set()
    await a
    await g.began("b").wait()
    g.gate("b").set()
    await asyncio.gather(b, c)
    assert d._state.session_count == 0  # idle sessions are forgotten


async def test_calls_of_one_group_never_run_at_once_even_across_sessions(g):
    d = Dispatcher(make_tools(g, group="fs"))

    async def run(keys: list[str], session: str) -> list[ToolResult]:
        async with d.round(session) as r:
            calls = [(f"id-{k}", "wait", {"key": k}) for k in keys]
            return await r.finish(chat_round(d.specs, calls))

    rounds = asyncio.gather(run(["a", "b"], "s1"), run(["c"], "s2"))
    for _ in range(3):
        while not any(e.is_set() for e in g.started.values()):
            await asyncio.sleep(0)
        await settle()
        assert g.running == 1
        running = next(k for k, e in g.started.items() if e.is_set())
        g.started.pop(running)
        g.gate(running).set()
    await rounds
    assert g.max_running == 1
    assert sorted(g.runs) == ["a", "b", "c"]


async def test_max_concurrency_bounds_running_calls(g):
    d = Dispatcher(make_tools(g), max_concurrency=2)
    keys = ["a", "b", "c", "d", "e"]
    round_ = chat_round(d.specs, [(k, "wait", {"key": k}) for k in keys])
    async with d.round() as r:
        finishing = asyncio.create_task(r.finish(round_))
        for k in keys:
            while g.running < 2 and not finishing.done():
                await asyncio.sleep(0)
            await settle()
            assert g.running <= 2
            g.gate(k).set()
        results = await finishing
    assert g.max_running == 2
    assert_pairs(round_, results)


# -- timeouts --------------------------------------------------------------------------------


async def test_the_tool_timeout_makes_a_tool_timeout_result():
    @tool(timeout=0.05)
    async def hang() -> None:
        await asyncio.Event().wait()

    events: list[Any] = []
    d = Dispatcher([hang], default_timeout_s=60, on_event=events.append)
    async with d.round() as r:
        [result] = await r.finish(chat_round(d.specs, [("c1", "hang", {})]))
    assert result.code is ErrorCode.TOOL_TIMEOUT
    assert events[-1] == ToolFinishedEvent(
        id="c1", name="hang", is_error=True, error="tool_timeout"
    )
    assert result.content.startswith("tool_timeout: the tool did not finish within 0.05 s")


async def test_the_default_timeout_applies_to_a_sync_tool_too():
    release = threading.Event()

    @tool
    def block() -> str:
        release.wait(timeout=10)
        return "late"

    d = Dispatcher([block], default_timeout_s=0.05)
    try:
        async with d.round() as r:
            [result] = await r.finish(chat_round(d.specs, [("c1", "block", {})]))
    finally:
        release.set()  # let the worker thread end
    assert result.code is ErrorCode.TOOL_TIMEOUT
    assert "0.05 s" in result.content


async def test_an_async_tool_that_blocks_the_loop_past_its_timeout_is_warned_about(caplog):
    """Its timeout cannot fire while it holds the loop: the result stands (documented), and
    a warning names the tool. A tool that awaits, and a sync one, are never warned about."""
    import time

    @tool(timeout=0.05)
    async def blocking() -> str:
        time.sleep(0.3)  # (the fault: a blocking call in an async tool)
        return "late"

    @tool(timeout=0.05)
    async def awaiting() -> str:
        await asyncio.sleep(0.3)
        return "late"

    @tool(timeout=0.05)
    def sync_sleep() -> str:
        time.sleep(0.3)
        return "late"

    d = Dispatcher([blocking, awaiting, sync_sleep])
    calls = [("c1", "blocking", {}), ("c2", "awaiting", {}), ("c3", "sync_sleep", {})]
    with caplog.at_level(logging.WARNING, logger="toollatch.runtime"):
        async with d.round() as r:
            results = await r.finish(chat_round(d.specs, calls))
    assert [r.code for r in results] == [None, ErrorCode.TOOL_TIMEOUT, ErrorCode.TOOL_TIMEOUT]
    assert results[0].content == "late"
    warned = [rec.getMessage() for rec in caplog.records if rec.name == "toollatch.runtime"]
    assert len(warned) == 1, warned
    assert warned[0].startswith("tool 'blocking' (call 'c1') held the event loop for 0.")
    assert "longer than its timeout of 0.05 s" in warned[0]


async def test_a_timeout_error_raised_by_the_tool_is_a_tool_error():
    @tool
    async def own() -> None:
        raise TimeoutError("upstream timed out")

    d = Dispatcher([own])
    async with d.round() as r:
        [result] = await r.finish(chat_round(d.specs, [("c1", "own", {})]))
    assert result.code is ErrorCode.TOOL_ERROR
    assert result.content == "tool_error: TimeoutError: upstream timed out"


# -- cancellation ----------------------------------------------------------------------------


async def test_abort_tells_never_started_from_outcome_unknown(g):
    events: list[Any] = []
    d = Dispatcher(make_tools(g, group="fs"), on_event=events.append)
    round_ = chat_round(
        d.specs,
        [("c1", "wait", {"key": "a"}), ("c2", "wait", {"key": "b"}), ("c3", "echo", {"text": "x"})],
    )
    async with d.round() as r:
        finishing = asyncio.create_task(r.finish(round_))
        await g.began("a").wait()  # a runs, b waits for the group lock, echo is done
        await settle()
        finishing.cancel()
        results = await r.abort(round_)
    assert [x.code for x in results] == [ErrorCode.CANCELLED, ErrorCode.CANCELLED, None]
    assert "while the tool was running; its outcome is unknown" in results[0].content
    assert "before the tool started; it was not run" in results[1].content
    assert results[2].content == "x"
    assert g.running == 0  # the running tool saw its cancellation
    assert g.runs == ["a", "x"]
    # every committed call's result is told, the one that never started (c2) too
    assert [(e.type, e.id) for e in events] == [
        ("tool_started", "c1"),
        ("tool_started", "c3"),
        ("tool_finished", "c3"),
        ("tool_finished", "c1"),
        ("tool_finished", "c2"),
    ]
    assert events[-2] == ToolFinishedEvent(id="c1", name="wait", is_error=True, error="cancelled")
    assert events[-1] == ToolFinishedEvent(id="c2", name="wait", is_error=True, error="cancelled")
    assert_pairs(round_, results)


async def test_abort_before_finish_answers_every_call_as_never_started(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"}), ("c2", "echo", '{"bad')])
    async with d.round() as r:
        results = await r.abort(round_)
    assert [x.code for x in results] == [ErrorCode.CANCELLED, ErrorCode.INVALID_JSON]
    assert "before the tool started" in results[0].content
    assert g.runs == []
    assert_pairs(round_, results)


async def test_cancelling_the_round_task_still_produces_results_and_leaves_no_task(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "wait", {"key": "a"}), ("c2", "wait", {"key": "b"})])
    got: list[ToolResult] = []
    task = asyncio.create_task(finish_or_abort(d, round_, got))
    await g.began("a").wait()
    await g.began("b").wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [x.code for x in got] == [ErrorCode.CANCELLED] * 2
    assert all("outcome is unknown" in x.content for x in got)
    assert g.running == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_leaving_the_block_cancels_what_still_runs(g):
    d = Dispatcher(make_tools(g), eager=["wait"], default_timeout_s=5)
    round_ = chat_round(d.specs, [("c1", "wait", {"key": "a"})])
    async with d.round() as r:
        r.start(round_.committed()[0])
        await g.began("a").wait()
    assert g.running == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}
    # the id is remembered with its unknown outcome: not run again
    async with d.round() as r:
        [result] = await r.finish(round_)
    assert result.code is ErrorCode.CANCELLED
    assert "outcome is unknown" in result.content
    assert g.runs == ["a"]


async def test_an_exception_in_the_block_propagates_unchanged(g):
    d = Dispatcher(make_tools(g), eager=["wait"])
    round_ = chat_round(d.specs, [("c1", "wait", {"key": "a"})])

    async def body() -> None:
        async with d.round() as r:
            r.start(round_.committed()[0])
            await g.began("a").wait()
            raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await body()
    assert g.running == 0


# -- a round's only call, awaited in the round's own task ------------------------------------


async def test_a_rounds_only_call_runs_in_the_task_that_finishes_it():
    """One call to start at finish runs in finish's task (no task of its own); two calls
    still run in tasks of their own, side by side."""
    ran_in: list[asyncio.Task[Any] | None] = []

    @tool(side_effects="read")
    async def where(n: int) -> int:
        ran_in.append(asyncio.current_task())
        await asyncio.sleep(0)
        return n

    d = Dispatcher([where])
    async with d.round() as r:
        [one] = await r.finish(chat_round(d.specs, [("c1", "where", {"n": 1})]))
    assert one.content == "1"
    assert ran_in == [asyncio.current_task()]
    ran_in.clear()
    async with d.round() as r:
        two = await r.finish(
            chat_round(d.specs, [("c2", "where", {"n": 2}), ("c3", "where", {"n": 3})])
        )
    assert [x.content for x in two] == ["2", "3"]
    assert len(set(ran_in)) == 2 and asyncio.current_task() not in ran_in


async def test_an_only_call_cancelled_while_running_is_paired_and_told_in_order(g):
    events: list[Any] = []
    d = Dispatcher(make_tools(g), on_event=events.append)
    round_ = chat_round(d.specs, [("c1", "wait", {"key": "a"})])
    got: list[ToolResult] = []
    task = asyncio.create_task(finish_or_abort(d, round_, got))
    await g.began("a").wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [result] = got
    assert result.code is ErrorCode.CANCELLED
    assert "while the tool was running; its outcome is unknown" in result.content
    assert g.running == 0  # the tool saw its cancellation
    assert [(e.type, e.id) for e in events] == [("tool_started", "c1"), ("tool_finished", "c1")]
    assert events[-1] == ToolFinishedEvent(id="c1", name="wait", is_error=True, error="cancelled")
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert_pairs(round_, got)


async def test_an_only_calls_own_timeout_and_a_deadline_around_finish_stay_apart():
    """The tool's timeout makes its tool_timeout result and nothing more; a deadline of the
    caller's that passes while the tool runs cancels it (``cancelled``, outcome unknown)
    and is the caller's TimeoutError, not the tool's."""

    @tool(timeout=0.05)
    async def short() -> None:
        await asyncio.Event().wait()

    @tool(timeout=60)
    async def long() -> None:
        await asyncio.Event().wait()

    events: list[Any] = []
    d = Dispatcher([short, long], on_event=events.append)
    async with asyncio.timeout(30), d.round() as r:
        [result] = await r.finish(chat_round(d.specs, [("c1", "short", {})]))
    assert result.code is ErrorCode.TOOL_TIMEOUT
    round_ = chat_round(d.specs, [("c2", "long", {})])
    async with d.round() as r:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await r.finish(round_)
        [result] = await r.abort(round_)
    assert result.code is ErrorCode.CANCELLED
    assert "outcome is unknown" in result.content
    assert [(e.type, e.id, e.error if e.type == "tool_finished" else None) for e in events] == [
        ("tool_started", "c1", None),
        ("tool_finished", "c1", "tool_timeout"),
        ("tool_started", "c2", None),
        ("tool_finished", "c2", "cancelled"),
    ]


async def test_a_cancellation_an_only_call_swallows_still_cancels_the_finish():
    """As when finish waited for the call's task: finish raises CancelledError; the call
    keeps the result its tool returned."""
    began = asyncio.Event()

    @tool(side_effects="read")
    async def stubborn() -> str:
        began.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "swallowed"
        return "unreachable"

    d = Dispatcher([stubborn])
    round_ = chat_round(d.specs, [("c1", "stubborn", {})])
    got: list[ToolResult] = []
    task = asyncio.create_task(finish_or_abort(d, round_, got))
    await began.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [x.content for x in got] == ["swallowed"]


async def test_finish_called_once_a_cancellation_was_caught_returns_its_results(g):
    """A cancellation the caller caught (and did not undo) before finish is not finish's:
    its only call runs and finish returns, as when it waited for the call's task."""
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"})])

    async def agent_round() -> list[ToolResult]:
        async with d.round() as r:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return await r.finish(round_)
        raise AssertionError("not cancelled")

    task = asyncio.create_task(agent_round())
    await settle()
    task.cancel()
    [result] = await task
    assert result.content == "a"
    assert g.runs == ["a"]


async def test_what_an_only_call_sets_in_a_context_variable_stays_its_own():
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    @tool(side_effects="read")
    async def setter() -> str:
        seen.append(var.get())
        var.set("the tool's")
        await asyncio.sleep(0)
        return var.get()

    d = Dispatcher([setter])
    var.set("the caller's")
    async with d.round() as r:
        [result] = await r.finish(chat_round(d.specs, [("c1", "setter", {})]))
    assert result.content == "the tool's"
    assert seen == ["the caller's"]  # the tool reads the caller's context...
    assert var.get() == "the caller's"  # ...and what it sets stays in its own copy


# -- eager, events, closing ------------------------------------------------------------------


async def test_only_eager_or_allow_listed_tools_start_early(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "wait", {"key": "a"}), ("c2", "echo", {"text": "e"})])
    wait_call, echo_call = round_.committed()
    async with d.round() as r:
        with pytest.raises(UsageError, match="'wait' is not allowed to start early"):
            r.start(wait_call)
        r.start(echo_call)  # declared eager=True
        await r.abort(round_)
    allowed = Dispatcher(make_tools(g), eager=["wait"])
    assert allowed.may_start_early("wait")
    assert not allowed.may_start_early("fail")
    assert not allowed.may_start_early("ghost")


async def test_events_for_success_and_error(g):
    events: list[Any] = []
    d = Dispatcher(make_tools(g), on_event=events.append)
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"}), ("c2", "fail", {"message": "m"})])
    async with d.round() as r:
        await r.finish(round_)
    assert ToolStartedEvent(id="c1", name="echo") in events
    assert ToolFinishedEvent(id="c1", name="echo", is_error=False, error=None) in events
    assert ToolFinishedEvent(id="c2", name="fail", is_error=True, error="tool_error") in events
    assert len(events) == 4


async def test_a_failing_event_callback_is_logged_and_changes_nothing(g, caplog):
    def broken(event: Any) -> None:
        raise RuntimeError("observer bug")

    d = Dispatcher(make_tools(g), on_event=broken)
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"})])
    with caplog.at_level(logging.ERROR, logger="toollatch.runtime"):
        async with d.round() as r:
            [result] = await r.finish(round_)
    assert result.content == "a"
    assert "on_event callback failed" in caplog.text


async def test_a_closed_round_returns_its_results_and_refuses_new_work(g):
    d = Dispatcher(make_tools(g))
    round_ = chat_round(d.specs, [("c1", "echo", {"text": "a"})])
    other = chat_round(d.specs, [("c2", "echo", {"text": "b"})])
    async with d.round() as r:
        results = await r.finish(round_)
        assert await r.finish(round_) == results
        assert await r.abort(round_) == results
        with pytest.raises(UsageError, match="another Round"):
            await r.finish(other)
        with pytest.raises(UsageError, match="closed"):
            r.start(other.committed()[0])
    assert g.runs == ["a"]


# -- end to end ------------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


async def test_the_recorded_example_runs_through_the_example_tools(tmp_path):
    """A recorded stream -> the real parser and gate -> the dispatcher -> a valid history."""
    d = Dispatcher(example_tools(tmp_path))
    parser = StreamParser("openai_chat", tools=d.specs)
    parser.feed((EXAMPLES / "openai_parallel_calls.sse").read_bytes())
    round_ = parser.finish()
    assert [c.name for c in round_.committed()] == ["get_weather", "write_file"]
    async with d.round("demo") as r:
        for call in round_.committed():
            if d.may_start_early(call.name):
                r.start(call)
        results = await r.finish(round_)
    weather = json.loads(results[0].content)
    assert weather["unit"] == "c"
    assert isinstance(weather["temperature"], int)
    written = json.loads(results[1].content)
    assert (tmp_path / written["path"]).read_text() == round_.calls[1].arguments["content"]
    history = assistant_messages(round_) + tool_results_messages(round_, results)
    assert len(history) >= 2
