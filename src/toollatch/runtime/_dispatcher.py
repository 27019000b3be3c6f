"""The dispatcher: runs committed calls (internal; public names in :mod:`toollatch.runtime`).

Theory of operation. A :class:`Dispatcher` owns the tools and what must hold across rounds:
the memory of call ids already run (dedupe), one lock per session, one lock per tool group and
the concurrency semaphore. Each model round is a :class:`DispatchRound`, an async context
manager around an ``asyncio.TaskGroup`` that owns every task the round starts::

    d = Dispatcher(tools, on_event=print)
    parser = StreamParser("anthropic", tools=d.specs)
    round_ = None
    async with d.round(session="s1") as r:
        try:
            ...                       # feed the stream; r.start(call) for eager calls
            round_ = parser.finish()
            results = await r.finish(round_)
        except asyncio.CancelledError:
            round_ = round_ or parser.cancel()
            results = await r.abort(round_)   # record them, then
            raise
    history += assistant_messages(round_)
    history += tool_results_messages(round_, results)   # always pairs: one result per call

A call's task waits for its session's lock (held from the round's first tool start until the
round closes, so two rounds of one session never run tools at once), then its group's lock,
then a semaphore slot; only then it *starts* (``ToolStartedEvent``) and runs under its
deadline. Every task records its result on its slot before it ends, cancelled or not, so that
``finish``/``abort`` always return one result per call of the round, in call order.

Dedupe: a call id runs at most once per dispatcher. A later call with the same id and the same
name and arguments gets the first run's result, whatever it is (waiting for it if it still
runs in another round); with other arguments it gets ``duplicate_call_id``. Two cases are
forgotten so the id may run later: a call that never started here (cancelled before it
started, ``ledger_unavailable``, a session lock busy past its wait), and a call of an
``idempotent`` tool whose outcome is unknown (cancelled while running, timed out). The memory
keeps the newest ``max_remembered_calls`` ids.

Durable, cross-process dedupe is the ledger's job: with ``ledger=...`` every call that would
run is first claimed in the ledger under its session (the scope: use a run id that survives a
restart), and what happens next (the stored result, waiting for a live worker, "started,
outcome unknown" for a dead one, a re-run of an idempotent tool) is :mod:`._ledger_run`'s
policy. A running tool reads its call, idempotency key and fencing token with
``toollatch.ledger.current_call()``.

Results: a tool's outcome becomes its ``ToolResult`` through :mod:`._results` (redacted with
the ``redaction`` policy's redactor, then cut to the call's size budget) before anything stores
or emits it, so the memo, the ledger, the events and the history only ever hold the shaped
result. Error results the dispatcher makes itself are cut to the budget, never redacted.

Limits of the design: a dispatcher belongs to one event loop (its locks do). A worker thread
cannot be stopped, so a sync tool that timed out or was cancelled finishes in the background
(with its result discarded) and holds one of the default executor's threads until then. A
round of a session opened inside another open round of the same session waits for it forever
(the session rule), so close a round before the next one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import socket
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Literal, TypeAlias

from .._errors import ConfigError, ErrorCode, InvariantBroken, UsageError
from .._gate import CommittedCall
from .._messages import error_result
from .._preview import PreviewPolicy
from .._round import Round, ToolResult
from .._specs import ToolSpec
from ..ledger._audit import ArgumentAudit
from ..ledger._base import Ledger
from ..ledger._context import CallContext, idempotency_key, reset_current, set_current
from ..ledger._records import LedgerError, LockBusy, LockLost, SessionLocks, digest_of
from ._agent_events import ToolFinishedEvent, ToolStartedEvent
from ._ledger_run import Clock, LedgerGuard, Owned, default_clock
from ._results import ResultLimits, ResultShaper
from ._tools import Tool

ToolEvent: TypeAlias = ToolStartedEvent | ToolFinishedEvent
"""The agent events the dispatcher emits."""
OnEvent: TypeAlias = Callable[[ToolEvent], None]
"""A sync callback for :data:`ToolEvent` (exceptions it raises are logged, never propagated:
an observer must not change what the tools do)."""

_log = logging.getLogger("toollatch.runtime")

_UNKNOWN_OUTCOME = "its outcome is unknown (it may have had its effect)"


class Dispatcher:
    """Runs committed calls of the given tools; see the module docstring.

    ``max_concurrency``: calls running at once across every round and session.
    ``default_timeout_s``: the run-time limit of a call whose tool sets none (None: no limit).
    ``eager``: names of tools that may start early besides those declared ``eager=True``.
    ``ledger``: claim every call there before running it (see the module docstring), as
    ``worker`` (default: host, pid and a random suffix), with claims that live ``lease_s``
    unless renewed (a heartbeat renews them while a call waits or runs), checking a call
    another worker runs every ``poll_s``; ``clock`` gives Unix time (tests pass their own).
    ``session_locks``: a distributed lock per session (``redis_session_locks``), held like
    the in-process one from a round's first tool start until its ``async with`` exits; when
    it is lost the round's running calls are cancelled and leaving the block raises
    ``LockLost``. ``audit`` (off by default): a redacted, bounded, expiring record of every
    call of a round that did not commit, written beside the tools once the round's
    ``finish`` or ``abort`` is called (a task of the round: the block waits for it).
    ``result_limits``: the size budgets of results (:class:`ResultLimits`; default 64 KiB
    each); ``redaction``: a ``PreviewPolicy`` whose ``redactor`` every tool's result passes
    (see :func:`redact_result`; None: no redaction; results over 64 Ki characters are
    redacted in a worker thread, so the redactor must be thread-safe).
    Raises ``ConfigError`` for duplicate tool names, unknown eager names or bad limits.
    """

    def __init__(
        self,
        tools: Sequence[Tool[Any, Any]],
        *,
        max_concurrency: int = 8,
        default_timeout_s: float | None = 30.0,
        eager: Iterable[str] = (),
        on_event: OnEvent | None = None,
        max_remembered_calls: int = 100_000,
        ledger: Ledger | None = None,
        worker: str | None = None,
        lease_s: float = 30.0,
        poll_s: float = 0.1,
        clock: Clock = default_clock,
        session_locks: SessionLocks | None = None,
        audit: ArgumentAudit | None = None,
        result_limits: ResultLimits | None = None,
        redaction: PreviewPolicy | None = None,
    ) -> None:
        self._tools: dict[str, Tool[Any, Any]] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigError(f"Dispatcher tools must be Tool objects (@tool), got {t!r:.60}")
            if t.name in self._tools:
                raise ConfigError(f"tool {t.name!r} is given twice")
            self._tools[t.name] = t
        self._eager = frozenset(eager)
        if unknown := sorted(self._eager - self._tools.keys()):
            raise ConfigError(f"eager names no tool: {unknown}")
        _check_positive_int("max_concurrency", max_concurrency)
        _check_positive_int("max_remembered_calls", max_remembered_calls)
        if default_timeout_s is not None and not (
            isinstance(default_timeout_s, int | float)
            and math.isfinite(default_timeout_s)
            and default_timeout_s > 0
        ):
            raise ConfigError("default_timeout_s must be a positive number of seconds or None")
        self.default_timeout_s = default_timeout_s
        self._on_event = on_event
        self._max_remembered = max_remembered_calls
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._groups = {t.group: asyncio.Lock() for t in self._tools.values() if t.group}
        self._sessions: dict[str, tuple[asyncio.Lock, int]] = {}
        self._memo: dict[str, _Memo] = {}
        self._guard = _guard(ledger, worker, lease_s, poll_s, clock)
        if session_locks is not None and not callable(session_locks):
            raise ConfigError(f"session_locks must be callable, got {session_locks!r:.60}")
        self._session_locks = session_locks
        if audit is not None and not isinstance(audit, ArgumentAudit):
            raise ConfigError(f"audit must be a toollatch.ledger.ArgumentAudit, got {audit!r:.60}")
        self._audit = audit
        self._results = ResultShaper(result_limits, redaction)

    @property
    def tools(self) -> Mapping[str, Tool[Any, Any]]:
        """The tools by name (read-only)."""
        return MappingProxyType(self._tools)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools' specs, for ``StreamParser(tools=...)`` or ``Gate``."""
        return tuple(t.spec for t in self._tools.values())

    def replace_tools(self, tools: Sequence[Tool[Any, Any]]) -> None:
        """Run ``tools`` from now on (a tool source's list changed; call it between rounds):
        calls already begun keep the tool they began with; the dedupe memory, the locks and
        the ``eager`` names stay (an ``eager`` name no tool has any more is ignored).
        Raises ``ConfigError`` as the constructor does, leaving the tools unchanged."""
        by_name: dict[str, Tool[Any, Any]] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigError(f"Dispatcher tools must be Tool objects (@tool), got {t!r:.60}")
            if t.name in by_name:
                raise ConfigError(f"tool {t.name!r} is given twice")
            by_name[t.name] = t
        for t in by_name.values():
            if t.group and t.group not in self._groups:
                self._groups[t.group] = asyncio.Lock()
        self._tools = by_name

    def may_start_early(self, name: str) -> bool:
        """True when a call of ``name`` may be passed to :meth:`DispatchRound.start`."""
        t = self._tools.get(name)
        return t is not None and (t.eager or name in self._eager)

    def round(self, session: str = "default") -> DispatchRound:
        """The tool execution of one model round of ``session`` (an async context manager)."""
        if not isinstance(session, str):
            raise UsageError(f"session must be a str, got {session!r:.60}")
        return DispatchRound(self, session)

    async def run(self, round_: Round, *, session: str = "default") -> list[ToolResult]:
        """Run every committed call of ``round_`` (no eager starts): ``finish`` in a round of
        its own. Cancelled, it cancels the calls and raises ``CancelledError``; the results
        are lost with it, so a loop that must record them uses :meth:`round` and ``abort``."""
        async with self.round(session) as r:
            return await r.finish(round_)

    # -- shared state (used by DispatchRound) ------------------------------------------------

    async def _acquire_session(self, session: str) -> None:
        lock, users = self._sessions.get(session) or (asyncio.Lock(), 0)
        self._sessions[session] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._drop_session_user(session)
            raise

    def _release_session(self, session: str) -> None:
        self._sessions[session][0].release()
        self._drop_session_user(session)

    def _drop_session_user(self, session: str) -> None:
        # Counted so the table forgets idle sessions: a server has unboundedly many.
        lock, users = self._sessions[session]
        if users <= 1:
            del self._sessions[session]
        else:
            self._sessions[session] = (lock, users - 1)

    def _group_lock(self, group: str | None) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._groups[group] if group else contextlib.nullcontext()

    def _remember(self, call_id: str, memo: _Memo) -> None:
        self._memo[call_id] = memo
        while len(self._memo) > self._max_remembered:
            oldest = next(iter(self._memo))
            if self._memo[oldest].result is None:
                break  # still running: it stays until it is done
            del self._memo[oldest]

    def _bounded(self, result: ToolResult) -> ToolResult:
        """``result`` within its call's budget (no redaction: a result toollatch made or one
        already shaped)."""
        return self._results.bounded(result, self._budget(result.name))

    def _budget(self, name: str) -> int:
        # getattr: a Tool made some other way (an MCP tool's) may not have set the option.
        declared = getattr(self._tools.get(name), "max_result_bytes", None)
        return self._results.limits.budget(name, declared)

    def _emit(self, event: ToolEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:
            _log.exception("on_event callback failed for %s", event)


def _guard(
    ledger: Ledger | None, worker: str | None, lease_s: float, poll_s: float, clock: Clock
) -> LedgerGuard | None:
    if ledger is None:
        return None
    if not isinstance(ledger, Ledger):
        raise ConfigError(f"ledger must be a toollatch.ledger.Ledger, got {ledger!r:.60}")
    for what, value in (("lease_s", lease_s), ("poll_s", poll_s)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{what} must be a positive number of seconds, got {value!r}")
    if worker is None:
        worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    elif not isinstance(worker, str) or not worker:
        raise ConfigError(f"worker must be a non-empty str, got {worker!r:.60}")
    return LedgerGuard(ledger, worker=worker, lease_s=lease_s, poll_s=poll_s, clock=clock)


def _check_positive_int(what: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")


@dataclass(slots=True)
class _Memo:
    """What the dispatcher remembers of one call id."""

    fingerprint: str
    done: asyncio.Future[ToolResult] | None = None
    result: ToolResult | None = None


@dataclass(slots=True, eq=False)
class _Slot:
    """One call of one round: its task and, once known, its result."""

    call: CommittedCall
    tool: Tool[Any, Any] | None = None
    memo: _Memo | None = None
    """Set when this slot runs the call (it owns the memo's result)."""
    phase: Literal["waiting", "running", "joined"] = "waiting"
    """``running`` once the tool started; ``joined`` when awaiting another round's run."""
    task: asyncio.Task[None] | None = None
    result: ToolResult | None = None


class DispatchRound:
    """The tool execution of one model round; made by :meth:`Dispatcher.round`.

    Use it as ``async with``; leaving the block cancels whatever still runs (as :meth:`abort`
    would) and waits for it, so no task outlives the block.
    """

    def __init__(self, dispatcher: Dispatcher, session: str) -> None:
        self._d = dispatcher
        self._session = session
        self._group: asyncio.TaskGroup | None = None
        self._slots: dict[str, _Slot] = {}
        self._holding = False
        self._entering = asyncio.Lock()
        self._closed: tuple[Round, list[ToolResult]] | None = None
        self._ui: dict[str, Any] = {}
        self._far: contextlib.AbstractAsyncContextManager[Any] | None = None
        self._lost: str | None = None
        self._audited = False

    @property
    def ui(self) -> Mapping[str, Any]:
        """UI payloads (``ToolOutcome.ui``) by call id, for calls whose tool returned one."""
        return MappingProxyType(self._ui)

    async def __aenter__(self) -> DispatchRound:
        if self._group is not None:
            raise UsageError("a DispatchRound is entered once")
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        group = self._group
        if group is None:
            raise UsageError("DispatchRound exited without being entered")
        self._cancel_running()
        try:
            # The body's own exception is not handed to the TaskGroup, which would wrap it in
            # an ExceptionGroup; it propagates unchanged when this returns.
            await group.__aexit__(None, None, None)
        finally:
            self._settle_unfinished()
            self._release()
            await self._release_far(exc_type is None)

    def start(self, call: CommittedCall) -> None:
        """Start ``call`` now (eager start); :meth:`finish` will not start it again.

        Raises ``UsageError`` for anything but a ``CommittedCall``, a call whose tool may not
        start early (see :meth:`Dispatcher.may_start_early`), or a round not open.
        """
        self._check_open()
        if not isinstance(call, CommittedCall):
            raise UsageError(f"the dispatcher runs only CommittedCall objects, got {call!r:.60}")
        if not self._d.may_start_early(call.name):
            raise UsageError(f"tool {call.name!r} is not allowed to start early")
        self._begin(call)

    async def finish(self, round_: Round) -> list[ToolResult]:
        """Start the committed calls of ``round_`` not started yet, wait for every call, and
        return one result per call of ``round_.calls`` in call order (error results for the
        calls that did not commit). Calling it again with the same round returns the same
        results; raises ``UsageError`` for another round or anything but a ``Round``.
        """
        if (done := self._closed_results(round_)) is not None:
            return done
        self._check_open()
        self._audit(round_)
        for record in round_.calls:
            if record.committed is not None:
                self._begin(record.committed)
        await self._wait_all()
        return self._close(round_)

    async def abort(self, round_: Round) -> list[ToolResult]:
        """Cancel every call of this round still waiting or running, wait for them, and
        return one result per call of ``round_.calls`` in call order: a finished call keeps
        its result, the others get ``cancelled`` (telling "never started" from "started,
        outcome unknown"). Safe in ``except CancelledError``; after :meth:`finish` it
        returns finish's results.
        """
        if (done := self._closed_results(round_)) is not None:
            return done
        if self._group is None:
            raise UsageError("abort() needs the round entered (async with)")
        self._cancel_running()
        self._audit(round_)
        await self._wait_all()
        self._settle_unfinished()
        return self._close(round_)

    def _audit(self, round_: Round) -> None:
        """Start writing the audit records of ``round_``'s uncommitted calls (once, with an
        audit): a task of the round's group, so it runs beside the tools, is not cancelled
        with them, and ends before the block does. It never raises for the store."""
        audit, group = self._d._audit, self._group
        if audit is None or group is None or self._audited:
            return
        self._audited = True
        if any(record.committed is None for record in round_.calls):
            group.create_task(audit.record(self._session, round_), name="toollatch:audit")

    # -- starting ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._group is None:
            raise UsageError("enter the round first: async with dispatcher.round(...) as r")
        if self._closed is not None:
            raise UsageError("this round is closed (finish or abort was called)")

    def _begin(self, call: CommittedCall) -> None:
        """Make the slot of ``call`` (once per call id per round) and start its task."""
        if call.call_id in self._slots:
            return  # started early; a different call with this id cannot commit in one round
        fingerprint = _fingerprint(call)
        slot = self._slots[call.call_id] = _Slot(call)
        memo = self._d._memo.get(call.call_id)
        if memo is not None and memo.fingerprint != fingerprint:
            slot.result = _error(call, ErrorCode.DUPLICATE_CALL_ID, _DUPLICATE)
        elif memo is not None and memo.result is not None:
            slot.result = memo.result  # ran before: its stored result, not run again
        elif memo is not None:
            self._spawn(slot, self._join(slot, memo))
        elif (tool := self._d._tools.get(call.name)) is None:
            slot.result = _error(call, ErrorCode.UNKNOWN_TOOL, _UNKNOWN_TOOL)
        else:
            slot.tool, slot.memo = (
                tool,
                _Memo(fingerprint, asyncio.get_running_loop().create_future()),
            )
            self._d._remember(call.call_id, slot.memo)
            self._spawn(slot, self._execute(slot, tool))

    def _spawn(self, slot: _Slot, work: Coroutine[Any, Any, None]) -> None:
        assert self._group is not None  # checked by _check_open
        slot.task = self._group.create_task(work, name=f"toollatch:{slot.call.call_id}")

    async def _join(self, slot: _Slot, memo: _Memo) -> None:
        """Wait for the result of the same call still running in another round."""
        slot.phase = "joined"
        if memo.done is not None:
            # shield: this round being cancelled must not cancel the other round's run.
            await asyncio.shield(memo.done)
        if memo.result is None:  # pragma: no cover - a memo's future is set with its result
            raise InvariantBroken("a joined call ended without a result")
        slot.result = memo.result

    # -- running -----------------------------------------------------------------------------

    async def _execute(self, slot: _Slot, tool: Tool[Any, Any]) -> None:
        try:
            if (guard := self._d._guard) is None:
                result = await self._run(slot, tool)
            else:
                result = await guard.run(
                    slot.call,
                    self._session,
                    idempotent=tool.idempotent,
                    runner=lambda owned: self._run(slot, tool, owned),
                    on_cancel=lambda: _on_cancel(slot),
                    max_wait_s=self._max_wait_s(tool, guard.lease_s),
                )
        except asyncio.CancelledError:
            self._settle(slot, _cancelled(slot))
            raise
        self._settle(slot, result)

    async def _run(
        self, slot: _Slot, tool: Tool[Any, Any], owned: Owned | None = None
    ) -> ToolResult:
        call = slot.call
        try:
            await self._hold_session()
        except LockBusy as exc:  # another worker holds the session: a wait that ran out
            return _error(call, ErrorCode.TOOL_TIMEOUT, f"{_LOCK_BUSY} ({exc})")
        except LedgerError as exc:
            return _error(call, ErrorCode.LEDGER_UNAVAILABLE, f"{_LOCK_DOWN} ({exc})")
        async with self._d._group_lock(tool.group), self._d._semaphore:
            if owned is not None:
                await owned.start()  # recorded before the tool starts, never after
            slot.phase = "running"
            self._d._emit(ToolStartedEvent(id=call.call_id, name=call.name))
            limit = tool.timeout_s if tool.timeout_s is not None else self._d.default_timeout_s
            context = owned.context if owned is not None else self._context(call)
            reset = set_current(context)
            try:
                async with asyncio.timeout(limit):
                    outcome = await tool.invoke(call.arguments)
            except TimeoutError:
                detail = f"the tool did not finish within {limit:g} s; {_UNKNOWN_OUTCOME}"
                return _error(call, ErrorCode.TOOL_TIMEOUT, detail)
            finally:
                reset_current(reset)
        if outcome.ui is not None:
            self._ui[call.call_id] = outcome.ui
        code = outcome.code or (ErrorCode.TOOL_ERROR if outcome.is_error else None)
        result = ToolResult(
            tool_call_id=call.call_id,
            name=call.name,
            content=outcome.content,
            is_error=outcome.is_error,
            code=code,
        )
        # Shaped here, inside the ledger's runner, so the ledger only stores the shaped one.
        shaper, budget = self._d._results, self._d._budget(call.name)
        if shaper.heavy(result):  # a long walk of the redactor: off the event loop
            return await asyncio.to_thread(shaper.tool_result, result, budget)
        return shaper.tool_result(result, budget)

    def _max_wait_s(self, tool: Tool[Any, Any], lease_s: float) -> float | None:
        """How long a call waits for another worker's run: that run's own limit (the same
        tool's) plus two leases for the claim and the write; None when it has no limit."""
        limit = tool.timeout_s if tool.timeout_s is not None else self._d.default_timeout_s
        return None if limit is None else limit + 2 * lease_s

    def _context(self, call: CommittedCall) -> CallContext:
        digest = digest_of(call.name, call.arguments)
        key = idempotency_key(self._session, call.call_id, digest)
        return CallContext(session=self._session, call_id=call.call_id, idempotency_key=key)

    async def _hold_session(self) -> None:
        """Take the session's lock for this round, once, on its first tool start (and the
        distributed one, when the dispatcher has ``session_locks``)."""
        if self._holding and (self._far is not None or self._d._session_locks is None):
            return
        async with self._entering:
            if not self._holding:
                await self._d._acquire_session(self._session)
                self._holding = True
            if self._far is None and (locks := self._d._session_locks) is not None:
                far = locks(self._session, self._lose)
                await far.__aenter__()  # LedgerError: the call gets an error result
                self._far = far

    def _lose(self, reason: str) -> None:
        self._lost = reason
        _log.error("%s; cancelling the round's running calls", reason)
        self._cancel_running()

    async def _release_far(self, raise_lost: bool) -> None:
        far, self._far = self._far, None
        if far is None:
            return
        try:
            await far.__aexit__(None, None, None)
        except LockLost:
            if raise_lost:
                raise

    def _settle(self, slot: _Slot, result: ToolResult) -> None:
        """Record ``slot``'s final result: on the slot, in the memo (or forget the id), and
        as a ``ToolFinishedEvent`` when the tool had started."""
        if slot.result is not None:
            return
        slot.result = result = self._d._bounded(result)
        if slot.phase == "running":
            error = str(result.code) if result.is_error and result.code else None
            self._d._emit(
                ToolFinishedEvent(
                    id=result.tool_call_id,
                    name=result.name,
                    is_error=result.is_error,
                    error=error,
                    truncated_from=result.truncated_from,
                )
            )
        memo = slot.memo
        if memo is None:
            return
        memo.result = result
        if memo.done is not None and not memo.done.done():
            memo.done.set_result(result)
        if _may_run_again(slot, result) and self._d._memo.get(slot.call.call_id) is memo:
            del self._d._memo[slot.call.call_id]

    def _cancel_running(self) -> None:
        for slot in self._slots.values():
            if slot.task is not None and not slot.task.done():
                slot.task.cancel()

    def _settle_unfinished(self) -> None:
        # A task cancelled before its first step never ran its own handler.
        for slot in self._slots.values():
            if slot.result is None:
                self._settle(slot, _cancelled(slot))

    async def _wait_all(self) -> None:
        tasks = [s.task for s in self._slots.values() if s.task is not None]
        if tasks:
            # asyncio.wait, not gather: being cancelled here leaves the tasks to abort().
            await asyncio.wait(tasks)

    # -- closing -----------------------------------------------------------------------------

    def _close(self, round_: Round) -> list[ToolResult]:
        results = [
            self._d._bounded(
                self._result_of(record.committed) if record.committed else error_result(record)
            )
            for record in round_.calls
        ]
        self._closed = (round_, results)
        self._release()
        return list(results)

    def _result_of(self, call: CommittedCall) -> ToolResult:
        slot = self._slots.get(call.call_id)
        if slot is None:  # committed, never begun (abort before finish)
            return _error(call, ErrorCode.CANCELLED, _NEVER_STARTED)
        if slot.result is None:  # pragma: no cover - every slot is settled before _close
            raise InvariantBroken(f"call {call.call_id!r} has no result at close")
        return slot.result

    def _closed_results(self, round_: Round) -> list[ToolResult] | None:
        if not isinstance(round_, Round):
            raise UsageError(f"expected a toollatch.Round, got {round_!r:.60}")
        if self._closed is None:
            return None
        if self._closed[0] is not round_:
            raise UsageError("this round was already closed with another Round")
        return list(self._closed[1])

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self._d._release_session(self._session)


_NEVER_STARTED = "the round was cancelled before the tool started; it was not run"
_DUPLICATE = "this call id already ran with other arguments; this call was not run"
_UNKNOWN_TOOL = "no tool of that name is registered with the dispatcher; it was not run"
_LOCK_BUSY = "another worker held the session's lock too long; the call was not run"
_LOCK_DOWN = "the session lock could not be taken (ledger unavailable); the call was not run"


def _cancelled(slot: _Slot) -> ToolResult:
    if slot.phase == "waiting":
        return _error(slot.call, ErrorCode.CANCELLED, _NEVER_STARTED)
    detail = f"the round was cancelled while the tool was running; {_UNKNOWN_OUTCOME}"
    return _error(slot.call, ErrorCode.CANCELLED, detail)


_NOT_RUN = frozenset({ErrorCode.CANCELLED, ErrorCode.LEDGER_UNAVAILABLE, ErrorCode.TOOL_TIMEOUT})
"""Codes of a call that never started here: the id may run later (with a ledger, a later
call asks the ledger again, which knows whether another worker ran it)."""
_UNKNOWN = frozenset({ErrorCode.CANCELLED, ErrorCode.TOOL_TIMEOUT, ErrorCode.OUTCOME_UNKNOWN})


def _on_cancel(slot: _Slot) -> tuple[ToolResult, bool]:
    """What a ledger records for a call cancelled while it owned the claim."""
    result = _cancelled(slot)
    return result, _may_run_again(slot, result)


def _may_run_again(slot: _Slot, result: ToolResult) -> bool:
    """True when the id is forgotten: never started, or an idempotent tool's unknown outcome."""
    if result.code in _NOT_RUN and slot.phase == "waiting":
        return True
    unknown = result.code in _UNKNOWN
    return unknown and slot.tool is not None and slot.tool.idempotent


def _error(call: CommittedCall, code: ErrorCode, detail: str) -> ToolResult:
    return ToolResult(
        tool_call_id=call.call_id,
        name=call.name,
        content=f"{code}: {detail}.",
        is_error=True,
        code=code,
    )


def _fingerprint(call: CommittedCall) -> str:
    """The name and the canonical (sorted keys, compact) JSON of the parsed arguments."""
    text = json.dumps(call.arguments, sort_keys=True, separators=(",", ":"), default=str)
    return f"{call.name}\x00{text}"
