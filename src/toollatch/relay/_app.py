"""The relay's HTTP surface: a Starlette app (internal; public names in :mod:`toollatch.relay`).

``GET /`` the page (and a session cookie); ``POST /runs`` ``{"message", "provider"?,
"model"?, "chat_id"?}`` -> 201 ``{"id", "events_url", "cancel_url"}`` (and ``"session"``
echoed when the request named it by header), or ``{"resume": id,
"message"?}`` to continue a run stored in the relay's ledger (404 when this session has no
such run, 409 while it is running here, 422 without a ledger); ``GET /runs/{id}/events`` the
run's events as SSE (``id:`` per run, ``Last-Event-ID`` or ``?after=N`` to resume, 204 once
a finished run has nothing more); ``POST /runs/{id}/cancel`` (``application/json``, ``{}``
or empty) -> 202. A session is the ``toollatch_session`` cookie (HttpOnly: the page's script
never sees it) or the ``X-Toollatch-Session`` header (a client that is not a browser picks its
own token: 43 characters of ``A-Za-z0-9_-``, e.g. ``secrets.token_urlsafe(32)``); another
session's run is 404, exactly like a run that does not exist. Per session at most
``max_session_runs`` runs in flight and ``max_session_readers`` event streams (429).
Errors are ``{"error": {"code", "message"}}`` with a 4xx status. Every request first passes
:class:`._guard.Guard` (Host, access token, Origin).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..core._errors import ConfigError, UsageError
from ..core._preview import PreviewPolicy
from ..ledger import ArgumentAudit, History, Ledger
from ..runtime import Agent, RunLimits, ToolSource, model_client
from ..tools._tools import Tool
from ._config import RelayLimits, default_previews
from ._guard import Guard, RelayAccess
from ._runs import RelayRun, RunRegistry
from ._tools import SessionTools

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
COOKIE = "toollatch_session"
HEADER = "x-toollatch-session"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{24}")
_CHAT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A conversation's id as the page makes them (24 characters of base64url)."""
_EVENT_ID = re.compile(r"[0-9]{1,12}")
"""An event id: ASCII digits only (``str.isdigit`` takes ``²`` and ``①``, which int() refuses)."""
_STATIC = {"app.js": "text/javascript", "app.css": "text/css", "index.html": "text/html"}
_CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


class HTTPError(Exception):
    """A 4xx answer with a stable code and a message for people."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> JSONResponse:
        """``{"error": {"code", "message"}}``."""
        body = {"error": {"code": self.code, "message": self.message}}
        return JSONResponse(body, status_code=self.status)


_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format's media type."""


def _default_metrics() -> Any:
    """A fresh :class:`toollatch.runtime.Metrics` (its own registry) when prometheus-client is
    installed, else None: the relay serves ``/metrics`` only with the ``[metrics]`` extra."""
    try:
        from ..runtime import Metrics  # noqa: PLC0415 (an optional extra)
    except ImportError:
        return None
    return Metrics()


class Relay:
    """The relay app: runs of an :class:`~toollatch.runtime.Agent` per request, relayed as SSE.

    ``base_url_for(provider)`` gives the model's base URL (the scripted server's, or the one
    configured); ``providers`` those a request may pick (the first is the default); ``model``
    the default model name. ``tools``: the tools of every run (``None``: the example tools,
    writing in ``workspace/<session>``, unless a ``tool_source`` is given: then only its
    tools). ``tool_source``: tools that may change between rounds (an entered
    :class:`toollatch.mcp.McpToolSource`), shared by every run. ``http``: httpx clients
    (connection pools) the runs' model clients share, a new run taking the one with the
    fewest runs (left open).
    ``ledger`` and ``history`` (:func:`toollatch.ledger.open_ledger` / ``open_history``):
    every run's calls are claimed in the ledger and its history stored, under
    :func:`run_scope`, so that ``POST /runs {"resume": id}`` continues a stored run of the
    same session, in this process or a later one, without running a completed call again;
    ``audit`` (opt-in) records the runs' calls that did not commit.
    ``run_limits``: the budgets of each run (default ``RunLimits()``: 900 s deadline).
    ``models``: the model names a request may pick (default: ``model`` only; a browser may
    otherwise name any model the key can reach). ``access``: the ``Host`` names, origins
    and access token the guard in front of the app accepts (:mod:`._guard`; default:
    loopback names, same-origin, no token).
    Raises ``ConfigError`` for an empty ``providers`` or an unknown one.
    """

    def __init__(
        self,
        *,
        base_url_for: Callable[[str], str],
        providers: Sequence[str],
        model: str,
        workspace: Path,
        http: Sequence[httpx.AsyncClient],
        tools: Sequence[Tool[..., Any]] | None = None,
        tool_source: ToolSource | None = None,
        limits: RelayLimits | None = None,
        previews: PreviewPolicy | None = None,
        metrics: Any = None,
        ledger: Ledger | None = None,
        history: History | None = None,
        audit: ArgumentAudit | None = None,
        models: Sequence[str] | None = None,
        access: RelayAccess | None = None,
        run_limits: RunLimits | None = None,
    ) -> None:
        if not providers or any(p not in PROVIDERS for p in providers):
            raise ConfigError(f"providers must be some of {PROVIDERS}, got {list(providers)!r}")
        self.base_url_for = base_url_for
        self.providers = tuple(providers)
        self.model = model
        self.models = tuple(models) if models is not None else (model,)
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ConfigError(f"models must be non-empty names, got {list(self.models)!r}")
        self.access = access or RelayAccess()
        self._readers: dict[str, int] = {}  # event streams open per session
        self.workspace = workspace
        if not http:
            raise ConfigError("the relay needs at least one httpx client")
        self.http = tuple(http)
        self._pool_runs = [0] * len(self.http)  # runs in flight per pool (a new run: the least)
        self.tools = tuple(tools) if tools is not None else None
        self.tool_source = tool_source
        self.limits = limits or RelayLimits()
        self.previews = previews or default_previews()
        self.metrics = metrics if metrics is not None else _default_metrics()
        self.ledger, self.history, self.audit = ledger, history, audit
        self.run_limits = run_limits or RunLimits()
        """The budgets of every run (``RunLimits``: rounds, calls, the deadline)."""
        self.runs = RunRegistry(self.limits)
        self._session_tools = SessionTools(workspace, self.limits.max_stored_runs)
        self._static = {
            n: resources.files(__package__).joinpath("static", n).read_bytes() for n in _STATIC
        }
        self.routes = Starlette(
            routes=[
                Route("/", self._page, methods=["GET"]),
                Route("/static/{name}", self._asset, methods=["GET"]),
                Route("/runs", self._create, methods=["POST"]),
                Route("/runs/{run_id}/events", self._events, methods=["GET"]),
                Route("/runs/{run_id}/cancel", self._cancel, methods=["POST"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        )
        self.app = Guard(self.routes, self.access)
        """The ASGI app to serve: the routes behind the guard (Host, token, Origin)."""

    # -- pages -------------------------------------------------------------------------------

    async def _metrics(self, request: Request) -> Response:
        """The runs' Prometheus metrics (the ``[metrics]`` extra; 404 without it)."""
        if self.metrics is None:
            return HTTPError(404, "not_found", "metrics need the [metrics] extra").response()
        return Response(self.metrics.exposition(), media_type=_PROMETHEUS_TEXT)

    async def _page(self, request: Request) -> Response:
        response = Response(self._static["index.html"], media_type="text/html; charset=utf-8")
        response.headers["content-security-policy"] = _CSP
        response.headers["cache-control"] = "no-store"
        if _session(request) is None:
            _set_cookie(response, secrets.token_urlsafe(32))
        return response

    async def _asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC or name == "index.html":
            return HTTPError(404, "not_found", "no such file").response()
        media = f"{_STATIC[name]}; charset=utf-8"
        return Response(self._static[name], media_type=media, headers={"cache-control": "no-cache"})

    # -- the API -----------------------------------------------------------------------------

    async def _create(self, request: Request) -> Response:
        try:
            provider, model, message, resume = await self._parse(request)
            session = _session(request)
            new_session = session is None
            session = session or secrets.token_urlsafe(32)
            if resume is not None:
                await self._check_resumable(resume, session, new_session)
            quota = min(self.limits.max_session_runs, self.limits.max_active_runs)
            if not new_session and self.runs.active(session) >= quota:
                raise HTTPError(
                    429, "too_many_session_runs", f"this session has {quota} runs in flight"
                )
            run = RelayRun(session, self.previews, self.limits, run_id=resume)
            if self.runs.closing:
                raise HTTPError(503, "shutting_down", "the relay is shutting down")
            if not self.runs.admit(run):
                raise HTTPError(
                    429,
                    "too_many_runs",
                    f"{self.limits.max_active_runs} runs are in flight; retry later",
                )
            self._start(run, provider, model, message, resume=resume is not None)
        except HTTPError as exc:
            response = exc.response()
            if exc.status == 429:
                response.headers["retry-after"] = "1"
            return response
        body = {
            "id": run.id,
            "events_url": f"/runs/{run.id}/events",
            "cancel_url": f"/runs/{run.id}/cancel",
        }
        if request.headers.get(HEADER):  # (echoed; a cookie's token never reaches the page)
            body["session"] = session
        response = JSONResponse(body, status_code=201)
        if new_session:
            _set_cookie(response, session)
        return response

    async def _check_resumable(self, run_id: str, session: str, new_session: bool) -> None:
        """Raise :class:`HTTPError` unless this session's run ``run_id`` is stored in the
        ledger's history and not running here (another session's run is 404, as unknown)."""
        if self.history is None:
            raise HTTPError(422, "no_ledger", "resume needs a ledger (toollatch serve --ledger)")
        live = self.runs.owned(run_id, session)
        if live is not None and not live.done:
            raise HTTPError(409, "run_in_flight", "the run is still going; read its events")
        if new_session or not await self.history.load(run_scope(session, run_id)):
            raise HTTPError(404, "not_found", "no such run")

    async def _parse(self, request: Request) -> tuple[str, str, str | None, str | None]:
        """``(provider, model, message, resume)`` of a valid body (``message`` may be left out
        when resuming); raises :class:`HTTPError`."""
        _require_json(request)
        body = await _read_body(request, self.limits)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise HTTPError(400, "invalid_json", f"the body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HTTPError(422, "invalid_body", "the body must be a JSON object")
        unknown = sorted(set(data) - {"message", "provider", "model", "resume", "chat_id"})
        if unknown:
            raise HTTPError(422, "invalid_body", f"unknown fields: {', '.join(unknown)}")
        chat_id = data.get("chat_id")  # (the page's conversation; checked, not used yet)
        if chat_id is not None and not (isinstance(chat_id, str) and _CHAT_ID.fullmatch(chat_id)):
            raise HTTPError(422, "invalid_body", "chat_id must be 1 to 64 of A-Za-z0-9_-")
        resume = data.get("resume")
        if resume is not None and not (isinstance(resume, str) and _RUN_ID.fullmatch(resume)):
            raise HTTPError(422, "invalid_body", "resume must be a run id")
        message = data.get("message")
        if message is not None or resume is None:  # (a resume may go on without a message)
            if not isinstance(message, str) or not message.strip():
                raise HTTPError(422, "invalid_body", "message must be a non-empty string")
            if len(message) > self.limits.max_message_chars:
                limit = self.limits.max_message_chars
                raise HTTPError(422, "message_too_long", f"message is over {limit} characters")
        provider = data.get("provider", self.providers[0])
        if provider not in self.providers:
            raise HTTPError(422, "invalid_body", f"provider must be one of {list(self.providers)}")
        model = data.get("model", self.model)
        if not isinstance(model, str) or not 0 < len(model) <= 200:
            raise HTTPError(422, "invalid_body", "model must be a string of 1 to 200 characters")
        if model not in self.models:
            shown = ", ".join(self.models[:20])
            raise HTTPError(422, "model_not_allowed", f"model must be one of: {shown}")
        return provider, model, message, resume

    def _start(
        self, run: RelayRun, provider: str, model: str, message: str | None, *, resume: bool
    ) -> None:
        pool = min(range(len(self.http)), key=self._pool_runs.__getitem__)
        try:
            client = model_client(
                provider, model=model, base_url=self.base_url_for(provider), http=self.http[pool]
            )
            tools = self.tools
            if tools is None and self.tool_source is not None:
                tools = ()  # the source's tools replace the examples (as in `toollatch run`)
            elif tools is None:  # the example tools, writing in the session's own directory
                tools = self._session_tools.get(_digest(run.session))
            observers = [run.observer, *([self.metrics] if self.metrics is not None else [])]
            agent = Agent(
                client,
                tools,
                previews=self.previews,
                observers=observers,
                tool_source=self.tool_source,
                audit=self.audit,
                ledger=self.ledger,
                history_store=self.history,
                session=run_scope(run.session, run.id),
                run_limits=self.run_limits,
            )
        except (ConfigError, UsageError) as exc:
            run.done = True
            raise HTTPError(422, "invalid_run", str(exc)) from None
        self._pool_runs[pool] += 1

        async def closing() -> None:
            self._pool_runs[pool] -= 1
            await client.aclose()

        run.start(agent.run(message, resume=resume), closing)

    async def _events(self, request: Request) -> Response:
        run = self.runs.owned(request.path_params["run_id"], _session(request))
        if run is None:
            return HTTPError(404, "not_found", "no such run").response()
        try:
            start = _resume_point(request, run.last_id)
        except HTTPError as exc:
            return exc.response()
        if run.done and start >= run.last_id:
            return Response(status_code=204)  # tells an EventSource not to reconnect
        session = run.session
        if self._readers.get(session, 0) >= self.limits.max_session_readers:
            limit = self.limits.max_session_readers
            response = HTTPError(
                429, "too_many_readers", f"this session has {limit} event streams open"
            ).response()
            response.headers["retry-after"] = "1"
            return response
        self._readers[session] = self._readers.get(session, 0) + 1

        def release() -> None:
            left = self._readers.pop(session) - 1
            if left:
                self._readers[session] = left

        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        return _CountedStream(
            self._sse(run, start), release, media_type="text/event-stream", headers=headers
        )

    async def _sse(self, run: RelayRun, cursor: int) -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n"
        batch = self.limits.sse_batch
        while True:
            if cursor < run.last_id:  # every frame queued for this reader, in one write
                chunk, cursor = run.log.after(cursor, batch)
                yield chunk
            elif run.done:
                return
            elif not await run.wait(cursor, self.limits.heartbeat_s):
                yield b": heartbeat\n\n"

    async def _cancel(self, request: Request) -> Response:
        """Like ``POST /runs``: a JSON body (``{}`` or none; 415 otherwise), from the relay's
        own origin (the guard)."""
        try:
            _require_json(request)
            body = await _read_body(request, self.limits)
            if body.strip() not in (b"", b"{}"):
                raise HTTPError(422, "invalid_body", "the body must be {} or empty")
        except HTTPError as exc:
            return exc.response()
        run = self.runs.owned(request.path_params["run_id"], _session(request))
        if run is None:
            return HTTPError(404, "not_found", "no such run").response()
        return JSONResponse({"id": run.id, "cancelled": run.cancel()}, status_code=202)


class _CountedStream(StreamingResponse):
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


def _require_json(request: Request) -> None:
    """415 unless the body is declared ``application/json`` (which a cross-site form cannot
    send without a CORS preflight, which the relay never grants)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise HTTPError(415, "unsupported_media_type", "the body must be application/json")


def _session(request: Request) -> str | None:
    token = request.headers.get(HEADER) or request.cookies.get(COOKIE)
    return token if token is not None and _TOKEN.fullmatch(token) else None


def _set_cookie(response: Response, token: str) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")


def run_scope(session: str, run_id: str) -> str:
    """The ledger scope (the Agent's ``session``) of a session's run: a stored run can be
    resumed only with the session token that started it, which the scope does not reveal."""
    return f"relay-{_digest(session)}-{run_id}"


def _digest(session: str) -> str:
    """A directory name for a session that does not reveal its token."""
    return hashlib.sha256(session.encode()).hexdigest()[:24]


def _resume_point(request: Request, stored: int) -> int:
    """How many frames the reader has: ``Last-Event-ID`` or ``?after=``; 400 if not 0..stored."""
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not _EVENT_ID.fullmatch(raw):
        raise HTTPError(400, "invalid_last_event_id", f"Last-Event-ID {raw[:20]!r} is not an id")
    if int(raw) > stored:
        raise HTTPError(400, "invalid_last_event_id", f"event {raw} was never sent")
    return int(raw)


async def _read_body(request: Request, limits: RelayLimits) -> bytes:
    """The body: 413 past ``max_body_bytes``, 408 when it takes over ``body_timeout_s``."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and _EVENT_ID.fullmatch(declared) and int(declared) > limit:
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
