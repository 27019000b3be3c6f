"""What keeps the proxy's added latency low, checked without a clock: each text delta is
passed on before the upstream sends the next one, and the upstream client
(:func:`toollatch.relay._http.upstream_http`: aiohttp's transport) neither bounds its
connections nor opens one per stream.

The proxy holds one upstream connection per client stream in flight: a bound on them (100 by
default, in aiohttp's connector as in httpx's pool) made stream 101 wait for another to end,
then fail 502 after the pool timeout (benchmarks/README.md, 200 streams). Its idle
connections are kept for the next streams. Real HTTP on loopback; the connections are
counted (the upstream sees each one's client port), never timed."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import orjson
import pytest
from starlette.responses import StreamingResponse

from loopback_http import loopback
from toollatch.relay import ProxyServer
from toollatch.relay._http import upstream_http
from toollatch.relay._proxy import EventStream, LastFrame, Proxy

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
DONE = b"data: [DONE]\n\n"


def open_client() -> httpx.AsyncClient:
    """The test's own client: no bound of its own on its connections to the proxy."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=60)


async def burst(client: httpx.AsyncClient, base: str, n: int) -> list[bytes]:
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


def answering(ports: list[int], before_end: asyncio.Event | None = None):
    """A streamed answer that notes the client port of the connection it came on (the
    proxy's upstream connection) and, with ``before_end``, sends its end only once that is
    set."""

    async def reply(scope, receive, send):
        ports.append(scope["client"][1])

        async def body():
            yield chunk(role="assistant", content="hi")
            if before_end is not None:
                await before_end.wait()
            yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
            yield DONE

        await StreamingResponse(body(), media_type="text/event-stream")(scope, receive, send)

    return reply


def gathered(n: int, ports: list[int]):
    """Replies for a burst of ``n`` streams: none ends before all ``n`` have reached the
    upstream (so each takes a connection of its own)."""
    all_in = asyncio.Event()

    async def counted(scope, receive, send):
        if len(ports) + 1 == n:
            all_in.set()
        await answering(ports, all_in)(scope, receive, send)

    return [counted] * n


async def test_more_streams_than_a_connection_pool_s_default_are_all_upstream_at_once():
    """110 streams at once, none of which ends before all 110 have reached the upstream: a
    bound of 100 upstream connections (aiohttp's and httpx's default) would hold the last 10
    until one of the first ended, so none would end (the timeout only ends the wait)."""
    n = 110
    ports: list[int] = []
    async with loopback() as lb:
        lb.replies += gathered(n, ports)
        async with ProxyServer(lb.url + "/v1") as proxy, open_client() as client:
            async with asyncio.timeout(30):
                bodies = await burst(client, proxy.url, n)
    assert all(body.endswith(DONE) for body in bodies)
    assert len(set(ports)) == n  # (one connection each)


async def test_the_upstream_connections_are_kept_for_the_next_streams():
    """Streams one after the other take the one kept connection; a burst of 8 then another
    take the same 8 connections."""
    ports: list[int] = []
    async with loopback() as lb:
        lb.replies += [answering(ports)] * 5
        async with ProxyServer(lb.url + "/v1") as proxy, open_client() as client:
            for _ in range(5):
                [body] = await burst(client, proxy.url, 1)
                assert body.endswith(DONE)
            assert len(set(ports)) == 1
            ports.clear()
            lb.replies += gathered(8, ports)
            first = await burst(client, proxy.url, 8)
            kept = set(ports)
            ports.clear()
            lb.replies += gathered(8, ports)
            again = await burst(client, proxy.url, 8)
    assert all(body.endswith(DONE) for body in [*first, *again])
    assert len(kept) == 8
    assert set(ports) == kept


async def test_an_upstream_connection_idle_near_the_upstreams_keep_alive_is_not_taken():
    """A connection idle 3.5 s (uvicorn, as most model servers, closes its own at 5 s) is
    dropped, not reused: at 5 s of idleness the proxy took connections just as the upstream
    closed them, 502 "Server disconnected" (``_http.UPSTREAM_KEEPALIVE_S``); one idle a
    moment is still taken."""
    ports: list[int] = []
    async with loopback() as lb:
        lb.replies += [answering(ports)] * 3
        async with ProxyServer(lb.url + "/v1") as proxy, open_client() as client:
            for pause in (0.0, 0.1, 3.5):
                await asyncio.sleep(pause)
                [body] = await burst(client, proxy.url, 1)
                assert body.endswith(DONE)
    assert ports[0] == ports[1] != ports[2]


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


async def test_what_one_upstream_read_decided_goes_to_the_client_in_one_write():
    """The upstream's first write holds three text deltas; its end waits until the proxy has
    sent the client its first body message, which must carry all three (one write per
    upstream read: a write per event would send one, then wait for nothing)."""
    first = chunk(role="assistant") + b"".join(chunk(content=t) for t in ("a", "b", "c"))
    sent_first = asyncio.Event()

    async def upstream(scope, receive, send):
        async def body():
            yield first
            await sent_first.wait()
            yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
            yield DONE

        await StreamingResponse(body(), media_type="text/event-stream")(scope, receive, send)

    bodies: list[bytes] = []
    done = asyncio.Event()

    async def send(message):
        if message["type"] == "http.response.body":
            bodies.append(message.get("body", b""))
            sent_first.set()
            if not message.get("more_body", False):
                done.set()

    await through_proxy(upstream, send, until=done)
    texts = [
        [c["delta"].get("content") for c in orjson.loads(line[6:])["choices"]]
        for line in bodies[0].split(b"\n\n")
        if line.startswith(b"data: {")
    ]
    assert texts == [["a"], ["b"], ["c"]]
    assert b"".join(bodies).endswith(DONE)


async def through_proxy(
    upstream: Any, send: Any, *, until: asyncio.Event, then: asyncio.Event | None = None
) -> None:
    """One ``POST /v1/chat/completions`` (:data:`BODY`) through a :class:`Proxy` app driven
    in this task over the loopback ``upstream`` (an ASGI app), its messages to ``send``; the
    client goes away once ``until`` is set; ``then``: waited for before the upstream stops."""
    request = [orjson.dumps(BODY)]

    async def receive():
        if request:
            return {"type": "http.request", "body": request.pop(), "more_body": False}
        await until.wait()
        return {"type": "http.disconnect"}

    async with loopback() as lb:
        lb.replies.append(upstream)
        async with upstream_http(httpx.Timeout(30)) as http, asyncio.timeout(30):
            await Proxy(lb.url + "/v1", http)(chat_scope(), receive, send)
            if then is not None:
                await then.wait()


def chat_scope() -> dict[str, object]:
    """An ASGI request for the proxy's ``POST /v1/chat/completions``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def test_the_last_chunks_and_done_go_with_the_bodys_end_in_one_message():
    """The closing chunks and ``[DONE]`` are the body's last message (``more_body`` false):
    one write of the server's, where an empty end message after them was a second socket
    write per stream (benchmarks/README.md: a stream's start and end)."""
    messages: list[dict[str, object]] = []
    done = asyncio.Event()

    async def send(message):
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    await through_proxy(answering([]), send, until=done)

    async def no_frames():
        yield b""

    sse = StreamingResponse(no_frames(), media_type="text/event-stream")
    sse.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
    assert messages[0]["headers"] == sse.raw_headers  # (Starlette's, as before)
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    assert [m.get("more_body", False) for m in bodies] == [True, False]
    assert bodies[-1]["body"].endswith(b'"finish_reason":"stop"}]}\n\n' + DONE)


async def test_a_client_gone_mid_stream_stops_the_stream_and_closes_the_upstream():
    """The client goes away after the first text while the upstream holds its next event:
    the proxy's answer ends, and so does the upstream's stream (its connection closed),
    without waiting for the upstream (which would wait for ever: the timeout only ends the
    wait)."""
    upstream_ended = asyncio.Event()

    async def holding(scope, receive, send):
        async def body():
            try:
                yield chunk(role="assistant", content="hi")
                await asyncio.Event().wait()
            finally:
                upstream_ended.set()

        await StreamingResponse(body(), media_type="text/event-stream")(scope, receive, send)

    first_text = asyncio.Event()

    async def send(message):
        if message["type"] == "http.response.body" and b"hi" in message.get("body", b""):
            first_text.set()

    await through_proxy(holding, send, until=first_text, then=upstream_ended)
    assert first_text.is_set()


async def test_an_event_stream_raises_a_send_error_as_itself_and_closes_its_frames():
    """A failing send (an ASGI server that raises on a closed connection) is raised as
    itself, not in an exception group, and the frames' generator is closed (its upstream
    with it); a LastFrame ends the body, whatever the generator would yield after it."""
    closed: list[bool] = []

    async def frames():
        try:
            yield b"data: 1\n\n"
            yield LastFrame(b"data: [DONE]\n\n")
            yield b"never sent"
        finally:
            closed.append(True)

    async def receive():
        await asyncio.Event().wait()

    sent: list[dict[str, object]] = []

    async def send(message):
        sent.append(message)

    await EventStream(frames())(chat_scope(), receive, send)
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b"data: [DONE]\n\n"]
    assert sent[-1]["more_body"] is False
    assert closed == [True]

    async def refusing(message):
        if message["type"] == "http.response.body":
            raise OSError("the connection is closed")

    closed.clear()
    with pytest.raises(OSError, match="closed"):
        await EventStream(frames())(chat_scope(), receive, refusing)
    assert closed == [True]
