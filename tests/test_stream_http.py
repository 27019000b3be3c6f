"""The client every model stream is read with (the loop's shared pool, the relay's runs, the
proxy's upstream): httpx's API on aiohttp, checked against raw loopback servers that break
HTTP/1.1 on purpose, and a proxy named by the environment."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
from collections.abc import Awaitable, Callable

import httpx
import pytest

from toollatch.relay._http import model_http, upstream_http
from toollatch.runtime._clients._http import stream_http
from toollatch.runtime._clients._pool import shared_http

pytestmark = pytest.mark.asyncio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
FIRST = b"a\r\ndata: {}\n\n\r\n"


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def read_head(reader: asyncio.StreamReader) -> bytes:
    head = b""
    while (line := await reader.readline()) not in (b"\r\n", b""):
        head += line
    return head


def client() -> httpx.AsyncClient:
    return stream_http(None, httpx.Limits(), httpx.create_ssl_context(), connections=0, idle_s=5)


def breaking(tail: bytes, *, close: bool) -> Handler:
    """A chunked answer whose first chunk is good and whose next bytes are ``tail``, read
    apart from it; then the connection closes, or stays open (``close`` False)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(HEAD + FIRST)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(tail)
        await writer.drain()
        if not close:
            await reader.read()  # until the client has gone
        writer.close()

    return handler


@pytest.mark.parametrize("close", [True, False], ids=["then-closed", "left-open"])
@pytest.mark.parametrize(
    "tail", [b"zz\r\nnot a size\r\n", b"5\r\ntoo long for five\r\n"], ids=["bad-size", "overlong"]
)
async def test_broken_framing_after_the_head_raises_at_once(tail, close, monkeypatch):
    # aiohttp's parser fails, closes the connection and keeps the error where the body's
    # reader never looks: without the connection watch the read waited for ever
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    server, url = await serve(breaking(tail, close=close))
    got: list[bytes] = []

    async def read(answer: httpx.Response) -> None:
        async with asyncio.timeout(3):
            async for chunk in answer.aiter_raw():
                got.append(chunk)

    async with server, client() as http, http.stream("GET", url) as answer:
        with pytest.raises(httpx.RemoteProtocolError):
            await read(answer)
    assert got[0] == b"data: {}\n\n"  # what came before the break was handed over


async def test_broken_framing_in_the_head_read_is_httpx_s_error():
    # (aiohttp raised its own ClientResponseError here, which no httpx caller catches)
    server, url = await serve(_bad_first_read)
    async with server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get(url)


async def _bad_first_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_head(reader)
    writer.write(HEAD + b"zz\r\n")
    await writer.drain()
    writer.close()


async def test_a_body_cut_short_is_httpx_s_remote_protocol_error():
    server, url = await serve(breaking(b"", close=True))
    async with server, client() as http, http.stream("GET", url) as answer:
        with pytest.raises(httpx.RemoteProtocolError):
            await answer.aread()


@pytest.mark.parametrize("tail", [b"", b"zz\r\nnot a size\r\n"], ids=["cut-short", "bad-size"])
async def test_what_came_before_a_break_is_handed_over_before_its_error(tail, monkeypatch):
    # the events and the break both arrived before the first read (a reader behind the
    # network): aiohttp's reader raises its error first and the events were lost
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    events = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (b"data: 1\n\n", b"data: 2\n\n"))

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(HEAD + events)
        await writer.drain()
        await asyncio.sleep(0.05)  # (the break in a read of its own, after the head's)
        writer.write(tail)
        await writer.drain()
        writer.close()

    server, url = await serve(handler)
    got: list[bytes] = []

    async def read(answer: httpx.Response) -> None:
        async for chunk in answer.aiter_raw():
            got.append(chunk)

    async with server, client() as http, http.stream("GET", url) as answer:
        await asyncio.sleep(0.3)  # (the events and the break are in before the first read)
        with pytest.raises(httpx.RemoteProtocolError):
            await read(answer)
    assert b"".join(got) == b"data: 1\n\ndata: 2\n\n"


async def test_send_stream_reads_as_send_does(monkeypatch):
    # the short way (straight to the transport) and httpx's send: the same answer
    monkeypatch.delenv("HTTP_PROXY", raising=False)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_head(reader):
            writer.write(HEAD + FIRST + b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    server, url = await serve(handler)
    async with server, client() as http:
        for send in (http.send_stream, functools.partial(http.send, stream=True)):
            answer = await send(http.build_request("POST", url, content=b"{}"))
            assert (answer.status_code, answer.headers["content-type"]) == (
                200,
                "text/event-stream",
            )
            assert [read async for read in answer.aiter_raw()] == [b"data: {}\n\n"]
            await answer.aclose()


async def test_a_kept_alive_connection_carries_many_bodies_one_watch():
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await read_head(reader):
            writer.write(HEAD + FIRST)  # the body's end comes in a later read: it is watched
            await writer.drain()
            await asyncio.sleep(0.002)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    server, url = await serve(handler)
    async with server, client() as http:
        for _ in range(50):
            async with http.stream("GET", url) as answer:
                assert await answer.aread() == b"data: {}\n\n"
        watched = http._transport._lost._bodies  # type: ignore[attr-defined]
        assert len(connections) == 1
        assert list(watched.values()) == [None]  # one connection, no body left behind


async def test_a_reset_leaves_no_unretrieved_error(monkeypatch):
    errors = []
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "call_exception_handler", errors.append)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(HEAD + FIRST)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    server, url = await serve(handler)
    async with server, client() as http, http.stream("GET", url) as answer:
        with pytest.raises(httpx.TransportError):
            await answer.aread()
    gc.collect()
    await asyncio.sleep(0)
    assert errors == []


@pytest.mark.parametrize("make", [model_http, upstream_http, None], ids=["relay", "proxy", "pool"])
async def test_a_proxy_from_the_environment_is_used(make, monkeypatch):
    seen: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await reader.readline()).rstrip())
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server, url = await serve(proxy)
    monkeypatch.setenv("HTTP_PROXY", url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with server, contextlib.AsyncExitStack() as stack:
        if make is None:  # the loop's shared pool of every model_client without http=
            shared = shared_http()
            http = shared.acquire()
            stack.callback(shared.release)
        else:
            http = await stack.enter_async_context(
                make(4) if make is model_http else make(httpx.Timeout(5))
            )
        answer = await http.get("http://model.invalid/v1/models")
        # the model streams' own call too (make: a StreamClient; the pool's is one)
        streamed = await http.send_stream(http.build_request("GET", "http://model.invalid/x"))
        assert await streamed.aread() == b"ok"
    assert answer.text == "ok"
    assert seen == [
        b"GET http://model.invalid/v1/models HTTP/1.1",
        b"GET http://model.invalid/x HTTP/1.1",
    ]
