"""A minimal real HTTP server on 127.0.0.1 (uvicorn, port 0) for client tests.

Each test queues *replies*: ASGI callables served in order, one per request; every request
is recorded as the server saw it (method, path, query, headers, body). ``release`` is set at
teardown so that a reply that stalls on it ends and the server can stop.
"""

from __future__ import annotations

import asyncio
import contextlib
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
async def loopback() -> AsyncIterator[Loopback]:
    """A running server; its URL is ``http://127.0.0.1:<port>``."""
    state = Loopback()
    config = uvicorn.Config(
        state.app,
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
