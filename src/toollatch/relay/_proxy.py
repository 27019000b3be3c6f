"""``toollatch proxy``: an OpenAI-compatible endpoint in front of a quirky model server
(internal; public names in :mod:`toollatch.relay`).

Theory of operation. ``POST /v1/chat/completions`` takes an OpenAI request, forwards it to
the upstream's ``/chat/completions`` (always with ``stream: true``: one reading path for
both kinds of answer), reads the upstream's stream with a :class:`~toollatch.StreamParser`
whose gate knows the request's ``tools`` (compiled once per distinct tool set, kept in a
bounded cache), and answers in OpenAI's own format through :class:`._proxy_chunks.ChatChunks`:
text as it comes; a tool call only once the gate committed it (``--calls hold``), as one
delta with its complete arguments, eagerly (as soon as the upstream moved on from it, not at
the round's end); a call that did not commit is never sent as a call, only reported under
the chunk's ``toollatch`` key. Whatever quirks the upstream has (no ``index``, reused
indices, ids repeated, arguments as objects, ``[DONE]`` without a finish reason, calls
interleaved: the adapters' rules), the client sees one ``index`` per call counting from 0,
``id``/``type``/``name`` once, one ``finish_reason``. A non-streaming request gets one
``chat.completion`` with the committed calls only. ``GET /v1/models`` is passed through.
With ``calls="stream"`` a streaming chat request gets each call's argument text as it
streams instead, normalized by the call's own buffer (:mod:`._proxy_live`), with the same
verdicts at the end. A silent upstream fails the round ``idle_timeout`` after
``idle_timeout_s`` (one :class:`~toollatch.runtime.IdleDeadline` per stream). A client that
goes away (from its body's end on) takes its upstream request with it at once, whether the
proxy was waiting for the upstream's answer head, reading a whole answer or streaming
(:class:`_ClientWatch`, one task per request). Each request is watched
(:mod:`._proxy_telemetry`: ``GET /metrics`` and OpenTelemetry spans). Requests that start
together take turns with the streams already flowing: one start step per iteration of the
event loop (:mod:`._proxy_turns`).

The client's ``Authorization`` is forwarded unless an upstream key is configured; then a
configured proxy token is the client's ``Bearer`` (so an SDK's ``api_key`` is the token).
Without an upstream key the token goes in ``X-Toollatch-Token``. ``Host`` must name the
proxy and a request carrying a foreign ``Origin`` is refused (the relay's rules,
:class:`._guard.RelayAccess`). Errors are OpenAI's shape, ``{"error": {"message", "type",
"code"}}``; an upstream's own error status and body are passed through (bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..core._assembler import RoundOver
from ..core._errors import ConfigError, ErrorCode, UsageError
from ..core._gate import Gate
from ..core._limits import Limits
from ..core._pipeline import StreamParser
from ..core._registry import Framing
from ..core._round import Round
from ..core._specs import ToolSpec
from ..runtime import IdleDeadline, Recorder
from ..runtime._clients._errors import ModelError
from ..scripted._server import http_implementation
from ..tools._tasks import join
from ._config import RelayLimits
from ._guard import ConnectionCap, RelayAccess, connection_cap, guarded_protocol, is_loopback
from ._http import StreamClient, upstream_http
from ._proxy_chunks import ChatChunks, error_chunk, interrupted
from ._proxy_live import LiveChunks
from ._proxy_responses import ResponseEvents
from ._proxy_telemetry import ProxyTelemetry, RequestWatch, watch
from ._proxy_turns import StartTurns
from ._proxy_upstreams import (
    UPSTREAM_PROVIDERS,
    Upstream,
    Upstreams,
    list_models,
    openai_error,
)
from ._serving import listening_socket, started

CALL_MODES = ("hold", "stream")
"""How calls reach the client: ``hold``, only once committed, complete (the default);
``stream``, their argument text as it streams, the verdicts at the end (:mod:`._proxy_live`:
a client may see fragments of a call refused later)."""
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""A request body's bound (``proxy.max_request_bytes``): conversations with images are big."""
DEFAULT_IDLE_TIMEOUT_S = 60.0
"""How long the upstream may stay silent mid-stream before the round fails ``idle_timeout``."""
_GATES_KEPT = 64
"""Distinct tool sets whose compiled gate is kept (least recently used goes first)."""
_FORWARDED = ("authorization", "openai-organization", "openai-project")
_ERROR_BODY_BYTES = 64 * 1024
"""At most this much of an upstream's error body is passed on."""
_TOKEN_HEADER = "x-toollatch-token"
_HOSTS_KEPT = 64
"""Distinct ``Host`` headers whose check is kept (all forgotten past that: clients choose
them)."""
_STEPS = _ROUTE, _SEND, _ANSWER = 0, 1, 2
"""A request's start steps that take turns with the flowing streams (:mod:`._proxy_turns`):
its routing and body; the gate's set-up and the upstream request; the answer's set-up once
the upstream answered."""
_TURN_PACE_S = 0.0005
"""Start steps go on at one per iteration of the loop, or one per this much of its time when
its iterations are longer (:class:`StartTurns`): each step is 0.05-0.3 ms of the loop's time,
so starts waiting take at most about half of a busy loop from the flowing streams."""


class ProxyError(Exception):
    """A refused request: status, OpenAI-style error type and code, message."""

    def __init__(
        self, status: int, code: str, message: str, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.kind = status, code, kind

    def response(self) -> JSONResponse:
        """The error as OpenAI answers one."""
        body = {"error": {"message": str(self), "type": self.kind, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


def gate_tools(body: Mapping[str, Any]) -> tuple[ToolSpec, ...]:
    """The gate's tools from an OpenAI request's ``tools`` (function tools only; a request
    without tools gets none, so any call is refused ``unknown_tool``). Raises ProxyError
    (400) for a malformed tool or schema."""
    tools = body.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ProxyError(400, "invalid_tools", "tools must be a list")
    specs = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue  # (built-in tools of other kinds are the upstream's business)
        try:
            specs.append(ToolSpec.from_definition(tool))
        except ConfigError as exc:
            raise ProxyError(400, "invalid_tools", f"tools[{n}]: {exc}") from None
    return tuple(specs)


class GateCache:
    """Compiled gates by tool set (the canonical JSON of the request's ``tools``)."""

    def __init__(self, limits: Limits, kept: int = _GATES_KEPT) -> None:
        self.limits, self.kept = limits, kept
        self._gates: OrderedDict[bytes, tuple[Gate, tuple[str, ...]]] = OrderedDict()

    def get(self, body: Mapping[str, Any]) -> tuple[Gate, tuple[str, ...]]:
        """The gate for ``body``'s tools and their names (every tool eager)."""
        key = orjson.dumps(body.get("tools"), option=orjson.OPT_SORT_KEYS)
        found = self._gates.get(key)
        if found is not None:
            self._gates.move_to_end(key)
            return found
        specs = gate_tools(body)
        made = (Gate(tools=specs, limits=self.limits), tuple(s.name for s in specs))
        self._gates[key] = made
        while len(self._gates) > self.kept:
            self._gates.popitem(last=False)
        return made


class Proxy:
    """The proxy's ASGI app over one upstream (``upstream``: a base URL as the ``openai`` SDK
    takes it, e.g. ``http://127.0.0.1:8000/v1``), reached through ``http``.

    ``upstream_key``: sent as the upstream's bearer instead of the client's
    ``Authorization``. ``access``: who may drive it (Host, token, Origin). ``limits``: the
    gate's and parser's bounds. ``max_request_bytes`` and ``idle_timeout_s``: see the
    module's constants. ``record``: a folder where each upstream answer is saved
    (:class:`Recorder`). ``connections``: the relay's bounds on connections, request heads
    and bodies (``max_connections``, ``max_header_bytes``, ``header_timeout_s``,
    ``body_timeout_s``, ``idle_timeout_s``), enforced as the relay enforces them. ``calls``:
    ``hold`` or ``stream`` (:data:`CALL_MODES`; streaming chat requests only).
    ``telemetry``: its metrics (``GET /metrics``) and spans (none: neither).
    """

    def __init__(
        self,
        upstream: str,
        http: StreamClient,
        *,
        upstream_key: str | None = None,
        access: RelayAccess | None = None,
        limits: Limits | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        record: Path | None = None,
        connections: RelayLimits | None = None,
        provider: str = "openai_chat",
        calls: str = "hold",
        telemetry: ProxyTelemetry | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.provider = provider
        self.calls, self.telemetry = calls, telemetry
        self.upstreams = None  # (a chat upstream is forwarded as is)
        if provider != "openai_chat":
            self.upstreams = Upstreams(
                provider=provider,
                base_url=self.upstream,
                http=http,
                upstream_key=upstream_key,
                idle_timeout_s=idle_timeout_s,
                record=record,
            )
        self.record = record
        self.connections = connections or RelayLimits()
        self.http, self.upstream_key = http, upstream_key
        self.access = access or RelayAccess()
        self.limits = limits or Limits()
        self.max_request_bytes, self.idle_timeout_s = max_request_bytes, idle_timeout_s
        self.gates = GateCache(self.limits)
        self._urls: dict[str, httpx.URL] = {}  # the upstream's, by path: parsed once
        self._hosts: dict[str, bool] = {}  # Host header -> allowed (parsed once each)
        self.turns = StartTurns(len(_STEPS), _TURN_PACE_S)
        """Request starts' turns, one step per loop iteration (:mod:`._proxy_turns`)."""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/healthz", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGI: the access checks, then the routes (watched, with telemetry)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif self.telemetry is None:
            await self._http(scope, receive, send)
        else:
            with self.telemetry.request(scope["method"], scope["path"]) as watching:
                await self._http(scope, receive, _status_of(send, watching))

    async def _http(self, scope: Any, receive: Any, send: Any) -> None:
        await self.turns.turn(_ROUTE)
        refusal = self._refusal(Request(scope))
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _metrics(self, _request: Request) -> Response:
        """The proxy's Prometheus metrics (the ``[metrics]`` extra; 404 without it)."""
        text = None if self.telemetry is None else self.telemetry.exposition()
        if text is None:
            return ProxyError(404, "not_found", "metrics need the [metrics] extra").response()
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    def _refusal(self, request: Request) -> ProxyError | None:
        access, headers = self.access, request.headers
        host = headers.get("host", "")
        if not self._host_allowed(host):
            return ProxyError(400, "host_not_allowed", "the Host header does not name this proxy")
        origin = headers.get("origin")
        if origin is not None and not access.origin_allowed(origin, host):
            return ProxyError(403, "origin_not_allowed", "the request comes from another site")
        if access.token is not None and not access.token_ok(self._token(request)):
            where = "Authorization: Bearer" if self.upstream_key else _TOKEN_HEADER
            return ProxyError(401, "unauthorized", f"this proxy needs its token ({where})")
        return None

    def _host_allowed(self, host: str) -> bool:
        allowed = self._hosts.get(host)
        if allowed is None:
            allowed = self.access.host_allowed(host)
            if len(self._hosts) >= _HOSTS_KEPT:
                self._hosts.clear()
            self._hosts[host] = allowed
        return allowed

    def _token(self, request: Request) -> str | None:
        given = request.headers.get(_TOKEN_HEADER)
        if given is None and self.upstream_key is not None:
            scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
            given = bearer.strip() if scheme.lower() == "bearer" else None
        return given

    def _headers(self, request: Request) -> dict[str, str]:
        """What goes upstream: JSON, and the client's credentials (or the upstream key). The
        body is asked for unencoded (``identity``): the reader parses its bytes as they come
        (:func:`_chunks`), and httpx's default would let a gateway gzip it."""
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "accept-encoding": "identity",
        }
        for name in _FORWARDED:
            value = request.headers.get(name)
            if value is not None:
                headers[name] = value
        if self.upstream_key is not None:
            headers["authorization"] = f"Bearer {self.upstream_key}"
        return headers

    def _url(self, path: str) -> httpx.URL:
        """The upstream's URL for ``path`` (parsed on its first request, then kept)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(f"{self.upstream}/{path}")
        return url

    async def _health(self, _request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def _models(self, request: Request) -> Response:
        return await _watched(request, self._listed(request))

    async def _listed(self, request: Request) -> Response:
        if self.upstreams is not None:  # another provider's list, in OpenAI's shape
            listed = await list_models(self.upstreams, request)
            if listed is not None:
                return listed
        headers = self._headers(request)
        headers.pop("content-type")
        try:
            async with asyncio.timeout(self.idle_timeout_s):
                answer = await self.http.get(self._url("models"), headers=headers)
        except (httpx.HTTPError, TimeoutError) as exc:
            return _unreachable(self.upstream, exc, self.idle_timeout_s).response()
        return Response(
            answer.content[:_ERROR_BODY_BYTES] if answer.status_code >= 400 else answer.content,
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type", "application/json"),
        )

    async def _chat(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            await self.turns.turn(_SEND)
            gate, eager = self.gates.get(body)
        except ProxyError as exc:
            return exc.response()
        return await _watched(request, self._chat_answer(request, body, gate, eager))

    async def _chat_answer(
        self, request: Request, body: dict[str, Any], gate: Gate, eager: tuple[str, ...]
    ) -> Response:
        wanted_stream = body.get("stream") is True
        options = body.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        upstream_body = {**body, "stream": True}
        if not wanted_stream:
            upstream_body.pop("stream_options", None)
        opened: tuple[Upstream, Recorder | None] | Response
        if self.upstreams is not None:  # another provider's wire (._proxy_upstreams)
            opened = await self.upstreams.open(request, body, tuple((gate.tools or {}).values()))
        else:
            opened = await self._open(request, "chat/completions", body, upstream_body)
        if isinstance(opened, Response):
            return opened
        answer, recorder = opened
        await self._answer_turn(answer, recorder)
        parser, chunks = self._chat_reader(body, gate, eager, live=wanted_stream)
        if not wanted_stream:
            async for _ in self._read(answer, parser, chunks, recorder):
                pass
            round_ = parser.finish()
            if interrupted(round_):
                return _broken(round_).response()
            return JSONResponse(chunks.completion(round_))
        return EventStream(self._stream(answer, parser, chunks, usage, recorder))

    def _chat_reader(
        self, body: Mapping[str, Any], gate: Gate, eager: tuple[str, ...], *, live: bool
    ) -> tuple[StreamParser, ChatChunks]:
        """The parser of a chat answer and its chunks: ``stream`` mode's for a streaming
        request when the proxy runs with ``calls="stream"``, the hold mode's otherwise."""
        streams = live and self.calls == "stream"
        framing: Framing = "eventstream" if self.provider == "bedrock" else "sse"
        parser = StreamParser(
            self.provider,
            framing=framing,
            gate=gate,
            eager=eager,
            observe=True,
            observe_arguments=streams,
        )
        completion_id = f"chatcmpl-{secrets.token_urlsafe(18)}"
        model, created = str(body.get("model", "")), int(time.time())
        if streams:
            live_chunks = LiveChunks(
                completion_id=completion_id, model=model, created=created, tools=eager
            )
            return parser, live_chunks
        return parser, ChatChunks(completion_id=completion_id, model=model, created=created)

    async def _responses(self, request: Request) -> Response:
        """``POST /v1/responses``: as :meth:`_chat`, over the Responses wire."""
        if self.provider not in ("openai_chat", "openai_responses"):
            message = f"/v1/responses needs an OpenAI upstream, not {self.provider}"
            return openai_error(404, "not_supported", message)
        try:
            body = await self._body(request, "input")
            await self.turns.turn(_SEND)
            gate, eager = self.gates.get(body)
        except ProxyError as exc:
            return exc.response()
        return await _watched(request, self._responses_answer(request, body, gate, eager))

    async def _responses_answer(
        self, request: Request, body: dict[str, Any], gate: Gate, eager: tuple[str, ...]
    ) -> Response:
        opened = await self._open(request, "responses", body, {**body, "stream": True})
        if isinstance(opened, Response):
            return opened
        answer, recorder = opened
        await self._answer_turn(answer, recorder)
        parser = StreamParser("openai_responses", gate=gate, eager=eager, observe=True)
        events = ResponseEvents(
            response_id=f"resp_{secrets.token_urlsafe(18)}",
            model=str(body.get("model", "")),
            created=int(time.time()),
        )
        if body.get("stream") is True:
            return EventStream(self._response_events(answer, parser, events, recorder))
        async for _ in self._read(answer, parser, events, recorder):
            pass
        round_ = parser.finish()
        if interrupted(round_):
            return _broken(round_).response()
        _kind, final = events.end(round_)[-1]
        return JSONResponse(final["response"])

    async def _answer_turn(self, answer: Upstream, recorder: Recorder | None) -> None:
        """The answer's set-up waits for its turn (:mod:`._proxy_turns`); cancelled meanwhile,
        the upstream's answer and its recorder are closed (nothing else holds them yet)."""
        try:
            await self.turns.turn(_ANSWER)
        except BaseException:
            await answer.aclose()
            if recorder is not None:
                recorder.close()
            raise

    async def _open(
        self,
        request: Request,
        path: str,
        body: Mapping[str, Any],
        upstream_body: Mapping[str, Any],
    ) -> tuple[httpx.Response, Recorder | None] | Response:
        """The upstream's answer to ``upstream_body`` at ``path`` (streaming), and its
        recorder (``record``); or the response to give instead: 502 when the upstream cannot
        be reached, its own error status and body (recorded too) when it refused."""
        sent = self.http.build_request(
            "POST",
            self._url(path),
            content=orjson.dumps(upstream_body),
            headers=self._headers(request),
        )
        watching = watch()
        if watching is not None:
            watching.upstream(str(body.get("model", "")))
        try:
            async with asyncio.timeout(self.idle_timeout_s):  # (silent before its head too)
                answer = await self.http.send_stream(sent)
        except (httpx.HTTPError, TimeoutError) as exc:
            refused = _unreachable(self.upstream, exc, self.idle_timeout_s)
            if watching is not None:
                bad = refused.code == "upstream_bad_answer"
                watching.upstream_error("bad_answer" if bad else "unreachable")
            return refused.response()
        recorder = None
        if self.record is not None:
            known = [
                request.headers.get(h, "").partition(" ")[2] or request.headers.get(h, "")
                for h in ("authorization", _TOKEN_HEADER)
            ]
            provider = "openai_chat" if path == "chat/completions" else "openai_responses"
            recorder = Recorder(
                self.record, body, known=[*known, self.upstream_key or ""], provider=provider
            )
            recorder.begin(answer.status_code, self.upstream)
        if answer.status_code != 200:
            if watching is not None:
                watching.upstream_error("status")
            passed = await _passed_on(answer)
            if recorder is not None:
                recorder.write(bytes(passed.body))
                recorder.close()
            return passed
        return answer, recorder

    async def _response_events(
        self,
        answer: httpx.Response,
        parser: StreamParser,
        events: ResponseEvents,
        recorder: Recorder | None,
    ) -> AsyncGenerator[bytes, None]:
        yield b"".join([_named_sse(kind, event) for kind, event in events.start()])
        async with contextlib.aclosing(self._read(answer, parser, events, recorder)) as reading:
            async for read in reading:  # (closed with this generator: the upstream too)
                yield b"".join([_named_sse(k, e) for decided in read for k, e in decided])
        round_ = parser.finish()
        if interrupted(round_):
            kind, event = events.error(str(_broken(round_)), "upstream_interrupted")
            yield LastFrame(_named_sse(kind, event))
            return
        yield LastFrame(b"".join([_named_sse(kind, event) for kind, event in events.end(round_)]))

    async def _body(self, request: Request, needs: str = "messages") -> dict[str, Any]:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ProxyError(415, "unsupported_media_type", "the body must be application/json")
        limit, seconds = self.max_request_bytes, self.connections.body_timeout_s
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(seconds):
                async for part in request.stream():
                    size += len(part)
                    if size > limit:
                        message = f"the body is over {limit} bytes"
                        raise ProxyError(413, "request_too_large", message)
                    parts.append(part)
        except TimeoutError:
            raise ProxyError(408, "body_timeout", f"the body took over {seconds:g} s") from None
        except ClientDisconnect:  # (answered to nobody: counted 499, as a client gone later)
            raise ProxyError(499, "client_gone", "the client went away") from None
        try:
            body = orjson.loads(b"".join(parts))
        except orjson.JSONDecodeError as exc:
            raise ProxyError(400, "invalid_json", f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ProxyError(400, "invalid_body", "the body must be a JSON object")
        if needs == "messages" and not isinstance(body.get("messages"), list):
            raise ProxyError(400, "invalid_body", "messages must be a list")
        if needs == "input" and not isinstance(body.get("input"), str | list):
            raise ProxyError(400, "invalid_body", "input must be a string or a list")
        return body

    async def _read(
        self,
        answer: Upstream,
        parser: StreamParser,
        encoder: ChatChunks | ResponseEvents,
        recorder: Recorder | None,
    ) -> AsyncGenerator[list[Any], None]:
        """The upstream's bytes into ``parser`` (and ``recorder``); yields ``encoder``'s
        output for the text and the committed calls as they are decided: once per upstream
        read that decided something, all that read decided (so its caller sends it to the
        client in one write: never more than one read's worth, so nothing already read
        waits for the next). A broken or silent upstream fails the round (not raised). The
        answer and the recorder are closed at the end, however it comes."""
        reads = _chunks(answer).__aiter__()
        watching = watch()
        noted = watching.notice if watching is not None and watching.traced else None
        # one timer per stream, moved by each read, not one asyncio.timeout per read (13 % of
        # the proxy's CPU at 50 streams: benchmarks/README.md); only the read is timed, never
        # the time the consumer holds this generator at a yield
        idle = IdleDeadline(self.idle_timeout_s)
        try:
            while not parser.over:
                idle.reading()
                try:
                    data = await anext(reads)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if not idle.expired_for():
                        raise  # (somebody else's cancellation: the client went away)
                    seconds = self.idle_timeout_s
                    parser.fail(ErrorCode.IDLE_TIMEOUT, f"no bytes for {seconds:g} s")
                    _failed(watching, "idle_timeout")
                    return
                except (httpx.HTTPError, ModelError) as exc:
                    parser.fail(ErrorCode.STREAM_INTERRUPTED, f"{type(exc).__name__}: {exc}")
                    _failed(watching, "stream_interrupted")
                    return
                finally:
                    idle.done()
                if recorder is not None:
                    recorder.write(data)
                decided: list[Any] = []
                over = False
                for notice in parser.feed(data):
                    if isinstance(notice, RoundOver):
                        over = True
                        break
                    if noted is not None:
                        noted(notice)
                    decided += encoder.notice(notice)
                if decided:
                    yield decided
                if over:
                    return
        finally:
            idle.close()
            await answer.aclose()
            if recorder is not None:
                recorder.close()
            if watching is not None:
                watching.round(parser.finish())  # (the callers' finish() gets the same Round)

    async def _stream(
        self,
        answer: Upstream,
        parser: StreamParser,
        chunks: ChatChunks,
        usage: bool,
        recorder: Recorder | None,
    ) -> AsyncGenerator[bytes, None]:
        async with contextlib.aclosing(self._read(answer, parser, chunks, recorder)) as reading:
            async for read in reading:  # (closed with this generator: the upstream too)
                yield b"".join([_sse(chunk) for chunk in read])  # (one write per read)
        round_: Round = parser.finish()
        if interrupted(round_):
            end = [error_chunk(str(_broken(round_)), "upstream_interrupted")]
        else:
            end = chunks.end(round_, usage=usage)
        yield LastFrame(b"".join([_sse(chunk) for chunk in end]) + b"data: [DONE]\n\n")


def _status_of(send: Any, watching: RequestWatch) -> Any:
    """``send``, noting the response's status in ``watching``."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            watching.status = message["status"]
        await send(message)

    return sending


def _failed(watching: RequestWatch | None, kind: str) -> None:
    if watching is not None:
        watching.upstream_error(kind)


_SSE_HEADERS = (
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
)
"""An event stream's response headers (as Starlette's StreamingResponse would make them)."""


class LastFrame(bytes):
    """An event stream's last frame: sent with the body's end (:class:`EventStream`)."""


class EventStream(Response):
    """A streamed SSE answer: each frame sent as it comes; a :class:`LastFrame` goes in the
    body's last message (the server's one write for it and the body's end, not a second one
    for the end alone); the client going away stops the frames (cancelled where they wait,
    so their generator, closed, closes the upstream too). ``client``: the request's watch,
    taken on from the handler (:func:`_watched`; None: one of its own).

    Starlette's own ``StreamingResponse`` watches for the disconnect the same way, in an
    anyio task group (cancel scopes, and a cancellation re-delivered every loop iteration
    until the task ends): 8 % of the proxy's busy samples over short streams, a task group
    of ours 1.4 % (py-spy, ``benchmarks/README.md``, "Stream starts"); now one task per
    request (:class:`_ClientWatch`), no group."""

    media_type = "text/event-stream"

    def __init__(
        self, frames: AsyncGenerator[bytes, None], client: _ClientWatch | None = None
    ) -> None:
        self.frames, self.client = frames, client
        self.status_code, self.background = 200, None
        self.raw_headers = list(_SSE_HEADERS)  # (built once, not per answer)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Send the answer; return when it is sent or the client has gone (a failed send
        raises as itself)."""
        client = self.client or _ClientWatch(receive)
        try:
            await self._send_frames(send)
        except asyncio.CancelledError:
            if not client.left():
                raise
        finally:
            client.stop()  # (before it reads the end of the answer as a disconnect)

    async def _send_frames(self, send: Any) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send(start | {"headers": self.raw_headers})
        async with contextlib.aclosing(self.frames) as frames:
            async for frame in frames:
                last = isinstance(frame, LastFrame)
                await send({"type": "http.response.body", "body": frame, "more_body": not last})
                if last:
                    return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _ClientWatch:
    """Watches a request's client from its body's end to its answer's: once the client goes
    away (ASGI ``http.disconnect``), the request's task is cancelled wherever it waits (for
    the upstream's answer head, a non-streaming answer's end, a stream's next frame), so the
    upstream request is closed at once, not at its end or the idle timeout. One task per
    request, kept from the handler through an :class:`EventStream` (never one per event).
    Made in the request's task; :meth:`left` on a CancelledError, :meth:`stop` at the end.
    The request's watch (:mod:`._proxy_telemetry`) is told: not an upstream failure."""

    __slots__ = ("_cancelling", "_owner", "_task", "_telemetry", "gone")

    def __init__(self, receive: Any) -> None:
        owner = asyncio.current_task()
        if owner is None:  # pragma: no cover - ASGI apps run in tasks
            raise RuntimeError("a request is answered in a task")
        self._owner, self._cancelling = owner, owner.cancelling()
        self._telemetry = watch()
        self.gone = False
        """True once the client went away (the request's task was cancelled for it)."""
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._telemetry is not None:
            self._telemetry.client_left()
        self._owner.cancel()

    def left(self) -> bool:
        """Called on a CancelledError in the request's task: True when it is this watch's
        (the client went away; the cancellation is then taken back, so the task ends
        normally), False when somebody else cancelled the task too (the caller re-raises)."""
        return self.gone and self._owner.uncancel() <= self._cancelling

    def stop(self) -> None:
        """No more watching (the answer is sent, or is being given up)."""
        self._task.cancel()


async def _watched(request: Request, answering: Coroutine[Any, Any, Response]) -> Response:
    """The response ``answering`` makes, its client watched meanwhile (:class:`_ClientWatch`):
    if the client goes away first, ``answering`` is cancelled where it waits (the upstream
    request closed with it) and nothing is sent (:data:`_GONE`). An :class:`EventStream`
    takes the watch on, to the stream's end."""
    client = _ClientWatch(request.receive)
    try:
        answer = await answering
    except asyncio.CancelledError:
        client.stop()
        if client.left():
            return _GONE
        raise
    except BaseException:
        client.stop()
        raise
    if isinstance(answer, EventStream):
        answer.client = client
        return answer
    client.stop()
    return _GONE if client.gone and client.left() else answer


class _Nothing(Response):
    """The answer to a client that went away: nothing sent (uvicorn closes the connection,
    as it does when an app returns without answering a disconnected client)."""

    def __init__(self) -> None:
        self.status_code, self.background = 499, None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Nothing to send."""


_GONE = _Nothing()


def _broken(round_: Round) -> ProxyError:
    """The 502 of a round whose upstream stream broke (its message: the in-stream error's)."""
    detail = round_.error or "the stream ended without its end signal"
    message = f"the upstream's stream broke: {detail}"
    return ProxyError(502, "upstream_interrupted", message, "upstream_error")


def _sse(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _named_sse(kind: str, event: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _unreachable(upstream: str, exc: Exception, idle_timeout_s: float) -> ProxyError:
    """502 for an upstream that cannot be reached; 502 ``upstream_bad_answer`` for one that was
    reached and then closed, reset or garbled its answer before the answer's head (not HTTP, a
    kept-alive connection it had closed); 504 for one that gave no answer's head within
    ``idle_timeout_s`` (a request it never took or never answered)."""
    if isinstance(exc, TimeoutError):
        detail = f"the upstream {upstream} sent no answer in {idle_timeout_s:g} s"
        return ProxyError(504, "upstream_timeout", detail, "upstream_error")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        detail = f"the upstream {upstream} broke off its answer before its head: {exc}"
        return ProxyError(502, "upstream_bad_answer", detail, "upstream_error")
    return ProxyError(
        502,
        "upstream_unreachable",
        f"cannot reach the upstream {upstream}: {exc}",
        "upstream_error",
    )


def _chunks(answer: Upstream) -> AsyncIterator[bytes]:
    """The upstream's body as it comes: its bytes as read, unless an upstream encoded it
    although asked not to (``Content-Encoding: gzip``...): then decoded (httpx's decoders)."""
    if isinstance(answer, httpx.Response):
        encoding = answer.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            return answer.aiter_bytes()
    return answer.aiter_raw()


async def _passed_on(answer: httpx.Response) -> Response:
    """An upstream's error answer, passed on (its status, at most 64 KiB of its body)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for part in _chunks(answer):
            parts.append(part)
            size += len(part)
            if size >= _ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        pass
    finally:
        await answer.aclose()
    headers = {k: v for k, v in answer.headers.items() if k.lower() == "retry-after"}
    return Response(
        b"".join(parts)[:_ERROR_BODY_BYTES],
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type", "application/json"),
        headers=headers,
    )


class ProxyServer:
    """``toollatch proxy`` on ``host:port`` (0: any free port, read back from :attr:`url`)
    in front of ``upstream`` (an OpenAI-compatible base URL, e.g. ``http://HOST:8000/v1``).

    ``token`` (``"auto"``: a new random one, in :attr:`token`; required when ``host`` is not
    loopback), ``allowed_hosts`` (more ``Host`` names), ``upstream_key`` (the upstream's API
    key; then the token is the client's ``Authorization: Bearer``), ``calls`` (``hold``, or
    ``stream``: see :data:`CALL_MODES`), ``limits``, ``max_request_bytes``,
    ``idle_timeout_s``, ``record`` (a folder: every upstream answer saved there, see
    :class:`Recorder`), ``connections`` (the relay's bounds), ``upstream_provider`` (the
    upstream's wire: ``openai_chat``, or ``anthropic``, ``gemini``, ``openai_responses``,
    ``bedrock``: the client's chat request translated, the answer in OpenAI chat's format;
    a Bedrock answer is recorded as an ``.eventstream`` file), ``telemetry`` (a
    ``ProxyTelemetry``; by default metrics in a registry of their own, served at
    ``/metrics``, and spans of the global tracer provider). ``async with ProxyServer(...) as
    proxy`` serves on the running loop until the block ends. Raises ConfigError for a bad
    port, mode, URL or token, or a host beyond loopback without a token.
    """

    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        allowed_hosts: Iterable[str] = (),
        upstream_key: str | None = None,
        calls: str = "hold",
        limits: Limits | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        record: str | Path | None = None,
        connections: RelayLimits | None = None,
        upstream_provider: str = "openai_chat",
        telemetry: ProxyTelemetry | None = None,
    ) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {port!r}")
        if calls not in CALL_MODES:
            raise ConfigError(f"calls must be one of {CALL_MODES}, got {calls!r}")
        if upstream_provider not in UPSTREAM_PROVIDERS:
            known = ", ".join(UPSTREAM_PROVIDERS)
            raise ConfigError(
                f"upstream_provider must be one of {known}, got {upstream_provider!r}"
            )
        self.upstream_provider = upstream_provider
        """The upstream's wire (``openai_chat``: forwarded as is)."""
        if not upstream.startswith(("http://", "https://")):
            raise ConfigError(f"the upstream must be an http(s) URL, got {upstream!r}")
        if not (isinstance(max_request_bytes, int) and max_request_bytes > 0):
            raise ConfigError(f"max_request_bytes must be positive, got {max_request_bytes!r}")
        if not (math.isfinite(idle_timeout_s) and idle_timeout_s > 0):
            raise ConfigError(f"idle_timeout_s must be positive, got {idle_timeout_s!r}")
        if token == "auto":
            token = secrets.token_urlsafe(32)
        if token is None and not is_loopback(host):
            raise ConfigError(f"listening on {host} (beyond loopback) needs a token (--token)")
        literal = not host or ":" in host or host.replace(".", "").isdigit()
        self.access = RelayAccess(
            allowed_hosts=(*([] if literal else [host]), *allowed_hosts),
            token=token,
            any_ip_host=not is_loopback(host),
        )
        self.token = token
        """The token every request must carry (None: none, on loopback only)."""
        self.upstream, self.host, self.port = upstream, host, port
        self.upstream_key, self.calls, self.limits = upstream_key, calls, limits
        self.max_request_bytes, self.idle_timeout_s = max_request_bytes, idle_timeout_s
        self.record = None if record is None else Path(record)
        self.connections = connections
        self.telemetry = telemetry if telemetry is not None else ProxyTelemetry(mode=calls)
        """Its metrics (``GET /metrics``, with the ``[metrics]`` extra) and OpenTelemetry
        spans (the global tracer provider's, with the ``[otel]`` extra)."""
        self._stack: contextlib.AsyncExitStack | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._bound: tuple[str, int] | None = None

    @property
    def url(self) -> str:
        """``http://host:port/v1`` (the base URL an OpenAI client takes) while serving."""
        if self._bound is None:
            raise UsageError("the proxy is not running (use `async with`)")
        return f"http://{self._bound[0]}:{self._bound[1]}/v1"

    async def __aenter__(self) -> ProxyServer:
        """Start serving; returns once the socket accepts connections."""
        if self._stack is not None:
            raise UsageError("the proxy is already running")
        stack = contextlib.AsyncExitStack()
        try:
            # (no read timeout: the stream's idle deadline is the proxy's own, and bounds the
            # wait for the answer's head too; connect bounds the TLS handshake: upstream_http)
            timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=30.0)
            http = await stack.enter_async_context(upstream_http(timeout))
            proxy = Proxy(
                self.upstream,
                http,
                upstream_key=self.upstream_key,
                access=self.access,
                limits=self.limits,
                max_request_bytes=self.max_request_bytes,
                idle_timeout_s=self.idle_timeout_s,
                record=self.record,
                connections=self.connections,
                provider=self.upstream_provider,
                calls=self.calls,
                telemetry=self.telemetry,
            )
            sock = listening_socket(self.host, self.port, stack)
            bounds = proxy.connections
            cap = ConnectionCap(connection_cap(bounds))
            config = uvicorn.Config(
                proxy,
                http=guarded_protocol(http_implementation(), bounds, cap),
                h11_max_incomplete_event_size=bounds.max_header_bytes + 1,
                ws="none",
                lifespan="off",
                log_config=None,
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=1,
            )
            server = uvicorn.Server(config)
            task = await started(server, sock, "toollatch-proxy")
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._server, self._task = stack, server, task
        self._bound = (self.host, sock.getsockname()[1])
        return self

    async def serve_forever(self) -> None:
        """Wait until the server stops (:meth:`stop`, or uvicorn's own signal handling)."""
        if self._task is None:
            raise UsageError("the proxy is not running (use `async with`)")
        await asyncio.shield(self._task)

    def stop(self) -> None:
        """Ask the server to stop (open streams get about a second)."""
        if self._server is not None:
            self._server.should_exit = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop serving and close the upstream client."""
        if self._stack is None:
            return
        try:
            self.stop()
            if self._task is not None:
                await join(self._task)
        finally:
            stack, self._stack = self._stack, None
            self._server = self._task = None
            self._bound = None
            await stack.aclose()
