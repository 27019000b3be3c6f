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
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ledger_helpers import RedisServer
from toollatch.ledger import LedgerError
from toollatch.ledger._lock import LockLost, RedisSessionLock

WORKER = Path(__file__).with_name("ledger_worker.py")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


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
    assert overlaps == 0 and sorted(tokens) == list(range(1, 6))  # fencing tokens grow


async def test_renewal_keeps_the_lock_past_its_lease(client: aioredis.Redis) -> None:
    async with RedisSessionLock(client, "s1", lease_s=0.15):
        await asyncio.sleep(0.6)  # four leases
        other = RedisSessionLock(client, "s1", lease_s=0.15, wait_s=0.1)
        with pytest.raises(LedgerError, match="busy"):
            await other.__aenter__()
    async with RedisSessionLock(client, "s1", wait_s=0.1):  # released on exit
        pass


async def test_a_lost_lock_cancels_the_body_with_lock_lost(client: aioredis.Redis) -> None:
    reached_end = False
    with pytest.raises(LockLost, match="expired or another worker took it"):
        async with RedisSessionLock(client, "s1", lease_s=0.15):
            await client.set("toollatch:lock:{s1}", "thief")
            await asyncio.sleep(2)
            reached_end = True
    assert not reached_end
    assert await client.get("toollatch:lock:{s1}") == b"thief"  # never deleted the thief's


async def test_the_lock_refuses_bad_options(client: aioredis.Redis) -> None:
    from toollatch import ConfigError, UsageError

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
        "session": "restart", "tool_sleep": 1.5,
    }  # fmt: skip

    def worker() -> subprocess.Popen[str]:
        args = [sys.executable, str(WORKER), json.dumps(config)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)

    first = worker()
    time.sleep(1.2)  # the interpreter started and the tool is running (it sleeps 1.5 s)
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
    assert second["content"] == "charged 1" or "outcome is unknown" in second["content"]
    assert len(effects.read_text().splitlines()) == 1
