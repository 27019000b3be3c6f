"""The relay's request helpers, shared by its endpoints (internal): the 4xx error, the
session a request names, its JSON body within the limits, an SSE response that releases its
reader slot, the ledger scope of a session's run."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ._config import RelayLimits

COOKIE = "toollatch_session"
HEADER = "x-toollatch-session"
TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")
EVENT_ID = re.compile(r"[0-9]{1,12}")
"""An event id: ASCII digits only (``str.isdigit`` takes ``²`` and ``①``, which int() refuses)."""


class HTTPError(Exception):
    """A 4xx answer with a stable code and a message for people."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> JSONResponse:
        """``{"error": {"code", "message"}}`` (a 429 with ``Retry-After: 1``)."""
        body = {"error": {"code": self.code, "message": self.message}}
        response = JSONResponse(body, status_code=self.status)
        if self.status == 429:
            response.headers["retry-after"] = "1"
        return response


class CountedStream(StreamingResponse):
    """A stream that calls ``release()`` once it is over, however it ends (the generator's
    own ``finally`` never runs when the client leaves before its first chunk)."""

    def __init__(
        self, content: AsyncIterator[bytes], release: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def require_json(request: Request) -> None:
    """415 unless the body is declared ``application/json`` (which a cross-site form cannot
    send without a CORS preflight, which the relay never grants)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise HTTPError(415, "unsupported_media_type", "the body must be application/json")


def session_of(request: Request) -> str | None:
    token = request.headers.get(HEADER) or request.cookies.get(COOKIE)
    return token if token is not None and TOKEN.fullmatch(token) else None


def set_cookie(response: Response, token: str) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")


def run_scope(session: str, run_id: str) -> str:
    """The ledger scope (the Agent's ``session``) of a session's run: a stored run can be
    resumed only with the session token that started it, which the scope does not reveal."""
    return run_scope_of(digest(session), run_id)


def run_scope_of(session_digest: str, run_id: str) -> str:
    """:func:`run_scope` from the session's SHA-256 (hex; what a shared store keeps)."""
    return f"relay-{session_digest[:24]}-{run_id}"


def digest(session: str) -> str:
    """A directory name for a session that does not reveal its token."""
    return hashlib.sha256(session.encode()).hexdigest()[:24]


def resume_point(request: Request, stored: int) -> int:
    """How many frames the reader has: ``Last-Event-ID`` or ``?after=``; 400 if not 0..stored."""
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not EVENT_ID.fullmatch(raw):
        raise HTTPError(400, "invalid_last_event_id", f"Last-Event-ID {raw[:20]!r} is not an id")
    if int(raw) > stored:
        raise HTTPError(400, "invalid_last_event_id", f"event {raw} was never sent")
    return int(raw)


async def read_body(request: Request, limits: RelayLimits, limit: int | None = None) -> bytes:
    """The body: 413 past ``limit`` (default ``max_body_bytes``), 408 when it takes over
    ``body_timeout_s``."""
    limit = limits.max_body_bytes if limit is None else limit
    declared = request.headers.get("content-length")
    if declared is not None and EVENT_ID.fullmatch(declared) and int(declared) > limit:
        raise HTTPError(413, "body_too_large", f"the body is over {limit} bytes")
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise HTTPError(413, "body_too_large", f"the body is over {limit} bytes")
                parts.append(part)
    except TimeoutError:
        timeout = limits.body_timeout_s
        raise HTTPError(408, "body_timeout", f"the body took over {timeout} s") from None
    return b"".join(parts)
