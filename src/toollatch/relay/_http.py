"""The relay's HTTP clients: for its runs' model streams, and ``toollatch proxy``'s for its
upstream (internal).

One ``httpx.AsyncClient`` whose transport is aiohttp's (``httpx_aiohttp``, as the OpenAI
SDK's ``openai[aiohttp]`` extra uses it for concurrent streams): the runs' model clients
keep httpx's API and errors, and each body chunk is parsed by aiohttp's C HTTP/1.1 parser
instead of h11 in Python. Measured with ``benchmarks/bench_relay.py`` (200 staggered runs at
30 ms pacing, a quiet machine): the relay's CPU per event went from about 0.41 ms with
httpx's own pools to 0.27 ms; the model streams' share of the relay's profile samples
(py-spy) from 31% to 19%.
aiohttp's connector keeps its idle connections per host, so one client serves every run,
where httpcore checks each connection of its pool per request (pools of 4 were needed).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from http.cookiejar import CookieJar
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp.transport import AiohttpTransport

_KEEPALIVE = 256
"""Idle connections kept by the proxy's client for a proxy from the environment (httpx's own
transport: aiohttp's keeps every idle connection until it expires)."""
_KEEPALIVE_S = 5.0
"""How long aiohttp keeps an idle connection of the runs' model client (httpx's default
keep-alive expiry)."""
UPSTREAM_KEEPALIVE_S = 3.0
"""How long the proxy keeps an idle upstream connection: well under 5 s, when the usual model
servers close theirs (uvicorn's default keep-alive, so the servers built on it, vLLM's and
LiteLLM's among them; cpp-httplib's, so llama.cpp's; Node's). At 5 s the proxy took a
connection just as the upstream closed it, and the request failed ``502
upstream_unreachable`` ("Server disconnected", "Can not write request body"):
``benchmarks/bench_proxy.py`` at 200 streams on a saturated machine, where a burst's streams
start over more than 5 s; captured on ``lo``: the upstream's FIN 5.0 s after the stream's
end, the proxy's next request 2 to 8 ms later, reset. The margin covers the proxy reading
an answer's end late (its idleness starts then, the upstream's when it sent it). A POST is
not retried on a new connection (RFC 9112, 9.3.1: it may have been applied)."""
_BODY_AT_ONCE = 1 << 20
"""A request body over this is handed to aiohttp in pieces (aiohttp's own bound for a body
of raw bytes: over it, it warns ``ResourceWarning``, an error under ``-W error``)."""
_BODY_PIECE = 256 * 1024
"""The pieces of such a body (each written, then drained)."""


def model_http(connections: int, tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """The client for ``connections`` model streams at once (a run holds one at a time);
    ``tls``: the context for ``https`` models (default: httpx's, from certifi or
    ``SSL_CERT_FILE``). No timeout of its own: each model client sets its own. No cookie
    kept (:func:`_aiohttp_client`: every run's model client shares it). A proxy from the
    environment (``HTTPS_PROXY``...) goes through httpx's own transport."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    verify = tls if tls is not None else httpx.create_ssl_context()
    return _aiohttp_client(None, limits, verify, connections=connections, idle_s=_KEEPALIVE_S)


def upstream_http(timeout: httpx.Timeout) -> httpx.AsyncClient:
    """``toollatch proxy``'s client for its upstream: aiohttp's transport, as
    :func:`model_http`'s (its C parser reads the upstream's stream: with httpx's own pools,
    reading through httpcore and h11 was over a third of the proxy's CPU; with this one and
    a write per read the proxy's CPU per relayed event is about a third lower,
    ``benchmarks/README.md``), with

    - no bound on connections: one per client stream in flight (aiohttp's default bound,
      100, as httpx's, would make stream 101 wait for a free one; aiohttp's connector keeps
      its idle connections per host and takes one without walking the others, where
      httpcore's pool checks each of them per request and had to be split in 16);
    - no cookie kept (:func:`_aiohttp_client`: the client is shared by every client of the
      proxy, so a ``Set-Cookie`` answered to one must never go with another's request);
    - idle connections kept :data:`UPSTREAM_KEEPALIVE_S` (closed before the upstream would);
    - ``timeout``, httpx's, per request (aiohttp's ``sock_connect``, which also bounds the
      TLS handshake, and ``sock_read``; the pool's timeout is aiohttp's ``connect``).
      aiohttp has no write timeout (it writes a body in a task of its own while the request
      waits for the answer's head): the proxy bounds the whole wait for the head instead.

    A proxy from the environment (``HTTPS_PROXY``...) goes through httpx's own transport.
    """
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=_KEEPALIVE)
    # (one context: each one loads the CA bundle, about 40 ms)
    tls = httpx.create_ssl_context()
    return _aiohttp_client(timeout, limits, tls, connections=0, idle_s=UPSTREAM_KEEPALIVE_S)


def _aiohttp_client(
    timeout: httpx.Timeout | None,
    limits: httpx.Limits,
    tls: ssl.SSLContext,
    *,
    connections: int,
    idle_s: float,
) -> httpx.AsyncClient:
    """An httpx client on aiohttp's transport: at most ``connections``
    at once (0: no bound), each kept ``idle_s`` once idle, ``tls`` for ``https``;
    ``timeout`` and ``limits`` are httpx's
    (``limits`` bound httpx's own transport, for a proxy from the environment). It keeps no
    cookie, in httpx's jar or in aiohttp's: a ``Set-Cookie`` answered to one request is
    never sent with a later one (aiohttp's default jar keeps the cookies of host names, and
    httpx's those of any host)."""

    def session() -> aiohttp.ClientSession:  # (made on the first request: in the loop)
        connector = aiohttp.TCPConnector(limit=connections, ssl=tls, keepalive_timeout=idle_s)
        return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

    return httpx.AsyncClient(
        timeout=timeout,
        limits=limits,
        transport=_Transport(verify=tls, client=session),
        cookies=_NoCookies(),
    )


class _Transport(AiohttpTransport):
    """aiohttp's transport, a request body over 1 MiB (:data:`_BODY_AT_ONCE`) sent in pieces.

    The transport hands aiohttp a request's content as raw bytes, which aiohttp writes in
    one go and warns about (``ResourceWarning``: "Sending a large body directly with raw
    bytes might lock the event loop") past 1 MiB: a proxied conversation with images, a
    long history. Such a body goes as an async stream of pieces instead (aiohttp writes one,
    drains the socket, writes the next), with its ``Content-Length`` kept, so the upstream
    sees the same request (not chunked). A smaller body goes as it is (no extra work per
    request)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` (see the class)."""
        try:
            content = request.content
        except httpx.RequestNotRead:  # (a stream already: sent as it is)
            content = b""
        if len(content) > _BODY_AT_ONCE:
            request = httpx.Request(
                request.method,
                request.url,
                headers=request.headers,
                stream=_Pieces(content),
                extensions=request.extensions,
            )
        return await super().handle_async_request(request)


class _Pieces(httpx.AsyncByteStream):
    """``content`` as pieces of :data:`_BODY_PIECE` bytes (views: nothing copied)."""

    def __init__(self, content: bytes) -> None:
        self.content = content

    async def __aiter__(self) -> AsyncIterator[bytes]:
        view = memoryview(self.content)
        for start in range(0, len(view), _BODY_PIECE):
            yield view[start : start + _BODY_PIECE]  # type: ignore[misc]  # (aiohttp writes views)


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
