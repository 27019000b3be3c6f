"""The agent loop over real loopback HTTP: the scripted model server, the httpx clients, the
gate, the dispatcher, per provider. Order is asserted on the events, not on sleeps (where a
stall makes room for an eager tool, the assertion is on event order)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from toollatch import Agent, ClientLimits, RetryPolicy, RunLimits, model_client, tool
from toollatch.runtime import example_tools
from toollatch.scripted import Call, Faults, Script, ScriptedServer, Text, Turn
from toollatch.scripted._server import _encode

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"]
EVERY_PROVIDER = pytest.mark.parametrize("provider", PROVIDERS)


def weather_call(call_id: str, city: str) -> Call:
    return Call(
        call_id=call_id, name="get_weather", arguments=f'{{"city": "{city}"}}', fragment_chars=4
    )


async def play(
    server,
    provider,
    tools,
    message="go",
    *,
    model="scripted",
    limits=None,
    client_limits=None,
    agent=None,
    **kw,
) -> tuple[list[dict[str, Any]], Any]:
    client = model_client(
        provider,
        model=model,
        base_url=server.base_url(provider),
        limits=client_limits,
        retry=RetryPolicy(attempts=1),
    )
    async with client:
        agent = agent or Agent(client, tools, run_limits=limits, **kw)
        run = agent.run(message)
        events = [e.to_json() async for e in run]
    return events, run


def types(events, *wanted):
    return [(e["type"], e.get("id")) for e in events if e["type"] in wanted]


@EVERY_PROVIDER
async def test_the_demo_runs_two_rounds_with_two_parallel_calls_and_a_valid_history(
    provider, tmp_path
):
    async with ScriptedServer(delay_scale=0) as server:
        events, run = await play(server, provider, example_tools(tmp_path))
        last = events[-1]
        assert last["type"] == "run_ended" and last["error"] is None
        assert last["rounds"] == 3
        assert [c["state"] for c in last["calls"]] == ["committed"] * 3
        assert [c["is_error"] for c in last["calls"]] == [False] * 3
        rounds = [e for e in events if e["type"] == "round_ended"]
        assert [r["ended"] for r in rounds] == ["normal"] * 3
        first_round = events[: events.index(rounds[0])]
        assert len([e for e in first_round if e["type"] == "tool_finished"]) == 2
        # every request the server answered passed its history check (200): the third
        # request carried both rounds' calls and results
        assert [r.status for r in server.requests] == [200, 200, 200]
        assert run.history == last["history"]
    assert (tmp_path / "notes" / "weather.md").read_text().startswith("# Weather")


@EVERY_PROVIDER
async def test_an_eager_tool_starts_while_the_stream_still_runs(provider, tmp_path):
    # the server stalls 400 ms right after the event that shows the provider moved on from
    # call 1 (call 2 begins); the eager call 1 must start before call 2 is even complete
    items = (Text(text="Checking."), weather_call("c1", "Oslo"), weather_call("c2", "Rome"))
    plain = Turn(items=items, delay_ms=0)
    wire = _encode(provider, plain, model="s", body={}, response_id="r")
    marker = b"Rome" if provider == "gemini" else b'"c2"'
    moved_on = next(n for n, event in enumerate(wire) if marker in event.data)
    turn = Turn(
        items=items, delay_ms=0, faults=Faults(stall_ms=400, stall_after_events=moved_on + 1)
    )
    async with ScriptedServer({"s": Script(turns=(turn,))}) as server:
        events, _ = await play(
            server, provider, example_tools(tmp_path), model="s", limits=RunLimits(max_rounds=1)
        )
    committed = [e["early"] for e in events if e["type"] == "call_committed"]
    assert committed[0] is True
    if provider != "gemini":  # (Gemini's second call comes with the finish reason)
        order = types(events, "tool_started", "call_committed")
        assert order.index(("tool_started", "c1")) < order.index(("call_committed", "c2"))


@EVERY_PROVIDER
async def test_a_truncated_last_call_never_runs_and_the_next_request_is_valid(provider, tmp_path):
    ran: list[str] = []

    @tool(eager=True)
    def get_weather(city: str) -> str:
        ran.append(city)
        return "sunny"

    turn = Turn(
        items=(weather_call("c1", "Oslo"), weather_call("c2", "Rome")),
        stop="max_tokens",
        delay_ms=0,
    )
    script = Script(turns=(turn, Turn(items=(Text(text="ok"),), delay_ms=0)))
    async with ScriptedServer({"s": script}) as server:
        events, _ = await play(server, provider, [get_weather], model="s")
        assert [r.status for r in server.requests] == [200, 200]
    assert "Rome" not in ran
    failed = [e for e in events if e["type"] == "call_failed"]
    if provider != "gemini":  # Gemini leaves a cut call out of the stream entirely
        assert [(e["id"], e["error"]) for e in failed] == [("c2", "truncated")]
    assert events[-1]["rounds"] == 2


@EVERY_PROVIDER
async def test_a_replayed_stream_does_not_run_a_call_id_twice(provider):
    ran: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        ran.append(city)
        return f"sunny in {city}"

    script = Script(turns=(Turn(items=(weather_call("c1", "Oslo"),), delay_ms=0),))
    async with ScriptedServer({"s": script}) as server:
        client = model_client(provider, model="s", base_url=server.base_url(provider))
        async with client:
            agent = Agent(client, [get_weather], run_limits=RunLimits(max_rounds=1))
            # the same stream again, in the same conversation (a replay, not a new chat)
            first = [e.to_json() async for e in agent.run("go", conversation="chat-1")]
            second = [e.to_json() async for e in agent.run("go", conversation="chat-1")]
    # Gemini sends no call ids: the ones toollatch makes up differ per attempt, so there is
    # no id to dedupe by and the call runs again; every other provider's id runs once
    assert ran == (["Oslo", "Oslo"] if provider == "gemini" else ["Oslo"])
    assert first[-1]["history"][-1] == second[-1]["history"][-1]  # the same result


async def test_results_are_in_call_order_when_the_first_call_finishes_last():
    release = asyncio.Event()

    @tool
    async def slow(n: int) -> str:
        if n == 1:
            await release.wait()
        else:
            release.set()
        return f"done {n}"

    calls = tuple(Call(call_id=f"c{n}", name="slow", arguments=f'{{"n": {n}}}') for n in (1, 2))
    script = Script(turns=(Turn(items=calls, delay_ms=0),))
    async with ScriptedServer({"s": script}) as server:
        events, run = await play(
            server, "openai_chat", [slow], model="s", limits=RunLimits(max_rounds=1)
        )
    finished = [e["id"] for e in events if e["type"] == "tool_finished"]
    assert finished == ["c2", "c1"]
    results = [m["tool_call_id"] for m in run.history if m.get("role") == "tool"]
    assert results == ["c1", "c2"]


@EVERY_PROVIDER
async def test_a_stalled_stream_fails_its_calls_idle_timeout(provider, tmp_path):
    # (the stall comes after the first argument fragment; Gemini's call arrives whole)
    turn = Turn(
        items=(weather_call("c1", "Oslo"), Text(text="and then")),
        delay_ms=0,
        faults=Faults(stall_ms=2000),
    )
    script = Script(turns=(turn, Turn(items=(Text(text="ok"),), delay_ms=0)))
    async with ScriptedServer({"s": script}) as server:
        events, _ = await play(
            server,
            provider,
            example_tools(tmp_path),
            model="s",
            client_limits=ClientLimits(idle_s=0.2),
        )
        assert [r.status for r in server.requests] == [200, 200]  # the history was valid
    rounds = [e for e in events if e["type"] == "round_ended"]
    assert rounds[0]["ended"] == "interrupted"
    failed = [(e["id"], e["error"]) for e in events if e["type"] == "call_failed"]
    if provider != "gemini":  # Gemini's call arrives whole after the stall point
        assert failed == [("c1", "idle_timeout")]


@EVERY_PROVIDER
async def test_a_dropped_connection_fails_the_open_calls_and_the_run_goes_on(provider, tmp_path):
    items = (Text(text="Checking the weather now."), weather_call("c1", "Oslo"))
    wire = _encode(provider, Turn(items=items), model="s", body={}, response_id="r")
    first_fragment = next(n for n, e in enumerate(wire) if e.in_arguments)
    # (Gemini's call arrives whole, with the finish reason: drop just before it)
    drop = first_fragment if provider == "gemini" else first_fragment + 1
    turn = Turn(items=items, delay_ms=0, faults=Faults(drop_after_events=drop))
    script = Script(turns=(turn, Turn(items=(Text(text="ok"),), delay_ms=0)))
    async with ScriptedServer({"s": script}) as server:
        events, _ = await play(server, provider, example_tools(tmp_path), model="s")
        assert [r.status for r in server.requests] == [200, 200]
    assert next(e["ended"] for e in events if e["type"] == "round_ended") == "interrupted"
    assert events[-1]["error"] is None


async def test_a_model_error_before_the_stream_ends_the_run_with_its_message(tmp_path):
    turn = Turn(items=(Text(text="never"),), faults=Faults(status=429, status_attempts=5))
    async with ScriptedServer({"s": Script(turns=(turn,))}) as server:
        events, run = await play(server, "anthropic", example_tools(tmp_path), model="s")
    assert events[-1]["type"] == "run_ended"
    assert events[-1]["rounds"] == 0
    assert "429" in events[-1]["error"] or "rate" in events[-1]["error"].lower()
    assert run.history == [{"role": "user", "content": "go"}]


@EVERY_PROVIDER
async def test_cancel_mid_tool_pairs_every_call_and_the_history_is_accepted(provider):
    started = asyncio.Event()

    @tool
    async def get_weather(city: str) -> str:
        started.set()
        await asyncio.Event().wait()  # never returns
        return "unreachable"

    script = Script(turns=(Turn(items=(weather_call("c1", "Oslo"),), delay_ms=0),))
    async with ScriptedServer({"s": script}) as server:
        client = model_client(provider, model="s", base_url=server.base_url(provider))
        async with client:
            run = Agent(client, [get_weather]).run("go")
            events = []
            async for event in run:
                events.append(event.to_json())
                if event.type == "tool_started":
                    run.cancel()
            # the history left behind is valid: the server accepts it as the next request
            # (Bedrock's needs the tools: a toolConfig, with toolUse blocks in the history)
            tools = [get_weather.spec] if provider == "bedrock" else []
            async with client.stream(run.history, tools=tools) as again:
                assert again.status == 200
    call_id = "gemini:1:0" if provider == "gemini" else "c1"  # (Gemini sends no ids)
    finished = [e for e in events if e["type"] == "tool_finished"]
    assert [(e["id"], e["error"]) for e in finished] == [(call_id, "cancelled")]
    assert events[-1]["type"] == "run_ended"
    assert events[-1]["calls"][0]["error"] == "cancelled"


@EVERY_PROVIDER
async def test_cancel_mid_stream_pairs_every_call(provider, tmp_path):
    turn = Turn(items=(Text(text="Checking."), weather_call("c1", "Oslo")), delay_ms=0)
    wire = _encode(provider, turn, model="s", body={}, response_id="r")
    after_text = next(n for n, e in enumerate(wire) if b"Checking." in e.data) + 1
    # the stall begins right after the text: the cancel lands in it, and must cut it short
    turn = Turn(
        items=turn.items, delay_ms=0, faults=Faults(stall_ms=30_000, stall_after_events=after_text)
    )
    async with ScriptedServer({"s": Script(turns=(turn,))}) as server:
        client = model_client(provider, model="s", base_url=server.base_url(provider))
        async with client:
            run = Agent(client, example_tools(tmp_path)).run("go")
            events = []
            async for event in run:
                events.append(event.to_json())
                if event.type == "text":
                    run.cancel()  # the stream is stalled: the round is in flight
            async with client.stream(run.history) as again:
                assert again.status == 200  # the history left behind is valid
    assert [e["ended"] for e in events if e["type"] == "round_ended"] == ["cancelled"]
    assert "call_opened" not in [e["type"] for e in events]  # the stall was not waited out
    assert events[-1]["type"] == "run_ended"


def test_run_limits_are_checked():
    from toollatch import ConfigError

    for bad in ({"max_rounds": 0}, {"max_tool_calls": -1}, {"deadline_s": 0.0}):
        with pytest.raises(ConfigError):
            RunLimits(**bad)


async def test_the_deadline_cancels_the_round_in_flight(tmp_path):
    turn = Turn(
        items=(weather_call("c1", "Oslo"),), delay_ms=0, faults=Faults(stall_ms=5000)
    )  # (after the first argument fragment)
    async with ScriptedServer({"s": Script(turns=(turn,))}) as server:
        events, _ = await play(
            server,
            "anthropic",
            example_tools(tmp_path),
            model="s",
            limits=RunLimits(deadline_s=0.3),
        )
    assert [e["ended"] for e in events if e["type"] == "round_ended"] == ["cancelled"]
    assert events[-1]["calls"][0]["error"] == "cancelled"


async def test_the_deadline_passing_while_the_rounds_only_tool_runs_cancels_it_in_order():
    """The round's only call runs in the run's own task: the run's deadline still cuts it
    (``cancelled``, outcome unknown), with its events in the order they had; and the tool's
    own timeout is a ``tool_timeout`` result the model reads, the run going on."""

    @tool(timeout=60)
    async def get_weather(city: str) -> str:
        await asyncio.Event().wait()
        return "unreachable"

    script = Script(turns=(Turn(items=(weather_call("c1", "Oslo"),), delay_ms=0),))
    async with ScriptedServer({"s": script}) as server:
        events, run = await play(
            server, "openai_chat", [get_weather], model="s", limits=RunLimits(deadline_s=0.3)
        )
    assert [e["type"] for e in events] == [
        "call_opened",
        "call_committed",
        "tool_started",
        "tool_finished",
        "round_ended",
        "run_ended",
    ]
    assert events[3]["error"] == "cancelled"
    assert "outcome is unknown" in events[3]["result"]
    assert run.deadline_passed

    @tool(name="get_weather", timeout=0.05)
    async def slow(city: str) -> str:
        await asyncio.Event().wait()
        return "unreachable"

    again = Turn(items=(Text(text="it timed out"),), delay_ms=0)
    script = Script(turns=(Turn(items=(weather_call("c1", "Oslo"),), delay_ms=0), again))
    async with ScriptedServer({"s": script}) as server:
        events, run = await play(server, "openai_chat", [slow], model="s")
    finished = [e for e in events if e["type"] == "tool_finished"]
    assert [e["error"] for e in finished] == ["tool_timeout"]
    assert [e["type"] for e in events][-3:] == ["text", "round_ended", "run_ended"]
    assert not run.deadline_passed and events[-1]["error"] is None


async def test_a_call_whose_arguments_stall_while_pings_go_on_fails_idle_timeout(tmp_path):
    from loopback_http import loopback, stream_reply

    def event(data: dict) -> bytes:
        return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()

    start = {
        "type": "message_start",
        "message": {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "content": [],
            "usage": {"input_tokens": 1},
        },
    }
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
    }
    fragment = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
    }

    async def pause() -> None:
        await asyncio.sleep(0.05)

    pings = [p for _ in range(40) for p in (pause, event({"type": "ping"}))]
    async with loopback() as server:
        server.replies.append(stream_reply([event(start), event(block), event(fragment), *pings]))
        client = model_client(
            "anthropic", model="m", base_url=server.url, retry=RetryPolicy(attempts=1)
        )
        async with client:
            agent = Agent(
                client,
                example_tools(tmp_path),
                run_limits=RunLimits(max_rounds=1, call_stall_s=0.3),
            )
            events = [e.to_json() async for e in agent.run("go")]
    failed = [(e["id"], e["error"]) for e in events if e["type"] == "call_failed"]
    assert failed == [("t1", "idle_timeout")]
    assert [e["ended"] for e in events if e["type"] == "round_ended"] == ["interrupted"]


async def test_cancel_before_the_run_begins_plays_no_round_and_still_ends_it(tmp_path):
    """A signal may come before the run's driver took its first step (a task cancelled then
    would never run the code that ends the run): no round is played, ``run_ended`` comes."""
    async with ScriptedServer(delay_scale=0) as server:
        client = model_client(
            "openai_chat", model="scripted", base_url=server.base_url("openai_chat")
        )
        async with client:
            early = Agent(client, example_tools(tmp_path)).run("go")
            early.cancel()  # before iterating
            ran = [e.to_json() async for e in early]
            late = Agent(client, example_tools(tmp_path)).run("go")
            # queued before the driver's first step, which iterating schedules
            asyncio.get_running_loop().call_soon(late.cancel)
            async with asyncio.timeout(10):  # (before the fix: waits forever)
                ran_late = [e.to_json() async for e in late]
    for events in (ran, ran_late):
        assert [e["type"] for e in events] == ["run_ended"]
        assert events[0]["rounds"] == 0
        assert events[0]["calls"] == []
    assert server.requests == []


async def test_a_consumer_cancelled_while_it_waits_gets_its_cancellation(tmp_path):
    # The consumer's task (not run.cancel()) is cancelled while it waits for the next event
    # in a stalled stream: the driver still ends the run (round_ended, run_ended go to the
    # hand-over the consumer no longer waits on), and the consumer sees CancelledError,
    # nothing else; the history left behind is valid.
    turn = Turn(items=(Text(text="Checking."), weather_call("c1", "Oslo")), delay_ms=0)
    wire = _encode("openai_chat", turn, model="s", body={}, response_id="r")
    after_text = next(n for n, e in enumerate(wire) if b"Checking." in e.data) + 1
    turn = Turn(
        items=turn.items, delay_ms=0, faults=Faults(stall_ms=30_000, stall_after_events=after_text)
    )
    async with ScriptedServer({"s": Script(turns=(turn,))}) as server:
        client = model_client("openai_chat", model="s", base_url=server.base_url("openai_chat"))
        async with client:
            run = Agent(client, example_tools(tmp_path)).run("go")
            seen: list[str] = []
            got_text = asyncio.Event()

            async def consume() -> None:
                async for event in run:
                    seen.append(event.type)
                    if event.type == "text":
                        got_text.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(got_text.wait(), 10)
            await asyncio.sleep(0.05)  # the consumer waits again: the stream is stalled
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
            assert [r.ended.value for r in run.rounds] == ["cancelled"]
            async with client.stream(run.history) as again:
                assert again.status == 200
    assert "call_opened" not in seen


class _CancelAt:
    """An observer that cancels its run, synchronously, at the ``at``-th event (as the
    relay's ``max_run_events`` bound does), and records every event's type."""

    def __init__(self, at: int) -> None:
        self.at, self.seen, self.run = at, list[str](), None

    def on_round_start(self, provider, round_no):
        pass

    def on_notice(self, provider, notice):
        pass

    def on_round(self, provider, round_):
        pass

    def on_not_committed(self, provider, detail):
        pass

    def on_event(self, provider, event):
        self.seen.append(event.type)
        if len(self.seen) == self.at:
            self.run.cancel()


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("at", [1, 2, 3, 4])
async def test_a_cancel_told_within_one_read_starts_no_tool(eager, at):
    # The whole round may come in one read (a loaded machine coalesces the stream's writes):
    # its notices are told without a wait, so the task's cancellation would come only after
    # them; calls committed after the cancel must not run (eager ones at their notice, the
    # others when the round is decided), each still paired, and the round is cancelled.
    ran: list[str] = []

    @tool(eager=eager)
    def get_weather(city: str) -> str:
        ran.append(city)
        return "sunny"

    items = (Text(text="Hi."), weather_call("c1", "Oslo"), weather_call("c2", "Rome"))
    script = Script(turns=(Turn(items=items, delay_ms=0), Turn(items=(Text(text="ok"),))))
    wire = b"".join(
        b"data: " + e.data + b"\n\n"
        for e in _encode("openai_chat", script.turns[0], model="s", body={}, response_id="r")
    )
    assert len(wire) < 4096  # (one read on a quiet machine; the checks hold for any split)
    watch = _CancelAt(at)
    async with ScriptedServer({"s": script}) as server:
        client = model_client("openai_chat", model="s", base_url=server.base_url("openai_chat"))
        async with client:
            run = Agent(client, [get_weather], observers=[watch]).run("go")
            watch.run = run
            events = [e.to_json() async for e in run]
    kinds = [e["type"] for e in events]
    kinds = [e["type"] for e in events]
    # an eager call committed before the cancelling event had begun: it is cancelled running
    begun = eager and "call_committed" in kinds[: at - 1]
    started = [e["id"] for e in events if e["type"] == "tool_started"]
    if begun:  # (cancelled as it began: it may or may not have reached the function)
        assert ran in ([], ["Oslo"]) and started in ([], ["c1"])
    else:
        assert ran == [] and started == []
    opened = {e["id"] for e in events if e["type"] == "call_opened"}
    ended = [e["id"] for e in events if e["type"] in ("tool_finished", "call_failed")]
    assert sorted(ended) == sorted(opened)  # every call told is paired, once
    assert {c["error"] for c in events[-1]["calls"]} <= {"cancelled"}
    # (a cancel told while a complete round's calls were decided: its stream ended normally)
    decided = not eager and kinds[at - 1] == "call_committed"
    rounds = [e["ended"] for e in events if e["type"] == "round_ended"]
    assert rounds == ["normal" if decided else "cancelled"]
    assert kinds[-1] == "run_ended" and events[-1]["error"] is None
