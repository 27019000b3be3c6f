"""The relay's HTTP client for its runs' model streams (internal).

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

import httpx
from httpx_aiohttp import HttpxAiohttpClient


def model_http(connections: int, tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """The client for ``connections`` model streams at once (a run holds one at a time);
    ``tls``: the context for ``https`` models (default: httpx's, from certifi or
    ``SSL_CERT_FILE``). No timeout of its own: each model client sets its own."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    verify = tls if tls is not None else httpx.create_ssl_context()
    return HttpxAiohttpClient(timeout=None, limits=limits, verify=verify)
