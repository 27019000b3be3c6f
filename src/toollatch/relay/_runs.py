"""Runs and their event logs (internal; public names in :mod:`toollatch.relay`).

Theory of operation. Each run's :class:`~toollatch.runtime.Agent` has the run as an
observer (:class:`_Feed`): observers are called synchronously as each event is created, in
stream order (previews included), so the event is encoded once (orjson), framed as one SSE
frame and appended to the run's log at its creation, with no queue or task switch between
(the run's driver task only iterates the :class:`~toollatch.runtime.AgentRun` to drive it).
Entry ``n`` (1-based) is the frame with ``id: n``; every reader gets the same bytes. Readers
never get a buffer of their own: each keeps a cursor into the shared log and is woken when
it grows, so a reader that stalls (its socket's send buffer full) blocks only its own
response, never the run. Resuming with ``Last-Event-ID: n`` restarts the cursor at ``n``:
nothing lost, nothing repeated.

With a shared run store (:mod:`.store`, Redis) the run's owner also *mirrors* its log:
:attr:`RelayRun.mirror` copies each new frame to the store, and :attr:`RelayRun.published`
(what every reader, local or not, may see) moves only once the store has it, so that an id
any client was sent is in the shared log and can be resumed on any worker. Without one,
:attr:`~RelayRun.published` is simply the newest id.

Memory is bounded twice: a run reaching :attr:`RelayLimits.max_run_events` is cancelled,
and the log keeps only its newest :attr:`RelayLimits.max_kept_bytes` of frames (the oldest
are forgotten first). A reader whose next event was forgotten is told so, never skipped in
silence: it gets ``event: lagged`` with ``data: {"first_id": F, "missed": M}`` and ``id:
F-1``, then the events from ``F`` on (the page shows the gap).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

from ..core._events import ReasoningBlock
from ..core._preview import PreviewPolicy, PreviewUpdated
from ..core._round import Round, reasoning_text
from ..runtime._agent_events import AgentEvent, ToolFinishedEvent
from ..runtime._agent_run import AgentRun
from ..tools._tasks import join
from ._answers import Asked, sign
from ._config import RelayLimits, shown_arguments, shown_result

_log = logging.getLogger("toollatch.relay")

_DROPPABLE = frozenset({"text", "call_preview", "call_opened", "reasoning"})
"""What a run past its event limit leaves out (still queued when the cancel was asked)."""


def preview_json(preview: PreviewUpdated) -> dict[str, Any]:
    """A ``call_preview`` event's JSON: ``{"type", "id", "name", "bytes", "deltas":
    [[pointer, op, value]...], "provisional", "final", "error"}`` (deltas already redacted)."""
    return {
        "type": "call_preview",
        "id": preview.call_id,
        "name": preview.name,
        "bytes": preview.bytes_so_far,
        "deltas": [[d.path, d.op, d.value] for d in preview.deltas],
        "provisional": sorted(preview.provisional),
        "final": preview.final,
        "error": preview.error,
    }


def _encoded(data: dict[str, Any]) -> bytes:
    """``data`` as JSON: orjson, or the stdlib for what orjson refuses (an integer beyond 64
    bits, which a model may write in arguments); what neither can encode shows as its repr."""
    try:
        return orjson.dumps(data)
    except TypeError:
        return json.dumps(data, ensure_ascii=False, default=repr).encode()


def lagged_frame(first_id: int, missed: int) -> bytes:
    """The frame telling a reader that ``missed`` events before ``first_id`` are gone."""
    data = orjson.dumps({"type": "lagged", "first_id": first_id, "missed": missed})
    return b"id: %d\nevent: lagged\ndata: %s\n\n" % (first_id - 1, data)


class EventLog:
    """A run's SSE frames by id (1-based), the newest ``max_bytes`` of them kept."""

    def __init__(self, max_bytes: int, start: int = 0) -> None:
        self._max_bytes = max_bytes
        self.start = start
        """The ids before this log's first (a run taken over from a dead worker: the shared
        store has them, this log goes on after them)."""
        self._frames: list[bytes] = []
        self._base = start  # ids compacted away before _frames[0]
        self._head = 0  # index in _frames of the oldest kept frame
        self._bytes = 0  # of the kept frames

    @property
    def last_id(self) -> int:
        """The newest event's id (0 before the first)."""
        return self._base + len(self._frames)

    @property
    def first_id(self) -> int:
        """The oldest kept event's id (``last_id + 1`` when none is)."""
        return self._base + self._head + 1

    @property
    def kept_from(self) -> int:
        """The oldest id a copy of this log keeps: 1 until this log forgot a frame of its
        own (the ids before :attr:`start` are not this log's to forget)."""
        return self.first_id if self.first_id > self.start + 1 else 1

    def append(self, frame: bytes) -> None:
        """Store the next frame; forget the oldest while over the bound (never the newest)."""
        self._frames.append(frame)
        self._bytes += len(frame)
        while self._bytes > self._max_bytes and self._head < len(self._frames) - 1:
            self._bytes -= len(self._frames[self._head])
            self._frames[self._head] = b""
            self._head += 1
        if self._head >= 1024 and self._head * 2 >= len(self._frames):  # amortized O(1)
            del self._frames[: self._head]
            self._base += self._head
            self._head = 0

    def after(self, cursor: int, limit: int) -> tuple[bytes, int]:
        """The frames after id ``cursor`` (at most ``limit``), joined, and the new cursor;
        a :func:`lagged_frame` first when the next one was forgotten."""
        lag = b""
        if cursor + 1 < self.first_id:
            lag, cursor = lagged_frame(self.first_id, self.first_id - 1 - cursor), self.first_id - 1
        start = cursor - self._base
        chunk = self._frames[start : start + limit]
        return lag + b"".join(chunk), cursor + len(chunk)

    def frames(
        self, cursor: int, limit: int, upto: int | None = None
    ) -> tuple[int, list[bytes], int]:
        """How many frames after id ``cursor`` were forgotten (0: none), the kept ones after
        it (at most ``limit``, none past id ``upto`` when given), and the new cursor."""
        missed = max(0, self.first_id - 1 - cursor)
        cursor += missed
        if upto is not None:
            limit = min(limit, upto - cursor)
        start = cursor - self._base
        chunk = self._frames[start : start + max(0, limit)]
        return missed, chunk, cursor + len(chunk)


Batch = tuple[int, list[bytes], int, bool]
"""What a run's reader gets per read: ``(missed, frames, cursor, ended)``: how many events
after its cursor were forgotten (0: none), the SSE frames after them, the new cursor, and
whether the run has nothing more after it. No frames, none missed and not ended: the wait
timed out (the reader sends a heartbeat)."""


class RunSource(Protocol):
    """A run as its readers see it, here or on another worker (:mod:`.store`)."""

    @property
    def id(self) -> str:
        """The run's id."""

    @property
    def session(self) -> str:
        """The session it belongs to (the reader's own, already checked)."""

    @property
    def last_id(self) -> int:
        """The newest event id a reader may get (when it was looked up)."""

    @property
    def ended(self) -> bool:
        """Whether the run had ended (and every event was readable) when looked up."""

    async def read(self, cursor: int, limit: int, wait_s: float) -> Batch:
        """The events after id ``cursor`` (at most ``limit``), waiting at most ``wait_s``
        seconds for one (0: not at all). Raises :class:`~.store.StoreUnavailable` when the
        shared store cannot be read."""

    async def ending(self) -> bool:
        """Whether its ``run_ended`` is logged: a reader may have it while its owner is still
        closing the run (it is :attr:`ended` moments later)."""


class Mirror(Protocol):
    """Where a run's owner copies its log (the shared store's writer)."""

    def push(self, run: RelayRun) -> None:
        """``run`` has new frames, or has ended: copy them, then :meth:`RelayRun.publish`."""


class _Feed:
    """The run as its agent's observer: every event appended at its creation."""

    __slots__ = ("_run",)

    def __init__(self, run: RelayRun) -> None:
        self._run = run

    def on_round_start(self, provider: str, round_no: int) -> None:
        """(Nothing: the events tell the page.)"""

    def on_notice(self, provider: str, notice: object) -> None:
        """A preview becomes a ``call_preview`` event (the other notices have events)."""
        if isinstance(notice, PreviewUpdated):
            self._run.append(preview_json(notice))

    def on_round(self, provider: str, round_: Round) -> None:
        """The round's reasoning, once its stream ended (the core keeps reasoning blocks
        whole, for the history): a ``reasoning`` event ``{"text"}`` per block with text
        (Anthropic ``thinking``, a Responses summary, Chat ``reasoning_content``, a Gemini
        thought), before the round's remaining ``call_committed`` / ``call_failed``."""
        for block in round_.blocks:
            if isinstance(block, ReasoningBlock) and block.choice == 0:
                text = reasoning_text(block.data)
                if text:
                    self._run.append({"type": "reasoning", "text": text})

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """Append the event as the browser may see it; a run the model failed is logged
        (the relay's console says what the page says)."""
        data = event.to_json()
        if isinstance(event, ToolFinishedEvent) and event.ui is not None:
            data["ui"] = event.ui  # (redacted and bounded by shown())
        if data["type"] == "run_ended" and data["error"]:
            _log.error("run %s…: model %s", self._run.id[:6], data["error"])
        self._run.append(self._run.shown(data))

    def on_not_committed(self, provider: str, detail: str) -> None:
        """(Nothing: the run's events report the refused call.)"""


class RelayRun:
    """One run of one session: its log, its driver task, its cancel."""

    def __init__(
        self,
        session: str,
        policy: PreviewPolicy,
        limits: RelayLimits,
        *,
        run_id: str | None = None,
        approval_secret: bytes | None = None,
        session_key: str | None = None,
        start: int = 0,
    ) -> None:
        self.id = run_id or secrets.token_urlsafe(18)
        """Unguessable (24 characters); a resumed run keeps the id it was stored under."""
        self.session = session
        """The session token ("" for a run a restarted relay resumed, until a request of its
        session finds it: :meth:`RunRegistry.owned`)."""
        self.session_key = session_key or session_key_of(session)
        """The SHA-256 (hex) of the session token: what ownership is checked against."""
        self.log = EventLog(limits.max_kept_bytes, start)
        self.published = start
        """The newest id its readers may get: the newest one, or with a :attr:`mirror` the
        newest the shared store has."""
        self.mirror: Mirror | None = None
        """The shared store's writer (None: the log is this process's only)."""
        self.done = False
        self.cancelled = False
        """Whether :meth:`cancel` stopped the run (its ``run_ended`` then has ``"cancelled":
        true``)."""
        self.lost: Exception | None = None
        """Why this worker no longer has the run (a shared store refused its write: another
        worker ended it or took it over): what its reads here raise (the store's
        StoreUnavailable: the reader's stream ends and it reconnects to the shared log)."""
        self.handed_over = False
        """Whether this stopping worker left the run to a survivor (a durable run: it is
        not cancelled, a survivor recovers its workflow once this worker's lease is gone)."""
        self.observer = _Feed(self)
        """Give it to the run's Agent (``observers=[...]``): it feeds the log."""
        self._policy = policy
        self._limits = limits
        self._ended = False
        self._grew = asyncio.Event()
        self._agent_run: AgentRun | None = None
        self._stop: Callable[[str | None], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._approval_secret = approval_secret
        self.asked: dict[str, Asked] = {}
        """The questions its log carried, by call id (:mod:`._answers`; with a secret)."""
        self.kept: dict[str, str] = {}
        """What a surviving worker needs to end the run if this one dies (a shared store
        keeps it beside the run): ``conversation``, its calls' ledger scope; for an AG-UI
        thread's run also ``history`` (where its rounds are stored), ``thread`` (the
        thread's history key) and ``provider``; for a durable run (:mod:`._durable`) also
        ``agent`` (its workflow's agent, where its answers go), ``history`` (the key its
        end writes its history under: its chat's, its AG-UI thread's or its own) and
        ``history_at`` (that history's length at the start), for a resumed one ``workflow``
        (its workflow id) and for an AG-UI one ``agui_thread`` (the client's thread id)."""

    @property
    def agent_run(self) -> AgentRun | None:
        """The run it drives (None before :meth:`start`): its answers go there."""
        return self._agent_run

    @property
    def last_id(self) -> int:
        """The id of the newest event its readers may get (0 before the first)."""
        return self.published

    @property
    def ended(self) -> bool:
        """Done, and every event readable."""
        return self.done and self.published >= self.log.last_id

    async def ending(self) -> bool:
        """See :meth:`RunSource.ending`."""
        return self._ended

    def publish(self, upto: int) -> None:
        """Let the readers have the events up to id ``upto`` (the store has them)."""
        self.published = upto
        self._wake()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()

    async def read(self, cursor: int, limit: int, wait_s: float) -> Batch:
        """See :meth:`RunSource.read` (the reader of a run of this process)."""
        waited = cursor < self.published or self.lost is not None
        if not waited and (self.ended or wait_s <= 0 or not await self.wait(cursor, wait_s)):
            return 0, [], cursor, self.ended
        if self.lost is not None:
            raise self.lost
        if cursor >= self.published:
            return 0, [], cursor, self.ended
        missed, frames, cursor = self.log.frames(cursor, limit, self.published)
        return missed, frames, cursor, False

    def start(
        self,
        agent_run: AgentRun,
        closing: Callable[[], Any],
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Drive ``agent_run`` (of an Agent observed by :attr:`observer`) in a task;
        ``before()``, if given, is awaited first (the run's record), ``closing()``
        (awaitable) runs when it ends."""
        self._agent_run = agent_run

        async def body() -> None:
            async for _event in agent_run:
                pass  # the observer appended it when it was created

        self.drive(body, agent_run.cancel, closing, before)

    def drive(
        self,
        body: Callable[[], Awaitable[None]],
        stop: Callable[[str | None], None],
        closing: Callable[[], Any],
        before: Callable[[], Awaitable[None]] | None = None,
        *,
        answers: AgentRun | None = None,
    ) -> None:
        """Drive the run in a task: ``body()`` makes its events (it ends with the run),
        ``stop(reason)`` cancels it; ``before`` and ``closing`` as in :meth:`start`;
        ``answers``: where its questions' answers go (:attr:`agent_run`; a durable run's,
        which it does not drive)."""
        if answers is not None:
            self._agent_run = answers
        self._stop = stop
        self._task = asyncio.get_running_loop().create_task(self._drive(body, closing, before))

    def append(self, data: dict[str, Any]) -> None:
        """Store one event (``data["type"]`` is its SSE name) and wake the readers."""
        n = self.log.last_id + 1
        if n > self._limits.max_run_events and data["type"] in _DROPPABLE:
            return  # past the limit only the events that pair calls and end the run are kept
        self._ended = self._ended or data["type"] == "run_ended"
        body = _encoded(data)
        self.log.append(b"id: %d\nevent: %s\ndata: %s\n\n" % (n, data["type"].encode(), body))
        if n == self._limits.max_run_events:
            self.cancel()  # bounded: the cancel adds only the round's closing events
        if self.mirror is None:
            self.published = n
            self._wake()
        else:
            self.mirror.push(self)  # (published once the store has it)

    async def wait(self, seen: int, timeout: float) -> bool:
        """Wait until events after id ``seen`` are readable or the run has ended; False on
        ``timeout`` (the caller sends a heartbeat)."""
        grew = self._grew
        if self.published > seen or self.ended:
            return True
        try:
            async with asyncio.timeout(timeout):
                await grew.wait()
        except TimeoutError:
            return False
        return True

    def cancel(self, reason: str | None = None) -> bool:
        """Stop the run (every open call gets its ``cancelled`` result; ``reason``, if given,
        is its ``run_ended.error``); False when done."""
        if self.done or self._stop is None or self.handed_over:
            return False
        self.cancelled = True
        self._stop(reason)
        return True

    async def stop(self) -> None:
        """Cancel and wait for the driver (server shutdown)."""
        self.cancel()
        if self._task is not None:
            await join(self._task)

    @property
    def driver(self) -> asyncio.Task[None] | None:
        """The task driving the run (None before :meth:`start`)."""
        return self._task

    async def _drive(
        self,
        body: Callable[[], Awaitable[None]],
        closing: Callable[[], Any],
        before: Callable[[], Awaitable[None]] | None,
    ) -> None:
        try:
            if before is not None:
                await before()
            await body()
        except Exception as exc:  # a broken client or tool file: the page must still end
            _log.error("run %s… failed: %s: %s", self.id[:6], type(exc).__name__, exc)
            _log.debug("run %s… failed", self.id[:6], exc_info=True)
            if not self._ended:
                self.append(
                    {
                        "type": "run_ended",
                        "rounds": 0,
                        "calls": [],
                        "history": [],
                        "error": f"{type(exc).__name__}: {exc}",
                        "history_omitted": 0,
                    }
                )
        finally:
            if not self.handed_over:  # (else a survivor goes on with it: no end here)
                self.done = True
                if self.mirror is not None:
                    self.mirror.push(self)  # (its end, once the store has every event)
                self._wake()
            await closing()

    def shown(self, data: dict[str, Any]) -> dict[str, Any]:
        """The event as the browser may see it (see :mod:`._config`); a question keeps its
        full committed arguments (what is approved) and gets its signed ``token``."""
        if self._approval_secret is not None:
            sign(self._approval_secret, self.asked, data)
        if data["type"] == "call_committed":
            data["arguments"] = shown_arguments(self._policy, data["name"], data["arguments"])
        elif data["type"] == "tool_finished":
            shown_result(self._policy, self._limits, data)
        elif data["type"] == "run_ended":
            data["history_omitted"] = len(data["history"])
            data["history"] = []
            if self.cancelled:  # (the key only then: the CLI's run_ended has no such key)
                data["cancelled"] = True
        return data


def session_key_of(session: str) -> str:
    """What a run keeps of its session token to check its owner (SHA-256, hex)."""
    return hashlib.sha256(session.encode()).hexdigest()


FINISH_SHARE = 0.8
"""The share of the shutdown grace a stopping worker with a shared store lets its runs go
on for before it cancels the rest (the cancel, pairing every call, gets the remainder)."""


class RunRegistry:
    """The runs of every session: bounded active runs, bounded stored runs."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self._runs: OrderedDict[str, RelayRun] = OrderedDict()
        self.closing = False
        """Set by :meth:`close`: no run is admitted any more (the server is stopping)."""
        # (loop times, set by the first close with a grace: see close)
        self._finish_by: float | None = None
        self._close_by: float | None = None

    def active(self, session: str | None = None) -> int:
        """Runs not done yet (of ``session`` only, when given)."""
        runs = self._runs.values()
        if session is None:
            return sum(1 for r in runs if not r.done)
        key = session_key_of(session)
        return sum(1 for r in runs if not r.done and secrets.compare_digest(r.session_key, key))

    def admit(self, run: RelayRun) -> bool:
        """Store ``run``; False (not stored) when ``max_active_runs`` are in flight."""
        if self.closing or self.active() >= self.limits.max_active_runs:
            return False
        while len(self._runs) >= self.limits.max_stored_runs:
            oldest = next((k for k, r in self._runs.items() if r.done), None)
            if oldest is None:
                return False
            del self._runs[oldest]
        self._runs[run.id] = run
        return True

    def keep(self, run: RelayRun) -> None:
        """Store a run this worker must drive whatever its limits (a dead worker's run it
        took over: refusing it would leave it to nobody)."""
        while len(self._runs) >= self.limits.max_stored_runs:
            oldest = next((k for k, r in self._runs.items() if r.done), None)
            if oldest is None:
                break
            del self._runs[oldest]
        self._runs[run.id] = run

    def get(self, run_id: str) -> RelayRun | None:
        """The run ``run_id`` of this process, whoever's it is (the store's control channel)."""
        return self._runs.get(run_id)

    def forget(self, run_id: str) -> None:
        """Drop a run that was admitted but never started."""
        self._runs.pop(run_id, None)

    def live(self) -> list[RelayRun]:
        """The runs not done yet."""
        return [r for r in self._runs.values() if not r.done]

    def owned(self, run_id: str, session: str | None) -> RelayRun | None:
        """The run, if it exists and belongs to ``session`` (constant-time compare of the
        token's SHA-256; a resumed run learns its token here)."""
        run = self._runs.get(run_id)
        if run is None or session is None:
            return None
        if not secrets.compare_digest(run.session_key, session_key_of(session)):
            return None
        if not run.session:
            run.session = session
        return run

    async def close(
        self,
        grace_s: float | None = None,
        *,
        reason: str | None = None,
        finish: bool = False,
        hand_over: Callable[[RelayRun], bool] | None = None,
    ) -> bool:
        """Admit no more runs, cancel every run (``reason``: their ``run_ended.error``) and
        wait for their drivers, at most ``grace_s`` seconds (None: no bound); True when every
        run ended. A driver still going after the grace (a tool that ignores its cancel) is
        left to the caller, never waited for here. ``finish``: the runs first go on for
        :data:`FINISH_SHARE` of the grace, and only the ones still running are cancelled,
        but those ``hand_over(run)`` leaves to a survivor (it returns True; the run is then
        :attr:`~RelayRun.handed_over`, never cancelled nor waited for here).

        The grace runs from the first call that gives one: a later call (a stopping server
        closes its runs from uvicorn's shutdown, from its own exit, then from its exit
        stack) waits only for what is left of it, so a stop takes the grace once, not once
        per call (a durable run handed over, whose driver goes on until DBOS stops, had each
        call wait out its share of the grace again)."""
        self.closing = True
        loop = asyncio.get_running_loop()
        if grace_s is not None and self._close_by is None:
            now = loop.time()
            self._finish_by, self._close_by = now + grace_s * FINISH_SHARE, now + grace_s
        close_by = None if grace_s is None else self._close_by
        if finish and self._finish_by is not None and grace_s is not None:
            going = [
                r.driver
                for r in self._runs.values()
                if r.driver and not r.driver.done() and not r.handed_over
            ]
            if going and (left := self._finish_by - loop.time()) > 0:
                await asyncio.wait(going, timeout=left)
        runs = list(self._runs.values())
        for run in runs:
            if hand_over is not None and not run.done and hand_over(run):
                run.handed_over = True
            run.cancel(reason)
        runs = [r for r in runs if not r.handed_over]
        drivers = [r.driver for r in runs if r.driver is not None and not r.driver.done()]
        if not drivers:
            return True
        timeout = None if close_by is None else max(0.0, close_by - loop.time())
        _done, pending = await asyncio.wait(drivers, timeout=timeout)
        return not pending
