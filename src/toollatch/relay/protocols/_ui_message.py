"""The Vercel AI SDK's UI message stream over a relay run (internal): what ``useChat`` and its
``DefaultChatTransport`` read (``ai`` 6.0.326: ``uiMessageChunkSchema``,
``processUIMessageStream`` in ``node_modules/ai/dist/index.mjs``; ../shared/PROTOCOLS.md §1).

Endpoints (registered by the relay's app, :func:`routes`):

* ``POST /api/chat`` takes what ``DefaultChatTransport`` sends (``id``: the chat id,
  ``messages``: UI messages, ``trigger``, ``messageId``; optional ``provider`` and ``model``,
  e.g. from ``useChat``'s ``body``) and answers the run of the chat's next message as a UI
  message stream. Only the **last** message is read, and only its text parts: the chat's
  history is the server's own (:mod:`.._chats`), so whatever else a client sends back (a tool
  result it made up, an edited answer) never reaches the model. The one exception: a last
  message of the assistant's answers the calls the chat's run waits on (an approval response,
  a client tool's output; :mod:`._ui_answers`), and only those parts of it are read. ``trigger:
  "regenerate-message"`` (``regenerate()``; ``messageId``: the answer, ``msg-<run id>``,
  or none for the last) drops the chat's last answer from the server's history and answers
  its last user message, as the server stored it, again (the client's messages are not
  read); 409 ``not_the_last_answer`` for an earlier answer, ``nothing_to_regenerate`` for a
  chat without one.
* ``GET /api/chat/{id}/stream`` replays the chat's run in flight from its start (what
  ``useChat({resume: true})`` asks for); 204 when none is in flight. A run of this worker
  that waits on its client ends the replay there, as ``POST /api/chat`` does (a reloaded
  page sees the question again and its answer is read from the next ``POST /api/chat``;
  a run a restarted relay resumed too).
* ``POST /api/chat/{id}/cancel`` (``{}`` or empty, JSON) cancels it: 202 ``{"id": run id,
  "cancelled"}``. Closing the stream does **not** cancel the run (so that it can be resumed);
  ``POST /runs/{run id}/cancel`` works too (the run id is the ``x-toollatch-run-id`` header).

Same session, guard, limits and metrics as ``POST /runs``; errors before the stream starts are
``{"error": {"code", "message"}}`` with their 4xx status (``DefaultChatTransport`` throws the
body's text).

The stream, from the run's own events (:class:`UIMessageEncoder`): ``start`` (``messageId``:
``msg-<run id>``, so a replay builds the same message), ``start-step`` / ``finish-step`` per
model round, ``text-start/delta/end``, ``reasoning-start/delta/end`` for the round's
reasoning blocks (the relay's ``reasoning`` events), ``tool-input-start`` when a call opens,
``tool-input-delta`` from the **preview channel** only (the redacted, policy-filtered preview
re-serialized as JSON text: display only), ``tool-input-available`` **only when the gate
commits the call**, with the committed arguments as the browser may see them
(:func:`~toollatch.relay.shown_arguments`: equal to the committed arguments unless the
preview policy hides fields or the redactor masks a secret), ``tool-input-error`` with the
stable error code for a call that did not commit (the client shows it as ``output-error``,
never ``input-available``), ``tool-output-available`` / ``tool-output-error`` in the
dispatcher's order (the result as the relay shows it: a redacted preview, parsed when it is
whole JSON; ``tool-output-denied`` for a denied approval), ``tool-approval-request``
(``approvalId``: the relay's signed token) for a call waiting for a person, ``finish``
(``tool-calls``) early when the run waits on the client (:mod:`._ui_answers`), ``error`` when
the run failed or events were forgotten (``lagged``), ``abort`` on
cancel, ``finish`` with the finish reason, ``data: [DONE]``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._chats import CHAT_ID, ChatStore
from .._config import RelayLimits
from .._requests import (
    CountedStream,
    HTTPError,
    read_body,
    require_json,
    session_of,
    set_cookie,
)
from .._runs import RelayRun, RunRegistry, RunSource
from ..store._base import RunStore, StoreUnavailable
from . import _ui_answers

UI_MESSAGE_STREAM_HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}
"""``ai``'s ``UI_MESSAGE_STREAM_HEADERS`` (the client checks none of them)."""

DONE = b"data: [DONE]\n\n"
_DATA = b"\ndata: "
_FINISH_REASONS = {"normal": "stop", "truncated": "length", "interrupted": "error"}


def _chunk(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class _ArgsText:
    """A call's preview deltas (``[pointer, op, value]``: ``set``, ``append``, ``end``) as
    the JSON text they spell, appended to as they come (the client partial-parses the
    concatenation). Deltas come in document order; anything else ends the text (``broken``):
    the preview is display only, the committed input comes with ``tool-input-available``."""

    __slots__ = ("broken", "sent", "stack")

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []  # [pointer, kind ("o", "a", "s"), children]
        self.sent = 0
        self.broken = False

    def feed(self, deltas: Sequence[Sequence[Any]]) -> str:
        out: list[str] = []
        for delta in deltas:
            if self.broken:
                return ""
            try:
                pointer, op, value = delta
                self._one(str(pointer), op, value, out)
            except (ValueError, TypeError, IndexError, orjson.JSONEncodeError):
                self.broken = True
                return ""
        text = "".join(out)
        self.sent += len(text)
        return text

    def _one(self, pointer: str, op: str, value: Any, out: list[str]) -> None:
        stack = self.stack
        if op == "append":
            if not stack or stack[-1][0] != pointer or stack[-1][1] != "s":
                raise ValueError(pointer)
            out.append(orjson.dumps(value).decode()[1:-1])
        elif op == "end":
            if not stack or stack[-1][0] != pointer:
                raise ValueError(pointer)
            out.append({"o": "}", "a": "]", "s": '"'}[stack.pop()[1]])
        elif op == "set":
            if pointer == "":
                if stack or self.sent:
                    raise ValueError(pointer)
            else:
                parent, _, key = pointer.rpartition("/")
                if not stack or stack[-1][0] != parent or stack[-1][1] == "s":
                    raise ValueError(pointer)
                top = stack[-1]
                if top[2]:
                    out.append(",")
                top[2] += 1
                if top[1] == "o":
                    name = key.replace("~1", "/").replace("~0", "~")
                    out.append(orjson.dumps(name).decode() + ":")
            if isinstance(value, dict) and not value:
                stack.append([pointer, "o", 0])
                out.append("{")
            elif isinstance(value, list) and not value:
                stack.append([pointer, "a", 0])
                out.append("[")
            elif isinstance(value, str):
                stack.append([pointer, "s", 0])
                out.append(orjson.dumps(value).decode()[:-1])
            else:
                out.append(orjson.dumps(value).decode())
        else:
            raise ValueError(op)


class UIMessageEncoder:
    """One reader's view of a run's events as UI message chunks: :meth:`start`, then
    :meth:`encode` for each event of the run's log in order (:meth:`lagged` where the log
    forgot some), then :meth:`close`. Deterministic: the same events give the same bytes
    (a replay builds the same message). It sends only what keeps the client's state valid:
    a delta or a result for a part it never opened is left out."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self._round = 1
        self._in_step = False
        self._text: str | None = None  # the open text part's id
        self._texts = 0
        self._names: dict[str, str] = {}  # opened call id -> tool name
        self._args: dict[str, _ArgsText] = {}
        self._decided: set[str] = set()  # committed or failed
        self._shown: dict[str, Any] = {}  # committed call id -> the input it showed
        self._failed: set[str] = set()
        self._ended: str | None = None  # the last round's ``ended``
        self._finished = False
        self.unfinished: set[str] = set()
        """Committed calls without their result yet (:mod:`._ui_answers` pauses on them)."""

    def start(self) -> bytes:
        """The ``start`` chunk."""
        return _chunk({"type": "start", "messageId": self.message_id})

    def lagged(self, missed: int) -> bytes:
        """``missed`` events were forgotten before the next one (the log's byte bound)."""
        text = f"lagged: {missed} events of this run were forgotten; the message is incomplete"
        return _chunk({"type": "error", "errorText": text})

    def encode(self, data: dict[str, Any]) -> bytes:
        """The chunks (SSE-framed, joined) for one relay event (``data``: its JSON)."""
        kind = data.get("type")
        out: list[bytes] = []
        if kind == "text":
            self._step(out)
            if self._text is None:
                self._texts += 1
                self._text = f"text-{self._round}-{self._texts}"
                out.append(_chunk({"type": "text-start", "id": self._text}))
            out.append(_chunk({"type": "text-delta", "id": self._text, "delta": data["text"]}))
        elif kind == "call_preview":
            call_id = data.get("id")
            if call_id in self._names and call_id not in self._decided:
                args = self._args.setdefault(call_id, _ArgsText())
                text = args.feed(data.get("deltas") or ())
                if text:
                    delta = {"type": "tool-input-delta", "toolCallId": call_id}
                    out.append(_chunk({**delta, "inputTextDelta": text}))
        elif kind == "call_opened":
            if isinstance(data.get("id"), str) and isinstance(data.get("name"), str):
                self._open(data["id"], data["name"], out)
        elif kind == "call_committed":
            call_id, name = data["id"], data["name"]
            self._open(call_id, name, out)
            self._decided.add(call_id)
            chunk = {"type": "tool-input-available", "toolCallId": call_id, "toolName": name}
            out.append(_chunk({**chunk, "input": data["arguments"]}))
            self._shown[call_id] = data["arguments"]
            self.unfinished.add(call_id)
        elif kind == "approval_requested" and isinstance(data.get("token"), str):
            # the person approves the whole committed input: where the preview policy showed
            # less (call_committed's arguments), the part's input is given again, in full
            full = data.get("arguments")
            if data["id"] in self._shown and self._shown[data["id"]] != full:
                chunk = {"type": "tool-input-available", "toolCallId": data["id"]}
                chunk |= {"toolName": data["name"], "input": full}
                out.append(_chunk(chunk))
            # ai's tool-approval-request: the approval id is the relay's signed token, which
            # addToolApprovalResponse sends back (checked against the waiting call)
            chunk = {"type": "tool-approval-request", "toolCallId": data["id"]}
            out.append(_chunk({**chunk, "approvalId": data["token"]}))
        elif kind == "call_failed":
            self._failed_call(data, out)
        elif kind == "tool_finished":
            self.unfinished.discard(data["id"])
            self._result(data, out)
        elif kind == "reasoning":
            self._reasoning(data["text"], out)
        elif kind == "round_ended":
            self._round_ended(data, out)
        elif kind == "run_ended":
            out.append(self._finish(data))
        return b"".join(out)

    def close(self) -> bytes:
        """The end of the stream: ``finish`` if the run's end was never seen, ``[DONE]``."""
        if self._finished:
            return DONE
        return self._finish({"error": "the run ended without its end event"}) + DONE

    # -- the pieces ------------------------------------------------------------------------

    def _step(self, out: list[bytes]) -> None:
        if not self._in_step:
            self._in_step = True
            out.append(_chunk({"type": "start-step"}))

    def _end_text(self, out: list[bytes]) -> None:
        if self._text is not None:
            out.append(_chunk({"type": "text-end", "id": self._text}))
            self._text = None

    def _reasoning(self, text: str, out: list[bytes]) -> None:
        self._step(out)
        self._end_text(out)
        self._texts += 1
        part = f"reasoning-{self._round}-{self._texts}"
        out.append(_chunk({"type": "reasoning-start", "id": part}))
        out.append(_chunk({"type": "reasoning-delta", "id": part, "delta": text}))
        out.append(_chunk({"type": "reasoning-end", "id": part}))

    def _round_ended(self, data: dict[str, Any], out: list[bytes]) -> None:
        self._step(out)
        self._end_text(out)
        out.append(_chunk({"type": "finish-step"}))
        self._in_step = False
        self._round += 1
        self._texts = 0
        self._ended = data.get("ended")
        # every call of the round has its result now: a later round may reuse an id
        # (servers that number ids per response), which is then a new part
        self._names.clear()
        self._args.clear()
        self._decided.clear()
        self._shown.clear()
        self._failed.clear()

    def _open(self, call_id: str, name: str, out: list[bytes]) -> None:
        if call_id in self._names:
            return
        self._step(out)
        self._end_text(out)  # (text after the call is a new part, after it)
        self._names[call_id] = name
        out.append(_chunk({"type": "tool-input-start", "toolCallId": call_id, "toolName": name}))

    def _failed_call(self, data: dict[str, Any], out: list[bytes]) -> None:
        call_id = data["id"]
        name = data.get("name") or self._names.get(call_id) or "unknown"
        self._open(call_id, name, out)
        self._decided.add(call_id)
        self._failed.add(call_id)
        error_text = f"{data['error']}: {data['detail']}" if data.get("detail") else data["error"]
        chunk = {"type": "tool-input-error", "toolCallId": call_id, "toolName": name}
        out.append(_chunk({**chunk, "input": None, "errorText": error_text}))

    def _result(self, data: dict[str, Any], out: list[bytes]) -> None:
        call_id = data["id"]
        if call_id not in self._names or call_id in self._failed:
            return  # (a failed call's error result: the client shows its input error already)
        result = data.get("result")
        if data.get("error") == "approval_denied":  # (the part shows output-denied)
            out.append(_chunk({"type": "tool-output-denied", "toolCallId": call_id}))
            return
        if data.get("is_error"):
            code = data.get("error") or "tool_error"
            text = f"{code}: {result}" if result else code
            out.append(
                _chunk({"type": "tool-output-error", "toolCallId": call_id, "errorText": text})
            )
            return
        output: Any = result
        if isinstance(result, str) and "result_chars" not in data:
            try:
                output = orjson.loads(result)
            except orjson.JSONDecodeError:
                output = result
        out.append(
            _chunk({"type": "tool-output-available", "toolCallId": call_id, "output": output})
        )

    def _finish(self, data: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        if self._in_step:  # (a run's end always follows its round's end; kept valid anyway)
            self._end_text(out)
            out.append(_chunk({"type": "finish-step"}))
            self._in_step = False
        error = data.get("error")
        if data.get("cancelled"):
            out.append(_chunk({"type": "abort", "reason": error or "cancelled"}))
            reason = "other"
        elif error:
            out.append(_chunk({"type": "error", "errorText": str(error)}))
            reason = "error"
        else:
            reason = _FINISH_REASONS.get(self._ended or "", "other")
        self._finished = True
        out.append(_chunk({"type": "finish", "finishReason": reason}))
        return b"".join(out)


def event_data(frame: bytes) -> dict[str, Any]:
    """The JSON of one of the relay's SSE frames (``id:``, ``event:``, ``data:`` lines)."""
    data: dict[str, Any] = orjson.loads(frame[frame.index(_DATA) + len(_DATA) : -2])
    return data


async def ui_message_stream(
    run: RunSource,
    limits: RelayLimits,
    *,
    start: int = 0,
    pause: Callable[[set[str], int], Awaitable[bool]] | None = None,
) -> AsyncIterator[bytes]:
    """The run's UI message stream, from its first event (live until it ends; an ``error``
    chunk and the end, without ``finish``, when the shared store is lost), or from event
    ``start`` on (the encoder primed with the ones before); ``pause(unfinished, cursor)``
    (``unfinished``: the committed calls without a result) True ends the stream early (a run
    waiting on its client: :mod:`._ui_answers`)."""
    encoder = UIMessageEncoder(f"msg-{run.id}")
    yield encoder.start()
    cursor = 0
    batch, heartbeat_s = limits.sse_batch, limits.heartbeat_s
    while True:
        try:
            if cursor < start:  # (the events a previous stream sent: the encoder's state)
                cursor = await _primed(encoder, run, start, batch)
            if (
                pause is not None
                and cursor == run.last_id
                and not run.ended
                and await pause(encoder.unfinished, cursor)
            ):
                yield _chunk({"type": "finish", "finishReason": "tool-calls"}) + DONE
                return
            missed, frames, cursor, ended = await run.read(cursor, batch, heartbeat_s)
        except StoreUnavailable as exc:  # (resume the stream later, or on another worker)
            yield _chunk({"type": "error", "errorText": str(exc)})
            return
        if missed or frames:
            out = [encoder.lagged(missed)] if missed else []
            out += [encoder.encode(event_data(f)) for f in frames]
            yield b"".join(out)
        elif not ended:
            yield b": heartbeat\n\n"
        if ended:
            yield encoder.close()
            return


async def _primed(encoder: UIMessageEncoder, run: RunSource, start: int, batch: int) -> int:
    """Feed ``encoder`` the run's events up to ``start`` (sent by an earlier stream) without
    output; the cursor reached."""
    cursor = 0
    while cursor < start:
        _missed, frames, cursor, _ended = await run.read(cursor, min(batch, start - cursor), 0)
        if not frames:
            break
        for frame in frames:
            encoder.encode(event_data(frame))
    return cursor


# -- the endpoints -----------------------------------------------------------------------------


class ChatHost(Protocol):
    """What the endpoints need of the relay (:class:`toollatch.relay.Relay`)."""

    limits: RelayLimits
    runs: RunRegistry
    chats: ChatStore
    providers: tuple[str, ...]
    models: tuple[str, ...]
    model: str
    approval_secret: bytes
    store: RunStore

    def open_reader(self, session: str) -> Callable[[], None]: ...

    async def find_run(self, run_id: str | None, session: str | None) -> RunSource | None: ...

    async def cancel_run(self, run: RunSource, reason: str | None = None) -> bool: ...

    async def answer_cancel(
        self,
        request: Request,
        find: Callable[[], Awaitable[RunSource | None]],
        missing: str = "no such run",
    ) -> Response: ...

    def check_message(self, message: str) -> None: ...

    def choice(self, data: Mapping[str, Any]) -> tuple[str | None, str]: ...

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
    ) -> RelayRun: ...


def routes(host: ChatHost) -> list[Route]:
    """The UI message stream's endpoints over ``host`` (see the module docstring)."""

    async def chat(request: Request) -> Response:
        return await _chat(host, request)

    async def resume(request: Request) -> Response:
        return await _resume(host, request)

    async def cancel(request: Request) -> Response:
        return await _cancel(host, request)

    return [
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/chat/{chat_id}/stream", resume, methods=["GET"]),
        Route("/api/chat/{chat_id}/cancel", cancel, methods=["POST"]),
    ]


def _error(exc: HTTPError) -> Response:
    response = exc.response()
    if exc.status == 429:
        response.headers["retry-after"] = "1"
    return response


@dataclass(frozen=True, slots=True)
class _ChatRequest:
    """A ``DefaultChatTransport`` body, checked: the user's ``message`` (None to regenerate
    the last answer, ``message_id`` naming it or None)."""

    chat_id: str
    message: str | None
    provider: str | None
    model: str
    regenerate: bool = False
    message_id: str | None = None


def _parse_chat(host: ChatHost, body: bytes) -> _ChatRequest:
    """The request of a ``DefaultChatTransport`` body (:class:`HTTPError` for a bad one)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HTTPError(400, "invalid_json", f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPError(422, "invalid_body", "the body must be a JSON object")
    chat_id = data.get("id")
    if not isinstance(chat_id, str) or not CHAT_ID.fullmatch(chat_id):
        raise HTTPError(422, "invalid_body", "id must be a chat id (1-128 of A-Za-z0-9_-)")
    trigger = data.get("trigger", "submit-message")
    if trigger == "regenerate-message":
        message_id = data.get("messageId")
        if message_id is not None and not (isinstance(message_id, str) and len(message_id) <= 200):
            raise HTTPError(422, "invalid_body", "messageId must be a string")
        provider, model = host.choice(data)
        return _ChatRequest(chat_id, None, provider, model, True, message_id)
    if trigger != "submit-message":
        raise HTTPError(422, "invalid_body", "trigger must be submit-message or regenerate-message")
    messages = data.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        raise HTTPError(422, "invalid_body", "messages must end with the user's message")
    parts = last.get("parts")
    if not isinstance(parts, list):
        raise HTTPError(422, "invalid_body", "the user's message needs its parts")
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    if not all(isinstance(t, str) for t in texts):
        raise HTTPError(422, "invalid_body", "a text part's text must be a string")
    message = "\n".join(t for t in texts if isinstance(t, str))
    if not message.strip():
        raise HTTPError(422, "invalid_body", "the user's message has no text")
    host.check_message(message)
    provider, model = host.choice(data)
    return _ChatRequest(chat_id, message, provider, model)


async def _chat(host: ChatHost, request: Request) -> Response:
    release: Callable[[], None] | None = None
    try:
        require_json(request)
        body = await read_body(request, host.limits, host.limits.max_chat_body_bytes)
        session = session_of(request)
        new_session = session is None
        start = 0
        found = _ui_answers.last_assistant(body)
        pause = None
        if found is not None:  # the answers to the calls the chat's run waits on
            run, start = await _ui_answers.answer_chat(host, session, found)
            assert session is not None  # (answer_chat found the session's run)
            if isinstance(run, RelayRun) and run.log.start:
                # taken over from a dead worker: its first events are in the shared log only
                pause = _ui_answers.pauser(run)
                run = await host.find_run(run.id, session) or run
            release = host.open_reader(session)
        else:
            asked = _parse_chat(host, body)
            session = session or secrets.token_urlsafe(32)
            release = host.open_reader(session)
            run = await host.start_chat_run(
                session,
                new_session,
                asked.chat_id,
                asked.message,
                provider=asked.provider,
                model=asked.model,
                regenerate=asked.regenerate,
                message_id=asked.message_id,
            )
    except HTTPError as exc:
        if release is not None:
            release()
        return _error(exc)
    headers = {**UI_MESSAGE_STREAM_HEADERS, "x-toollatch-run-id": run.id}
    if isinstance(run, RelayRun):
        pause = _ui_answers.pauser(run)
    stream = ui_message_stream(run, host.limits, start=start, pause=pause)
    response = CountedStream(stream, release, headers=headers)
    if new_session:
        set_cookie(response, session)
    return response


async def _chat_run(host: ChatHost, request: Request) -> RunSource | None:
    """The chat's latest run (of any worker, with a shared store), if this session's chat
    has one; 503 :class:`HTTPError` when the store is unreachable."""
    session, chat_id = session_of(request), request.path_params["chat_id"]
    if session is None or not CHAT_ID.fullmatch(chat_id):
        return None
    return await host.find_run(await host.chats.latest_run(session, chat_id), session)


async def _resume(host: ChatHost, request: Request) -> Response:
    try:
        run = await _chat_run(host, request)
        if run is None or run.ended:
            return Response(status_code=204)  # nothing to resume (useChat then does nothing)
        release = host.open_reader(run.session)
    except HTTPError as exc:
        return _error(exc)
    headers = {**UI_MESSAGE_STREAM_HEADERS, "x-toollatch-run-id": run.id}
    # (a run of this worker waiting on the client ends the stream, as the POST's does: the
    # page that resumed it can then answer; another worker's run streams on, unpaused: which
    # calls it waits on is known to its owner only)
    pause = _ui_answers.pauser(run) if isinstance(run, RelayRun) else None
    stream = ui_message_stream(run, host.limits, pause=pause)
    return CountedStream(stream, release, headers=headers)


async def _cancel(host: ChatHost, request: Request) -> Response:
    return await host.answer_cancel(request, lambda: _chat_run(host, request), "no such chat run")
