""" "Always allow this tool for this session" is a sticky, revocable decision kept in the
ledger and shared by every run of the session: the stores (memory, SQLite, Redis), the
runtime (two agents sharing a ledger and an approval session), a question asked before a
restart, and the relay over real HTTP (two runs of one browser session, revoke, another
session, a relay restart on a SQLite or Redis ledger)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from ledger_helpers import RedisServer, chat_round
from relay_helpers import read_events, start_run
from test_cli_approvals import ROOT, lines, run_cli, tools_file, writes
from test_relay_approvals import until_asked
from toollatch import Agent, ApprovalPolicy, ConfigError, model_client, tool
from toollatch.ledger import AlwaysStore, Question, TooManyAlways
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._history import SQLiteHistory
from toollatch.ledger._records import LedgerKey, digest_of
from toollatch.ledger._sqlite import SQLiteLedger
from toollatch.relay import RelayServer
from toollatch.relay._requests import run_scope
from toollatch.relay._restore import SUFFIX, forget, remember
from toollatch.runtime import Dispatcher
from toollatch.runtime._approvals import ALWAYS_REASON
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

ran: list[str] = []


@tool(needs_approval=True)
def note(key: str) -> str:
    """Record a key (the list proves how often it ran)."""
    ran.append(key)
    return f"noted {key}"


@tool(needs_approval=True)
def other(key: str) -> str:
    """A second tool that asks."""
    ran.append(f"other:{key}")
    return "ok"


def one_call(name: str = "note") -> Script:
    """Every run: one call of ``name``, then text."""
    call = Call(call_id="call_a", name=name, arguments='{"key": "a"}')
    return Script(turns=(Turn(items=(call,)), Turn(items=(Text(text="done"),))))


SCRIPTS = {"n": one_call(), "o": one_call("other")}
QUICK = ApprovalPolicy(timeout_s=5)  # a question nobody answers fails the test in 5 s


# -- the stores ------------------------------------------------------------------------------


async def test_every_store_keeps_always_decisions_per_session_capped_and_revocable(store: Any):
    """(``store``: each built-in ledger, conftest.py)"""
    assert isinstance(store, AlwaysStore)
    assert await store.allow_always("s1", "note", now=1.0, limit=2)
    assert not await store.allow_always("s1", "note", now=2.0, limit=2)  # there already
    assert await store.allow_always("s1", "other", now=3.0, limit=2)
    with pytest.raises(TooManyAlways):
        await store.allow_always("s1", "third", now=4.0, limit=2)
    assert not await store.allow_always("s1", "note", now=5.0, limit=2)  # (held: no refusal)
    assert await store.always("s1") == ["note", "other"]
    assert await store.always_allowed("s1", "note")
    assert not await store.always_allowed("s2", "note")  # another session: nothing
    assert not await store.always_allowed("s1", "third")
    assert await store.allow_always("s2", "third", now=6.0, limit=1)
    assert await store.revoke_always("s1", "note")
    assert not await store.revoke_always("s1", "note")
    assert not await store.always_allowed("s1", "note")
    assert await store.always("s1") == ["other"]
    assert await store.allow_always("s1", "third", now=7.0, limit=2)  # room again
    assert await store.always("s2") == ["third"]


async def test_a_sqlite_ledger_keeps_them_across_processes_and_purges_old_ones(tmp_path: Path):
    first = SQLiteLedger(tmp_path / "ledger.db")
    await first.allow_always("s1", "note", now=10.0, limit=5)
    await first.allow_always("s1", "other", now=20.0, limit=5)
    await first.aclose()
    second = SQLiteLedger(tmp_path / "ledger.db")
    try:
        assert await second.always("s1") == ["note", "other"]
        await second.purge(finished_before=15.0)
        assert await second.always("s1") == ["other"]
    finally:
        await second.aclose()


def test_the_cap_is_checked():
    with pytest.raises(ConfigError):
        ApprovalPolicy(max_always=0)
    with pytest.raises(ConfigError):
        ApprovalPolicy(max_always=True)  # type: ignore[arg-type]
    assert ApprovalPolicy().max_always == 32


# -- the runtime -----------------------------------------------------------------------------


async def play(
    url: str, ledger: Any, approval_session: str, *, model: str = "n", always: bool = False
) -> tuple[list[str], Any]:
    """One run of a fresh Agent (its own dispatcher, as another process would have) on
    ``ledger``: the ids it asked about (each approved, ``always`` when asked) and the run."""
    asked: list[str] = []
    async with model_client("openai_chat", model=model, base_url=url) as client:
        run = Agent(client, [note, other], ledger=ledger, approvals=QUICK).run(
            "go", approval_session=approval_session
        )
        async for event in run:
            if event.type == "approval_requested":
                asked.append(event.name)
                await run.approve(event.id, args_sha256=event.args_sha256, always=always)
    assert run.error is None and run.results[0][0].is_error is False, run.results
    return asked, run


async def test_two_agent_runs_sharing_a_ledger_and_session_ask_once_until_revoked(
    tmp_path: Path,
):
    ran.clear()
    ledger = SQLiteLedger(tmp_path / "ledger.db")
    try:
        async with ScriptedServer(SCRIPTS, delay_scale=0) as server:
            url = server.base_url("openai_chat")
            asked, first = await play(url, ledger, "alice", always=True)
            assert asked == ["note"]
            assert await first.always_allowed() == ["note"]
            asked, second = await play(url, ledger, "alice")
            assert asked == []  # the second run did not ask
            assert (await play(url, ledger, "bob"))[0] == ["note"]  # another session asks
            assert (await play(url, ledger, "alice", model="o"))[0] == ["other"]  # other tool
            assert await second.revoke("note")
            assert not await second.revoke("note")
            assert (await play(url, ledger, "alice"))[0] == ["note"]  # asks again
    finally:
        await ledger.aclose()
    assert ran == ["a", "a", "a", "other:a", "a"]


async def test_the_cap_refuses_the_answer_and_the_call_keeps_waiting():
    async with ScriptedServer(SCRIPTS, delay_scale=0) as server:
        url = server.base_url("openai_chat")
        ledger = MemoryLedger()
        policy = ApprovalPolicy(timeout_s=5, max_always=1)
        await ledger.allow_always("alice", "other", now=1.0, limit=1)
        async with model_client("openai_chat", model="n", base_url=url) as client:
            run = Agent(client, [note, other], ledger=ledger, approvals=policy).run(
                "go", approval_session="alice"
            )
            async for event in run:
                if event.type == "approval_requested":
                    with pytest.raises(TooManyAlways):
                        await run.approve(event.id, args_sha256=event.args_sha256, always=True)
                    assert run.pending == [event.id]  # nothing was answered
                    await run.approve(event.id, args_sha256=event.args_sha256)
    assert run.results[0][0].is_error is False
    assert await ledger.always("alice") == ["other"]


async def test_a_question_asked_before_a_restart_is_answered_by_the_always():
    """A pending question (its process died) meets a session that always allows the tool
    now: the resumed call runs and its question is answered, so no restart resumes it."""
    ledger = MemoryLedger()
    dispatcher = Dispatcher([note], ledger=ledger)
    args = {"key": "z"}
    key = LedgerKey(scope="conv", call_id="call_z")
    digest = digest_of("note", args)
    now = time.time()  # (it expires in 5 s: without the always, the test fails then)
    asked = Question(
        key=key, kind="approval", name="note", digest=digest, asked_at=now, expires_at=now + 5
    )
    await ledger.ask(asked)
    await ledger.allow_always("alice", "note", now=2.0, limit=5)
    events: list[str] = []
    round_ = chat_round(dispatcher.specs, [("call_z", "note", args)])
    async with dispatcher.round(
        "conv", approval_session="alice", on_event=lambda e: events.append(e.type)
    ) as r:
        results = await r.finish(round_)
    assert results[0].content == "noted z"
    found = await ledger.question(key)
    assert found is not None and found.decision == "approved" and found.reason == ALWAYS_REASON
    assert "approval_requested" not in events and "approval_answered" in events


# -- the relay -------------------------------------------------------------------------------


def relay(**extra: Any) -> RelayServer:
    return RelayServer(
        scripts=SCRIPTS, delay_scale=0, tools=[note, other], approvals=QUICK, **extra
    )


async def run_once(client: httpx.AsyncClient, *, always: bool = False) -> bool:
    """One run of the session (approving its question, ``always`` if asked so); whether it
    asked. The run must end with its call run."""
    run = await start_run(client, "go", model="n")
    frames = await until_asked(client, run["events_url"], 1, or_end=True)
    asked = [f.data for f in frames if f.event == "approval_requested"]
    if asked:
        body = {"token": asked[0]["token"], "always": always}
        ok = await client.post(f"/runs/{run['id']}/calls/{asked[0]['id']}/approve", json=body)
        assert ok.status_code == 202, ok.text
        frames = await read_events(client, run["events_url"])
    finished = [f.data for f in frames if f.event == "tool_finished"]
    assert [(f["name"], f["error"]) for f in finished] == [("note", None)], finished
    return bool(asked)


def session_client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=30)


async def test_two_runs_of_one_relay_session_ask_once_until_revoked():
    ran.clear()
    async with relay() as server, session_client(server.url) as alice:
        assert await run_once(alice, always=True)
        assert not await run_once(alice)  # the second run of the session did not ask
        listed = await alice.get("/session/approvals")
        assert (listed.status_code, listed.json()) == (200, {"always": ["note"]})
        async with session_client(server.url) as bob:
            assert await run_once(bob)  # another session still asks
            assert (await bob.get("/session/approvals")).json() == {"always": []}
            foreign = await bob.delete("/session/approvals/note")  # not bob's to revoke
            assert (foreign.status_code, foreign.json()["error"]["code"]) == (404, "not_found")
        assert not await run_once(alice)
        revoked = await alice.delete("/session/approvals/note")
        assert (revoked.status_code, revoked.json()) == (200, {"tool": "note", "revoked": True})
        again = await alice.delete("/session/approvals/note")
        assert (again.status_code, again.json()["error"]["code"]) == (404, "not_found")
        assert (await alice.get("/session/approvals")).json() == {"always": []}
        assert await run_once(alice)  # asks again
        nobody = await alice.get("/session/approvals", headers={"x-toollatch-session": ""})
        assert nobody.status_code == 404
        cross = await alice.delete(
            "/session/approvals/note", headers={"origin": "https://evil.example"}
        )
        assert (cross.status_code, cross.json()["error"]["code"]) == (403, "origin_not_allowed")
    assert ran == ["a"] * 5


async def test_the_relay_answers_409_past_the_sessions_cap():
    policy = ApprovalPolicy(timeout_s=5, max_always=1)
    server = RelayServer(scripts=SCRIPTS, delay_scale=0, tools=[note, other], approvals=policy)
    async with server, session_client(server.url) as alice:
        run = await start_run(alice, "go", model="o")
        frames = await until_asked(alice, run["events_url"], 1)
        asked = next(f.data for f in frames if f.event == "approval_requested")
        body = {"token": asked["token"], "always": True}
        ok = await alice.post(f"/runs/{run['id']}/calls/{asked['id']}/approve", json=body)
        assert ok.status_code == 202, ok.text
        await read_events(alice, run["events_url"])
        run = await start_run(alice, "go", model="n")
        frames = await until_asked(alice, run["events_url"], 1)
        asked = next(f.data for f in frames if f.event == "approval_requested")
        body = {"token": asked["token"], "always": True}
        full = await alice.post(f"/runs/{run['id']}/calls/{asked['id']}/approve", json=body)
        assert (full.status_code, full.json()["error"]["code"]) == (409, "too_many_always")
        body["always"] = False
        ok = await alice.post(f"/runs/{run['id']}/calls/{asked['id']}/approve", json=body)
        assert ok.status_code == 202, ok.text
        await read_events(alice, run["events_url"])
        assert (await alice.get("/session/approvals")).json() == {"always": ["other"]}


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_the_decision_survives_a_relay_restart_on_a_shared_ledger(
    backend: str, tmp_path: Path, request: Any
):
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        url = redis_server.url
        flush = aioredis.Redis.from_url(url)
        await flush.flushdb()
        await flush.aclose()
    ran.clear()
    async with session_client("http://unused") as alice:
        async with relay(ledger=url) as server:
            alice.base_url = httpx.URL(server.url)
            assert await run_once(alice, always=True)
        async with relay(ledger=url) as server:  # a new process's relay on the same ledger
            alice.base_url = httpx.URL(server.url)
            assert not await run_once(alice)
            assert (await alice.get("/session/approvals")).json() == {"always": ["note"]}
            async with session_client(server.url) as bob:
                assert await run_once(bob)
            assert (await alice.delete("/session/approvals/note")).status_code == 200
        async with relay(ledger=url) as server:
            alice.base_url = httpx.URL(server.url)
            assert await run_once(alice)  # the revoke was kept too
    assert ran == ["a"] * 4


# -- run records (relay/_restore.py): deleted once the run ends --------------------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite", "redis"])
async def test_a_runs_record_is_deleted_when_the_run_ends(
    backend: str, tmp_path: Path, request: Any
):
    if backend == "memory":
        url = "memory:"
    elif backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("redis_server").url
    async with relay(ledger=url) as server, session_client(server.url) as alice:
        assert server.relay is not None and server.relay.history is not None
        history = server.relay.history
        records: list[tuple[str, list[dict[str, Any]]]] = []
        for action in ("approve", "deny", "cancel"):
            run = await start_run(alice, "go", model="n")
            key = f"{run_scope(alice.headers['x-toollatch-session'], run['id'])}{SUFFIX}"
            frames = await until_asked(alice, run["events_url"], 1)
            asked = next(f.data for f in frames if f.event == "approval_requested")
            records.append((run["id"], await history.load(key)))  # while it waits: kept
            if action == "cancel":
                done = await alice.post(run["cancel_url"], json={})
            else:
                body = {"token": asked["token"]}
                done = await alice.post(
                    f"/runs/{run['id']}/calls/{asked['id']}/{action}", json=body
                )
            assert done.status_code == 202, done.text
            await read_events(alice, run["events_url"])
            for _ in range(200):  # (the record goes once the run's driver has closed)
                if not await history.load(key):
                    break
                await asyncio.sleep(0.01)
            assert await history.load(key) == [], action
    assert [[r["run"] for r in kept] for _, kept in records] == [[i] for i, _ in records]


async def test_a_record_a_newer_run_wrote_is_kept(tmp_path: Path):
    history = SQLiteHistory(tmp_path / "history.db")
    try:
        old = {"run": "r1", "conversation": "c", "start": "1"}
        new = {"run": "r1", "conversation": "c", "start": "2"}  # (resumed elsewhere)
        await remember(history, old)
        await remember(history, new)
        await forget(history, old)
        assert await history.load(f"c{SUFFIX}") == [old, new]
        await forget(history, new)
        assert await history.load(f"c{SUFFIX}") == []
    finally:
        await history.aclose()


# -- toollatch run: `a` at the prompt, kept under the run's session (--resume keeps it) --------


def test_run_answers_a_and_a_resumed_run_of_the_session_does_not_ask(tmp_path: Path):
    tools, log = tools_file(tmp_path)
    db = tmp_path / "ledger.db"
    command = ["--json", "--tools", str(tools), "--ledger", f"sqlite:///{db}"]
    done = run_cli(*command, "--session", "r1", stdin="a\n")
    assert done.returncode == 0, done.stderr
    assert "(a: always, this session)" in done.stderr
    assert writes(log) == ["write notes/weather.md"]
    assert asyncio.run(always_of(db, "r1")) == ["write_file"]

    # r2 is killed while it waits; meanwhile its session always allows the tool (another
    # run of it said `a`); `--resume r2` meets the call again and runs it without asking
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    runner = [sys.executable, "-m", "toollatch.cli", "run", *command]
    with subprocess.Popen(
        [*runner, "--session", "r2"], cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=env,
    ) as first:  # fmt: skip
        assert first.stdout is not None
        asked = next(e for e in map(json.loads, first.stdout) if e["type"] == "approval_requested")
        first.send_signal(signal.SIGKILL)
    asyncio.run(allow(db, "r2", "write_file"))
    done = run_cli(*command, "--resume", "r2", stdin="")  # (no line: a question would deny)
    assert done.returncode == 0, done.stderr
    events = lines(done.stdout)
    assert [e for e in events if e["type"] == "approval_requested"] == []
    answered = [e for e in events if e["type"] == "approval_answered"]
    assert [(e["id"], e["decision"]) for e in answered] == [(asked["id"], "approved")]
    assert writes(log) == ["write notes/weather.md"] * 2
    assert events[-1]["error"] is None


async def always_of(db: Path, scope: str) -> list[str]:
    ledger = SQLiteLedger(db)
    try:
        return await ledger.always(scope)
    finally:
        await ledger.aclose()


async def allow(db: Path, scope: str, name: str) -> None:
    ledger = SQLiteLedger(db)
    try:
        await ledger.allow_always(scope, name, now=time.time(), limit=32)
    finally:
        await ledger.aclose()
