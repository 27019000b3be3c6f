"""What can go wrong talking to a model, as typed exceptions, and how an error body reads.

The agent loop maps them to results: :class:`StreamTimeout` -> ``idle_timeout`` and
:class:`StreamInterrupted` -> ``stream_interrupted`` for the calls of the round in flight;
:class:`ModelHTTPError` and :class:`ModelConnectError` come before any byte of a round, so
no call exists yet and the run stops (or the loop decides on a new attempt).
"""

from __future__ import annotations

from typing import Literal

import orjson

from ..._errors import ToolLatchError

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
    ) -> None:
        super().__init__(provider, f"HTTP {status}: {message}")
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


class ModelConnectError(ModelError):
    """No response at all: connecting or sending failed on every attempt."""

    def __init__(self, provider: str, *, cause: BaseException, attempts: int) -> None:
        super().__init__(provider, f"cannot reach the model ({_describe(cause)})")
        self.cause = cause
        """The last transport error."""
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


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_MESSAGE_CHARS = 300


def error_message(body: bytes) -> str:
    """One line describing an error body.

    Understands the providers' shapes: OpenAI ``{"error": {"message", "type", "code"}}``,
    Anthropic ``{"type": "error", "error": {"type", "message"}}``, Gemini ``{"error":
    {"code", "message", "status"}}`` (sometimes wrapped in a list). Anything else: the
    body's first line. Never raises; at most ~300 characters.
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
    else:
        text = body.decode("utf-8", "replace").strip()
    line = " ".join(text.split()) or "(empty body)"
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 1] + "…"
