"""Redis specifics on a real redis-server (loopback): the per-session lock (exclusion,
renewal past its lease, a clear LockLost when it is taken, a bounded wait) and a Redis
restart in the middle of a tool run (a clear error or the stored result, never a double run).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from ledger_helpers import RedisServer, chat_round, free_port
from toollatch import ConfigError, ErrorCode, UsageError, tool
from toollatch.ledger import LedgerError, LockLost
from toollatch.ledger._lock import RedisSessionLock
from toollatch.ledger.redis import redis_session_locks
from toollatch.runtime import Dispatcher

WORKER = Path(__file__).with_name("ledger_worker.py")


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.Redis.from_url(redis_server.url, socket_timeout=2)
    await made.flushdb()
    yield made
    await made.aclose()


async def test_two_holders_never_overlap(client: aioredis.Redis) -> None:
    inside: list[int] = []
    overlaps = 0

    async def hold(i: int) -> int:
        nonlocal overlaps
        async with RedisSessionLock(client, "s1", lease_s=1, poll_s=0.005) as lock:
            inside.append(i)
            overlaps += len(inside) > 1
            await asyncio.sleep(0.02)
            inside.remove(i)
            assert lock.token is not None
            return lock.token

    tokens = await asyncio.gather(*(hold(i) for i in range(5)))
    assert overlaps == 0
    assert sorted(tokens) == list(range(1, 6))


async def test_renewal_keeps_the_lock_past_its_lease(client: aioredis.Redis) -> None:
    # a 0.3 s lease, renewed every 0.1 s: a renewal must be 0.2 s late to lose it (with 0.15 s,
    # 0.1 s was enough, which a loaded machine gave now and then)
    async with RedisSessionLock(client, "s1", lease_s=0.3):
        await asyncio.sleep(1.2)  # four leases
        other = RedisSessionLock(client, "s1", lease_s=0.3, wait_s=0.1)
        with pytest.raises(LedgerError, match="busy"):
            await other.__aenter__()
    async with RedisSessionLock(client, "s1", wait_s=0.1):  # released on exit
        pass


async def test_a_lost_lock_cancels_the_body_with_lock_lost(client: aioredis.Redis) -> None:
    reached_end = False

    async def body() -> None:
        nonlocal reached_end
        async with RedisSessionLock(client, "s1", lease_s=0.15):
            await client.set("toollatch:lock:{s1}", "thief")
            await asyncio.sleep(2)
            reached_end = True

    with pytest.raises(LockLost, match="expired or another worker took it"):
        await body()
    assert not reached_end
    assert await client.get("toollatch:lock:{s1}") == b"thief"  # never deleted the thief's


async def test_a_released_lock_never_cancels_its_former_holder(client: aioredis.Redis) -> None:
    """A renewal whose cancel a Redis command swallowed (redis-py's, under Python 3.11's
    asyncio.wait_for: python/cpython#86296) comes back after the release to find the key
    gone: that is no lost lock, and the task that held it, now doing something else, is
    never cancelled for it."""
    lock = RedisSessionLock(client, "s1", lease_s=0.15)
    renew = lock._renew
    in_renewal = asyncio.Event()
    swallowed: list[bool] = []

    async def swallowing(*args: Any, **kwargs: Any) -> Any:
        if swallowed:
            return await renew(*args, **kwargs)
        in_renewal.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.append(True)  # (and answers late: the key is gone by now)
        return await renew(*args, **kwargs)

    lock._renew = swallowing  # type: ignore[method-assign]
    async with lock:
        await asyncio.wait_for(in_renewal.wait(), 10)
    await asyncio.sleep(0.5)  # (cancelled here, without the check: the test fails)
    assert swallowed == [True]


async def test_the_lock_refuses_bad_options(client: aioredis.Redis) -> None:

    with pytest.raises(ConfigError):
        RedisSessionLock(client, "s", lease_s=0)
    with pytest.raises(UsageError):
        RedisSessionLock(client, "")


def test_a_redis_restart_mid_run_never_runs_a_call_twice(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    effects = tmp_path / "effects.txt"
    config = {
        "ledger": redis_server.url, "calls": [["c1", "charge", {"n": 1}]],
        "effects": str(effects), "attempts": str(tmp_path / "a.txt"), "lease_s": 0.5,
        "session": "restart", "tool_sleep": 1.5, "running": str(tmp_path / "running"),
    }  # fmt: skip

    def worker() -> subprocess.Popen[str]:
        args = [sys.executable, str(WORKER), json.dumps(config)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)

    first = worker()
    deadline = time.monotonic() + 30  # (a loaded machine may take seconds to start Python)
    while not (tmp_path / "running").exists():  # the tool is running (it sleeps 1.5 s)
        assert time.monotonic() < deadline, "the worker's tool never started"
        time.sleep(0.01)
    redis_server.restart()  # the append-only file keeps the "started" record
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0
    [result] = json.loads(out)
    assert result["content"] == "charged 1"  # the model gets what the tool did
    again = worker()
    out, _ = again.communicate(timeout=60)
    [second] = json.loads(out)
    # Either the first worker stored its result after the restart (the same result) or it
    # could not, and the call is "outcome unknown"; never a second run.
    assert second["content"] == "charged 1" or second["code"] == "outcome_unknown", second
    assert len(effects.read_text().splitlines()) == 1


def dispatcher_with_locks(client: aioredis.Redis, log: list[str], **options: float) -> Any:

    @tool
    async def step(v: str) -> str:
        """Logs its start and end."""
        log.append(f"start {v}")
        await asyncio.sleep(0.05)
        log.append(f"end {v}")
        return v

    locks = redis_session_locks(client, poll_s=0.005, **options)
    return Dispatcher([step], session_locks=locks)


async def test_two_workers_never_interleave_one_sessions_tools(client: aioredis.Redis) -> None:

    log: list[str] = []
    a, b = dispatcher_with_locks(client, log), dispatcher_with_locks(client, log)
    round_a = chat_round(a.specs, [("a1", "step", {"v": "a1"}), ("a2", "step", {"v": "a2"})])
    round_b = chat_round(b.specs, [("b1", "step", {"v": "b1"})])
    await asyncio.gather(a.run(round_a, session="s"), b.run(round_b, session="s"))
    owners = [entry.split()[1][0] for entry in log]
    assert owners in (["a"] * 4 + ["b"] * 2, ["b"] * 2 + ["a"] * 4), log  # one worker at a time
    log.clear()
    round_a = chat_round(a.specs, [("a3", "step", {"v": "a3"}), ("a4", "step", {"v": "a4"})])
    round_b = chat_round(b.specs, [("b2", "step", {"v": "b2"})])
    await asyncio.gather(a.run(round_a, session="s2"), b.run(round_b, session="t"))
    assert sorted(log[:3]) == ["start a3", "start a4", "start b2"], log  # other sessions: no wait


async def test_a_lost_session_lock_cancels_the_round_and_raises(client: aioredis.Redis) -> None:

    log: list[str] = []
    d = dispatcher_with_locks(client, log, lease_s=0.06)
    round_ = chat_round(d.specs, [("c1", "step", {"v": "c1"})])
    results = []

    async def body() -> None:
        async with d.round(session="s") as r:
            task = asyncio.create_task(r.finish(round_))
            while not log:
                await asyncio.sleep(0.001)
            await client.set("toollatch:lock:{s}", "thief")
            results.extend(await task)

    with pytest.raises(LockLost, match="another worker took it"):
        await body()
    assert results[0].code is ErrorCode.CANCELLED  # cancelled here, mid-run
    assert "outcome is unknown" in results[0].content
    assert log == ["start c1"]  # cancelled mid-run


async def test_an_unavailable_session_lock_means_not_run(client: aioredis.Redis) -> None:

    log: list[str] = []
    d = dispatcher_with_locks(client, log, wait_s=0.05)
    await client.set("toollatch:lock:{s}", "someone else")
    round_ = chat_round(d.specs, [("c1", "step", {"v": "c1"})])
    [result] = await d.run(round_, session="s")
    assert result.is_error
    assert result.code is ErrorCode.TOOL_TIMEOUT  # busy, not down
    assert "held the session's lock" in result.content
    assert log == []


async def test_a_session_lock_on_a_redis_that_is_down_is_ledger_unavailable() -> None:
    log: list[str] = []
    down = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=2)
    d = dispatcher_with_locks(down, log)
    round_ = chat_round(d.specs, [("c1", "step", {"v": "c1"})])
    [result] = await d.run(round_, session="s")
    await down.aclose()
    assert result.code is ErrorCode.LEDGER_UNAVAILABLE
    assert "session lock could not be taken" in result.content
    assert log == []
