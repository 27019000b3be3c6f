"""The scripted model server: a Starlette app on uvicorn, on loopback, that plays scripts.

Theory of operation: each request is parsed, checked like the real API would
(:func:`._validate.check_request`, which also counts the assistant turns of its history),
and answered with the turn of the script named by its ``model`` that this count picks. The
wire encoders (pure) give the turn's SSE events; :class:`_Playback` sends them with the
turn's delays and faults, each at its own time from the stream's start (:func:`schedule`:
a slow send does not push the later events back), and stops as soon as the client has
gone. The state is a counter per (script, turn) for the "answer an HTTP status for the
first K attempts" fault and the counts of streams by how they ended
(:attr:`ScriptedServer.streams`); requests are recorded for tests.

``with ScriptedServer() as s`` serves from a thread with its own event loop (so synchronous
SDK clients can call it); ``async with`` serves on the running loop. Both bind
``127.0.0.1:0`` and stop within about a second, leaving no thread or socket behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..core._errors import ConfigError, UsageError
from ._errors import error_response, status_response
from ._quirks import profile, rewritten
from ._script import Script, Turn, demo_script
from ._validate import InvalidRequest, bedrock_auth_problem, check_request
from ._wire import CREATED, WireEvent, anthropic_events, chat_events
from ._wire_bedrock import CONTENT_TYPE as EVENTSTREAM
from ._wire_bedrock import bedrock_events
from ._wire_gemini import gemini_events
from ._wire_responses import responses_events
from ._wire_whole import NotWhole, whole_body

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini", "bedrock")
"""The wire formats served (the provider names of :class:`toollatch.StreamParser`)."""

STREAM_ENDS = ("open", "complete", "client_left", "dropped", "cancelled")
"""The keys of :attr:`ScriptedServer.streams`."""

_SSE = "text/event-stream; charset=utf-8"

_STOP_TIMEOUT_S = 1
"""How long stopping waits for streams still being sent before it cancels them (uvicorn
takes whole seconds)."""


def http_implementation() -> str:
    """uvicorn's HTTP/1.1 implementation for toollatch's servers: ``httptools`` when it is
    installed (its C parser, and body writes without h11's per-event state machine: the
    relay's CPU per SSE event measured lower, see ``benchmarks/README.md``), else ``h11``.
    ``TOOLLATCH_HTTP=h11`` forces h11."""
    if os.environ.get("TOOLLATCH_HTTP") == "h11" or importlib.util.find_spec("httptools") is None:
        return "h11"
    return "httptools"


def loopback_server(app: Any, stop_timeout_s: int) -> uvicorn.Server:
    """A quiet uvicorn server for ``app`` (:func:`http_implementation`, no websockets, no
    lifespan, no access log), to be served on a socket its caller bound; open streams get
    ``stop_timeout_s`` at stop. The one configuration of toollatch's servers (this one and
    the relay)."""
    config = uvicorn.Config(
        app,
        http=http_implementation(),
        ws="none",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=stop_timeout_s,
    )
    return uvicorn.Server(config)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRequest:
    """One request the server received, and how it answered."""

    provider: str
    """The wire format of the endpoint called."""
    path: str
    """The URL path called."""
    body: Any
    """The parsed JSON body (``None`` when it was not JSON)."""
    headers: Mapping[str, str]
    """The request headers (lower-case names)."""
    status: int
    """The HTTP status answered (200 for a stream, even one later dropped)."""
    turn: int | None
    """The index of the script turn played (``None`` when none was)."""


class ScriptedServer:
    """A loopback HTTP server that speaks five providers' streaming wire formats.

    ``scripts`` maps a model name to its :class:`Script`; ``"scripted"`` is the demo
    (:func:`demo_script`) unless given. ``delay_scale`` multiplies every delay and stall
    (0 for tests that need no pauses). Endpoints, as the official SDKs call them:
    ``POST /v1/chat/completions``, ``POST /v1/responses``, ``POST /v1/messages``,
    ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``,
    ``POST /model/{modelId}/converse-stream`` (Bedrock: AWS event-stream frames; its
    ``Authorization`` header's shape is checked, see :func:`._validate.bedrock_auth_problem`).
    Raises ConfigError for a
    negative ``delay_scale`` or a script that is not a :class:`Script`.
    """

    def __init__(
        self,
        scripts: Mapping[str, Script] | None = None,
        *,
        delay_scale: float = 1.0,
        host: str = "127.0.0.1",
        port: int = 0,
        quirks: str | None = None,
    ) -> None:
        if not delay_scale >= 0:
            raise ConfigError(f"delay_scale must be >= 0, not {delay_scale!r}")
        if not (isinstance(port, int) and 0 <= port <= 65535):
            raise ConfigError(f"port must be 0 (any free port) to 65535, not {port!r}")
        self.host = host
        self.port = port
        self.scripts: dict[str, Script] = {"scripted": demo_script(), **(scripts or {})}
        for name, script in self.scripts.items():
            if not isinstance(script, Script):
                raise ConfigError(f"script {name!r} is not a Script: {type(script).__name__}")
        self.delay_scale = delay_scale
        self.quirks = profile(quirks)
        """The quirk profile its OpenAI chat streams follow (:mod:`._quirks`; None: none)."""
        self.app = Starlette(routes=self._routes())
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._attempts: dict[tuple[str, int], int] = {}
        self._streams = dict.fromkeys(STREAM_ENDS, 0)
        self._port: int | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    # --- what tests and clients read ----------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` while running; raises UsageError otherwise."""
        if self._port is None:
            raise UsageError("the scripted server is not running (use `with` / `async with`)")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    def base_url(self, provider: str) -> str:
        """The base URL as the official SDK for ``provider`` takes it: ``{url}/v1`` for
        ``openai_chat`` and ``openai_responses``, ``{url}`` for ``anthropic``, ``gemini`` and
        ``bedrock`` (boto3's ``endpoint_url``).
        Raises UsageError for another provider or when not running."""
        if provider not in PROVIDERS:
            raise UsageError(f"unknown provider {provider!r}; expected one of {PROVIDERS}")
        return f"{self.url}/v1" if provider.startswith("openai") else self.url

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the requests received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def streams(self) -> dict[str, int]:
        """How many streams are being sent (``open``) and how many ended, by how: ``complete``,
        ``client_left`` (stopped at once when the client closed its connection), ``dropped``
        (the turn's drop fault), ``cancelled`` (still sending when the server stopped)."""
        with self._lock:
            return dict(self._streams)

    def reset(self) -> None:
        """Forget the recorded requests, the fault attempt counters and the ended streams'
        counts."""
        with self._lock:
            self._requests.clear()
            self._attempts.clear()
            self._streams = dict.fromkeys(STREAM_ENDS, 0) | {"open": self._streams["open"]}

    def _stream_opened(self) -> None:
        with self._lock:
            self._streams["open"] += 1

    def _stream_ended(self, end: str) -> None:
        with self._lock:
            self._streams["open"] -= 1
            self._streams[end] += 1

    # --- serving ------------------------------------------------------------------------------

    def __enter__(self) -> ScriptedServer:
        """Serve from a background thread; returns once the socket accepts connections."""
        server, sock = self._prepare()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except BaseException as exc:  # re-raised by __enter__ below
                failure.append(exc)

        thread = threading.Thread(target=run, name="toollatch-scripted", daemon=True)
        thread.start()
        while not server.started and thread.is_alive():
            time.sleep(0.002)
        if not server.started:
            thread.join()
            self._forget()
            raise failure[0] if failure else UsageError("the scripted server did not start")
        self._thread = thread
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server and join its thread (open streams get a second)."""
        if self._uvicorn is None or self._thread is None:
            return
        self._uvicorn.should_exit = True
        self._thread.join()
        self._forget()

    async def __aenter__(self) -> ScriptedServer:
        """Serve on the running event loop, from a task this object owns and awaits on exit;
        returns once the socket accepts connections. (In the main thread uvicorn holds
        SIGINT/SIGTERM while it serves: a Ctrl-C stops it, then is raised again.)"""
        server, sock = self._prepare()
        task = asyncio.create_task(server.serve(sockets=[sock]), name="toollatch-scripted")
        while not server.started and not task.done():
            await asyncio.sleep(0.002)
        if not server.started:
            self._forget()
            await task  # raises what stopped it
            raise UsageError("the scripted server did not start")
        self._task = task
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server and wait for it (open streams get a second)."""
        if self._uvicorn is None or self._task is None:
            return
        self._uvicorn.should_exit = True
        try:
            await self._task
        finally:
            self._forget()

    def _prepare(self) -> tuple[uvicorn.Server, socket.socket]:
        """A bound socket (port 0) and a uvicorn server for it; raises UsageError if running."""
        if self._uvicorn is not None:
            raise UsageError("the scripted server is already running")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        _quiet_drops.install()
        self._uvicorn, self._socket = loopback_server(self.app, _STOP_TIMEOUT_S), sock
        self._port = sock.getsockname()[1]
        return self._uvicorn, sock

    def _forget(self) -> None:
        if self._socket is not None:
            self._socket.close()  # uvicorn closed it already; closing twice is harmless
            _quiet_drops.remove()
        self._uvicorn = self._socket = self._port = None
        self._thread = self._task = None

    # --- the endpoints ------------------------------------------------------------------------

    def _routes(self) -> list[Route]:
        def endpoint(provider: str) -> Any:
            async def handle(request: Request) -> Response:
                return await self._handle(provider, request)

            return handle

        return [
            Route("/v1/chat/completions", endpoint("openai_chat"), methods=["POST"]),
            Route("/v1/responses", endpoint("openai_responses"), methods=["POST"]),
            Route("/v1/messages", endpoint("anthropic"), methods=["POST"]),
            Route("/v1beta/models/{target}", endpoint("gemini"), methods=["POST"]),
            # the Gemini API serves its stable methods on /v1 too (google-genai may use it)
            Route("/v1/models/{target}", endpoint("gemini"), methods=["POST"]),
            # Bedrock's model id may be an ARN: its "/" arrives decoded, so the path's rest
            Route("/model/{target:path}", endpoint("bedrock"), methods=["POST"]),
            Route("/v1/models", self._list_models, methods=["GET"]),
            Route("/v1beta/models", self._list_models_gemini, methods=["GET"]),
        ]

    async def _list_models(self, request: Request) -> Response:
        """``GET /v1/models``: the scripts as models, in a list both the OpenAI and the
        Anthropic SDKs read (each takes its own fields of one entry and ignores the rest)."""
        names = sorted(self.scripts)
        data = [
            {
                "id": name,
                "object": "model",
                "created": CREATED,
                "owned_by": "toollatch",
                "type": "model",
                "display_name": name,
                "created_at": "2026-01-01T00:00:00Z",
            }
            for name in names
        ]
        first, last = (names[0], names[-1]) if names else (None, None)
        body = {"object": "list", "data": data, "has_more": False}
        return JSONResponse({**body, "first_id": first, "last_id": last})

    async def _list_models_gemini(self, request: Request) -> Response:
        """``GET /v1beta/models``: the scripts in Gemini's ``ListModelsResponse`` shape."""
        models = [
            {
                "name": f"models/{name}",
                "displayName": name,
                "supportedGenerationMethods": ["generateContent", "streamGenerateContent"],
            }
            for name in sorted(self.scripts)
        ]
        return JSONResponse({"models": models})

    async def _handle(self, provider: str, request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        response, turn = self._answer(provider, request, body)
        record = RecordedRequest(
            provider=provider,
            path=request.url.path,
            body=body,
            headers=dict(request.headers),
            status=response.status_code,
            turn=turn,
        )
        with self._lock:
            self._requests.append(record)
        return response

    def _answer(self, provider: str, request: Request, body: Any) -> tuple[Response, int | None]:
        """The response for one request, and the index of the turn it plays (if any)."""
        model = _model(provider, request, body)
        if model is None:
            method = {"bedrock": "/converse-stream"}.get(
                provider, ":streamGenerateContent?alt=sse or :generateContent"
            )
            return error_response(provider, 404, f"Not found: use {method}"), None
        if provider == "bedrock" and (problem := bedrock_auth_problem(request.headers)):
            return error_response(provider, 403, problem), None
        if body is None:
            return error_response(provider, 400, "the request body is not valid JSON"), None
        try:
            turns = check_request(provider, body)
        except InvalidRequest as exc:
            return error_response(provider, 400, exc.message, param=exc.param), None
        script = self.scripts.get(model)
        if script is None:
            return error_response(provider, 404, f"The model `{model}` does not exist"), None
        turn = script.turn(turns)
        faults = turn.faults
        if (
            faults.status is not None
            and self._count_attempt(model, turns) <= faults.status_attempts
        ):
            return status_response(provider, faults.status, faults.retry_after_s), turns
        if not _streams(provider, request, body):
            try:
                whole = whole_body(provider, turn, model=model, response_id=self._next_id(provider))
            except NotWhole as exc:
                return error_response(provider, 400, str(exc), param="stream"), turns
            return JSONResponse(whole), turns
        events = _encode(
            provider, turn, model=model, body=body, response_id=self._next_id(provider)
        )
        if provider == "openai_chat" and self.quirks is not None:
            events = rewritten(events, self.quirks)
        media = EVENTSTREAM if provider == "bedrock" else _SSE
        playback = _Playback(events, turn, self.delay_scale, media)
        playback.opened, playback.ended = self._stream_opened, self._stream_ended
        return playback, turns

    def _count_attempt(self, model: str, turn: int) -> int:
        with self._lock:
            count = self._attempts.get((model, turn), 0) + 1
            self._attempts[(model, turn)] = count
            return count

    def _next_id(self, provider: str) -> str:
        prefix = {"openai_chat": "chatcmpl", "openai_responses": "resp", "anthropic": "msg"}
        with self._lock:
            n = len(self._requests)
        return f"{prefix.get(provider, 'gemini')}_scripted_{n}"


def _model(provider: str, request: Request, body: Any) -> str | None:
    """The model asked for: the body's ``model`` (a missing one is refused by the validator),
    Gemini's ``{model}:streamGenerateContent`` path segment or Bedrock's
    ``/model/{modelId}/converse-stream`` (``None``: no such method)."""
    target = str(request.path_params.get("target", ""))
    if provider == "bedrock":
        model_id, _, method = target.rpartition("/")
        return model_id if method == "converse-stream" and model_id else None
    if provider != "gemini":
        value: object = body.get("model") if isinstance(body, dict) else None
        return value if isinstance(value, str) else ""
    model, _, method = target.rpartition(":")
    if method == "generateContent":
        return model
    if method != "streamGenerateContent" or request.query_params.get("alt") != "sse":
        return None
    return model


def _streams(provider: str, request: Request, body: Any) -> bool:
    """Whether the request asks for a stream: ``stream: true`` in the body, or Gemini's
    ``:streamGenerateContent`` method (``:generateContent`` answers whole), or Bedrock's
    ``converse-stream`` (the only Bedrock method served)."""
    if provider == "bedrock":
        return True
    if provider == "gemini":
        target: str = request.path_params["target"]
        return target.endswith(":streamGenerateContent")
    return isinstance(body, dict) and body.get("stream") is True


def _encode(
    provider: str, turn: Turn, *, model: str, body: Any, response_id: str
) -> list[WireEvent]:
    if provider == "openai_chat":
        options = body.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        return chat_events(turn, model=model, response_id=response_id, include_usage=usage)
    if provider == "openai_responses":
        return responses_events(turn, model=model, response_id=response_id)
    if provider == "anthropic":
        return anthropic_events(turn, model=model, response_id=response_id)
    if provider == "bedrock":
        return bedrock_events(turn, model=model, response_id=response_id)
    return gemini_events(turn, model=model, response_id=response_id)


def schedule(count: int, delay_s: float, stall_at: int | None, stall_s: float) -> list[float]:
    """When each of a stream's ``count`` events is due, in seconds from the stream's start:
    the head (and the first event) after ``delay_s``, then one every ``delay_s``; the event
    ``stall_at`` waits ``stall_s`` instead of ``delay_s``. Absolute, so the time a send
    takes does not push the later events back (a slow send is caught up, not carried)."""
    due: list[float] = []
    at = delay_s
    for n in range(count):
        at += stall_s if n == stall_at and stall_s else (delay_s if n else 0.0)
        due.append(at)
    return due


class _Playback(Response):
    """Sends a turn's events at their :func:`schedule`; a stall; a drop (the connection
    closes with no terminal event: the ASGI app returns before the response is complete).
    Stops at once when the client closes its connection (ASGI ``http.disconnect``, or a
    send raising ``OSError``); ``opened`` / ``ended(how)`` count it on its server."""

    def __init__(
        self, events: list[WireEvent], turn: Turn, scale: float, media: str = _SSE
    ) -> None:
        super().__init__(status_code=200, media_type=media)
        self.content_type = media
        self.events = events
        self.delay_s = turn.delay_ms * scale / 1000
        faults = turn.faults
        self.stall_s = faults.stall_ms * scale / 1000
        self.stall_at = faults.stall_after_events
        if self.stall_at is None:
            first = next((n for n, e in enumerate(events) if e.in_arguments), None)
            self.stall_at = None if first is None else first + 1
        self.drop_after = faults.drop_after_events
        self.due = schedule(len(events), self.delay_s, self.stall_at, self.stall_s)
        self.opened: Callable[[], None] = lambda: None
        self.ended: Callable[[str], None] = lambda how: None

    def clock(self) -> float:
        """The time the schedule is kept by (the event loop's)."""
        return asyncio.get_running_loop().time()

    async def wait_until(self, deadline: float, gone: asyncio.Event) -> bool:
        """Wait until :meth:`clock` reaches ``deadline`` (at once if it has), or less if
        the client leaves first; False if it has left."""
        remaining = deadline - self.clock()
        if remaining > 0 and not gone.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await gone.wait()
        return not gone.is_set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()
        watch = asyncio.ensure_future(_watch_disconnect(receive, gone))
        how = "cancelled"  # (what is left when the server's stop cancels the stream)
        self.opened()
        try:
            how = await self._play(send, gone)
        finally:
            watch.cancel()
            self.ended(how)

    async def _play(self, send: Send, gone: asyncio.Event) -> str:
        """Send the stream; how it ended (a key of :attr:`ScriptedServer.streams`)."""
        start = self.clock()
        if not await self.wait_until(start + self.delay_s, gone):
            return "client_left"  # before the first byte
        headers = [
            (b"content-type", self.content_type.encode()),
            (b"cache-control", b"no-cache"),
        ]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for n, event in enumerate(self.events):
                if n == self.drop_after:
                    return "dropped"  # uvicorn closes the connection mid-body (_quiet_drops)
                if not await self.wait_until(start + self.due[n], gone):
                    return "client_left"  # nobody reads the rest: stop writing it
                await send({"type": "http.response.body", "body": event.data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # ASGI 2.4: a send to a closed connection may raise
            return "client_left"
        return "complete"


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client closes its connection (ASGI's ``http.disconnect``; the
    request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


class _QuietDrops(logging.Filter):
    """Hides uvicorn's error line for a deliberately dropped stream (and only that line),
    while at least one server runs."""

    _MESSAGE = "ASGI callable returned without completing response."

    def __init__(self) -> None:
        super().__init__()
        self._users = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self._MESSAGE

    def install(self) -> None:
        with self._lock:
            self._users += 1
            if self._users == 1:
                logging.getLogger("uvicorn.error").addFilter(self)

    def remove(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                logging.getLogger("uvicorn.error").removeFilter(self)


_quiet_drops = _QuietDrops()
