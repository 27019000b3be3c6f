"""The httpx clients that carry model streams (internal): one builder for the loop's shared
client (:mod:`._pool`), the relay's runs and ``toollatch proxy``'s upstream.

Theory of operation. Every model stream is read through httpx's API (its requests, responses
and errors are what the model clients handle), on aiohttp (:class:`AiohttpStreams`, as the
OpenAI SDK's ``openai[aiohttp]`` extra reads its streams): each body chunk is parsed by
aiohttp's C HTTP/1.1 parser instead of h11 in Python, and aiohttp's connector takes an idle
connection per host without walking the others. Measured: the relay's CPU per event 0.41 -> 0.27 ms
(``benchmarks/bench_relay.py``), the proxy's a third lower, and the agent loop's client CPU
per model request (``benchmarks/bench_agent.py --cpu``) about a third lower.

Two things httpx would do on its own transport are kept:

- **A proxy from the environment** (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, with
  ``NO_PROXY``): httpx mounts its proxies only when it builds its own transport, and the
  aiohttp session is made without ``trust_env``, so with such a variable set the client is
  httpx's own (its proxy map, read once, when the client is made).
- **No cookie kept**, in httpx's jar or aiohttp's: one client serves many conversations (and
  the proxy's serves every one of its clients), so a ``Set-Cookie`` answered to one request
  must never go with another's.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import urllib.request
import weakref
from collections.abc import AsyncIterator
from http.cookiejar import CookieJar
from typing import Any

import aiohttp
import httpx

_BODY_AT_ONCE = 1 << 20
"""A request body over this is handed to aiohttp in pieces (aiohttp's own bound for a body
of raw bytes: over it, it warns ``ResourceWarning``, an error under ``-W error``)."""
_BODY_PIECE = 256 * 1024
"""The pieces of such a body (each written, then drained)."""

_PROXY_SCHEMES = ("http", "https", "all")
"""The proxy variables httpx reads from the environment (``urllib.request.getproxies``)."""


_BROKEN_HTTP = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
    aiohttp.ClientResponseError,
)
"""aiohttp's errors for an answer that broke HTTP/1.1 or ended early: httpx's
``RemoteProtocolError``."""


def stream_http(
    timeout: httpx.Timeout | None,
    limits: httpx.Limits,
    tls: ssl.SSLContext,
    *,
    connections: int,
    idle_s: float,
) -> StreamClient:
    """An httpx client for model streams, on aiohttp's transport (see the module's notes):
    at most ``connections`` at once (0: no bound), each kept ``idle_s`` once idle (httpx's
    own keeps them 5 s), ``tls`` for ``https``; ``timeout`` and
    ``limits`` are httpx's (``limits`` bound httpx's own transport, used when a proxy is
    set in the environment). It keeps no cookie."""
    if environment_proxied():
        return StreamClient(None, timeout=timeout, limits=limits, verify=tls)
    streams = AiohttpStreams(tls, connections=connections, idle_s=idle_s)
    return StreamClient(streams, timeout=timeout, limits=limits)


def environment_proxied() -> bool:
    """Whether the environment names a proxy for httpx to use (``HTTP_PROXY``,
    ``HTTPS_PROXY``, ``ALL_PROXY``, any case)."""
    proxies = urllib.request.getproxies()
    return any(proxies.get(scheme) for scheme in _PROXY_SCHEMES)


class StreamClient(httpx.AsyncClient):
    """The httpx client :func:`stream_http` makes: httpx's own in every way, plus
    :meth:`send_stream`, the one call a model stream's request takes."""

    def __init__(self, streams: AiohttpStreams | None, **kwargs: Any) -> None:
        super().__init__(transport=streams, cookies=_NoCookies(), **kwargs)
        self._streams = streams

    async def send_stream(self, request: httpx.Request) -> httpx.Response:
        """``send(request, stream=True)`` for a request made by :meth:`build_request`: on
        aiohttp's transport it goes to the transport at once. httpx's ``send`` around it
        adds nothing a model stream uses (no auth flow, no redirect followed, no cookie
        kept, no event hook) and cost about a seventh of a proxied stream's start
        (``benchmarks/bench_proxy_starts.py``). The answer has no ``elapsed``. With a
        proxy from the environment, httpx's ``send`` (its transport by URL)."""
        if self._streams is None:
            return await self.send(request, stream=True)
        return await self._streams.handle_async_request(request)


class AiohttpStreams(httpx.AsyncBaseTransport):
    """httpx's transport interface on one ``aiohttp.ClientSession`` (made on the first
    request, in the running loop): HTTP/1.1, no redirect followed, no content decoded (httpx
    and the model clients decode), no cookie; httpx's ``connect``, ``read`` and ``pool``
    timeouts as aiohttp's ``sock_connect``, ``sock_read`` and ``connect``. aiohttp's errors
    are raised as httpx's (``RemoteProtocolError`` for a body or head that breaks HTTP/1.1
    or ends early, ``ConnectError``, ``ReadError``, the timeouts), so callers see httpx's
    errors only. A body whose connection is lost before its end raises: aiohttp's parser
    drops a response body whose chunked framing breaks after its head (an invalid chunk
    size) without ending it, and its reader would wait for ever."""

    def __init__(self, tls: ssl.SSLContext, *, connections: int, idle_s: float) -> None:
        self._tls = tls
        self._connections = connections
        self._idle_s = idle_s
        self._session: aiohttp.ClientSession | None = None
        self._lost = _Lost()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the response's body is read as it arrives."""
        session = self._session
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=self._connections, ssl=self._tls, keepalive_timeout=self._idle_s
            )
            session = self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar()
            )
        timeout = request.extensions.get("timeout", {})
        try:
            content: Any = request.content or None
        except httpx.RequestNotRead:  # a streamed body: aiohttp frames it itself
            content = request.stream
            request.headers.pop("transfer-encoding", None)
        else:
            if content is not None and len(content) > _BODY_AT_ONCE:
                content = _pieces(content)  # (its Content-Length is kept: not chunked)
        try:
            answer = await session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=content,
                allow_redirects=False,
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                    connect=timeout.get("pool"),
                ),
                server_hostname=request.extensions.get("sni_hostname"),
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise _httpx_error(exc, request, reading=False) from exc
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if answer.reason:
            extensions["reason_phrase"] = answer.reason.encode()
        return httpx.Response(
            answer.status,
            headers=answer.raw_headers,
            stream=_Body(answer, request, self._lost),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            await self._session.close()


async def _pieces(content: bytes) -> AsyncIterator[memoryview]:
    """A large request body in pieces of :data:`_BODY_PIECE` (views: nothing copied): aiohttp
    writes raw bytes at once and warns past 1 MiB (a long history, images), and writes a
    stream piece by piece, draining the socket between them."""
    view = memoryview(content)
    for start in range(0, len(view), _BODY_PIECE):
        yield view[start : start + _BODY_PIECE]


class _Body(httpx.AsyncByteStream):
    """An aiohttp response's body as httpx reads it: each read as it arrives."""

    def __init__(
        self, answer: aiohttp.ClientResponse, request: httpx.Request, watch: _Lost
    ) -> None:
        self._answer = answer
        self._request = request
        connection = answer.connection  # (None once the body ended: read with the head)
        self._protocol = connection.protocol if connection is not None else None
        self._watch = watch
        self._reset: OSError | None = None  # (the connection's own error, when it had one)
        if self._protocol is not None:
            watch.reading(self._protocol, self)

    def lost(self, cause: BaseException | None = None) -> None:
        """The connection closed (``cause``: its error, a reset): a body not ended by then
        broke (see :class:`_Lost`). aiohttp reports a reset as a body that ended early; the
        reset is kept, so the error raised is httpx's for it (``ReadError``), as on h11."""
        if isinstance(cause, OSError):
            self._reset = cause
        content = self._answer.content
        if not content.is_eof() and content.exception() is None:
            content.set_exception(
                aiohttp.ClientPayloadError("the connection was lost before the body's end")
            )

    def _forget(self) -> None:
        """The body ended or is left: its connection's end is no longer its business (the
        connection may carry the next request)."""
        if self._protocol is not None:
            self._watch.reading(self._protocol, None)
            self._protocol = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._answer.content
        try:
            while True:
                try:
                    read = await content.readany()
                except (aiohttp.ClientError, OSError) as exc:
                    left = _received(content)
                    if left:
                        yield left
                    broke = self._reset if isinstance(exc, aiohttp.ClientPayloadError) else None
                    raise _httpx_error(broke or exc, self._request, reading=True) from exc
                if not read:
                    return
                yield read
        finally:
            self._forget()

    async def aclose(self) -> None:
        """Give the connection back (kept only when the body was read to its end)."""
        self._forget()
        self._answer.release()


def _received(content: aiohttp.StreamReader) -> bytes:
    """The bytes a broken body had received and not yet handed over. aiohttp's reader, as
    asyncio's (python/cpython#75044), raises a body's error before the bytes it holds: a
    reader a little behind the network (a busy loop) lost the events that came just before
    the upstream broke off, the text and the calls it had already finished among them.
    Read from its buffer as its own ``readany`` would (no public call reads past the error)."""
    read_held = getattr(content, "_read_nowait", None)
    return read_held(-1) if read_held is not None else b""


class _Lost:
    """Which body each connection of a session carries, told when the connection closes.

    aiohttp's parser drops a response body whose chunked framing breaks after the head (an
    invalid chunk size) without ending it: the connection is closed, the error kept where
    no reader looks, and the body's reader would wait for ever. So each connection's
    ``closed`` future (aiohttp makes it on first access) gets one callback, for its whole
    life, which tells the body then being read, if any. One callback per connection, not
    per request: a kept-alive connection carries any number of them. The callback also
    retrieves the future's error (a reset), which nobody else awaits."""

    __slots__ = ("_bodies",)

    def __init__(self) -> None:
        self._bodies: weakref.WeakKeyDictionary[Any, _Body | None] = weakref.WeakKeyDictionary()

    def reading(self, protocol: Any, body: _Body | None) -> None:
        """``protocol``'s connection now carries ``body`` (None: no body)."""
        bodies = self._bodies
        if protocol not in bodies:
            closed = protocol.closed
            if closed is None:  # lost already
                if body is not None:
                    body.lost()
                return
            closed.add_done_callback(functools.partial(self._closed, weakref.ref(protocol)))
        bodies[protocol] = body

    def _closed(self, protocol: weakref.ref[Any], closed: asyncio.Future[None]) -> None:
        error = None if closed.cancelled() else closed.exception()  # (retrieved)
        body = self._bodies.pop(protocol(), None) if protocol() is not None else None
        if body is not None:
            body.lost(error.__cause__ if error is not None else None)


def _httpx_error(
    exc: BaseException, request: httpx.Request, *, reading: bool
) -> httpx.TransportError:
    """The httpx error an aiohttp one is (``reading``: while the body was read)."""
    kind: type[httpx.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(exc, aiohttp.ServerTimeoutError):
        kind = httpx.ReadTimeout
    elif isinstance(exc, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(exc, _BROKEN_HTTP):
        kind = httpx.RemoteProtocolError
    elif isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        kind = httpx.UnsupportedProtocol
    elif reading or isinstance(exc, OSError):
        kind = httpx.ReadError
    else:
        kind = httpx.TransportError
    return kind(str(exc) or type(exc).__name__, request=request)


class _NoCookies(CookieJar):
    """A jar that keeps no cookie and reads no answer's ``Set-Cookie``: httpx hands every
    answer to its jar, and reading one (its headers copied into an ``email`` message for
    ``http.cookiejar``) was about 6 % of the proxy's busy samples over stream starts, for
    cookies its policy then refused (CPU per start, ``benchmarks/bench_proxy_starts.py``:
    main 1.01-1.08x this, four runs)."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        """Nothing kept."""

    def set_cookie(self, cookie: Any) -> None:
        """Nothing kept."""
