"""A worker with a shared store serves as many readers of other workers' runs as its
``relay.max_connections`` admits: each holds one Redis connection for its blocking read, more
than redis-py's default pool of 100 (which ended the streams past it with "Too many
connections" and no ``run_ended``: benchmarks/bench_relay.py --workers 3 found it at 600 runs).
Two relays on a real redis-server on loopback."""

from __future__ import annotations

import asyncio

import httpx

from ledger_helpers import RedisServer
from relay_helpers import read_events, start_run
from test_relay_store import workers
from toollatch.relay._config import RelayLimits

READERS = 130
"""More than redis-py's default pool (100 connections)."""


async def test_more_remote_readers_than_redis_pys_default_pool_all_read_the_end(
    redis_server: RedisServer,
) -> None:
    limits = RelayLimits(max_session_readers=READERS + 10, max_connections=400)
    async with workers(redis_server.url, 2, limits=limits) as [a, b]:
        wide = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=a.url, timeout=60, limits=wide) as on_a:
            run = await start_run(on_a, "two cities", model="slow")  # (about 3 s)
            headers = {"x-toollatch-session": run["session"]}
            async with httpx.AsyncClient(
                base_url=b.url, timeout=60, limits=wide, headers=headers
            ) as on_b:
                read = [read_events(on_b, run["events_url"]) for _ in range(READERS)]
                got = await asyncio.gather(*read)
    whole = got[0]
    assert whole[-1].event == "run_ended" and whole[-1].data["error"] is None
    assert [f.id for f in whole] == list(range(1, len(whole) + 1))
    assert all(frames == whole for frames in got)
