"""The relay's HTTP clients: for its runs' model streams, and ``toollatch proxy``'s for its
upstream (internal). Both are built by the model clients' own builder
(:func:`toollatch.runtime._clients._http.stream_http`: httpx's API on aiohttp, a proxy from
the environment on httpx's own transport, no cookie kept, a request body over 1 MiB sent in
pieces); here only their bounds and timeouts. Measured with ``benchmarks/bench_relay.py``
(200 staggered runs at 30 ms pacing, a quiet machine): the relay's CPU per event went from
about 0.41 ms with httpx's own pools to 0.27 ms; the model streams' share of the relay's
profile samples (py-spy) from 31% to 19%. aiohttp's connector keeps its idle connections per
host, so one client serves every run, where httpcore checks each connection of its pool per
request (pools of 4 were needed).
"""

from __future__ import annotations

import ssl

import httpx

from ..runtime._clients._http import StreamClient, stream_http

__all__ = ["StreamClient", "model_http", "upstream_http"]

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
connection just as the upstream closed it, and the request failed 502 ("Server
disconnected", "Can not write request body"; now ``upstream_bad_answer``):
``benchmarks/bench_proxy.py`` at 200 streams on a saturated machine, where a burst's streams
start over more than 5 s; captured on ``lo``: the upstream's FIN 5.0 s after the stream's
end, the proxy's next request 2 to 8 ms later, reset. The margin covers the proxy reading
an answer's end late (its idleness starts then, the upstream's when it sent it). A POST is
not retried on a new connection (RFC 9112, 9.3.1: it may have been applied)."""


def model_http(connections: int, tls: ssl.SSLContext | None = None) -> StreamClient:
    """The client for ``connections`` model streams at once (a run holds one at a time);
    ``tls``: the context for ``https`` models (default: httpx's, from certifi or
    ``SSL_CERT_FILE``). No timeout of its own: each model client sets its own. No cookie
    kept (every run's model client shares it). A proxy from the
    environment (``HTTPS_PROXY``...) goes through httpx's own transport."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    verify = tls if tls is not None else httpx.create_ssl_context()
    return stream_http(None, limits, verify, connections=connections, idle_s=_KEEPALIVE_S)


def upstream_http(timeout: httpx.Timeout) -> StreamClient:
    """``toollatch proxy``'s client for its upstream: aiohttp's transport, as
    :func:`model_http`'s (its C parser reads the upstream's stream: with httpx's own pools,
    reading through httpcore and h11 was over a third of the proxy's CPU; with this one and
    a write per read the proxy's CPU per relayed event is about a third lower,
    ``benchmarks/README.md``), with

    - no bound on connections: one per client stream in flight (aiohttp's default bound,
      100, as httpx's, would make stream 101 wait for a free one; aiohttp's connector keeps
      its idle connections per host and takes one without walking the others, where
      httpcore's pool checks each of them per request and had to be split in 16);
    - no cookie kept (the client is shared by every client of the
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
    return stream_http(timeout, limits, tls, connections=0, idle_s=UPSTREAM_KEEPALIVE_S)
