"""What stands between the network and the relay's agent (internal; the settings are
:class:`RelayAccess` and :class:`~toollatch.relay.RelayLimits`).

Whoever can drive the relay can act as its user: the agent's tools write files and call MCP
servers. Two layers guard it.

The ASGI layer (:class:`Guard`, in front of the Starlette app), for every request:

* ``Host`` must name the relay: ``localhost``, a loopback address, the bound address, one of
  :attr:`RelayAccess.allowed_hosts` (``name``, ``*.suffix`` or ``*``), or, when the relay
  listens beyond loopback, any IP address (a browser sends an IP literal only when its page
  came from that address, so a DNS-rebinding page, whose ``Host`` is the attacker's name,
  is still refused). Anything else is 400 ``host_not_allowed``. Starlette's
  ``TrustedHostMiddleware`` is the usual part for this check; it is not used because it
  splits ``[::1]:8000`` at the first colon and answers in plain text.
* With an access token (:attr:`RelayAccess.token`, required beyond loopback), the request
  must carry it: ``Authorization: Bearer TOKEN``, or the HttpOnly cookie that ``GET
  /?token=TOKEN`` sets (answered 303 to the same URL without the token, as Jupyter does).
  Compared with :func:`secrets.compare_digest`; without it 401 ``unauthorized``.
* A state-changing request (any method but GET, HEAD, OPTIONS) whose ``Origin`` is not the
  relay's own (the scheme-less ``Host`` it was sent to, or one of
  :attr:`RelayAccess.allowed_origins`), or whose ``Sec-Fetch-Site`` is ``cross-site`` or
  ``same-site`` (another port of ``localhost`` is same-site), is 403 ``origin_not_allowed``.
  Clients that are not browsers send no ``Origin``, and are not the cross-site threat.
* Every response gets ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy:
  no-referrer``.

The protocol layer (:func:`guarded_protocol`, uvicorn's HTTP/1.1 protocol with a guard in
its ``data_received``): neither uvicorn implementation bounds how long a request's head may
take (``timeout_keep_alive`` only runs between requests), and with httptools none bounds its
size either (``h11_max_incomplete_event_size`` is h11's alone; llhttp buffers a header of
any length). So the guard counts the bytes of each request head and times it from its
first byte (a new connection from its opening): past
:attr:`~toollatch.relay.RelayLimits.max_header_bytes` 431, past
:attr:`~toollatch.relay.RelayLimits.header_timeout_s` 408, and the connection is closed.
Open connections are capped (:class:`ConnectionCap`, below the open-file limit): at the cap
a new connection takes the place of the oldest one that is idle or still sending its head,
so a flood of slow connections cannot lock a new client out; with none to close, 503.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from ..core._errors import ConfigError
from ._config import RelayLimits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))
"""Sent with every response (the guard's own refusals included)."""

_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::[0-9]{1,5})?")
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,256}")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_PATTERN = re.compile(r"\*|(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*")


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayAccess:
    """Who may drive the relay (see the module's doc): the ``Host`` names accepted, the
    origins of state-changing requests, the access token."""

    allowed_hosts: tuple[str, ...] = ()
    """More ``Host`` names: ``relay.example.com``, ``*.example.com`` or ``*`` (any)."""
    allowed_origins: tuple[str, ...] = ()
    """More origins a POST may come from (``https://relay.example.com``): behind a proxy
    that rewrites ``Host``."""
    token: str | None = None
    """The access token every request must carry (16 to 256 of ``A-Za-z0-9._~-``)."""
    any_ip_host: bool = False
    """Accept any IP literal as ``Host`` (the relay listens beyond loopback)."""

    def __post_init__(self) -> None:
        for host in self.allowed_hosts:
            if not isinstance(host, str) or not _PATTERN.fullmatch(host.lower()):
                raise ConfigError(f"allowed host {host!r}: expected NAME, *.SUFFIX or *")
        for origin in self.allowed_origins:
            if not re.fullmatch(r"https?://[^/?#\s]+", origin):
                raise ConfigError(f"allowed origin {origin!r}: expected http(s)://HOST[:PORT]")
        if self.token is not None and not _TOKEN.fullmatch(self.token):
            raise ConfigError("the access token must be 16 to 256 characters of A-Za-z0-9._~-")

    @property
    def cookie(self) -> str:
        """The token cookie's name: one per token, so relays on other ports of the same host
        (cookies are shared across ports) do not overwrite each other's."""
        token = self.token or ""
        return "toollatch_token_" + hashlib.sha256(token.encode()).hexdigest()[:12]

    def host_allowed(self, header: str) -> bool:
        """Whether a ``Host`` header names this relay."""
        match = _HOST.fullmatch(header.strip().lower())
        if match is None:
            return False
        name = match.group("v6") or match.group("name")
        ip = _ip(name)
        if match.group("v6") is not None and not isinstance(ip, ipaddress.IPv6Address):
            return False
        if name == "localhost" or (ip is not None and (ip.is_loopback or self.any_ip_host)):
            return True
        for pattern in self.allowed_hosts:
            allowed = pattern.lower()
            if allowed in ("*", name) or (allowed.startswith("*.") and name.endswith(allowed[1:])):
                return True
        return False

    def origin_allowed(self, origin: str, host: str) -> bool:
        """Whether a request with ``Origin: origin`` sent to ``Host: host`` is same-origin (or
        from an allowed origin); ``null`` never is."""
        if origin in self.allowed_origins:
            return True
        _, sep, netloc = origin.partition("://")
        return (
            bool(sep)
            and origin.startswith(("http://", "https://"))
            and (netloc.lower() == host.strip().lower())
        )

    def token_ok(self, given: str | None) -> bool:
        """Whether ``given`` is the token (constant-time)."""
        if self.token is None:
            return True
        return given is not None and secrets.compare_digest(given.encode(), self.token.encode())


def _refusal(status: int, code: str, message: str, **headers: str) -> Response:
    body = {"error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers or None)


class Guard:
    """The ASGI guard in front of the relay's app (see the module's doc)."""

    def __init__(self, app: ASGIApp, access: RelayAccess) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check ``Host``, the token and ``Origin``; add the security headers."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), *SECURITY_HEADERS]
                message = {**message, "headers": headers}
            await send(message)

        answer = self._check(Request(scope))
        await (answer or self.app)(scope, receive, sending)

    def _check(self, request: Request) -> Response | None:
        """The refusal (or the token's redirect) for ``request``; None lets it through."""
        access, headers = self.access, request.headers
        host = headers.get("host", "")
        if not access.host_allowed(host):
            return _refusal(400, "host_not_allowed", "the Host header does not name this relay")
        if access.token is not None:
            answer = self._token(request)
            if answer is not None:
                return answer
        if request.method not in _SAFE_METHODS:
            origin = headers.get("origin")
            site = headers.get("sec-fetch-site")
            if (origin is not None and not access.origin_allowed(origin, host)) or site in (
                "cross-site",
                "same-site",
            ):
                return _refusal(403, "origin_not_allowed", "the request comes from another site")
        return None

    def _token(self, request: Request) -> Response | None:
        access = self.access
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and access.token_ok(bearer.strip()):
            return None
        if access.token_ok(request.cookies.get(access.cookie)):
            return None
        given = request.query_params.get("token")
        if given is not None and access.token_ok(given) and request.method == "GET":
            rest = [(k, v) for k, v in parse_qsl(request.url.query) if k != "token"]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            answer = RedirectResponse(target, status_code=303)
            answer.set_cookie(access.cookie, given, httponly=True, samesite="strict", path="/")
            answer.headers["cache-control"] = "no-store"
            return answer
        return _refusal(
            401,
            "unauthorized",
            "this relay needs its access token (Authorization: Bearer, or open /?token=...)",
            **{"www-authenticate": "Bearer"},
        )


# -- the protocol layer ----------------------------------------------------------------------


def _raw_answer(status: int, reason: str, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    head = [
        f"HTTP/1.1 {status} {reason}".encode(),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        *(name + b": " + value for name, value in SECURITY_HEADERS),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


TOO_LARGE = _raw_answer(
    431, "Request Header Fields Too Large", "headers_too_large", "the request head is too large"
)
TIMED_OUT = _raw_answer(
    408, "Request Timeout", "header_timeout", "the request head came too slowly"
)
BUSY = _raw_answer(503, "Service Unavailable", "too_many_connections", "too many connections")

_FD_RESERVE = 64
"""Open files kept free of connections besides four per run (its model stream, tool files,
MCP pipes), for the ledger, logs and the interpreter's own."""

BACKLOG = 128
"""The listening socket's backlog, which is also how many connections asyncio accepts in one
go before any of them is counted (its accept loop runs ``backlog`` times): uvicorn's default
of 2,048 let a flood of 1,100 connections exhaust 1,024 open files in one loop iteration,
before the cap saw one. The cap keeps this many files free for it."""


def connection_cap(limits: RelayLimits) -> int:
    """``max_connections``, lowered to stay under the process's soft open-file limit minus a
    reserve (64, the :data:`BACKLOG` of 128, and 4 per active run): at 1,024 files and 16
    runs, 768. An accept that fails
    with EMFILE stalls the listening socket for everyone; a cap below it never lets that
    happen. Raises ``ConfigError`` when the limit leaves fewer than 16 connections."""
    try:
        import resource  # noqa: PLC0415 (Unix only)
    except ImportError:  # pragma: no cover (Windows)
        return limits.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    room = soft - _FD_RESERVE - BACKLOG - 4 * limits.max_active_runs
    if room < 16:
        raise ConfigError(
            f"the open-file limit ({soft}) leaves {room} connections; raise it (ulimit -n)"
        )
    return min(limits.max_connections, room)


class ConnectionCap:
    """The open connections (oldest first), at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[Any, None] = {}
        self.evicted = 0
        """Connections closed to make room (for the benchmark and tests)."""
        self.refused = 0
        """Connections refused (503) with none to close."""

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, conn: Any) -> bool:
        """Count ``conn``; at the cap close the oldest idle one; False when none is."""
        self._open[conn] = None
        if len(self._open) <= self.limit:
            return True
        for other in self._open:
            if other is not conn and other.evictable():
                del self._open[other]
                other.evict()
                self.evicted += 1
                return True
        del self._open[conn]
        self.refused += 1
        return False

    def closed(self, conn: Any) -> None:
        """Forget ``conn``."""
        self._open.pop(conn, None)


_LINGER_S = 1.0
"""How long a refused connection is still read (and its input dropped) before it is closed."""


class _HeadGuard:
    """The guard mixed into a uvicorn HTTP protocol (httptools or h11): counts and times
    each request head, counts the connection in the cap. Its subclass says when a head
    begins and ends (:meth:`_head_begin`, :meth:`_head_end`)."""

    limits: RelayLimits
    cap: ConnectionCap
    # (from the uvicorn protocol it is mixed into)
    transport: asyncio.Transport
    cycle: Any
    loop: asyncio.AbstractEventLoop

    def _guard_init(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Count the connection (503 and closed when over the cap); time its first head."""
        super().connection_made(transport)  # type: ignore[misc]
        if not self.cap.opened(self):
            self._refuse(BUSY)
            return
        self._start_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection."""
        self.cap.closed(self)
        self._stop_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        """Feed the parser, at most ``max_header_bytes`` of one request's head."""
        if self._refused:
            return
        if not self._in_head:
            self._feed(data)
            return
        if self._head_timer is None:
            self._start_timer()
        room = self.limits.max_header_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            self._feed(data)
            return
        self._head_bytes = self.limits.max_header_bytes
        self._feed(data[:room])
        if self._in_head and not self._refused:
            self._refuse(TOO_LARGE)
        elif not self._refused:
            self.data_received(data[room:])

    def _feed(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]

    def _head_begin(self) -> None:
        if not self._in_head:
            self._in_head, self._head_bytes = True, 0

    def _head_end(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._stop_timer()

    def _start_timer(self) -> None:
        if self._head_timer is None and not self._refused:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._timed_out)

    def _stop_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _timed_out(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(TIMED_OUT)

    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _refuse(self, answer: bytes) -> None:
        """Answer (unless a response is being sent on the connection) and close it: after a
        linger of :data:`_LINGER_S` reading and dropping what the client still sends, since
        closing a socket with unread input resets the connection, and the client could lose
        the answer (nginx's ``lingering_close``)."""
        self._refused = True
        self._stop_timer()
        transport = self.transport
        if transport.is_closing():
            return
        if self._busy():
            transport.close()
            return
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        self._head_timer = self.loop.call_later(_LINGER_S, transport.close)

    def evictable(self) -> bool:
        """Idle, or still sending a request's head (no request being answered)."""
        return self._in_head and not self._busy() and not self._refused

    def evict(self) -> None:
        """Close the connection to make room for a new one."""
        self._refused = True
        self._stop_timer()
        self.transport.close()


def guarded_protocol(
    implementation: str, limits: RelayLimits, cap: ConnectionCap
) -> type[asyncio.Protocol]:
    """uvicorn's ``implementation`` (``httptools`` or ``h11``) HTTP/1.1 protocol class with
    the guard: give it to ``uvicorn.Config(http=...)``."""
    if implementation == "httptools":
        return _httptools(limits, cap)
    return _h11(limits, cap)


def _httptools(limits: RelayLimits, cap: ConnectionCap) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415

    class GuardedHttpTools(_HeadGuard, HttpToolsProtocol):
        """httptools' parser calls say where heads begin and end."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = limits.idle_timeout_s  # type: ignore[assignment]
            self._guard_init()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_begin()
            self._start_timer()

        def on_headers_complete(self) -> None:
            self._head_end()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_begin()  # what comes next is the next request's head

    GuardedHttpTools.limits, GuardedHttpTools.cap = limits, cap
    return GuardedHttpTools


def _h11(limits: RelayLimits, cap: ConnectionCap) -> type[asyncio.Protocol]:
    import h11  # noqa: PLC0415
    from uvicorn.protocols.http.h11_impl import H11Protocol  # noqa: PLC0415

    class GuardedH11(_HeadGuard, H11Protocol):
        """h11 is in a request's head while the client's state is IDLE."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = limits.idle_timeout_s  # type: ignore[assignment]
            self._guard_init()

        def _feed(self, data: bytes) -> None:
            super()._feed(data)
            self._sync()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._sync()

        def _sync(self) -> None:
            if self.conn.their_state is h11.IDLE:
                self._head_begin()
            elif self._in_head:
                self._head_end()

    GuardedH11.limits, GuardedH11.cap = limits, cap
    return GuardedH11
