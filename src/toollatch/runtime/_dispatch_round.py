"""One model round's tool execution (internal; see :mod:`._dispatcher` for the theory):
:class:`DispatchRound` owns the round's ``TaskGroup``, the session locks it holds (in-process
and distributed), and each call's task from its start (eager or at ``finish``) through the
ledger, the locks and the tool's deadline to its settled, shaped result (a round's only call
may run in ``finish``'s own task instead: :meth:`DispatchRound._inline`). What it shares with
the other rounds of its dispatcher is one :class:`~._dispatch_state.DispatchState`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import replace
from types import MappingProxyType, TracebackType
from typing import Any, TypeAlias

from ..core._errors import ErrorCode, InvariantBroken, UsageError
from ..core._gate import CommittedCall, Gate, Rejection
from ..core._messages import error_result
from ..core._round import Round, ToolResult
from ..ledger import (
    LedgerError,
    LockBusy,
    LockLost,
    Question,
    QuestionKind,
    StaleArguments,
)
from ..ledger._context import (
    CallContext,
    canonical_call,
    digest_of_canonical,
    idempotency_key,
    reset_current,
    set_current,
)
from ..tools._tools import Tool, ToolOutcome, as_text
from ._agent_events import ApprovalAnsweredEvent, ToolFinishedEvent, ToolStartedEvent
from ._approvals import regate
from ._dispatch_calls import (
    DUPLICATE,
    LOCK_BUSY,
    LOCK_DOWN,
    NEVER_ANSWERED,
    NEVER_STARTED,
    UNKNOWN_OUTCOME,
    UNKNOWN_TOOL,
    Memo,
    Slot,
    cancelled,
    dispatch_error,
    may_run_again,
    on_cancel,
)
from ._dispatch_state import DispatchState, OnEvent, ToolEvent
from ._ledger_run import Owned
from ._loop_watch import HeldLoop

_log = logging.getLogger("toollatch.runtime")

_Begun: TypeAlias = tuple[Slot, Coroutine[Any, Any, None], bool]
"""A call's slot, the work left to run for it, and whether that is the tool's run alone."""


def _warn_blocked(call: CommittedCall, held_s: float, limit: float) -> None:
    """Log that ``call``'s tool held the event loop past its timeout (see :mod:`._loop_watch`)."""
    _log.warning(
        "tool %r (call %r) held the event loop for %.2f s without awaiting, longer than its "
        "timeout of %g s: a timeout cannot interrupt an async tool that blocks, and every other "
        "call and stream waited; make it a sync function (it then runs in a worker thread) or "
        "await while it works",
        call.name,
        call.call_id,
        held_s,
        limit,
    )


def _answered_event(q: Question, *, edited: bool) -> ApprovalAnsweredEvent:
    waited = max(0.0, (q.answered_at or q.asked_at) - q.asked_at)
    return ApprovalAnsweredEvent(
        id=q.key.call_id, name=q.name, decision=str(q.decision), reason=q.reason,
        waited_s=waited, edited=edited,
    )  # fmt: skip


def result_text(value: Any) -> str:
    """A client's result as the model reads it: a str as it is, else compact JSON (what a
    tool's return value becomes); ``UsageError`` for a value with no JSON form."""
    outcome = as_text(ToolOutcome(content=value))
    if outcome.is_error:
        raise UsageError(f"the result has no JSON form: {outcome.content}")
    return str(outcome.content)


class DispatchRound:
    """The tool execution of one model round; made by :meth:`Dispatcher.round`.

    Use it as ``async with``; leaving the block cancels whatever still runs (as :meth:`abort`
    would) and waits for it, so no task outlives the block. The round runs the dispatcher's
    tools as they were when it was made; its tool events go to the dispatcher's ``on_event``
    and then to its own ``on_event``.
    """

    def __init__(
        self,
        state: DispatchState,
        session: str,
        *,
        on_event: OnEvent | None = None,
        gate: Gate | None = None,
        always: str | None = None,
    ) -> None:
        self._shared = state
        self._always = always or session  # whose "always allow" decisions apply
        self._tools = state.tools  # (an immutable view: replace_tools makes a new one)
        # what edited arguments of an approval pass (the run's, with its limits and policy)
        self._gate = gate or Gate([t.spec for t in self._tools.values()])
        self._on_event = on_event
        self._session = session
        self._group: asyncio.TaskGroup | None = None
        self._slots: dict[str, Slot] = {}
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
        if not self._shared.may_start_early(call.name, self._tools):
            raise UsageError(f"tool {call.name!r} is not allowed to start early")
        if (begun := self._begin(call)) is not None:
            self._spawn(begun[0], begun[1])

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
        begun = [
            left
            for record in round_.calls
            if record.committed is not None and (left := self._begin(record.committed))
        ]
        if len(begun) == 1 and self._may_inline(begun[0]):
            await self._inline(begun[0][1])
        else:
            for slot, work, _ in begun:
                self._spawn(slot, work)
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
        audit, group = self._shared.audit, self._group
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

    def _begin(self, call: CommittedCall) -> _Begun | None:
        """Make the slot of ``call`` (once per call id per round); what is left to run for
        it, if anything (a call settled at once has nothing): its slot, the work, and
        whether that work is the tool's run alone (no answer to wait for, no other
        round's run to join)."""
        if call.call_id in self._slots:
            return None  # started early (a different call with this id cannot commit in one round)
        fingerprint = canonical_call(call.name, call.arguments)  # (the digest hashes it too)
        slot = self._slots[call.call_id] = Slot(call, fingerprint)
        memo = self._shared.memo(self._session, call.call_id)
        if memo is not None and memo.fingerprint != fingerprint:
            self._settle(slot, dispatch_error(call, ErrorCode.DUPLICATE_CALL_ID, DUPLICATE))
        elif memo is not None and memo.result is not None:
            self._settle(slot, memo.result)  # ran before: its stored result, not run again
        elif memo is not None:
            return slot, self._join(slot, memo), False
        elif (tool := self._tools.get(call.name)) is None:
            self._settle(slot, dispatch_error(call, ErrorCode.UNKNOWN_TOOL, UNKNOWN_TOOL))
        else:
            slot.tool, slot.memo = (
                tool,
                Memo(fingerprint, asyncio.get_running_loop().create_future()),
            )
            self._shared.remember(self._session, call.call_id, slot.memo)
            kind = self._shared.approvals.kind_of(tool, call, self._session)
            if kind is None:
                return slot, self._execute(slot, tool), True
            return slot, self._answered(slot, tool, kind), False
        return None

    def _spawn(self, slot: Slot, work: Coroutine[Any, Any, None]) -> None:
        assert self._group is not None  # checked by _check_open
        slot.task = self._group.create_task(work, name=f"toollatch:{slot.call.call_id}")

    def _may_inline(self, begun: _Begun) -> bool:
        """Whether ``finish`` may run the round's only call to start in its own task (see
        :meth:`_inline`): the tool's run alone, nothing of the round still running (an
        eager call's task: its cancellation and its events keep their order), no ledger
        and no distributed session lock (their waits, heartbeats and lock loss cancel a
        call's task), and no cancellation of this task asked for and not undone (one the
        caller caught before calling finish: it is not the call's to raise again)."""
        shared = self._shared
        if not begun[2] or shared.guard is not None or shared.session_locks is not None:
            return False
        if any(s.task is not None and not s.task.done() for s in self._slots.values()):
            return False
        task = asyncio.current_task()
        return task is not None and task.cancelling() == 0

    async def _inline(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a call's :meth:`_execute`) in this task instead of a task of the
        round's group: the task, its wake-ups and the wait for it cost more than a quick
        tool. It behaves as the task would: cancelling this task cancels the tool, whose
        call is then settled ``cancelled`` (:meth:`_execute`) before the cancellation goes
        on; the tool's deadline is its ``asyncio.timeout``; the tool runs in a copy of the
        context (:class:`HeldLoop`). A cancellation the tool swallowed is raised after it,
        as waiting for its task would have raised it (the call keeps the result it
        returned)."""
        task = asyncio.current_task()
        assert task is not None  # checked by _may_inline, as no cancellation asked yet
        await work
        if task.cancelling():
            raise asyncio.CancelledError

    async def _join(self, slot: Slot, memo: Memo) -> None:
        """Wait for the result of the same call still running in another round."""
        slot.phase = "joined"
        if memo.done is not None:
            # shield: this round being cancelled must not cancel the other round's run.
            await asyncio.shield(memo.done)
        if memo.result is None:  # pragma: no cover - a memo's future is set with its result
            raise InvariantBroken("a joined call ended without a result")
        self._settle(slot, memo.result)

    # -- waiting for a person or a client (see ._approvals) --------------------------------

    async def _answered(self, slot: Slot, tool: Tool[Any, Any], kind: QuestionKind) -> None:
        """Wait for ``slot``'s answer, then run it (approved) or settle it (any other)."""
        call = slot.call
        slot.phase = "awaiting"
        try:
            approvals = self._shared.approvals
            question = await approvals.wait(
                self._session, call, kind, self._emit, self._gate, always=self._always
            )
        except StaleArguments:
            self._settle(slot, dispatch_error(call, ErrorCode.DUPLICATE_CALL_ID, DUPLICATE))
            return
        except LedgerError as exc:
            detail = f"the question could not be stored ({exc}); the call was not run"
            self._settle(slot, dispatch_error(call, ErrorCode.LEDGER_UNAVAILABLE, detail))
            return
        except asyncio.CancelledError:
            self._settle(slot, cancelled(slot))
            raise
        if question is None:  # always allowed in this session, never asked: it runs now
            slot.phase = "waiting"
            await self._execute(slot, tool)
            return
        edited = question.decision == "approved" and question.value is not None
        self._emit(_answered_event(question, edited=edited))
        slot.phase = "waiting"  # (for its locks, if it runs)
        if question.decision == "approved" and question.value is not None:
            checked = regate(self._gate, call, question.value)
            if isinstance(checked, Rejection):
                self._settle(slot, dispatch_error(call, checked.code, checked.detail))
                return
            slot.call, slot.canonical = checked, None
            slot.note = (
                "[a person approved this call with edited arguments; it ran with "
                f"{checked.arguments_text}]\n"
            )
            await self._execute(slot, tool)
        elif question.decision == "approved":
            await self._execute(slot, tool)
        else:
            self._settle(slot, self._not_run(call, tool, question))

    def _not_run(self, call: CommittedCall, tool: Tool[Any, Any], q: Question) -> ToolResult:
        """The result of an answered call that did not run here."""
        if q.decision == "result":  # a client tool's: shaped like any tool's result
            result = ToolResult(tool_call_id=call.call_id, name=call.name, content=q.value or "")
            return self._shared.results.tool_result(result, self._shared.budget(call.name, tool))
        if q.decision == "denied":
            detail = f"a person denied this call; it was not run. Reason: {q.reason or 'none'}"
            return dispatch_error(call, ErrorCode.APPROVAL_DENIED, detail)
        if q.decision == "expired":
            what = "its result" if q.kind == "client" else "an approval"
            detail = f"{what} did not come in time; the call was not run"
            return dispatch_error(call, ErrorCode.APPROVAL_EXPIRED, detail)
        return dispatch_error(call, ErrorCode.CANCELLED, NEVER_ANSWERED)

    # -- running -----------------------------------------------------------------------------

    async def _execute(self, slot: Slot, tool: Tool[Any, Any]) -> None:
        try:
            if (guard := self._shared.guard) is None:
                result = await self._run(slot, tool)
            else:
                result = await guard.run(
                    slot.call,
                    self._session,
                    idempotent=tool.idempotent,
                    runner=lambda owned: self._run(slot, tool, owned),
                    on_cancel=lambda: on_cancel(slot),
                    max_wait_s=self._max_wait_s(tool, guard.lease_s),
                    ready=lambda: self._ready(tool),
                )
        except asyncio.CancelledError:
            self._settle(slot, cancelled(slot))
            raise
        self._settle(slot, result)

    async def _run(
        self, slot: Slot, tool: Tool[Any, Any], owned: Owned | None = None
    ) -> ToolResult:
        call = slot.call
        taken = owned.held if owned is not None else None
        if taken is None:
            try:
                await self._hold_session()
            except LockBusy as exc:  # another worker holds the session: a wait that ran out
                return dispatch_error(call, ErrorCode.TOOL_TIMEOUT, f"{LOCK_BUSY} ({exc})")
            except LedgerError as exc:
                return dispatch_error(call, ErrorCode.LEDGER_UNAVAILABLE, f"{LOCK_DOWN} ({exc})")
            # (a tool without a group waits for a concurrency slot only: no lock chain)
            taken = self._slot(tool) if tool.group else self._shared.semaphore
        async with taken:
            if owned is not None:
                await owned.start()  # recorded before the tool starts, never after
            slot.phase = "running"
            self._emit(ToolStartedEvent(id=call.call_id, name=call.name))
            limit = self._shared.timeout_s(tool)
            context = owned.context if owned is not None else self._context(slot)
            reset = set_current(context)
            held = HeldLoop(tool.invoke(call.arguments))
            try:
                if limit is None:
                    outcome = await held
                else:
                    async with asyncio.timeout(limit):
                        outcome = await held
            except TimeoutError:
                detail = f"the tool did not finish within {limit:g} s; {UNKNOWN_OUTCOME}"
                return dispatch_error(call, ErrorCode.TOOL_TIMEOUT, detail)
            finally:
                reset_current(reset)
                if limit is not None and held.longest_s > limit:
                    _warn_blocked(call, held.longest_s, limit)
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
        shaper, budget = self._shared.results, self._shared.budget(call.name, tool)
        if shaper.heavy(result):  # a long walk of the redactor: off the event loop
            return await asyncio.to_thread(shaper.tool_result, result, budget)
        return shaper.tool_result(result, budget)

    @contextlib.asynccontextmanager
    async def _slot(self, tool: Tool[Any, Any]) -> AsyncIterator[None]:
        """The tool's group lock and a concurrency slot, held while it runs."""
        async with self._shared.group_lock(tool.group), self._shared.semaphore:
            yield

    async def _ready(
        self, tool: Tool[Any, Any]
    ) -> contextlib.AbstractAsyncContextManager[Any] | None:
        """Everything a call of ``tool`` waits for before it starts (the session's locks,
        its group's lock, a concurrency slot), taken when all are free now, so that the
        ledger claims and starts the call in one write; None, with nothing taken, when one
        of them may have to be waited for (the call is then claimed, waits, and is started
        after). Free now means taken without a suspension, so no other task comes between
        the look and the taking."""
        shared = self._shared
        session_held = self._holding and (self._far is not None or shared.session_locks is None)
        if not session_held and (
            shared.session_locks is not None  # the distributed lock is a trip to its store
            or self._entering.locked()
            or not shared.session_free(self._session)
        ):
            return None
        group = shared.group_lock(tool.group)
        if (isinstance(group, asyncio.Lock) and group.locked()) or shared.semaphore.locked():
            return None
        await self._hold_session()
        taken = contextlib.AsyncExitStack()  # (entered: leaving it releases the slot)
        await taken.enter_async_context(self._slot(tool))
        return taken

    def _max_wait_s(self, tool: Tool[Any, Any], lease_s: float) -> float | None:
        """How long a call waits for another worker's run: that run's own limit (the same
        tool's) plus two leases for the claim and the write; None when it has no limit."""
        limit = self._shared.timeout_s(tool)
        return None if limit is None else limit + 2 * lease_s

    def _context(self, slot: Slot) -> CallContext:
        call = slot.call
        if slot.canonical is None:
            slot.canonical = canonical_call(call.name, call.arguments)
        digest = digest_of_canonical(slot.canonical)
        key = idempotency_key(self._session, call.call_id, digest)
        return CallContext(session=self._session, call_id=call.call_id, idempotency_key=key)

    async def _hold_session(self) -> None:
        """Take the session's lock for this round, once, on its first tool start (and the
        distributed one, when the dispatcher has ``session_locks``)."""
        if self._holding and (self._far is not None or self._shared.session_locks is None):
            return
        async with self._entering:
            if not self._holding:
                await self._shared.acquire_session(self._session)
                self._holding = True
            if self._far is None and (locks := self._shared.session_locks) is not None:
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

    def _settle(self, slot: Slot, result: ToolResult) -> None:
        """Record ``slot``'s final result: on the slot, in the memo (or forget the id), and
        as a ``ToolFinishedEvent``, whether the tool ran here or not (a stored result, a
        ledger's ``outcome_unknown``, a cancel before it started): every committed call's
        result is told once."""
        if slot.result is not None:
            return
        if slot.note is not None:
            result = replace(result, content=slot.note + result.content)
        slot.result = result = self._bounded(result)
        self._finished(result)
        memo = slot.memo
        if memo is None:
            return
        memo.result = result
        if memo.done is not None and not memo.done.done():
            memo.done.set_result(result)
        if may_run_again(slot, result):
            self._shared.forget(self._session, slot.call.call_id, memo)

    def _finished(self, result: ToolResult) -> None:
        error = str(result.code) if result.is_error and result.code else None
        self._emit(
            ToolFinishedEvent(
                id=result.tool_call_id,
                name=result.name,
                is_error=result.is_error,
                error=error,
                truncated_from=result.truncated_from,
                result=result.content,
                ui=self._ui.get(result.tool_call_id),
            )
        )

    def _cancel_running(self) -> None:
        for slot in self._slots.values():
            if slot.task is not None and not slot.task.done():
                slot.task.cancel()

    def _settle_unfinished(self) -> None:
        # A task cancelled before its first step never ran its own handler.
        for slot in self._slots.values():
            if slot.result is None:
                self._settle(slot, cancelled(slot))

    async def _wait_all(self) -> None:
        tasks = [s.task for s in self._slots.values() if s.task is not None]
        if tasks:
            # asyncio.wait, not gather: being cancelled here leaves the tasks to abort().
            await asyncio.wait(tasks)

    # -- closing -----------------------------------------------------------------------------

    def _close(self, round_: Round) -> list[ToolResult]:
        results = [
            self._bounded(
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
            result = self._bounded(dispatch_error(call, ErrorCode.CANCELLED, NEVER_STARTED))
            self._finished(result)
            return result
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
            self._shared.release_session(self._session)

    def _bounded(self, result: ToolResult) -> ToolResult:
        return self._shared.bounded(result, self._tools.get(result.name))

    def _emit(self, event: ToolEvent) -> None:
        self._shared.emit(event, self._on_event)
