"""What can go wrong talking to a model, as typed exceptions, and how an error body reads.

The agent loop maps them to results: :class:`StreamTimeout` -> ``idle_timeout`` and
:class:`StreamInterrupted` (:class:`StreamTooLarge` included) -> ``stream_interrupted`` for
the calls of the round in flight; :class:`ModelHTTPError` (:class:`ModelResponseError`: a 200
whose body is not an event stream), :class:`ModelConnectError` and a first-byte
:class:`StreamTimeout` come before any byte of a round, so no call exists yet and the run
stops with the error.
"""

from __future__ import annotations

import errno
import re
import socket
import ssl
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import orjson

from ...core._errors import ToolLatchError

TimeoutKind = Literal["first_byte", "idle"]


class ModelError(ToolLatchError):
    """Base of every failure of a model request or its stream."""

    provider: str
    """The toollatch provider name of the client that failed."""

    def __init__(self, provider: str, message: str) -> None:
        super().__init__(f"{provider}: {message}")
        self.provider = provider


class ModelHTTPError(ModelError):
    """The provider answered with an HTTP error status (after any retries).

    ``message`` is one line taken from the provider's error body (its ``error.message`` and
    type or status), or the start of the body when it is not the provider's JSON.
    """

    def __init__(
        self,
        provider: str,
        *,
        status: int,
        message: str,
        body: bytes,
        retry_after_s: float | None,
        attempts: int,
        url: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.url = url
        """The URL the request went to (without its query), when known."""
        self.hint = hint
        """What may be wrong with the client's settings (a 404 with a base URL that lacks
        ``/v1``: "does the base URL need /v1?"), or None."""
        super().__init__(provider, self._headline(status, message) + self._where())
        self.status = status
        """The HTTP status code."""
        self.message = message
        """One line from the error body."""
        self.body = body
        """The error body as received (at most ``ClientLimits.error_body_bytes``)."""
        self.retry_after_s = retry_after_s
        """The wait the provider asked for (``Retry-After``), in seconds, if any."""
        self.attempts = attempts
        """Requests made, this one included."""

    def _headline(self, status: int, message: str) -> str:
        return f"HTTP {status}: {message}"

    def _where(self) -> str:
        if self.url is None:
            return f" ({self.hint})" if self.hint else ""
        return f" (from {self.url}; {self.hint})" if self.hint else f" (from {self.url})"


class ModelResponseError(ModelHTTPError):
    """A success status whose body is not an event stream: a JSON error (a quota message
    sent with 200), an HTML page (a proxy's or a captive portal's), an empty body. Not
    retried: the answer is the provider's, and asking again gets the same."""

    def __init__(
        self,
        provider: str,
        *,
        status: int,
        content_type: str,
        body: bytes,
        attempts: int,
        url: str | None = None,
    ) -> None:
        self.content_type = content_type
        """The response's media type ("" when it sent none)."""
        super().__init__(
            provider,
            status=status,
            message=error_message(body),
            body=body,
            retry_after_s=None,
            attempts=attempts,
            url=url,
        )

    def _headline(self, status: int, message: str) -> str:
        what = self.content_type or "no content-type"
        return f"HTTP {status} ({what}) is not an event stream: {message}"


class ModelConnectError(ModelError):
    """No response at all: connecting or sending failed on every attempt."""

    def __init__(
        self, provider: str, *, cause: BaseException, attempts: int, url: str | None = None
    ) -> None:
        where = f" at {url}" if url else ""
        super().__init__(provider, f"cannot reach the model{where}: {connect_reason(cause)}")
        self.url = url
        """The URL the request went to (without its query), when known."""
        self.cause = cause
        """The last transport error (its text, the HTTP library's, is not in the message:
        the client logs it at debug level)."""
        self.attempts = attempts
        """Requests tried."""


class StreamTimeout(ModelError):
    """The stream was too slow: no first chunk in time (``kind="first_byte"``: connect,
    response headers and the first body chunk) or too long between two chunks (``"idle"``)."""

    def __init__(self, provider: str, *, kind: TimeoutKind, seconds: float) -> None:
        what = "no first byte" if kind == "first_byte" else "no data"
        super().__init__(provider, f"{what} within {seconds:g} s")
        self.kind: TimeoutKind = kind
        """Which deadline passed."""
        self.seconds = seconds
        """The deadline, in seconds."""


class StreamInterrupted(ModelError):
    """The connection broke or the HTTP framing was violated after the stream began."""

    def __init__(self, provider: str, *, cause: BaseException, bytes_received: int) -> None:
        super().__init__(
            provider, f"stream interrupted after {bytes_received} bytes: {_describe(cause)}"
        )
        self.cause = cause
        """The transport or protocol error."""
        self.bytes_received = bytes_received
        """Body bytes handed to the caller before the break."""


class StreamTooLarge(StreamInterrupted):
    """The body, as decoded (``Content-Encoding`` undone), passed
    ``ClientLimits.max_body_bytes``: a decompression bomb or a stream without end."""

    def __init__(self, provider: str, *, limit: int, bytes_received: int, wire_bytes: int) -> None:
        cause = ValueError(
            f"the decoded body passed max_body_bytes={limit} ({wire_bytes} bytes on the wire)"
        )
        super().__init__(provider, cause=cause, bytes_received=bytes_received)
        self.limit = limit
        """The bound that was passed (``ClientLimits.max_body_bytes``)."""
        self.wire_bytes = wire_bytes
        """Body bytes read from the connection (before decoding) when it was passed."""


def shown_url(url: str) -> str:
    """``url`` as an error may name it: no query (a key may ride in one), no user or
    password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def endpoint_hint(status: int, base_url: str, default_base_url: str, path: str) -> str | None:
    """What a 404 says about the base URL, from the provider's official one: the OpenAI
    APIs' ends in ``/v1`` (the SDKs' default ``https://api.openai.com/v1``; their request path
    is ``/chat/completions``), Anthropic's and Gemini's do not (the path holds ``/v1/...`` or
    ``/v1beta/...``). None when nothing fits or the status is not 404."""
    if status != 404:
        return None
    own = urlsplit(default_base_url).path.rstrip("/")  # "/v1" or ""
    given = urlsplit(base_url).path.rstrip("/")
    if own and not given.endswith(own):
        return f"does the base URL need {own}?"
    first = "/" + path.lstrip("/").split("/", 1)[0]  # "/v1", "/v1beta"
    if not own and first != "/" and given.endswith(first):
        return f"the base URL should not end in {first}: the request path starts with it"
    return None


_ERRNO_REASONS = {
    errno.ECONNREFUSED: "connection refused (is the server running, and on that port?)",
    errno.ECONNRESET: "the connection was reset",
    errno.EHOSTUNREACH: "no route to the host",
    errno.ENETUNREACH: "the network is unreachable",
    errno.ETIMEDOUT: "connecting timed out",
}


def connect_reason(exc: BaseException) -> str:
    """Why a connection failed, in words, without the HTTP library's own text (httpx's
    ``ConnectError``, aiohttp's ``Cannot connect to host ... ssl:default``): from the
    ``OSError`` somewhere in its chain (``__cause__``, ``__context__``, aiohttp's
    ``os_error``), else from its kind."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, socket.gaierror):
            return "the host name does not resolve"
        if isinstance(current, ssl.SSLError):
            return "the TLS handshake failed (an https URL to a plain http server?)"
        if isinstance(current, OSError) and current.errno in _ERRNO_REASONS:
            return _ERRNO_REASONS[current.errno]
        if isinstance(current, TimeoutError):
            return "connecting timed out"
        os_error = getattr(current, "os_error", None)
        todo += [os_error if isinstance(os_error, BaseException) else None]
        todo += [current.__cause__, current.__context__]
    name = type(exc).__name__.lower()
    if "timeout" in name:
        return "connecting timed out"
    if "protocol" in name or "remoteprotocol" in name:
        return "the server closed the connection without an HTTP answer"
    return "the connection failed"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_MESSAGE_CHARS = 300
_TITLE = re.compile(r"<title[^>]*>([^<]{1,300})", re.IGNORECASE)


def error_message(body: bytes) -> str:
    """One line describing an error body.

    Understands the providers' shapes: OpenAI ``{"error": {"message", "type", "code"}}``,
    Anthropic ``{"type": "error", "error": {"type", "message"}}``, Gemini ``{"error":
    {"code", "message", "status"}}`` (sometimes wrapped in a list), AWS's ``{"message"}``.
    An HTML page: its ``<title>``. Anything else: the body's text. Never raises; at most
    ~300 characters.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, list) and data:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or "").strip()
        kind = error.get("type") or error.get("status") or error.get("code")
        text = f"{message} ({kind})" if kind and message else message or str(kind or "")
    elif isinstance(error, str):
        text = error
    elif isinstance(data, dict) and isinstance(data.get("message"), str):
        text = data["message"]  # AWS (Bedrock): {"message"}, the kind in a header
    else:
        text = body.decode("utf-8", "replace").strip()
        title = _TITLE.search(text) if text.startswith("<") else None
        if title is not None and title.group(1).strip():
            text = title.group(1)  # an HTML page: its title says it (a proxy's "502 Bad Gateway")
    line = " ".join(text.split()) or "(empty body)"
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 1] + "…"
