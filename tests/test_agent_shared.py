"""One Agent shared by many runs at once (an agent is a configuration; a run holds its state):
50 concurrent runs against the scripted server over loopback, each in its own conversation,
with results that never cross runs and ledger keys naming each conversation; and runs that
share a conversation, deduped as documented."""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
from typing import Any

import pytest

from toollatch import Agent, AgentRun, RetryPolicy, UsageError, model_client, open_ledger, tool
from toollatch.ledger import LedgerKey, current_call
from toollatch.ledger._history import MemoryHistory
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

RUNS = 50
RUN_VALUE: contextvars.ContextVar[str] = contextvars.ContextVar("run_value", default="?")
"""Set by each run's consumer task; the run's tools inherit it through the run's tasks."""


def two_calls() -> Script:
    """The same two calls, with the same ids, in every conversation (as servers that number
    ids per response do), then "done"."""
    items = (
        Text(text="Looking."),
        Call(call_id="call_0", name="echo", arguments='{"tag": "a"}', fragment_chars=4),
        Call(call_id="call_1", name="echo", arguments='{"tag": "b"}', fragment_chars=4),
    )
    return Script(turns=(Turn(items=items, delay_ms=0),))


def echo_tool(ran: list[str]) -> Any:
    @tool(name="echo", eager=True)
    async def echo(tag: str) -> str:
        """Echo the tag with the run's value and the conversation the call runs under."""
        context = current_call()
        await asyncio.sleep(0)  # let the other runs interleave
        text = f"{tag}|{RUN_VALUE.get()}|{context.session if context else None}"
        ran.append(text)
        return text

    return echo


async def drive(run: AgentRun, value: str) -> list[dict[str, Any]]:
    """Iterate ``run`` in a task of its own whose context carries ``value``."""

    async def consume() -> list[dict[str, Any]]:
        RUN_VALUE.set(value)
        return [event.to_json() async for event in run]

    return await asyncio.create_task(consume())


def results_of(events: list[dict[str, Any]]) -> list[str]:
    """The tool results the run sent back to the model (from its history), sorted."""
    history = events[-1]["history"]
    found: list[str] = []
    for entry in history:
        for part in entry.get("content") or entry.get("parts") or ():
            if not isinstance(part, dict):
                continue
            if part.get("type") == "tool_result":  # anthropic
                found.append(f"{part['tool_use_id']}={part['content']}")
            elif "functionResponse" in part:  # gemini (results pair by position)
                found.append(str(part["functionResponse"]["response"]))
    return sorted(found)


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
async def test_fifty_concurrent_runs_of_one_agent_keep_their_own_results(provider, tmp_path):
    ran: list[str] = []
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    async with ScriptedServer({"two": two_calls()}, delay_scale=0) as server:
        client = model_client(
            provider, model="two", base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
        )
        async with client:
            agent = Agent(client, [echo_tool(ran)], ledger=ledger, max_concurrency=16)
            runs = [agent.run(f"go {n}") for n in range(RUNS)]
            every = await asyncio.gather(*(drive(run, f"v{n}") for n, run in enumerate(runs)))
    try:
        conversations = [run.conversation for run in runs]
        assert len(set(conversations)) == RUNS  # each run has a conversation of its own
        assert len(ran) == 2 * RUNS  # every run's two calls ran: nothing deduped across runs
        for n, (run, events) in enumerate(zip(runs, every, strict=True)):
            ended = events[-1]
            assert ended["type"] == "run_ended"
            assert ended["error"] is None, ended
            assert ended["rounds"] == 2
            assert [c["state"] for c in ended["calls"]] == ["committed", "committed"]
            assert not any(c["is_error"] for c in ended["calls"])
            # this run's events: its own two tool starts and finishes, no other run's
            assert [e["type"] for e in events].count("tool_started") == 2
            assert [e["type"] for e in events].count("tool_finished") == 2
            ids = [c["id"] for c in ended["calls"]]
            texts = results_of(events)
            assert len(texts) == 2, texts
            assert all(f"|v{n}|{run.conversation}" in t for t in texts), texts
            for call_id in ids:  # the ledger keys each call under the run's conversation
                record = await ledger.get(LedgerKey(scope=run.conversation, call_id=call_id))
                assert record is not None
                assert record.state == "completed", record
        if provider == "gemini":  # made-up ids carry the agent-wide attempt number
            all_ids = [c["id"] for events in every for c in events[-1]["calls"]]
            assert len(set(all_ids)) == 2 * RUNS
    finally:
        await ledger.aclose()
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        scopes = [scope for (scope,) in db.execute("SELECT scope FROM toollatch_calls")]
    assert sorted(scopes) == sorted(c for c in conversations for _ in range(2))


async def test_concurrent_runs_sharing_a_conversation_run_each_call_id_once(tmp_path):
    # one conversation: a call id runs at most once in it, whichever run asks first; the
    # other run gets the stored result (waiting for it while it runs)
    ran: list[str] = []
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    async with ScriptedServer({"two": two_calls()}, delay_scale=0) as server:
        client = model_client(
            "anthropic",
            model="two",
            base_url=server.base_url("anthropic"),
            retry=RetryPolicy(attempts=1),
        )
        async with client:
            agent = Agent(client, [echo_tool(ran)], ledger=ledger)
            first, second = (
                agent.run("go", conversation="shared"),
                agent.run("go", conversation="shared"),
            )
            a, b = await asyncio.gather(drive(first, "first"), drive(second, "second"))
    try:
        assert len(ran) == 2  # call_0 and call_1 ran once each, for both runs
        assert a[-1]["error"] is None
        assert b[-1]["error"] is None
        assert results_of(a) == results_of(b)  # the same stored results in both histories
        assert {t.split("|")[2] for t in ran} == {"shared"}
        for events in (a, b):  # every committed call's result is told in each run
            assert [e["type"] for e in events].count("tool_finished") == 2
        for call_id in ("call_0", "call_1"):
            record = await ledger.get(LedgerKey(scope="shared", call_id=call_id))
            assert record is not None
            assert record.state == "completed"
    finally:
        await ledger.aclose()


async def test_runs_sharing_a_conversation_never_share_made_up_ids(tmp_path):
    # Gemini sends no call ids: the ids toollatch makes up embed an attempt number unique
    # over the agent's runs, so two runs in one conversation run their own calls
    ran: list[str] = []
    async with ScriptedServer({"two": two_calls()}, delay_scale=0) as server:
        client = model_client(
            "gemini", model="two", base_url=server.base_url("gemini"), retry=RetryPolicy(attempts=1)
        )
        async with client:
            agent = Agent(client, [echo_tool(ran)])
            first, second = agent.run("go", conversation="c"), agent.run("go", conversation="c")
            a, b = await asyncio.gather(drive(first, "first"), drive(second, "second"))
    assert len(ran) == 4
    assert {t.split("|")[1] for t in ran} == {"first", "second"}
    ids_a = {c["id"] for c in a[-1]["calls"]}
    ids_b = {c["id"] for c in b[-1]["calls"]}
    assert len(ids_a) == len(ids_b) == 2
    assert not ids_a & ids_b


async def test_a_run_takes_a_snapshot_of_the_agent(tmp_path):
    # changing the agent after run() changes later runs only
    async with ScriptedServer({"two": two_calls()}, delay_scale=0) as server:
        client = model_client(
            "anthropic",
            model="two",
            base_url=server.base_url("anthropic"),
            retry=RetryPolicy(attempts=1),
        )
        async with client:
            agent = Agent(client, [echo_tool([])], system="first system")
            early = agent.run("go")
            agent.system = "second system"
            late = agent.run("go")
            await asyncio.gather(drive(early, "e"), drive(late, "l"))
    systems = [r.body.get("system") for r in server.requests]
    assert systems.count("first system") == 2
    assert systems.count("second system") == 2


async def test_runs_of_one_agent_store_and_resume_their_own_sessions(tmp_path):
    # with a history store, one session is one stored run: concurrent runs of one agent
    # each name their own (run(session=...)), and one of them is resumed on the same agent
    store = MemoryHistory()
    async with ScriptedServer({"two": two_calls()}, delay_scale=0) as server:
        client = model_client(
            "anthropic",
            model="two",
            base_url=server.base_url("anthropic"),
            retry=RetryPolicy(attempts=1),
        )
        async with client:
            agent = Agent(client, [echo_tool([])], history_store=store)
            runs = [agent.run("go", session=f"s{n}") for n in range(3)]
            every = await asyncio.gather(*(drive(run, f"v{n}") for n, run in enumerate(runs)))
            assert [run.conversation for run in runs] == ["s0", "s1", "s2"]
            for n, events in enumerate(every):
                assert await store.load(f"s{n}") == events[-1]["history"]
            again = agent.run("and again?", session="s1", resume=True)
            events = await drive(again, "v1")
    assert events[-1]["error"] is None
    assert events[-1]["history"][: len(every[1][-1]["history"])] == every[1][-1]["history"]
    assert await store.load("s1") == events[-1]["history"]
    with pytest.raises(UsageError, match="session must be a non-empty str"):
        agent.run("go", session="")
