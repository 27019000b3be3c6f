"""The httpx client that the model clients of one event loop share (internal): httpx's API
on aiohttp's transport, no cookie kept (:func:`._http.stream_http`).

Theory of operation. A :class:`~._client.ModelClient` made without ``http=`` does not build
an httpx client of its own (its pool, its proxy map read from the environment, a new TCP
connection per conversation: with a short conversation that was most of the client's
cost). On its first request it takes the running loop's :class:`SharedHTTP` (made on first
need) and counts itself as a user; its ``aclose`` gives it back. So conversations written as
``async with model_client(...)``, one after another, reuse the kept-alive connections of the
ones before them, as one long-lived httpx client would.

The shared client's lifetime is a keeper task in its loop, so that it is never left to the
garbage collector with sockets open (a ``ResourceWarning``):

- while a model client holds it, it stays open;
- once none has held it for :data:`KEEP_IDLE_S` (httpx's own keep-alive expiry, past which
  its pooled connections would be dropped anyway), the keeper closes it and the loop
  forgets it; a later request makes a new one;
- when the loop shuts down (``asyncio.run``, ``asyncio.Runner`` and pytest-asyncio cancel
  every task left before closing the loop), the keeper's cancellation closes it. A loop
  closed by hand without cancelling its tasks first (``run_until_complete`` then
  ``close``) gives the keeper no chance: pass your own ``http=`` client there, and close it.

A model client used in another loop later (a second ``asyncio.run``) takes that loop's.
"""

from __future__ import annotations

import asyncio
import ssl

import httpx

from ._http import stream_http

KEEP_IDLE_S = 5.0
"""How long a shared client with no user stays open: httpx's default keep-alive expiry."""

_CONNECTION_IDLE_S = 5.0
"""How long an idle connection of the shared client is kept (httpx's own default), whether
or not the client is held."""

_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=20)
"""No cap on concurrent streams (each model client had its own pool of 100 before they were
shared; a cap would turn a busy loop's streams into pool timeouts); httpx's default number
of idle connections kept, when httpx's own transport carries them (a proxy from the
environment: aiohttp's keeps each idle connection until :data:`_CONNECTION_IDLE_S`)."""

_TLS: list[ssl.SSLContext] = []  # the process's default context, once made


def default_tls() -> ssl.SSLContext:
    """The TLS context of every shared httpx client: httpx's default (certifi's roots,
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` as set when first made), made once per process on
    first use. Making one loads the CA bundle, ~25-50 ms of CPU. A context is made to be
    shared (one per application, as the ``ssl`` docs advise), and httpx takes it as
    ``verify``; an ``http://`` URL still gets it, for a TLS proxy from the environment."""
    if not _TLS:
        _TLS.append(httpx.create_ssl_context())
    return _TLS[0]


class SharedHTTP:
    """One loop's shared httpx client, with its count of users (see the module's notes)."""

    __slots__ = ("_expiry", "_keeper", "_wake", "client", "loop", "users")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.client = stream_http(
            None, _LIMITS, default_tls(), connections=0, idle_s=_CONNECTION_IDLE_S
        )
        self.users = 0
        self._expiry: asyncio.TimerHandle | None = None
        self._wake: asyncio.Future[None] = loop.create_future()
        self._keeper = loop.create_task(self._keep(), name="toollatch: shared model HTTP")

    def acquire(self) -> httpx.AsyncClient:
        """Count one more user; its client (open until the last user is gone)."""
        self.users += 1
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        return self.client

    def release(self) -> None:
        """One user fewer; the last one starts the idle countdown."""
        self.users -= 1
        if self.users == 0 and not self.loop.is_closed() and not self._wake.done():
            self._expiry = self.loop.call_later(KEEP_IDLE_S, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        if self.users == 0 and not self._wake.done():
            self._forget()
            self._wake.set_result(None)

    def _forget(self) -> None:
        if _SHARED.get(self.loop) is self:
            del _SHARED[self.loop]

    async def _keep(self) -> None:
        try:
            await self._wake  # idle expiry; a cancellation when the loop shuts down
        finally:
            self._forget()
            await self.client.aclose()


_SHARED: dict[asyncio.AbstractEventLoop, SharedHTTP] = {}
"""Each running loop's shared client; an entry goes when its keeper ends (and, for a loop
closed without cancelling its tasks, when the next one is made)."""


def shared_http() -> SharedHTTP:
    """The running loop's shared client (made now if it has none); call :meth:`SharedHTTP.
    acquire` on it and :meth:`SharedHTTP.release` when done."""
    loop = asyncio.get_running_loop()
    shared = _SHARED.get(loop)
    if shared is None:
        for gone in [other for other in _SHARED if other.is_closed()]:
            del _SHARED[gone]
        shared = _SHARED[loop] = SharedHTTP(loop)
    return shared
