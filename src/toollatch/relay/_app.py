"""The relay's HTTP surface: a Starlette app (internal; public names in :mod:`toollatch.relay`).

``GET /`` the page (and a session cookie); ``POST /runs`` ``{"message", "provider"?,
"model"?, "chat_id"?}`` -> 201 ``{"id", "events_url", "cancel_url"}`` (and ``"session"``
echoed when the request named it by header; ``"chat_id"`` with one: the message continues
that chat's server-side history, :mod:`._chats`), or ``{"resume": id,
"message"?}`` to continue a run stored in the relay's ledger (404 when this session has no
such run, 409 while it is running here, 422 without a ledger); ``GET /runs/{id}/events`` the
run's events as SSE (``id:`` per run, ``Last-Event-ID`` or ``?after=N`` to resume, 204 once
a finished run has nothing more); ``POST /runs/{id}/cancel`` (``application/json``, ``{}``
or empty) -> 202; ``POST /runs/{id}/calls/{call_id}/approve|deny|result`` answers a call
the run waits on (:mod:`._answers`). A session is the ``toollatch_session`` cookie
(HttpOnly: the page's script never sees it) or the ``X-Toollatch-Session`` header (a
client that is not a browser picks its own token: 43 characters of ``A-Za-z0-9_-``, e.g.
``secrets.token_urlsafe(32)``); another session's run is 404, exactly like a run that does
not exist. Per session at most ``max_session_runs`` runs in flight and
``max_session_readers`` event streams (429).
``POST /agui`` takes an AG-UI ``RunAgentInput`` and answers the run's AG-UI event stream
(:mod:`.protocols._agui`: the same runs, quotas and guard, another encoder of the same log).
Errors are ``{"error": {"code", "message"}}`` with a 4xx status. Every request first passes
:class:`._guard.Guard` (Host, access token, Origin). ``POST /api/chat`` (and its ``/stream``
and ``/cancel``): the Vercel AI SDK's UI message stream, :mod:`.protocols._ui_message`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, cast

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..core._errors import ConfigError, UsageError
from ..core._preview import PreviewPolicy
from ..ledger import AlwaysStore, ArgumentAudit, History, HistoryConflict, Ledger, LedgerError
from ..ledger._open import open_ledger
from ..runtime._agent import Agent
from ..runtime._approvals import ApprovalPolicy
from ..runtime._clients import model_client
from ..runtime._resume import file_interrupted, ledger_fate
from ..runtime._run_setup import RunLimits, ToolSource
from ..tools._tools import Tool
from . import _answers, _restore
from ._chats import CHAT_ID, BoundedMemoryHistory, ChatStore
from ._config import RelayLimits, default_previews
from ._guard import Guard, RelayAccess
from ._requests import COOKIE as COOKIE  # noqa: PLC0414 (the names tests know)
from ._requests import HEADER, HTTPError, run_scope, run_scope_of
from ._requests import CountedStream as _CountedStream
from ._requests import read_body as _read_body
from ._requests import require_json as _require_json
from ._requests import resume_point as _resume_point
from ._requests import session_of as _session
from ._requests import set_cookie as _set_cookie
from ._runs import RelayRun, RunRegistry, RunSource, lagged_frame, session_key_of
from ._tools import SessionTools
from .protocols import _ui_answers, _ui_message
from .protocols._agui import AguiEndpoint, Refusal, StoredThreads, Thread
from .store._base import MemoryRunStore, RunStore, StoreUnavailable

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{24}")
_STATIC = {"app.js": "text/javascript", "app.css": "text/css", "index.html": "text/html"}
_CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
_SETTLE_S, _SETTLE_STEP_S = 5.0, 0.02
"""How long a resume waits for a run whose ``run_ended`` is logged to be over, by step."""


_log = logging.getLogger("toollatch.relay")

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
    With both, :meth:`restore` (``RelayServer`` calls it at start) resumes the runs that
    were waiting for an answer when the relay stopped.
    ``approvals``: which calls wait for a person (:class:`~toollatch.ApprovalPolicy`; tools
    declared ``needs_approval`` and client tools wait anyway); ``approval_secret`` (at least
    16 bytes; default: random per process) signs the questions' tokens (:mod:`._answers`);
    an approval's ``always`` holds for every run of the browser session, kept in the ledger
    (without one, in this process's memory).
    ``models``: the model names a request may pick (default: ``model`` only; a browser may
    otherwise name any model the key can reach). ``access``: the ``Host`` names, origins
    and access token the guard in front of the app accepts (:mod:`._guard`; default:
    loopback names, same-origin, no token). ``store``: where the runs live for other
    workers (:mod:`.store`; default: this process only), opened by the caller.
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
        approvals: ApprovalPolicy | None = None,
        approval_secret: bytes | None = None,
        store: RunStore | None = None,
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
        self.approvals = approvals
        """Which calls wait for a person, and how long (None: the tools' own
        ``needs_approval`` only, the default expiry)."""
        if approval_secret is not None and len(approval_secret) < 16:
            raise ConfigError("the approval secret must be at least 16 bytes")
        self.approval_secret = approval_secret or secrets.token_bytes(32)
        """Signs the questions' tokens (:mod:`._answers`; default: random per process)."""
        self.always_store: AlwaysStore = (
            ledger if isinstance(ledger, AlwaysStore) else cast(AlwaysStore, open_ledger("memory:"))
        )
        """The sessions' "always allow" decisions, shared by all their runs: the ledger's,
        else this process's memory (:mod:`._answers`)."""
        self.runs = RunRegistry(self.limits)
        self.store: RunStore = store or MemoryRunStore(self.limits.max_stored_runs)
        """The runs as other workers see them (:mod:`.store`)."""
        self.durable: Any = None  # (a DurableRelay: its module imports this one)
        """The runs of ``POST /runs`` and chats as DBOS workflows (:class:`._durable.DurableRelay`,
        set by :class:`._server.RelayServer` with ``durable``; None: plain runs)."""
        chat_history = (
            history
            if history is not None
            else BoundedMemoryHistory(2 * self.limits.max_stored_runs)
        )
        self.chats = ChatStore(chat_history, self.store, max_messages=self.limits.max_chat_messages)
        """The chats (:mod:`._chats`): in the history store, in memory without a ledger."""
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
                *_answers.routes(
                    lambda r: self.runs.owned(r.path_params["run_id"], _session(r)),
                    self.read_json,
                    lambda: self.approval_secret,
                    self._forward_answer,
                ),
                *_answers.session_routes(
                    lambda r: None if (t := _session(r)) is None else session_key_of(t),
                    lambda: self.always_store,
                ),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/agui", self._agui, methods=["POST"]),
                *_ui_message.routes(self),  # POST /api/chat: the AI SDK's UI message stream
            ]
        )
        self.agui = AguiEndpoint(self)
        self.agui.threads = StoredThreads(
            self.chats.history, max_messages=self.limits.max_chat_messages
        )
        """``POST /agui``: AG-UI over the same runs (:mod:`.protocols._agui`)."""
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

    async def _agui(self, request: Request) -> Response:
        try:
            return await self.agui.answer(request)
        except (HTTPError, Refusal) as exc:
            return HTTPError(exc.status, exc.code, exc.message).response()

    # (what the other protocols' endpoints share with the relay's own)
    def session_of(self, request: Request) -> str | None:
        """The request's session token (cookie or header), if it is a well-formed one."""
        return _session(request)

    def set_session(self, response: Response, token: str) -> None:
        """Give a new session its (HttpOnly) cookie."""
        _set_cookie(response, token)

    async def read_json(self, request: Request) -> Any:
        """The body as JSON: 415 unless ``application/json``, 413 / 408 (the body limits),
        400 when it is not JSON (:class:`HTTPError`)."""
        _require_json(request)
        try:
            return orjson.loads(await _read_body(request, self.limits))
        except orjson.JSONDecodeError as exc:
            raise HTTPError(400, "invalid_json", f"the body is not JSON: {exc}") from None

    def resume_point(self, request: Request, stored: int) -> int:
        """``Last-Event-ID`` (or ``?after=``) of ``request``: 400 unless 0..``stored``."""
        return _resume_point(request, stored)

    def start_run(
        self,
        run: RelayRun,
        provider: str,
        model: str,
        message: str,
        *,
        history: Sequence[Mapping[str, Any]],
        observers: Sequence[Any],
        conversation: str,
        client_tools: Sequence[Tool[..., Any]] = (),
        kept: Mapping[str, Any] | None = None,
    ) -> None:
        """Start an admitted run of ``message`` after ``history`` (see :meth:`_start`);
        ``client_tools``: tools whose results the client submits (AG-UI's frontend tools);
        ``kept``: what its run record keeps besides (:mod:`._restore`). With ``durable``, an
        AG-UI thread's run (``kept["agui"]["thread"]``) is a workflow (:mod:`._durable`):
        its calls' ledger scope is its own, not ``conversation``, and its end writes the
        thread's new messages (its observers do not)."""
        agui = (kept or {}).get("agui")
        thread = agui.get("thread") if isinstance(agui, Mapping) else None
        if self.durable is not None and isinstance(thread, str):
            self._start_durable(
                run, provider, model, message, history=history,
                chat=StoredThreads.scope_of(run.session_key, thread), thread=thread,
                tools=client_tools, observers=observers,
            )  # fmt: skip
            return
        self._start(
            run,
            provider,
            model,
            message,
            resume=False,
            history=history,
            observers=observers,
            conversation=conversation,
            client_tools=client_tools,
            kept=kept,
        )

    def session_tools(self, key: str) -> tuple[Tool[..., Any], ...]:
        """The example tools of the session whose digest begins with ``key`` (24
        characters), writing in its own directory."""
        return self._session_tools.get(key)

    def tool_names(self) -> list[str]:
        """The names of the runs' own tools (those a client tool may not take)."""
        if self.tools is None and self.tool_source is None:
            return self._session_tools.names
        return [t.name for t in self.tools or ()]

    async def _create(self, request: Request) -> Response:
        try:
            provider, model, message, resume, chat_id = await self._parse(request)
            session = _session(request)
            new_session = session is None
            session = session or secrets.token_urlsafe(32)
            if chat_id is not None and message is not None:
                run = await self.start_chat_run(
                    session, new_session, chat_id, message, provider=provider, model=model
                )
            else:
                if resume is not None:
                    await self._check_resumable(resume, session, new_session)
                run = await self.admit(session, new_session, run_id=resume)
                chosen = provider or self.providers[0]
                if self.durable is None:
                    self._start(run, chosen, model, message, resume=resume is not None)
                elif resume is not None:  # (its own stored history: _check_resumable read it)
                    assert self.history is not None
                    stored = await self.history.load(run_scope(session, run.id))
                    self._start_durable(run, chosen, model, message, history=stored, resumed=True)
                else:
                    self._start_durable(run, chosen, model, message)
        except HTTPError as exc:
            return exc.response()
        body = {
            "id": run.id,
            "events_url": f"/runs/{run.id}/events",
            "cancel_url": f"/runs/{run.id}/cancel",
        }
        if chat_id is not None:
            body["chat_id"] = chat_id
        if request.headers.get(HEADER):  # (echoed; a cookie's token never reaches the page)
            body["session"] = session
        response = JSONResponse(body, status_code=201)
        if new_session:
            _set_cookie(response, session)
        return response

    async def admit(
        self, session: str, new_session: bool, *, run_id: str | None = None
    ) -> RelayRun:
        """A new run of ``session``, admitted to the registry and recorded in the store
        (every endpoint that starts runs goes through here: the same quotas; ``run_id``: a
        stored run's id, to resume it); :class:`HTTPError` 429 past the session's or the
        relay's runs in flight (counted per worker), 503 while shutting down or when the
        store is unreachable. Start it with :meth:`_start` (or :meth:`start_run`)."""
        quota = min(self.limits.max_session_runs, self.limits.max_active_runs)
        if not new_session and self.runs.active(session) >= quota:
            raise HTTPError(
                429, "too_many_session_runs", f"this session has {quota} runs in flight"
            )
        run = RelayRun(
            session,
            self.previews,
            self.limits,
            run_id=run_id,
            approval_secret=self.approval_secret,
        )
        if self.runs.closing:
            raise HTTPError(503, "shutting_down", "the relay is shutting down")
        if not self.runs.admit(run):
            raise HTTPError(
                429,
                "too_many_runs",
                f"{self.limits.max_active_runs} runs are in flight; retry later",
            )
        try:
            await self.store.created(run)
        except StoreUnavailable as exc:
            self.runs.forget(run.id)
            raise HTTPError(503, "store_unavailable", str(exc)) from None
        return run

    async def find_run(self, run_id: str | None, session: str | None) -> RunSource | None:
        """``session``'s run ``run_id``, of this worker or (a shared store) another's; None
        when there is none (another session's run is none). 503 :class:`HTTPError` when the
        store is unreachable."""
        if run_id is None or session is None:
            return None
        run = self.runs.owned(run_id, session)
        if not self.store.shared or (run is not None and run.log.start == 0):
            return run  # (a run taken over from a dead worker: read from the shared log)
        try:
            return await self.store.find(run_id, session)
        except StoreUnavailable as exc:
            raise HTTPError(503, "store_unavailable", str(exc)) from None

    async def settled_run(self, run_id: str | None, session: str | None) -> RunSource | None:
        """:meth:`find_run`, after waiting (at most 5 s) for a run whose ``run_ended`` is logged
        to be over: its reader may have its end (and send the next message) while its owner
        still closes it (the store's copy, the driver's last steps)."""
        live = await self.find_run(run_id, session)
        loop = asyncio.get_running_loop()
        until = loop.time() + _SETTLE_S
        while live is not None and not live.ended and loop.time() < until and await live.ending():
            await asyncio.sleep(_SETTLE_STEP_S)
            live = await self.find_run(run_id, session)
        return live

    async def close(self, grace_s: float | None = None, *, reason: str | None = None) -> bool:
        """Stop serving runs (POST /runs: 503): the reads of other workers' runs end at once
        (their clients reconnect elsewhere with ``Last-Event-ID``), this worker's runs are
        cancelled and waited for (:meth:`RunRegistry.close`); with a shared store they may
        first finish, for most of the grace (their readers on other workers go on); durable
        runs still going then are handed over, not cancelled (a survivor recovers them once
        this worker's lease is dropped). True when every run ended (a run still going is
        ended by a survivor once this worker's lease is dropped). With its PostgreSQL lost,
        durable runs are ended here, none handed over (:meth:`.DurableRelay.handing_over`)."""
        self.store.end_reads()
        hand_over = None if self.durable is None else await self.durable.handing_over()
        shared = self.store.shared
        return await self.runs.close(grace_s, reason=reason, finish=shared, hand_over=hand_over)

    async def cancel_run(self, run: RunSource, reason: str | None = None) -> bool:
        """Cancel ``run`` here, or through its owner (False: it had ended, or no owner
        answered); 503 :class:`HTTPError` when the store is unreachable."""
        if isinstance(run, RelayRun):
            return run.cancel(reason)
        try:
            return await self.store.cancel(run, reason)
        except StoreUnavailable as exc:
            raise HTTPError(503, "store_unavailable", str(exc)) from None

    async def _forward_answer(
        self, request: Request, asked: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """An answer to a run of another worker, handed to its owner (:mod:`._answers`):
        its reply; None when there is no such run."""
        run = await self.find_run(request.path_params["run_id"], _session(request))
        if run is None or isinstance(run, RelayRun):
            return None
        if run.ended:
            raise HTTPError(409, "run_not_running", "the run is over; resume it first")
        try:
            replied = await self.store.ask(run, {"kind": "answer", **asked})
        except StoreUnavailable as exc:
            raise HTTPError(503, "store_unavailable", str(exc)) from None
        if replied is None:
            raise HTTPError(409, "run_not_running", "the run's worker is gone")
        return replied

    async def forwarded(self, run: RelayRun, asked: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Apply an answer another worker forwarded to this worker's ``run``
        (:meth:`RunStore.ask`): the same checks as this worker's own endpoint."""
        if asked.get("kind") == "agui":
            return await self.agui.forwarded(run, asked.get("input"))
        if asked.get("kind") == "chat" and isinstance(asked.get("message"), dict):
            try:
                start = await _ui_answers.apply_answers(run, self.approval_secret, asked["message"])
            except HTTPError as exc:
                return exc.status, {"error": {"code": exc.code, "message": exc.message}}
            return 202, {"start": start}
        body = asked.get("body")
        call_id, action = str(asked.get("call_id")), str(asked.get("action"))
        if action not in _answers.ACTIONS or not isinstance(body, dict):
            return 422, {"error": {"code": "invalid_body", "message": "not an answer"}}
        return await _answers.reply(run, self.approval_secret, call_id, action, body)

    def open_reader(self, session: str) -> Callable[[], None]:
        """Count one more event stream of ``session`` (429 :class:`HTTPError` at
        ``max_session_readers``); call the function returned once the stream is over."""
        if self._readers.get(session, 0) >= self.limits.max_session_readers:
            limit = self.limits.max_session_readers
            raise HTTPError(429, "too_many_readers", f"this session has {limit} event streams open")
        self._readers[session] = self._readers.get(session, 0) + 1

        def release() -> None:
            left = self._readers.pop(session) - 1
            if left:
                self._readers[session] = left

        return release

    async def start_chat_run(
        self,
        session: str,
        new_session: bool,
        chat_id: str,
        message: str | None,
        *,
        provider: str | None,
        model: str,
        regenerate: bool = False,
        message_id: str | None = None,
    ) -> RelayRun:
        """Admit and start the run of a chat's next ``message`` (:mod:`._chats`): it continues
        the chat's stored history (``provider`` None: the chat's own, or the default for a new
        chat). ``regenerate``: instead, drop the chat's last answer (``message_id``, if given,
        must name it) and answer its last user message again (``message`` unused).
        :class:`HTTPError` 409 ``chat_busy`` while the chat's last message is being
        answered, ``chat_provider_mismatch``, ``chat_too_long``, ``nothing_to_regenerate``,
        ``not_the_last_answer``; the limits of :meth:`admit`. The run streams and cancels
        like any other."""
        latest = await self.chats.latest_run(session, chat_id)
        live = await self.settled_run(latest, session)
        self.chats.claim(session, chat_id, running=live is not None and not live.ended)
        try:
            if regenerate:
                turn = await self.chats.regenerate(session, chat_id, message_id)
                message = None
            else:
                turn = await self.chats.turn(session, chat_id, provider, default=self.providers[0])
            if turn.provider not in self.providers:
                raise HTTPError(409, "chat_provider_mismatch", f"{turn.provider} is not served")
            run = await self.admit(session, new_session)
            try:
                await self.chats.record(session, chat_id, turn, run.id)
            except HTTPError:
                run.done = True
                if run.mirror is not None:
                    run.mirror.push(run)  # (the store records its end)
                raise
            chat = {"chat": self.chats.scope(session, chat_id)}
            if self.durable is not None:
                stored = await self.chats.history.load(turn.scope) if turn.resume else []
                self._start_durable(
                    run, turn.provider, model, message, history=stored, chat=turn.scope
                )
            else:
                self._start(
                    run, turn.provider, model, message, resume=turn.resume, scope=turn.scope,
                    kept=chat,
                )  # fmt: skip
            await self.chats.bind(session, chat_id, run.id)
        finally:
            self.chats.release(session, chat_id)
        return run

    async def _check_resumable(self, run_id: str, session: str, new_session: bool) -> None:
        """Raise :class:`HTTPError` unless this session's run ``run_id`` is stored in the
        ledger's history and not running here (another session's run is 404, as unknown)."""
        if self.history is None:
            raise HTTPError(422, "no_ledger", "resume needs a ledger (toollatch serve --ledger)")
        live = await self.settled_run(run_id, session)
        if live is not None and not live.ended:
            raise HTTPError(409, "run_in_flight", "the run is still going; read its events")
        if new_session or not await self.history.load(run_scope(session, run_id)):
            raise HTTPError(404, "not_found", "no such run")

    async def _parse(
        self, request: Request
    ) -> tuple[str | None, str, str | None, str | None, str | None]:
        """``(provider, model, message, resume, chat_id)`` of a valid body (``provider`` None
        when not named, ``message`` may be left out when resuming); raises
        :class:`HTTPError`."""
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
        chat_id = data.get("chat_id")
        if chat_id is not None and not (isinstance(chat_id, str) and CHAT_ID.fullmatch(chat_id)):
            raise HTTPError(422, "invalid_body", "chat_id must be 1-128 of A-Za-z0-9_-")
        if chat_id is not None and data.get("resume") is not None:
            raise HTTPError(422, "invalid_body", "chat_id and resume do not go together")
        resume = data.get("resume")
        if resume is not None and not (isinstance(resume, str) and _RUN_ID.fullmatch(resume)):
            raise HTTPError(422, "invalid_body", "resume must be a run id")
        message = data.get("message")
        if message is not None or resume is None:  # (a resume may go on without a message)
            if not isinstance(message, str) or not message.strip():
                raise HTTPError(422, "invalid_body", "message must be a non-empty string")
            self.check_message(message)
        provider, model = self.choice(data)
        return provider, model, message, resume, chat_id

    def check_message(self, message: str) -> None:
        """422 :class:`HTTPError` for a message over ``max_message_chars`` (every endpoint's
        bound on what a user sends)."""
        if len(message) > self.limits.max_message_chars:
            limit = self.limits.max_message_chars
            raise HTTPError(422, "message_too_long", f"message is over {limit} characters")

    def choice(self, data: Mapping[str, Any]) -> tuple[str | None, str]:
        """A request body's ``provider`` (None when not named) and ``model`` (default: the
        relay's), checked against what the relay serves: 422 :class:`HTTPError`."""
        provider = data.get("provider")
        if provider is not None and provider not in self.providers:
            raise HTTPError(422, "invalid_body", f"provider must be one of {list(self.providers)}")
        model = data.get("model", self.model)
        if not isinstance(model, str) or not 0 < len(model) <= 200:
            raise HTTPError(422, "invalid_body", "model must be a string of 1 to 200 characters")
        if model not in self.models:
            shown = ", ".join(self.models[:20])
            raise HTTPError(422, "model_not_allowed", f"model must be one of: {shown}")
        return provider, model

    def _start(
        self,
        run: RelayRun,
        provider: str,
        model: str,
        message: str | None,
        *,
        resume: bool,
        history: Sequence[Mapping[str, Any]] = (),
        observers: Sequence[Any] = (),
        conversation: str | None = None,
        scope: str | None = None,
        client_tools: Sequence[Tool[..., Any]] = (),
        kept: Mapping[str, Any] | None = None,
    ) -> None:
        """Start ``run``'s Agent (admitted by :meth:`admit`): ``message`` after ``history``
        (the provider's format), or after the history stored under ``scope`` (default
        :func:`run_scope`; ``resume``: continue it); ``observers`` see its events before the
        run's log does; ``conversation``: the call-id scope (default: the run's own). With a
        ledger, a run that may ask first writes its record (:mod:`._restore`; ``kept``: what
        else it holds). 422 :class:`HTTPError` when the agent cannot be made."""
        pool = min(range(len(self.http)), key=self._pool_runs.__getitem__)
        try:
            client = model_client(
                provider, model=model, base_url=self.base_url_for(provider), http=self.http[pool]
            )
            tools = self.tools
            if tools is None and self.tool_source is not None:
                tools = ()  # the source's tools replace the examples (as in `toollatch run`)
            elif tools is None:  # the example tools, writing in the session's own directory
                tools = self._session_tools.get(run.session_key[:24])
            tools = (*tools, *client_tools)
            stores = self.history if scope is None else self.chats.history
            scope = scope or run_scope(run.session, run.id)
            metrics = [self.metrics] if self.metrics is not None else []
            observers = [*observers, run.observer, *metrics]
            agent = Agent(
                client,
                tools,
                previews=self.previews,
                observers=observers,
                tool_source=self.tool_source,
                audit=self.audit,
                ledger=self.ledger,
                history_store=stores,
                session=scope,
                run_limits=self.run_limits,
                approvals=self.approvals,
                always_store=self.always_store,
            )
        except (ConfigError, UsageError) as exc:
            run.done = True
            if run.mirror is not None:
                run.mirror.push(run)  # (the store records its end)
            raise HTTPError(422, "invalid_run", str(exc)) from None
        self._pool_runs[pool] += 1
        run.kept = {"conversation": conversation or scope}  # (see RelayRun.kept)
        agui = (kept or {}).get("agui")
        if isinstance(agui, Mapping) and isinstance(agui.get("thread"), str) and stores is not None:
            thread = StoredThreads.scope_of(run.session_key, agui["thread"])
            run.kept.update(history=scope, thread=thread, provider=provider)

        before = record = None
        history_store = self.history
        if history_store is not None and _restore.may_ask(
            tools, self.approvals, self.tool_source is not None
        ):
            record = {
                "session": run.session_key, "run": run.id, "provider": provider, "model": model,
                "scope": scope, "conversation": conversation or scope, **(kept or {}),
                "start": secrets.token_hex(8),
            }  # fmt: skip
            if client_tools:
                record["client_tools"] = _restore.client_tool_specs(client_tools)

            async def before() -> None:
                await _restore.remember(history_store, record)

        async def closing() -> None:
            self._pool_runs[pool] -= 1
            await client.aclose()
            if history_store is not None and record is not None:  # (the run is over)
                await _restore.forget(history_store, record)

        approval_session = _answers.approval_scope(run.session_key)  # (every run of it)
        agent_run = agent.run(
            message, resume=resume, history=history, conversation=conversation,
            approval_session=approval_session,
        )  # fmt: skip
        run.start(agent_run, closing, before)

    def _start_durable(
        self,
        run: RelayRun,
        provider: str,
        model: str,
        message: str | None,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        chat: str | None = None,
        resumed: bool = False,
        tools: Sequence[Tool[..., Any]] = (),
        observers: Sequence[Any] = (),
        thread: str | None = None,
    ) -> None:
        """Start an admitted run as a DBOS workflow (:mod:`._durable`): ``message`` after
        ``history``, the stored history of the chat (or AG-UI thread: ``thread``) whose
        history key is ``chat``; ``resumed``, ``tools``, ``observers`` as in
        :meth:`DurableRelay.start`; 422 :class:`HTTPError` when its agent cannot be made."""
        try:
            self.durable.start(
                run, provider, model, message, history=history, chat=chat, resumed=resumed,
                tools=tools, observers=observers, thread=thread,
            )  # fmt: skip
        except (ConfigError, UsageError) as exc:
            run.done = True
            if run.mirror is not None:
                run.mirror.push(run)  # (the store records its end)
            raise HTTPError(422, "invalid_run", str(exc)) from None

    async def restore(self, wait_s: float = 5.0) -> list[str]:
        """Resume the runs that were waiting for an answer when the relay stopped (see
        :mod:`._restore`; nothing without a ledger that lists its questions); the ids of the
        runs resumed. Returns once each has asked its questions again (or ended), at most
        ``wait_s`` seconds. ``LedgerError`` when the ledger cannot be read."""
        if self.history is None or self.ledger is None:
            return []
        resumed: list[tuple[RelayRun, list[str]]] = []
        for record, call_ids in await _restore.pending_runs(self.ledger, self.history):
            if self.runs.get(record["run"]) is not None:
                continue  # (listed twice, or already resumed by a request)
            try:
                run = await self._resume_recorded(record)
            except (HTTPError, ConfigError, UsageError) as exc:
                _log.warning("run %s… was not resumed: %s", record["run"][:6], exc)
                continue
            if run is not None:
                resumed.append((run, call_ids))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                for run, call_ids in resumed:
                    while not (run.done or _restore.asked_again(run.asked, call_ids)):
                        await run.wait(run.log.last_id, wait_s)
        return [run.id for run, _ in resumed]

    async def adopt_orphan(
        self, run_id: str, session: str, owner: str = "", kept: Mapping[str, str] | None = None
    ) -> bool:
        """A dead worker's run this worker won in its sweep (:data:`.store.Adopter`;
        ``kept``: :attr:`RelayRun.kept` as the store read it back): with ``durable``, True
        when it goes on as a workflow recovered from the dead worker ``owner``; else resumed
        here when it waits for an answer and its record is in the shared history (as
        :meth:`restore` would); else False, its pending questions settled ``cancelled`` first
        (the store then ends it), so no restarting relay resumes an ended run; its stored
        history gets the round it cut off, every call paired (``outcome_unknown``), and an
        assistant note that it was interrupted (:func:`.runtime._resume.file_interrupted`),
        and an AG-UI thread's run hands its thread what it stored (:meth:`_file_thread`)."""
        kept = kept or {}
        workflow = kept.get("workflow")
        if self.durable is not None and await self.durable.recovered(
            run_id, session, owner, workflow
        ):
            return True
        if self.history is None or self.ledger is None:
            return False
        scope = kept.get("conversation") or run_scope_of(session, run_id)
        try:
            record, questions = await _restore.of_run(self.ledger, self.history, run_id, scope)
        except (LedgerError, UsageError) as exc:
            _log.warning("run %s…: the ledger could not be read (%s)", run_id[:6], exc)
            return False
        if record is not None and questions:
            try:
                if await self._resume_recorded(record) is not None:
                    return True
            except (HTTPError, ConfigError, UsageError) as exc:
                _log.warning("run %s… was not resumed: %s", run_id[:6], exc)
        try:
            await _restore.settle(self.ledger, questions, "its run was ended: its worker stopped")
        except (LedgerError, UsageError) as exc:
            _log.warning("run %s…: its questions were not settled (%s)", run_id[:6], exc)
        try:  # (its conversation goes on from what it did: the round cut off, paired)
            await file_interrupted(
                self.history, kept.get("history") or scope, ledger_fate(self.ledger, scope)
            )
        except (LedgerError, UsageError, HistoryConflict) as exc:
            _log.warning("run %s…: its interrupted round was not kept (%s)", run_id[:6], exc)
        await self._file_thread(run_id, kept)
        return False

    async def _file_thread(self, run_id: str, kept: Mapping[str, str]) -> None:
        """What a dead worker's AG-UI run stored of its conversation (its history as of its
        last finished round: every call paired) appended to its thread, as the run's
        ``_Keeper`` would have at its end, so the thread's next message, on any worker,
        continues it (nothing for another run, or a relay without a shared history)."""
        history, thread, provider = (kept.get(k) for k in ("history", "thread", "provider"))
        if self.history is None or not (history and thread and provider):
            return
        threads = self.agui.threads
        if not isinstance(threads, StoredThreads):
            return
        try:
            stored = await self.history.load(history)
            if stored:
                await threads.save_under(thread, Thread(provider, tuple(stored)))
        except (LedgerError, UsageError, HistoryConflict) as exc:
            _log.warning("run %s…: its AG-UI thread was not kept (%s)", run_id[:6], exc)

    async def _resume_recorded(self, record: Mapping[str, Any]) -> RelayRun | None:
        """Admit and start the run ``record`` names, continuing its stored history (None:
        a live worker sharing the run store drives it)."""
        run = RelayRun(
            "", self.previews, self.limits, run_id=record["run"],
            approval_secret=self.approval_secret, session_key=record["session"],
        )  # fmt: skip
        provider, model = record["provider"], record["model"]
        if provider not in self.providers or model not in self.models:
            raise HTTPError(409, "invalid_run", f"{provider} / {model} is not served here")
        try:
            if not await self.store.adopt(run.id):
                return None  # (another worker drives it)
        except StoreUnavailable as exc:
            raise HTTPError(503, "store_unavailable", str(exc)) from None
        if not self.runs.admit(run):
            raise HTTPError(429, "too_many_runs", "the relay's active runs are full")
        try:
            await self.store.created(run)
            if isinstance(record.get("chat"), str):
                await self.store.point("chat", record["chat"], run.id)
        except StoreUnavailable as exc:
            self.runs.forget(run.id)
            raise HTTPError(503, "store_unavailable", str(exc)) from None
        kept = {k: v for k, v in record.items() if k in ("chat", "agui")}
        agui = record.get("agui")
        observers = []
        if isinstance(agui, dict) and isinstance(agui.get("thread"), str):
            observers.append(self.agui.resume(run, agui["thread"], provider))
        self._start(
            run, provider, model, None, resume=True, scope=record["scope"],
            conversation=record["conversation"], client_tools=_restore.client_tools(record),
            kept=kept, observers=observers,
        )  # fmt: skip
        return run

    async def _events(self, request: Request) -> Response:
        try:
            run = await self.find_run(request.path_params["run_id"], _session(request))
            if run is None:
                return HTTPError(404, "not_found", "no such run").response()
            start = _resume_point(request, run.last_id)
            if run.ended and start >= run.last_id:
                return Response(status_code=204)  # tells an EventSource not to reconnect
            return self.stream(run, start)
        except HTTPError as exc:
            return exc.response()

    def stream(
        self,
        run: RunSource,
        start: int,
        *,
        opening: bytes = b"",
        view: Callable[[bytes], bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        pause: Callable[[int], Awaitable[bytes | None]] | None = None,
    ) -> Response:
        """``run``'s log after frame ``start`` as an SSE response, counted against the
        session's ``max_session_readers`` (429 :class:`HTTPError` past it, :meth:`open_reader`):
        the frames as stored, or through ``view`` (another protocol's encoder: stored frames
        in, its SSE bytes out), after ``opening``; ``pause(cursor)``, asked when the reader
        has every stored frame, may end the stream early with its bytes (None: go on)."""
        release = self.open_reader(run.session)

        sent = {"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})}
        return _CountedStream(
            self._sse(run, start, opening, view, pause),
            release,
            media_type="text/event-stream",
            headers=sent,
        )

    async def _sse(
        self,
        run: RunSource,
        cursor: int,
        opening: bytes = b"",
        view: Callable[[bytes], bytes] | None = None,
        pause: Callable[[int], Awaitable[bytes | None]] | None = None,
    ) -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n" + opening
        batch, heartbeat_s = self.limits.sse_batch, self.limits.heartbeat_s
        while True:
            if pause is not None and cursor == run.last_id and not run.ended:
                ending = await pause(cursor)  # (a run waiting on its client: ._agui_answers)
                if ending is not None:
                    yield ending
                    return
            try:
                missed, frames, cursor, ended = await run.read(cursor, batch, heartbeat_s)
            except StoreUnavailable as exc:  # (the stream ends; the client reconnects)
                yield b": %s\n\n" % str(exc).encode()
                return
            if frames or missed:  # every frame queued for this reader, in one write
                chunk = b"".join(frames)
                if missed:
                    chunk = lagged_frame(cursor - len(frames) + 1, missed) + chunk
                yield chunk if view is None else view(chunk)
            elif not ended:
                yield b": heartbeat\n\n"
            if ended:
                return

    async def _cancel(self, request: Request) -> Response:
        """Like ``POST /runs``: a JSON body (``{}`` or none; 415 otherwise), from the relay's
        own origin (the guard)."""
        run_id = request.path_params["run_id"]
        return await self.answer_cancel(request, lambda: self.find_run(run_id, _session(request)))

    async def answer_cancel(
        self,
        request: Request,
        find: Callable[[], Awaitable[RunSource | None]],
        missing: str = "no such run",
    ) -> Response:
        """A cancel endpoint's answer: the body checked (JSON, ``{}`` or empty), the run
        ``find()`` gives cancelled here or through its owner: 202 ``{"id", "cancelled"}``,
        404 ``missing`` when there is none, the 4xx / 503 of :class:`HTTPError`."""
        try:
            _require_json(request)
            body = await _read_body(request, self.limits)
            if body.strip() not in (b"", b"{}"):
                raise HTTPError(422, "invalid_body", "the body must be {} or empty")
            run = await find()
            if run is None:
                raise HTTPError(404, "not_found", missing)
            cancelled = await self.cancel_run(run)
        except HTTPError as exc:
            return exc.response()
        return JSONResponse({"id": run.id, "cancelled": cancelled}, status_code=202)
