"""What keeps the proxy's added latency low, checked without a clock: each text delta is
passed on before the upstream sends the next one, and the upstream connection pools
(:class:`PoolShards`) keep their bookkeeping small.

Each request goes through the least busy of several httpx pools, so none holds more than its
share of the connections. httpcore's pool (1.0.9) walks all of its connections, once more
for each idle one, every time a request starts or ends (encode/httpcore#1035): with every
stream in one pool, 50 streams started at once cost the proxy's loop a third of its time
there, and every stream's first event waited for it (benchmarks/README.md). Real HTTP on
loopback; the work is counted (connection checks), never timed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpcore
import httpx
import orjson
import pytest
from starlette.responses import StreamingResponse

from loopback_http import loopback
from toollatch.relay import ProxyServer
from toollatch.relay._proxy import PoolShards
from toollatch.scripted import Script, ScriptedServer, Text, Turn

STREAMS = 32
SLOW = Script(turns=(Turn(items=(Text(text="one two three four", chunk_chars=4),), delay_ms=40),))
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@contextlib.contextmanager
def counted_checks() -> Iterator[list[int]]:
    """Counts httpcore's idle checks of a connection (its pool's bookkeeping) meanwhile."""
    count = [0]
    real = httpcore.AsyncHTTPConnection.is_idle

    def is_idle(self: httpcore.AsyncHTTPConnection) -> bool:
        count[0] += 1
        return real(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(httpcore.AsyncHTTPConnection, "is_idle", is_idle)
        yield count


async def burst(client: httpx.AsyncClient, base: str, n: int = STREAMS) -> list[bytes]:
    """``n`` streams at once, all open before any is read to its end; their bodies."""
    async with contextlib.AsyncExitStack() as stack:
        answers = await asyncio.gather(
            *(
                stack.enter_async_context(
                    client.stream("POST", f"{base}/chat/completions", json=BODY)
                )
                for _ in range(n)
            )
        )
        return list(await asyncio.gather(*(a.aread() for a in answers)))


async def test_a_burst_is_spread_over_the_pools_and_each_keeps_its_connections():
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=4)
    shards = PoolShards(8, limits)
    async with ScriptedServer({"m": SLOW}) as upstream:
        base = upstream.base_url("openai_chat")
        async with httpx.AsyncClient(transport=shards) as client:
            bodies = await burst(client, base)
            assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
            pools = [pool._pool.connections for pool in shards._pools]  # (httpx's own pools)
            assert [len(c) for c in pools] == [STREAMS // 8] * 8
            first = {id(c) for cs in pools for c in cs}
            await burst(client, base)  # the same connections again (each pool keeps its 4)
            again = {id(c) for pool in shards._pools for c in pool._pool.connections}
            assert again == first


async def test_one_stream_at_a_time_keeps_to_one_pool_and_one_connection():
    """Streams one after the other take the first pool, the least busy, and its kept
    connection, as a single pool did (pools in turn would open one connection per pool,
    and one per stream once each has expired between two visits)."""
    shards = PoolShards(8, httpx.Limits(max_connections=None, max_keepalive_connections=4))
    async with ScriptedServer({"m": SLOW}) as upstream:
        base = upstream.base_url("openai_chat")
        async with httpx.AsyncClient(transport=shards) as client:
            for _ in range(5):
                [body] = await burst(client, base, 1)
                assert body.endswith(b"data: [DONE]\n\n")
            assert [len(pool._pool.connections) for pool in shards._pools] == [1] + [0] * 7


async def test_a_burst_of_streams_costs_the_proxy_few_connection_checks():
    """32 streams started at once through the proxy: one pool of all 32 connections checked
    them 169,312 times; 16 pools of 2, 672 (measured)."""
    async with (
        ScriptedServer({"m": SLOW}) as upstream,
        ProxyServer(upstream.base_url("openai_chat")) as proxy,
    ):
        # (the client's own pools: one connection each, so the checks counted are the proxy's)
        mine = PoolShards(STREAMS, httpx.Limits(max_connections=None))
        async with httpx.AsyncClient(transport=mine) as client:
            await burst(client, proxy.url)  # the pools' connections, made
            with counted_checks() as checks:
                bodies = await burst(client, proxy.url)
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    assert checks[0] < 100 * STREAMS, checks[0]


def chunk(**delta: object) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"


async def test_each_text_delta_reaches_the_client_before_the_upstream_sends_the_next():
    """The upstream sends text delta k only once the client holds delta k-1 through the
    proxy: a proxy that held a delta back until more bytes came (a write batch, a buffer
    waiting for a next event) would never pass this (the timeout only ends the wait)."""
    texts = ["Oslo ", "is ", "cold ", "today."]
    gates = [asyncio.Event() for _ in texts]
    gates[0].set()

    async def gated(scope, receive, send):
        async def body():
            yield chunk(role="assistant")
            for text, gate in zip(texts, gates, strict=True):
                await gate.wait()
                yield chunk(content=text)
            yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
            yield b"data: [DONE]\n\n"

        await StreamingResponse(body(), media_type="text/event-stream")(scope, receive, send)

    got: list[str] = []
    async with loopback() as lb:
        lb.replies.append(gated)
        async with ProxyServer(lb.url + "/v1") as proxy, httpx.AsyncClient(timeout=30) as client:
            async with (
                asyncio.timeout(30),
                client.stream("POST", f"{proxy.url}/chat/completions", json=BODY) as answer,
            ):
                async for line in answer.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    for choice in orjson.loads(line[6:])["choices"]:
                        if choice["delta"].get("content"):
                            got.append(choice["delta"]["content"])
                            if len(got) < len(gates):
                                gates[len(got)].set()
    assert got == texts
