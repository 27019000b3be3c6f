"""A durable run's takeover when no worker drives its recovered workflow, driven directly on
one relay's objects (a real redis-server; no PostgreSQL: DBOS is not launched): the lease
sweep's winner ends the run the Redis way once nobody took it over within a bound, and a
recovered workflow whose run is over runs no further step (its fence says so)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from ledger_helpers import RedisServer
from relay_helpers import slow_script
from toollatch.relay import RelayServer

pytest.importorskip("dbos")

from toollatch.relay import _durable
from toollatch.relay._durable import DurableRelay
from toollatch.relay._requests import run_scope_of
from toollatch.relay._runs import RelayRun
from toollatch.relay.store._orphans import read_log
from toollatch.relay.store._redis import (
    _CLAIM_ORPHAN,
    RedisRunStore,
    RemoteRun,
    _meta,
    _stream,
)
from toollatch.runtime import DurableRuns

DEAD = "dead0000dead0000"
"""The worker whose lease a Redis restart lost (its run was won by the sweep)."""

BOUND_S = 0.5
"""``_durable._UNTAKEN_S`` in these tests (15 s served)."""


@pytest.fixture
async def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None:
        redis_server.start()
    return redis_server.url


@contextlib.asynccontextmanager
async def relays(url: str, tmp_path: Path, n: int) -> AsyncIterator[list[DurableRelay]]:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    servers = [
        RelayServer(scripts={"slow": slow_script()}, store=url, ledger=ledger) for _ in range(n)
    ]
    for server in servers:
        await server.__aenter__()
    try:
        made = []
        for server in servers:
            assert server.relay is not None and isinstance(server.relay.store, RedisRunStore)
            # (not opened: no DBOS here; the engine's workflow results are the test's)
            made.append(DurableRelay(server.relay, "postgresql://127.0.0.1:1/x", lease_s=1.0))
        yield made
    finally:
        for server in reversed(servers):
            await server.__aexit__(None, None, None)


def frame(n: int, data: dict[str, Any]) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (n, data["type"].encode(), orjson.dumps(data))


async def dead_workers_run(url: str, winner: RedisRunStore) -> tuple[str, str, str]:
    """A run of :data:`DEAD` mid-tool (a call committed and started), won by ``winner``'s
    sweep (``ending``, its ender), as when its workflow was recovered: its id, session
    digest and workflow id."""
    run_id, session = secrets.token_hex(12), secrets.token_hex(32)
    raw = aioredis.Redis.from_url(url)
    try:
        meta = {"session": session, "owner": DEAD, "status": "running", "epoch": 1}
        await raw.hset(_meta(run_id), mapping=meta)
        events = [
            {"type": "call_committed", "id": "call_a", "name": "get_weather"},
            {"type": "tool_started", "id": "call_a", "name": "get_weather"},
        ]
        for n, data in enumerate(events, start=1):
            await raw.xadd(_stream(run_id), {"f": frame(n, data)}, id=f"0-{n}")
        assert await raw.eval(_CLAIM_ORPHAN, 1, _meta(run_id), DEAD, winner.worker) == 1
    finally:
        await raw.aclose()
    return run_id, session, run_scope_of(session, run_id)


def never_ends(engine: DurableRuns, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's recovered workflow never ends: nobody drives it (it was dequeued by
    the worker that lost the run, which refuses it)."""

    async def result(_workflow: str) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(engine, "result", result)


async def test_a_recovered_run_nobody_takes_over_is_ended_after_a_bound(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_durable, "_UNTAKEN_S", BOUND_S, raising=False)
    async with relays(redis_url, tmp_path, 2) as (winner, owner):
        never_ends(winner.engine, monkeypatch)
        run_id, session, workflow = await dead_workers_run(redis_url, winner.store)
        # the owner (alive: Redis lost its lease) lost the run to the sweep's winner; the
        # workflow the winner recovered is dequeued by the owner, which refuses it
        relay = owner.relay
        lost = RelayRun(
            "", relay.previews, relay.limits, run_id=run_id, session_key=session,
            approval_secret=relay.approval_secret,
        )  # fmt: skip
        owner._runs[workflow] = lost
        assert owner._lose(lost)
        assert not await owner._fence(workflow)
        with pytest.raises(DurableRuns.Lost):
            await owner._attempt(workflow, 2)
        # nobody drives it: the winner ends the run, every call paired, once the bound passed
        async with asyncio.timeout(BOUND_S + 5.0):
            await winner._watch(run_id, session, DEAD, workflow)
        seen = read_log(await winner.store.logged(run_id))
        assert seen.ended and not seen.committed and "call_a" in seen.results
        assert await winner.store.client.hget(_meta(run_id), "status") == b"done"
        # taken over in time by another worker: the winner leaves the run to that worker
        run_id, session, workflow = await dead_workers_run(redis_url, winner.store)
        assert await owner.store.take_over(run_id) is not None
        async with asyncio.timeout(BOUND_S + 5.0):
            await winner._watch(run_id, session, DEAD, workflow)
        assert not read_log(await winner.store.logged(run_id)).ended
        fields = await winner.store.client.hmget(_meta(run_id), "status", "owner")
        assert fields == [b"running", owner.store.worker.encode()]


async def test_a_recovered_workflow_whose_run_is_over_runs_no_further_step(
    redis_url: str, tmp_path: Path
) -> None:
    async with relays(redis_url, tmp_path, 2) as (winner, other):
        run_id, session, workflow = await dead_workers_run(redis_url, winner.store)
        assert await winner.store.end_if_held(run_id, DEAD, session)  # (ended the Redis way)
        # the workflow, recovered, reaches ``other``: its next step is fenced (RunLost in
        # the runtime: nothing recorded, no tool started), and so are its events
        assert not await other._fence(workflow)
        assert not await other._fence(workflow)  # (decided once, kept)
        with pytest.raises(DurableRuns.Lost):
            await other._attempt(workflow, 3)
        assert await other.store.client.hget(_meta(run_id), "status") == b"done"
        assert workflow not in other._runs


async def test_a_request_forwarded_while_its_run_is_being_taken_over_is_asked_again(
    redis_url: str, tmp_path: Path
) -> None:
    """Between the store's ``take_over`` and the run kept in the taker's process (it reads
    the run's questions from the shared log first), a request forwarded to the taker is
    answered 409 ``run_not_running``, which the clients ask again, not 404 (an AI SDK
    answer to a durable chat failed so under load); a run nobody holds is still 404."""
    async with relays(redis_url, tmp_path, 2) as (winner, taker):
        run_id, session, _workflow = await dead_workers_run(redis_url, winner.store)
        assert await taker.store.take_over(run_id) is not None  # (not kept there yet)
        owner = taker.store.worker
        remote = RemoteRun(winner.store, run_id, secrets.token_urlsafe(32), owner, 2, False)
        replied = await winner.store.ask(remote, {"kind": "answer", "call": "call_a"})
        assert replied is not None
        assert (replied[0], replied[1]["error"]["code"]) == (409, "run_not_running")
        other = RemoteRun(winner.store, secrets.token_hex(12), session, owner, 0, False)
        replied = await winner.store.ask(other, {"kind": "answer", "call": "call_a"})
        assert replied is not None and replied[0] == 404
