"""AG-UI from the relay: ``POST /agui`` (internal; needs the ``[server]`` extra's
``ag-ui-protocol``, else 404).

The request is AG-UI's ``RunAgentInput``; the answer is the AG-UI event stream as SSE,
each event the bytes the package's ``EventEncoder`` writes for its validated model (``data:
<json>``; the encoder writes each kind once, see :class:`Shape`). A run is an ordinary
relay run (the same admission, quotas, Agent, previews policy, metrics and guard as ``POST
/runs``); :class:`AguiView` is a view over its event log, so every reader of the same run
gets the same events, and the run goes on when the reader leaves (as ``GET
/runs/{id}/events``; stop it with ``POST /runs/{id}/cancel``, the id being the response's
``X-Toollatch-Run`` header).

What a frontend sees, from the relay's events (one producer, this encoder):

* ``RUN_STARTED`` first; per model round a step (``STEP_STARTED``/``STEP_FINISHED``,
  ``stepName`` ``"round N"``); the round's text as one assistant message
  (``TEXT_MESSAGE_START/CONTENT/END``, id ``<run>-rN``).
* A call only **when the gate commits it**: ``TOOL_CALL_START``, ``TOOL_CALL_ARGS`` (the
  committed arguments as JSON text, filtered by the relay's preview policy as
  ``call_committed`` is) and ``TOOL_CALL_END`` together, ``parentMessageId`` the round's
  message. Clients run frontend tools on ``TOOL_CALL_END`` and ``verifyEvents`` rejects a
  started call that never ends, so a call that did not commit (``max_tokens``, bad JSON,
  schema...) is never started: it is a ``CUSTOM`` event ``toollatch.call_failed`` with
  ``{"id", "name", "error", "detail"}`` (``error``: the stable code, e.g. ``truncated``).
* Live argument previews: ``CUSTOM`` ``toollatch.preview`` with the relay's ``call_preview``
  fields (already redacted; display only).
* A committed call's result: ``TOOL_CALL_RESULT`` (``content``: the relay's redacted result
  preview, an error result's message).
* The end: ``RUN_FINISHED`` (``outcome`` ``{"type": "cancelled"}`` when the run was
  cancelled), or ``RUN_ERROR`` (``code`` ``run_failed``) when the model could not be reached
  or the run stopped for a reason (its message). A reader that fell behind the kept log gets
  the open message and step closed and a ``CUSTOM`` ``toollatch.lagged`` ``{"first_id",
  "missed"}``. (The relay's events have no reasoning, so no ``REASONING_*`` is sent.)

Reconnect. ``HttpAgent`` has none (its ``connect()`` is not implemented in 1.0.0), so this is
the relay's own: every SSE frame that ends the events of relay event ``N`` carries ``id:
N`` (SSE's field; AG-UI's parser reads only ``data:``). POSTing the same ``threadId`` and
``runId`` again from the same session reads that run again instead of starting another
(a retried POST never runs the tools twice), from ``Last-Event-ID`` when given: the stream
starts with ``RUN_STARTED`` again and re-opens the step and message that were open, so it
passes ``verifyEvents`` on its own.

Threads. Only the input's last message is used, and it must be the user's: the model gets
the relay's own history of the thread (keyed by session and ``threadId``: another session's
thread is another thread) plus that message; assistant and tool messages a client sends are
never passed on. The history lives behind :attr:`AguiEndpoint.threads` (:class:`ThreadStore`,
in memory by default). ``forwardedProps.provider`` / ``.model`` pick them as ``POST /runs``'s
fields do; a thread keeps its provider (history formats differ). The input's ``tools`` are
frontend tools (client tools of the run), and while the thread's run waits on the client its
stream ends with ``RUN_FINISHED`` (an interrupt outcome for calls a person must approve); the
next input's ``resume`` entries and ``tool`` messages answer those calls only
(:mod:`._agui_answers`). ``context`` and ``state`` are not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from pydantic import ValidationError
from pydantic_core import to_json

from ...core._round import Round
from ...runtime._agent_events import AgentEvent, RunEndedEvent
from .. import _answers
from .._config import RelayLimits
from .._requests import HTTPError
from .._runs import RelayRun, RunRegistry, RunSource, session_key_of
from ..store._base import RunStore, StoreUnavailable
from . import _agui_answers

try:
    from ag_ui.core import (
        BaseEvent,
        CustomEvent,
        Interrupt,
        RunAgentInput,
        RunErrorEvent,
        RunFinishedCancelledOutcome,
        RunFinishedEvent,
        RunFinishedInterruptOutcome,
        RunStartedEvent,
        StepFinishedEvent,
        StepStartedEvent,
        TextMessageContentEvent,
        TextMessageEndEvent,
        TextMessageStartEvent,
        TextPart,
        ToolCallArgsEvent,
        ToolCallEndEvent,
        ToolCallResultEvent,
        ToolCallStartEvent,
        UserMessage,
    )
    from ag_ui.encoder import EventEncoder

    AVAILABLE = True
    ENCODER = EventEncoder()
except ImportError:  # pragma: no cover (the [server] extra is not installed)
    AVAILABLE = False

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

PREVIEW = "toollatch.preview"
CALL_FAILED = "toollatch.call_failed"
LAGGED = "toollatch.lagged"
RUN_HEADER = "x-toollatch-run"
"""The response header naming the relay run (for ``POST /runs/{id}/cancel``)."""
MAX_ID_CHARS = 200
"""Longest ``threadId`` / ``runId`` accepted."""


class Refusal(Exception):
    """A 4xx answer (the app renders it as every error: ``{"error": {"code", "message"}}``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


# -- the encoder: relay events -> AG-UI events ----------------------------------------------


class Shape:
    """One kind of AG-UI event the view sends: a package event class, the fields that vary
    (``variables``) and those that do not (``constants``).

    :meth:`model` is the package's validated event; :meth:`frame` its SSE frame, byte for byte
    what the package's ``EventEncoder`` writes for that model, without building it. The
    encoder's cost is the package's serializer (a Python wrap serializer on every model that
    drops unset optional fields, then a second JSON pass: about 5 µs an event, 6x the
    validation). So the encoder writes each shape once, the first time it is used, with a
    unique marker in each variable field, and the frame is cut at the markers' JSON; an event
    is then those pieces with each value written by ``pydantic_core.to_json``, the serializer
    pydantic applies to a ``str`` or ``Any`` field. Exact for a ``str`` in a string field
    (anything else, ``None`` included, takes the validated path) and for JSON data in an
    ``Any`` one (what the view puts there comes from the relay's log: dicts, lists, strings,
    numbers, booleans, null). tests/test_agui.py checks every event of real runs on the four
    wires, every code point and hard JSON values against the encoder."""

    def __init__(self, cls: type[BaseEvent], *variables: str, **constants: Any) -> None:
        """``variables`` in the order the class declares them (its JSON's order)."""
        self.cls, self.variables, self.constants = cls, variables, constants
        self._strings = tuple(
            cls.model_fields[name].annotation in (str, str | None) for name in variables
        )
        self._pieces: tuple[bytes, ...] = ()

    def model(self, values: Sequence[Any]) -> BaseEvent:
        """The package's event (validated)."""
        return self.cls(**self.constants, **dict(zip(self.variables, values, strict=True)))

    def encoded(self, values: Sequence[Any]) -> bytes:
        """The package encoder's frame of :meth:`model` (the reference)."""
        return ENCODER.encode(self.model(values)).encode()

    def frame(self, values: Sequence[Any]) -> bytes:
        """The same bytes as :meth:`encoded`."""
        if not self._pieces:
            self._cut()
        for value, string in zip(values, self._strings, strict=True):
            if string and type(value) is not str:
                return self.encoded(values)
        pieces = self._pieces
        out = [pieces[0]]
        for value, piece in zip(values, pieces[1:], strict=True):
            out += (to_json(value), piece)
        return b"".join(out)

    def _cut(self) -> None:
        markers = [f"\x00toollatch {n}\x00" for n in range(len(self.variables))]
        whole = self.encoded(markers)
        pieces, at = [], 0
        for marker in markers:
            written = to_json(marker)
            where = whole.find(written, at)
            if where < 0 or written in whole[where + 1 :]:  # pragma: no cover (a changed package)
                raise RuntimeError(f"{self.variables} are not once each, in order, in {whole!r}")
            pieces.append(whole[at:where])
            at = where + len(written)
        pieces.append(whole[at:])
        self._pieces = tuple(pieces)


Event = tuple[Shape, tuple[Any, ...]]
"""An AG-UI event of the view: its shape and the values of its variable fields."""


def log_frames(chunk: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(id, data)`` of each SSE frame of the relay's log in ``chunk`` (whole frames:
    ``id: N\\nevent: T\\ndata: JSON\\n\\n``; the JSON has no raw newline)."""
    for frame in chunk.split(b"\n\n"):
        if frame.startswith(b"id: "):
            head, _, body = frame.partition(b"\ndata: ")
            yield int(head[4 : head.index(b"\n")]), orjson.loads(body)


if AVAILABLE:
    RUN_STARTED = Shape(RunStartedEvent, "thread_id", "run_id")
    RUN_FINISHED = Shape(RunFinishedEvent, "thread_id", "run_id")
    RUN_CANCELLED = Shape(
        RunFinishedEvent, "thread_id", "run_id", outcome=RunFinishedCancelledOutcome()
    )
    RUN_ERROR = Shape(RunErrorEvent, "message", code="run_failed")
    STEP_STARTED = Shape(StepStartedEvent, "step_name")
    STEP_FINISHED = Shape(StepFinishedEvent, "step_name")
    TEXT_START = Shape(TextMessageStartEvent, "message_id", role="assistant")
    TEXT_CONTENT = Shape(TextMessageContentEvent, "message_id", "delta")
    TEXT_END = Shape(TextMessageEndEvent, "message_id")
    CALL_START = Shape(ToolCallStartEvent, "tool_call_id", "tool_call_name", "parent_message_id")
    CALL_ARGS = Shape(ToolCallArgsEvent, "tool_call_id", "delta")
    CALL_END = Shape(ToolCallEndEvent, "tool_call_id")
    CALL_RESULT = Shape(ToolCallResultEvent, "message_id", "tool_call_id", "content", role="tool")
    CUSTOM = Shape(CustomEvent, "name", "value")


class AguiView:
    """One reader's AG-UI encoding of a relay run's events (the state of what it has open).

    ``thread_id``, ``run_id``: the client's (echoed in ``RUN_STARTED`` / ``RUN_FINISHED``);
    ``prefix``: the relay run's id, which makes the message ids unique."""

    def __init__(self, thread_id: str, run_id: str, prefix: str) -> None:
        self.thread_id, self.run_id, self.prefix = thread_id, run_id, prefix
        self.rounds = 0
        """Rounds ended (the next step is ``round {rounds + 1}``)."""
        self.step: str | None = None
        self.text: str | None = None
        """The open text message's id."""
        self.committed: set[str] = set()
        """Calls started (committed) in this view: the only ones whose results are sent."""
        self.cancelled = False
        self.finished = False
        self.results: set[str] = set()
        """Calls whose result this view has seen."""
        self.client_calls: set[str] = set()
        """Client tools' calls: their result is the client's own (never sent back to it)."""

    # the view over the log

    def __call__(self, chunk: bytes) -> bytes:
        """The AG-UI SSE bytes of a chunk of the relay's log."""
        out: list[bytes] = []
        for event_id, data in log_frames(chunk):
            events = self.events(data)
            if events:
                out += [shape.frame(values) for shape, values in events[:-1]]
                shape, values = events[-1]
                out += (b"id: %d\n" % event_id, shape.frame(values))
        return b"".join(out)

    def opening(self) -> bytes:
        """``RUN_STARTED``, and the step and message open at this point (a resumed read)."""
        events: list[Event] = [(RUN_STARTED, (self.thread_id, self.run_id))]
        if self.step is not None:
            events.append((STEP_STARTED, (self.step,)))
        if self.text is not None:
            events.append((TEXT_START, (self.text,)))
        return b"".join(shape.frame(values) for shape, values in events)

    def replay(self, missed: int, frames: Sequence[bytes], upto: int) -> None:
        """Take the state of a reader that has read the events up to id ``upto`` (sending
        nothing), from the run's log read from its start: ``missed`` events forgotten
        (they count as a lag), then the kept ``frames`` (those past ``upto`` are left)."""
        if missed:
            self.events({"type": "lagged", "first_id": missed + 1, "missed": 0})
        for event_id, data in log_frames(b"".join(frames)):
            if event_id > upto:
                break
            self.events(data)

    # one relay event

    def events(self, data: Mapping[str, Any]) -> list[Event]:
        """The AG-UI events for one relay event (none for those AG-UI has no place for:
        ``call_opened``, ``tool_started``, and anything after the run's end)."""
        kind = data["type"]
        if self.finished:
            return []
        if kind == "text":
            if not data["text"]:
                return []
            out = self._open_step()
            if self.text is None:
                self.text = self._message_id()
                out.append((TEXT_START, (self.text,)))
            out.append((TEXT_CONTENT, (self.text, data["text"])))
            return out
        if kind == "call_preview":
            value = {k: v for k, v in data.items() if k != "type"}
            return [*self._open_step(), (CUSTOM, (PREVIEW, value))]
        if kind == "call_committed":
            call_id = data["id"]
            self.committed.add(call_id)
            arguments = _json_text(data["arguments"])
            return [
                *self._open_step(),
                (CALL_START, (call_id, data["name"], self._message_id())),
                (CALL_ARGS, (call_id, arguments)),
                (CALL_END, (call_id,)),
            ]
        if kind == "call_failed":
            value = {k: data.get(k) for k in ("id", "name", "error", "detail")}
            return [*self._open_step(), (CUSTOM, (CALL_FAILED, value))]
        if kind == "client_call":
            self.client_calls.add(data["id"])
            return []
        if kind == "tool_finished":
            call_id = data["id"]
            self.results.add(call_id)
            if call_id not in self.committed or call_id in self.client_calls:
                return []
            result = (f"{self.prefix}-result-{call_id}", call_id, data.get("result") or "")
            return [*self._open_step(), (CALL_RESULT, result)]
        if kind == "round_ended":
            out = [*self._open_step(), *self._close()]
            self.rounds = max(self.rounds + 1, int(data["round"]))
            self.cancelled = self.cancelled or data["ended"] == "cancelled"
            return out
        if kind == "run_ended":
            out = self._close()
            self.finished = True
            if data.get("error"):
                out.append((RUN_ERROR, (str(data["error"]),)))
            else:
                shape = RUN_CANCELLED if self.cancelled else RUN_FINISHED
                out.append((shape, (self.thread_id, self.run_id)))
            return out
        if kind == "lagged":
            value = {"first_id": data["first_id"], "missed": data["missed"]}
            return [*self._close(), (CUSTOM, (LAGGED, value))]
        return []  # call_opened, tool_started (AG-UI holds a call until it commits)

    def unfinished(self) -> set[str]:
        """Calls started in this view that have no result yet."""
        return self.committed - self.results

    def paused(self, interrupts: list[dict[str, Any]]) -> bytes:
        """The end of a stream whose run waits on the client: the open message and step
        closed, ``RUN_FINISHED`` (with an interrupt outcome when a person must answer)."""
        closed = b"".join(shape.frame(values) for shape, values in self._close())
        if not interrupts:
            return closed + RUN_FINISHED.frame((self.thread_id, self.run_id))
        outcome = RunFinishedInterruptOutcome(
            interrupts=[Interrupt.model_validate(i) for i in interrupts]
        )
        finished = RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome)
        return closed + ENCODER.encode(finished).encode()  # (rare: the validated path)

    def _message_id(self) -> str:
        return f"{self.prefix}-r{self.rounds + 1}"

    def _open_step(self) -> list[Event]:
        if self.step is not None:
            return []
        self.step = f"round {self.rounds + 1}"
        return [(STEP_STARTED, (self.step,))]

    def _close(self) -> list[Event]:
        """End the open message and step."""
        out: list[Event] = []
        if self.text is not None:
            out.append((TEXT_END, (self.text,)))
            self.text = None
        if self.step is not None:
            out.append((STEP_FINISHED, (self.step,)))
            self.step = None
        return out


def _json_text(value: Any) -> str:
    """``value`` as JSON text (an integer beyond 64 bits through the stdlib, as the log)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        import json  # noqa: PLC0415 (rare)

        return json.dumps(value, ensure_ascii=False, default=repr)


# -- threads: the seam for the chat store ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Thread:
    """A thread's history as the server keeps it: the provider's format, valid to send."""

    provider: str
    history: tuple[Mapping[str, Any], ...]


class ThreadStore(Protocol):
    """Where the threads' histories live, keyed by (session, threadId)."""

    async def load(self, session: str, thread_id: str) -> Thread | None:
        """The thread's history, None for a new thread."""

    async def save(self, session: str, thread_id: str, thread: Thread) -> None:
        """Keep the thread's history (after each run)."""


class MemoryThreads:
    """:class:`ThreadStore` in memory: the newest ``keep`` threads (lost on restart)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._threads: OrderedDict[tuple[str, str], Thread] = OrderedDict()

    async def load(self, session: str, thread_id: str) -> Thread | None:
        """The thread's history (it becomes the newest)."""
        thread = self._threads.get((session, thread_id))
        if thread is not None:
            self._threads.move_to_end((session, thread_id))
        return thread

    async def save(self, session: str, thread_id: str, thread: Thread) -> None:
        """Keep it, forgetting the oldest thread past ``keep``."""
        self._threads[(session, thread_id)] = thread
        self._threads.move_to_end((session, thread_id))
        while len(self._threads) > self._keep:
            self._threads.popitem(last=False)


class StoredThreads:
    """:class:`ThreadStore` over a history store (the relay's chats' one: the ledger's when
    it has one, so a restart keeps the threads): a thread's messages under the scope
    ``agui-<session digest>-<threadId>``, its provider beside them (``/meta``), only the new
    messages appended after each run. ``max_messages`` bounds a thread (409
    ``thread_too_long`` for a message past it)."""

    def __init__(self, history: Any, *, max_messages: int) -> None:
        self.history = history
        self.max_messages = max_messages

    @staticmethod
    def scope(session: str, thread_id: str) -> str:
        """The history store key of a session's thread (the session only as a digest)."""
        return StoredThreads.scope_of(hashlib.sha256(session.encode()).hexdigest(), thread_id)

    @staticmethod
    def scope_of(digest: str, thread_id: str) -> str:
        """:meth:`scope` from the session's SHA-256 (hex; what a shared run store keeps)."""
        return f"agui-{digest[:24]}-{thread_id}"

    async def load(self, session: str, thread_id: str) -> Thread | None:
        """The thread's stored history, None for a new thread."""
        scope = self.scope(session, thread_id)
        meta = await self.history.load(f"{scope}/meta")
        provider = meta[0].get("provider") if meta else None
        if not isinstance(provider, str):
            return None
        messages = await self.history.load(scope)
        if len(messages) >= self.max_messages:
            raise Refusal(
                409,
                "thread_too_long",
                f"this thread has {len(messages)} messages (at most {self.max_messages}); "
                "start a new thread",
            )
        return Thread(provider=provider, history=tuple(messages))

    async def save(self, session: str, thread_id: str, thread: Thread) -> None:
        """Append what the run added to the stored history."""
        await self.save_under(self.scope(session, thread_id), thread)

    async def save_under(self, scope: str, thread: Thread) -> None:
        """:meth:`save` to the thread whose key is ``scope`` (:meth:`scope_of`)."""
        if not await self.history.load(f"{scope}/meta"):
            await self.history.append(f"{scope}/meta", [{"provider": thread.provider}], at=0)
        stored = await self.history.load(scope)
        new = [dict(m) for m in thread.history[len(stored) :]]
        if new:
            await self.history.append(scope, new, at=len(stored))


class _Keeper:
    """The run's observer that hands its final history to the thread store (before the
    run's log gets ``run_ended``, so a client that read ``RUN_FINISHED`` finds it kept),
    unless ``saves`` is false (a durable run writes its thread itself: :mod:`.._durable`)."""

    def __init__(
        self,
        endpoint: AguiEndpoint,
        key: tuple[str, str],
        provider: str,
        run: RelayRun,
        *,
        saves: bool = True,
    ) -> None:
        self._endpoint, self._key, self._provider = endpoint, key, provider
        """``key``: (session, threadId); a resumed run's session is "" until a request of
        its session adopts it (:meth:`AguiEndpoint.adopted`)."""
        self.run = run
        self.ended = False
        self.saves = saves

    @property
    def busy(self) -> bool:
        """The run is still going (a driver that failed outside the Agent is done too)."""
        return not (self.ended or self.run.done)

    def on_round_start(self, provider: str, round_no: int) -> None:
        """(Nothing.)"""

    def on_notice(self, provider: str, notice: object) -> None:
        """(Nothing.)"""

    def on_round(self, provider: str, round_: Round) -> None:
        """(Nothing.)"""

    def on_not_committed(self, provider: str, detail: str) -> None:
        """(Nothing.)"""

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """On ``run_ended``: save the history (a task; the thread's next run awaits it)."""
        if isinstance(event, RunEndedEvent):
            self.ended = True
            endpoint, key = self._endpoint, self._key
            if endpoint.live.get(key) is self:
                del endpoint.live[key]
            if not key[0]:  # (resumed, and no request of its session came: nothing to file)
                endpoint.resumed.pop((self.run.session_key, key[1]), None)
                return
            if not self.saves:
                return
            thread = Thread(self._provider, tuple(dict(m) for m in event.history))
            saving = asyncio.ensure_future(endpoint.threads.save(*key, thread))
            endpoint.saving[key] = saving

            def saved(done: asyncio.Future[None]) -> None:
                if endpoint.saving.get(key) is done:
                    del endpoint.saving[key]  # (its error, if any, is the store's to log)

            saving.add_done_callback(saved)


# -- the endpoint ----------------------------------------------------------------------------


class RelayHost(Protocol):
    """What the endpoint uses of :class:`toollatch.relay.Relay`."""

    limits: RelayLimits
    providers: tuple[str, ...]
    model: str
    models: tuple[str, ...]
    runs: RunRegistry
    approval_secret: bytes
    store: RunStore
    durable: Any
    """Not None: the runs are durable workflows, which write their thread themselves."""

    def session_of(self, request: Request) -> str | None: ...
    def set_session(self, response: Response, token: str) -> None: ...
    async def read_json(self, request: Request) -> Any: ...
    def resume_point(self, request: Request, stored: int) -> int: ...
    async def admit(
        self, session: str, new_session: bool, *, run_id: str | None = None
    ) -> RelayRun: ...
    async def find_run(self, run_id: str | None, session: str | None) -> RunSource | None: ...
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
        client_tools: Sequence[Any] = (),
        kept: Mapping[str, Any] | None = None,
    ) -> None: ...
    def stream(
        self,
        run: RunSource,
        start: int,
        *,
        opening: bytes = b"",
        view: Callable[[bytes], bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        pause: Callable[[int], Awaitable[bytes | None]] | None = None,
    ) -> Response: ...
    def tool_names(self) -> list[str]: ...


class AguiEndpoint:
    """``POST /agui`` over a relay (see the module's doc)."""

    def __init__(self, host: RelayHost) -> None:
        self.host = host
        self.threads: ThreadStore = MemoryThreads(host.limits.max_stored_runs)
        """The threads' histories (the relay gives it :class:`StoredThreads` over its chats'
        history store: the ledger's, so a restart keeps them)."""
        self.saving: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.live: dict[tuple[str, str], _Keeper] = {}
        """The threads with a run in flight (another message on one is 409)."""
        self.resumed: dict[tuple[str, str], _Keeper] = {}
        """The threads' runs a restarted relay resumed, by (session key, threadId), until a
        request of their session adopts them (:meth:`adopted`)."""

    def resume(
        self, run: RelayRun, thread_id: str, provider: str, *, saves: bool = True
    ) -> _Keeper:
        """The observer of a thread's run a restarted relay resumes, or a durable run a
        survivor took over (``saves`` false: it writes its thread itself); give it to the
        run."""
        keeper = _Keeper(self, ("", thread_id), provider, run, saves=saves)
        self.resumed[(run.session_key, thread_id)] = keeper
        return keeper

    def adopted(self, session: str, thread_id: str) -> _Keeper | None:
        """The thread's live run: one of this process, or one resumed after a restart (it
        becomes the session's own)."""
        live = self.live.get((session, thread_id))
        if live is not None:
            return live
        keeper = self.resumed.pop((session_key_of(session), thread_id), None)
        if (
            keeper is None
            or not keeper.busy
            or self.host.runs.owned(keeper.run.id, session) is None
        ):
            return None
        keeper._key = (session, thread_id)
        self.live[(session, thread_id)] = keeper
        return keeper

    async def answer(self, request: Request) -> Response:
        """Start the run (or read it again) and stream its AG-UI events."""
        if not AVAILABLE:
            raise Refusal(404, "not_found", "AG-UI needs the [server] extra (ag-ui-protocol)")
        host = self.host
        data = await host.read_json(request)
        given = _run_input(data)
        session = host.session_of(request)
        new_session = session is None
        session = session or secrets.token_urlsafe(32)
        key = _run_key(session, given.thread_id, given.run_id)
        try:
            known = await host.store.pointed("agui", key)
        except StoreUnavailable as exc:
            raise Refusal(503, "store_unavailable", str(exc)) from None
        run = await host.find_run(known, session)
        if run is not None:
            return await self._read_again(request, run, given)
        provider, model = self._pick(given.forwarded_props)
        thread = (session, given.thread_id)
        live = self.adopted(*thread)
        if live is not None and live.busy and _answers.waiting(live.run):
            # the thread's run waits on this client: the input answers it, the run goes on
            return await self._answered(live.run, given, session, key)
        if live is None and host.store.shared and (given.resume or _tool_messages(given)):
            forwarded = await self._through_owner(session, given, data, key)
            if forwarded is not None:  # (the thread's run waits on another worker)
                return forwarded
        message = self._message(given)
        if live is not None and live.busy:
            raise Refusal(409, "thread_busy", "this thread has a run in flight")
        saving = self.saving.get(thread)
        if saving is not None:  # (the previous run's history, still being stored)
            with contextlib.suppress(Exception):
                await saving
        stored = await self.threads.load(*thread)
        if stored is not None and stored.provider != provider:
            raise Refusal(
                409, "thread_provider", f"this thread runs on {stored.provider}, not {provider}"
            )
        run = await host.admit(session, new_session)
        keeper = _Keeper(self, thread, provider, run, saves=host.durable is None)
        host.start_run(
            run,
            provider,
            model,
            message,
            history=stored.history if stored is not None else (),
            observers=[keeper],
            conversation=_thread_scope(session, given.thread_id),
            client_tools=_agui_answers.client_tools(given.tools or (), host.tool_names()),
            kept={"agui": {"thread": given.thread_id}},
        )
        self.live[thread] = keeper
        with contextlib.suppress(StoreUnavailable):  # (then a re-POST starts another run)
            await host.store.point("agui", key, run.id)  # (the memory store keeps the newest)
            await host.store.point("agui", _run_key(session, given.thread_id, ""), run.id)
        view = AguiView(given.thread_id, given.run_id, run.id)
        response = self._stream(run, 0, view)
        if new_session:
            host.set_session(response, session)
        return response

    async def _answered(
        self, run: RelayRun, given: RunAgentInput, session: str, key: str
    ) -> Response:
        """Answer this worker's ``run`` from the input; the run's events from where its
        last stream ended."""
        host = self.host
        start = await _agui_answers.answer_input(run, host.approval_secret, given)
        with contextlib.suppress(StoreUnavailable):  # (then a re-POST answers again)
            await host.store.point("agui", key, run.id)
        view = AguiView(given.thread_id, given.run_id, run.id)
        source: RunSource = run
        if run.log.start:  # (taken over: its first events are in the shared log only)
            source = await host.find_run(run.id, session) or run
        await self._replayed(source, view, start)
        return self._stream(source, start, view, owner=run)

    async def _through_owner(
        self, session: str, given: RunAgentInput, data: Any, key: str
    ) -> Response | None:
        """Answers to the thread's run of another worker, handed to its owner (it applies
        them as :func:`._agui_answers.answer_input` does here); the run's events from where
        its last stream ended. None when the thread has no live run elsewhere; 409
        ``run_not_running`` while its owner is gone and no survivor has ended or taken it."""
        host = self.host
        try:
            run_id = await host.store.pointed("agui", _run_key(session, given.thread_id, ""))
            run = await host.find_run(run_id, session)
            if run is None or isinstance(run, RelayRun) or run.ended:
                return None
            replied = await host.store.ask(run, {"kind": "agui", "input": data})
        except StoreUnavailable as exc:
            raise Refusal(503, "store_unavailable", str(exc)) from None
        if replied is None:  # (not a new run of the thread: a survivor ends or takes it)
            raise Refusal(409, "run_not_running", "the thread's run has no worker now; retry")
        status, body = replied
        if status != 202:
            error = body.get("error", {})
            raise Refusal(status, str(error.get("code")), str(error.get("message")))
        start = int(body["start"])
        with contextlib.suppress(StoreUnavailable):  # (then a re-POST answers again)
            await host.store.point("agui", key, run.id)
        view = AguiView(given.thread_id, given.run_id, run.id)
        await self._replayed(run, view, start)
        return self._stream(run, start, view)

    async def forwarded(self, run: RelayRun, data: Any) -> tuple[int, dict[str, Any]]:
        """Apply the answers another worker was posted for ``run`` (this worker's): the
        status and body of the reply (202 ``{"start"}``: where the stream continues)."""
        try:
            given = _run_input(data)
            live = self.live.get((run.session, given.thread_id))
            if live is None:  # (a run this worker resumed or took over, its session unknown)
                live = self.resumed.get((run.session_key, given.thread_id))
            if live is None or live.run is not run or not _answers.waiting(run):
                raise Refusal(409, "thread_busy", "this thread's run waits on no answer")
            start = await _agui_answers.answer_input(run, self.host.approval_secret, given)
        except (Refusal, HTTPError) as exc:
            return exc.status, {"error": {"code": exc.code, "message": exc.message}}
        return 202, {"start": start}

    def _stream(
        self, run: RunSource, start: int, view: AguiView, *, owner: RelayRun | None = None
    ) -> Response:
        """``run``'s AG-UI events after ``start``; a run of this worker's (``owner``: the
        one ``run`` reads from the shared log) ends the stream early while it waits on the
        client (:mod:`._agui_answers`)."""
        local = run if isinstance(run, RelayRun) else owner
        pause = (
            _agui_answers.pauser(local, view.unfinished, view.paused) if local is not None else None
        )
        return self.host.stream(
            run, start, opening=view.opening(), view=view, headers={RUN_HEADER: run.id},
            pause=pause,
        )  # fmt: skip

    async def _replayed(self, run: RunSource, view: AguiView, start: int) -> None:
        """``view`` as a reader's that has read ``run``'s events up to ``start``."""
        if start:
            try:
                missed, frames, _cursor, _ended = await run.read(0, start, 0)
            except StoreUnavailable as exc:
                raise Refusal(503, "store_unavailable", str(exc)) from None
            view.replay(missed, frames, start)

    async def _read_again(self, request: Request, run: RunSource, given: RunAgentInput) -> Response:
        """The run's events again (of any worker's run), after ``Last-Event-ID`` (204 when
        none are left)."""
        from starlette.responses import Response  # noqa: PLC0415 (the app's dependency)

        start = self.host.resume_point(request, run.last_id)
        if run.ended and start >= run.last_id:
            return Response(status_code=204)
        view = AguiView(given.thread_id, given.run_id, run.id)
        await self._replayed(run, view, start)
        return self._stream(run, start, view)

    def _pick(self, props: Any) -> tuple[str, str]:
        """``(provider, model)`` from ``forwardedProps`` (defaults: the relay's)."""
        host = self.host
        props = props if isinstance(props, Mapping) else {}
        provider = props.get("provider", host.providers[0])
        if provider not in host.providers:
            raise Refusal(
                422,
                "invalid_body",
                f"forwardedProps.provider must be one of {list(host.providers)}",
            )
        model = props.get("model", host.model)
        if not isinstance(model, str) or model not in host.models:
            shown = ", ".join(host.models[:20])
            raise Refusal(422, "model_not_allowed", f"model must be one of: {shown}")
        return provider, model

    def _message(self, given: RunAgentInput) -> str:
        """The text of the input's last message, which must be the user's."""
        last = given.messages[-1] if given.messages else None
        if not isinstance(last, UserMessage):
            raise Refusal(422, "no_user_message", "the last message must be the user's")
        content = last.content
        if isinstance(content, str):
            text = content
        elif all(isinstance(p, TextPart) for p in content):
            text = "\n".join(p.text for p in content if isinstance(p, TextPart))
        else:
            raise Refusal(422, "unsupported_content", "only text content is supported")
        if not text.strip():
            raise Refusal(422, "invalid_body", "the user's message is empty")
        limit = self.host.limits.max_message_chars
        if len(text) > limit:
            raise Refusal(422, "message_too_long", f"message is over {limit} characters")
        return text


def _run_input(data: Any) -> RunAgentInput:
    """``data`` as a ``RunAgentInput``; 422 with the first problem when it is not one."""
    if not isinstance(data, dict):
        raise Refusal(422, "invalid_body", "the body must be a RunAgentInput object")
    try:
        given = RunAgentInput.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise Refusal(422, "invalid_body", f"RunAgentInput.{where}: {first['msg']}") from None
    for name, value in (("threadId", given.thread_id), ("runId", given.run_id)):
        if not 0 < len(value) <= MAX_ID_CHARS:
            raise Refusal(422, "invalid_body", f"{name} must be 1 to {MAX_ID_CHARS} characters")
    return given


def _tool_messages(given: RunAgentInput) -> bool:
    """Whether the input carries a tool's result (a client tool's answer)."""
    return any(getattr(m, "role", None) == "tool" for m in given.messages)


def _run_key(session: str, thread_id: str, run_id: str) -> str:
    """The run pointer's key of a session's ``(threadId, runId)`` (reveals neither)."""
    return hashlib.sha256(f"{session}\0{thread_id}\0{run_id}".encode()).hexdigest()


def _thread_scope(session: str, thread_id: str) -> str:
    """The call-id scope (the Agent's ``conversation``) of a session's thread: neither the
    session token nor the client's thread id shows in it."""
    digest = hashlib.sha256(f"{session}\0{thread_id}".encode()).hexdigest()[:32]
    return f"relay-agui-{digest}"
