"""Minimal real HTTP servers on 127.0.0.1 (port 0) for client tests: :func:`loopback`
(uvicorn, ASGI replies) and :func:`raw_loopback` (raw asyncio: the test writes every byte,
so framing, encoding and the connection itself can break).

Each test queues *replies*: ASGI callables served in order, one per request; every request
is recorded as the server saw it (method, path, query, headers, body). ``release`` is set at
teardown so that a reply that stalls on it ends and the server can stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import orjson
import uvicorn
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

Reply = Callable[..., Awaitable[None]]  # an ASGI app: (scope, receive, send)


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return orjson.loads(self.body)


@dataclass
class Loopback:
    url: str = ""
    replies: list[Reply] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    clients: list = field(default_factory=list)  # closed by the test fixture

    async def app(self, scope, receive, send):
        if scope["type"] != "http":  # lifespan is off; nothing else is expected
            return
        request = Request(scope, receive)
        body = await request.body()
        self.seen.append(
            Seen(
                method=request.method,
                path=request.url.path,
                query=request.url.query,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
            )
        )
        reply = self.replies.pop(0) if self.replies else Response("no reply queued", 599)
        await reply(scope, receive, send)


@contextlib.asynccontextmanager
async def loopback(app: Reply | None = None) -> AsyncIterator[Loopback]:
    """A running server; its URL is ``http://127.0.0.1:<port>``. ``app``: served for every
    request instead of the queued replies (its requests are not recorded)."""
    state = Loopback()
    config = uvicorn.Config(
        app or state.app,
        host="127.0.0.1",
        port=0,
        lifespan="off",
        interface="asgi3",
        log_level="error",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # startup failed: raise its error
        await asyncio.sleep(0.005)  # polling uvicorn's start flag; it offers no event
    port = server.servers[0].sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        state.release.set()
        server.should_exit = True
        await task


def sse(events: Sequence[object]) -> bytes:
    """``data:`` lines for JSON objects (or raw strings such as ``[DONE]``)."""
    out = b""
    for event in events:
        data = event if isinstance(event, str) else orjson.dumps(event).decode()
        out += f"data: {data}\n\n".encode()
    return out


def json_reply(status: int, body: object, headers: dict[str, str] | None = None) -> Reply:
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


def stream_reply(
    pieces: Sequence[bytes | Callable[[], Awaitable[object]]],
    status: int = 200,
    *,
    ended: asyncio.Event | None = None,
) -> Reply:
    """A streamed 200 whose body is ``pieces`` in order; a callable piece is awaited
    between writes (e.g. an event's ``wait``) instead of written. ``ended`` is set when the
    body generator stops, however (finished, or cancelled when the client went away)."""

    async def body():
        try:
            for piece in pieces:
                if callable(piece):
                    await piece()
                else:
                    yield piece
        finally:
            if ended is not None:
                ended.set()

    return StreamingResponse(body(), status, media_type="text/event-stream")


def gzipping(app: Reply, *, always: bool = False) -> Reply:
    """``app`` with its answers gzipped when the request accepts gzip (``always``: whatever
    it accepts, as a server that ignores ``Accept-Encoding``), each body message flushed
    (``Z_SYNC_FLUSH``) so that a stream stays one, as nginx's gzip sends it."""

    async def reply(scope, receive, send):
        accepted = dict(scope["headers"]).get(b"accept-encoding", b"")
        if not always and b"gzip" not in accepted:
            await app(scope, receive, send)
            return
        packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

        async def packed(message):
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message["headers"] if k.lower() != b"content-length"]
                message = {**message, "headers": [*kept, (b"content-encoding", b"gzip")]}
            elif message["type"] == "http.response.body":
                more = message.get("more_body", False)
                data = packer.compress(message.get("body", b""))
                data += packer.flush(zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH)
                message = {**message, "body": data}
            await send(message)

        await app(scope, receive, packed)

    return reply


def dropping_reply(first: bytes) -> Reply:
    """Sends headers and ``first``, then ends without finishing the chunked body: the
    server closes the connection mid-message."""

    async def app(scope, receive, send):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": first, "more_body": True})

    return app


def stalling_reply(release: asyncio.Event, *, headers_first: bool) -> Reply:
    """Never sends a body byte until ``release``: with ``headers_first`` the 200 headers
    go out at once, else nothing at all."""

    async def app(scope, receive, send):
        if headers_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await release.wait()
        if not headers_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


# -- a raw asyncio server: every byte of the response is the test's, framing included ------

RawReply = Callable[[asyncio.StreamWriter], Awaitable[None]]
"""Writes a whole response (status line, headers, body, however broken) to the client; the
server closes the connection after it, unless the reply reset it."""


@dataclass
class RawLoopback:
    url: str = ""
    replies: list[RawReply] = field(default_factory=list)
    always: RawReply | None = None
    """Served once ``replies`` is empty (else a 599)."""
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head.decode("latin-1").split("\r\n")
            method, target, _ = line.split(" ", 2)
            headers = {}
            for entry in fields:
                if entry:
                    name, _, value = entry.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            path, _, query = target.partition("?")
            self.seen.append(Seen(method, path, query, headers, body))
            reply = self.replies.pop(0) if self.replies else self.always
            await (reply or raw_reply(http_response(599, b"no reply queued")))(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: what the test is about, often
        finally:
            if not writer.transport.is_closing():
                writer.close()


@contextlib.asynccontextmanager
async def raw_loopback() -> AsyncIterator[RawLoopback]:
    """A running raw server on ``http://127.0.0.1:<port>`` (one request per connection)."""
    state = RawLoopback()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await server.wait_closed()


def http_head(status: int, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """A status line and headers (``connection: close`` added), ending with the blank line."""
    lines = [f"HTTP/1.1 {status} X", *(f"{k}: {v}" for k, v in headers), "connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def http_response(
    status: int,
    body: bytes,
    headers: Sequence[tuple[str, str]] = (("content-type", "application/json"),),
) -> bytes:
    """A whole response with a ``content-length``."""
    return http_head(status, [*headers, ("content-length", str(len(body)))]) + body


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def raw_reply(*parts: bytes, reset: bool = False, pause_s: float = 0.005) -> RawReply:
    """Writes ``parts`` in order, each flushed and ``pause_s`` apart (separate reads for the
    client); then closes the connection, or resets it (TCP RST) with ``reset``."""

    async def reply(writer: asyncio.StreamWriter) -> None:
        for n, part in enumerate(parts):
            if n and pause_s:
                await asyncio.sleep(pause_s)
            writer.write(part)
            await writer.drain()
        if reset:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    return reply


def sse_response(events: Sequence[bytes], *, content_type: str = "text/event-stream") -> RawReply:
    """A chunked 200 whose chunks are ``events`` (an empty ``content_type``: none sent)."""
    headers = [("transfer-encoding", "chunked")]
    if content_type:
        headers.append(("content-type", content_type))
    return raw_reply(http_head(200, headers), *(chunk(e) for e in events), LAST_CHUNK)


def gzip_bomb(mib: int, block: bytes = bytes(1 << 20), *, prefix: bytes = b"") -> bytes:
    """A gzip body inflating to ``prefix`` then ``mib`` times ``block`` (1 MiB of zeros by
    default), from about 1 KiB per MiB: each block is deflated alone (a full flush resets
    the history), so its bytes repeat. The trailer's CRC is not computed (a client that
    stops at its bound never reads it)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    start = deflate.compress(prefix) + deflate.flush(zlib.Z_FULL_FLUSH) if prefix else b""
    packed = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    size = (len(prefix) + len(block) * mib) & 0xFFFFFFFF
    return header + start + packed * mib + deflate.flush() + struct.pack("<II", 0, size)
