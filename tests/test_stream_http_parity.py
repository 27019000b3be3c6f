"""The model streams' client (:func:`toollatch.runtime._clients._http.stream_http`, httpx's
API on aiohttp) against httpx's own transport (httpcore and h11), on the same raw loopback
servers: answers that end well, break HTTP/1.1, end early, reset, go silent. For each, both
must hand over the same bytes and then raise the same httpx error (or none): a model client,
the relay or the proxy must not learn a different story from a different transport.

Each case is also read *late* (the whole answer, break included, is in before the first
read): aiohttp reads a connection as its bytes come, h11 only when asked, and aiohttp's reader
once raised its error before the bytes it held."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import httpx
import pytest

from toollatch.runtime._clients._http import stream_http

pytestmark = pytest.mark.asyncio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
CHUNKED = SSE + b"transfer-encoding: chunked\r\n\r\n"
EVENTS = (b"data: 1\n\n", b"data: 2\n\n")
FRAMED = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS)
SENT = b"".join(EVENTS)
PART = b"data:"  # (the start of a chunk of 10 bytes, cut there)


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            await reader.readexactly(int(value))


def answer(*parts: bytes, pause: float = 0.05, end: str = "close") -> Handler:
    """Writes ``parts`` one after another (``pause`` between them, so each is read apart),
    then closes (``end``: ``close``), resets (``reset``) or stays silent (``silent``)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for n, part in enumerate(parts):
            if n:
                await asyncio.sleep(pause)
            writer.write(part)
            await writer.drain()
        if end == "reset":  # (a linger of 0: the close sends RST, not FIN)
            await asyncio.sleep(pause)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        if end == "silent":
            await reader.read()  # until the client has gone
        writer.close()

    return handler


CASES: dict[str, tuple[Handler, bytes, type[httpx.HTTPError] | None]] = {
    # name: (server, the bytes both hand over, the error both raise then)
    "chunked-whole": (answer(CHUNKED + FRAMED, b"0\r\n\r\n"), SENT, None),
    "chunked-trailers": (answer(CHUNKED + FRAMED + b"0\r\nx-usage: 1\r\n\r\n"), SENT, None),
    "close-delimited": (answer(SSE + b"\r\n" + SENT), SENT, None),
    "length-whole": (answer(b"HTTP/1.1 200 OK\r\ncontent-length: 18\r\n\r\n" + SENT), SENT, None),
    "continue-then-200": (
        answer(b"HTTP/1.1 100 Continue\r\n\r\n", CHUNKED + FRAMED + b"0\r\n\r\n"),
        SENT,
        None,
    ),
    "error-status": (
        answer(b'HTTP/1.1 429 Too Many Requests\r\ncontent-length: 11\r\n\r\n{"e":"slow"}'[:-1]),
        b'{"e":"slow"',
        None,
    ),
    "chunked-cut": (answer(CHUNKED + FRAMED), SENT, httpx.RemoteProtocolError),
    "chunked-cut-mid-chunk": (
        answer(CHUNKED + FRAMED, b"a\r\n" + PART),
        SENT + PART,  # (what came of the cut chunk: no whole event, the parsers drop it)
        httpx.RemoteProtocolError,
    ),
    "length-cut": (
        answer(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + SENT),
        SENT,
        httpx.RemoteProtocolError,
    ),
    "bad-chunk-size": (answer(CHUNKED + FRAMED, b"zz\r\n"), SENT, httpx.RemoteProtocolError),
    "no-answer": (answer(), b"", httpx.RemoteProtocolError),
    "not-http": (answer(b"SSH-2.0-OpenSSH\r\n\r\n"), b"", httpx.RemoteProtocolError),
    "silent-before-head": (answer(end="silent"), b"", httpx.ReadTimeout),
    "silent-after-head": (answer(CHUNKED + FRAMED, end="silent"), SENT, httpx.ReadTimeout),
    "reset-mid-body": (answer(CHUNKED + FRAMED, end="reset"), SENT, httpx.ReadError),
}


async def outcome(
    http: httpx.AsyncClient, url: str, *, late: bool
) -> tuple[int | None, bytes, type[Exception] | None]:
    """The status (None: no answer), the bytes handed over, the error then raised."""
    got: list[bytes] = []
    status = None
    try:
        async with http.stream("POST", url, content=b"{}") as response:
            status = response.status_code
            if late:
                await asyncio.sleep(0.4)
            async for read in response.aiter_raw():
                got.append(read)
    except httpx.HTTPError as exc:
        return status, b"".join(got), type(exc)
    return status, b"".join(got), None


def transports() -> dict[str, httpx.AsyncClient]:
    timeout = httpx.Timeout(5, read=0.5)
    ours = stream_http(timeout, httpx.Limits(), httpx.create_ssl_context(), connections=0, idle_s=5)
    return {"httpx": httpx.AsyncClient(timeout=timeout), "ours": ours}


@pytest.mark.parametrize("late", [False, True], ids=["as-it-comes", "late"])
@pytest.mark.parametrize("case", sorted(CASES))
async def test_both_transports_hand_over_the_same_bytes_then_the_same_error(
    case, late, monkeypatch
):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    handler, sent, error = CASES[case]
    handling: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handling.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    seen = {}
    async with server:
        for name, http in transports().items():
            async with http:
                seen[name] = await outcome(http, url, late=late)
        async with asyncio.timeout(5):  # (each answer's end, its connection closed)
            await asyncio.gather(*handling, return_exceptions=True)
    assert seen["ours"] == seen["httpx"]
    assert seen["ours"][1:] == (sent, error)


async def test_both_transports_say_connect_error_for_a_port_nobody_listens_on(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = await asyncio.start_server(answer(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    seen = {}
    for name, http in transports().items():
        async with http:
            seen[name] = await outcome(http, f"http://127.0.0.1:{port}/v1/x", late=False)
    assert seen["ours"] == seen["httpx"] == (None, b"", httpx.ConnectError)
