"""Running one call under a ledger claim (internal; used by the dispatcher).

Theory of operation. :meth:`LedgerGuard.run` claims the call before anything else, then:

- it won the claim: it keeps the lease alive (a heartbeat every third of ``lease_s``) while
  the call waits for its locks and while the tool runs, marks the record ``started`` right
  before the tool starts (so a worker killed while waiting leaves a ``claimed`` record that is
  safe to run again), and stores the result. When the caller's ``ready`` could take at once
  everything the call waits for, nothing is left to wait for between the claim and the
  tool: the claim itself records ``started`` (``claim(start=True)``: one write, and one
  trip to a SQLite ledger's thread, instead of two), and what ``ready`` took is released if
  the claim is not won;
- the record is final: its stored result, the tool not run;
- the record holds other arguments: ``duplicate_call_id``;
- a live worker holds it: it polls until that worker's record is final or its lease runs out;
- a dead worker had *started* it: ``outcome_unknown`` ("started, outcome unknown"), stored
  as the call's final result, unless the tool is ``idempotent``, whose call is then claimed
  and run again with :attr:`CallContext.rerun` set (the claim took the stale record over).

A ledger that cannot be reached before the tool starts means the call is not run
(``ledger_unavailable``); after the tool ran, the result still goes to the model and the
failed write is logged (the record stays ``started`` and other workers will call its
outcome unknown). A call cancelled or timed out *in this process* keeps ``cancelled`` /
``tool_timeout`` (with "its outcome is unknown" in the text when the tool had started): the
code names the cause, which the caller chose (a cancel, a deadline); ``outcome_unknown`` is
for the case nobody here chose, a worker that vanished mid-call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..core._errors import ErrorCode
from ..core._gate import CommittedCall
from ..core._round import ToolResult
from ..ledger import Ledger
from ..ledger._context import CallContext, idempotency_key
from ..ledger._records import FINAL, Found, LeaseLost, LedgerError, LedgerKey, Won, digest_of
from ..tools._tasks import cancel_lost
from ._dispatch_calls import dispatch_error

_log = logging.getLogger("toollatch.ledger")

Clock = Callable[[], float]
"""Wall-clock seconds (Unix time); ``time.time`` unless a test passes its own."""

STALE_UNKNOWN = (
    "a worker claimed and started this call, then stopped renewing its claim (it died or "
    "hung); its outcome is unknown (it may have had its effect), so it was not run again"
)
WAITED = "it was not run here and its outcome is unknown"
LEDGER_DOWN = "the call ledger is unavailable, so the call was not run"
_WRITE_TIMEOUT_S = 5.0
"""Longest wait for the write that records a cancelled call (it runs shielded)."""


class _Retry(Exception):
    """Our claim was taken over before the tool started: claim again (and find theirs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Owned:
    """A won claim, handed to the runner: ``start`` marks the record started (call it right
    before the tool runs; a no-op when the claim started it), ``context`` is what the tool
    reads with ``current_call()``, ``held``: what ``ready`` took for it (the runner releases
    it), or None when the runner waits for it itself."""

    context: CallContext
    start: Callable[[], Awaitable[None]]
    held: contextlib.AbstractAsyncContextManager[Any] | None = None


Runner = Callable[[Owned], Awaitable[ToolResult]]
"""Runs the tool of a won claim (waiting for its locks first) and returns its result."""
Ready = Callable[[], Awaitable[contextlib.AbstractAsyncContextManager[Any] | None]]
"""Takes, only when it can without waiting, everything the runner would wait for, and
returns it held (entered; leaving it releases it); None, with nothing taken, when something
may have to be waited for."""


class LedgerGuard:
    """The dispatcher's ledger policy; see the module docstring."""

    def __init__(
        self, ledger: Ledger, *, worker: str, lease_s: float, poll_s: float, clock: Clock
    ) -> None:
        self.ledger = ledger
        self.worker = worker
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.clock = clock

    async def run(
        self,
        call: CommittedCall,
        session: str,
        *,
        idempotent: bool,
        runner: Runner,
        on_cancel: Callable[[], tuple[ToolResult, bool]],
        max_wait_s: float | None = None,
        ready: Ready | None = None,
    ) -> ToolResult:
        """The call's result, run at most once across every worker of the ledger.

        ``on_cancel`` gives, when the task is cancelled while owning the claim, the result
        to record and whether the call may run again (then the claim is released).
        ``max_wait_s``: how long to wait for another live worker's run of the call before
        giving up with ``tool_timeout`` (None: as long as its lease is renewed). ``ready``:
        see :data:`Ready`; when it holds all, the claim starts the call in the same write."""
        key = LedgerKey(scope=session, call_id=call.call_id)
        digest = digest_of(call.name, call.arguments)
        loop = asyncio.get_running_loop()
        give_up = None if max_wait_s is None else loop.time() + max_wait_s
        while True:
            if give_up is not None and loop.time() > give_up:
                detail = f"another worker has run this call for over {max_wait_s:g} s; {WAITED}"
                return dispatch_error(call, ErrorCode.TOOL_TIMEOUT, detail)
            held = await ready() if ready is not None else None
            try:
                claim = await self._claim(key, digest, idempotent, held)
            except LedgerError as exc:
                return dispatch_error(call, ErrorCode.LEDGER_UNAVAILABLE, f"{LEDGER_DOWN} ({exc})")
            if held is not None and not isinstance(claim, Won):
                await held.__aexit__(None, None, None)  # (another worker's call: not ours)
                held = None
            if isinstance(claim, Won):
                context = CallContext(
                    session=session, call_id=call.call_id, token=claim.token,
                    idempotency_key=idempotency_key(session, call.call_id, digest),
                    rerun=claim.previous is not None and claim.previous.state == "started",
                )  # fmt: skip
                try:
                    return await self._own(key, call, context, runner, on_cancel, held)
                except _Retry:
                    continue
            if (done := await self._found(key, call, digest, claim)) is not None:
                return done

    async def _claim(
        self,
        key: LedgerKey,
        digest: str,
        idempotent: bool,
        held: contextlib.AbstractAsyncContextManager[Any] | None,
    ) -> Won | Found:
        """One claim; ``held`` (taken by ``ready``): the claim also starts the call, and
        ``held`` is released here if the claim fails. A claim that starts the call and is
        cancelled in flight is let finish (shielded, bounded) and, won, released, as a
        cancel between a claim and its start is."""
        claim = self.ledger.claim(
            key, digest=digest, worker=self.worker, now=self.clock(),
            lease_s=self.lease_s, rerun_started=idempotent, start=held is not None,
        )  # fmt: skip
        if held is None:
            return await claim
        try:
            task = asyncio.ensure_future(claim)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                await _shielded(self._release_won(key, task))
                raise
        except BaseException:
            await held.__aexit__(None, None, None)
            raise

    async def _release_won(self, key: LedgerKey, claim: asyncio.Future[Won | Found]) -> None:
        won = await claim
        if isinstance(won, Won):
            await self.ledger.release(key, won.token)

    async def _found(
        self, key: LedgerKey, call: CommittedCall, digest: str, found: Found
    ) -> ToolResult | None:
        """The result for a claim that lost, or None to claim again (after a pause)."""
        record = found.record
        if record.digest != digest:
            detail = "this call id already ran with other arguments; this call was not run"
            return dispatch_error(call, ErrorCode.DUPLICATE_CALL_ID, detail)
        if record.state in FINAL and record.result is not None:
            return record.result
        if found.live or record.state == "claimed":
            await asyncio.sleep(self.poll_s)  # a live worker holds it: wait for its result
            return None
        verdict = dispatch_error(call, ErrorCode.OUTCOME_UNKNOWN, STALE_UNKNOWN)
        try:
            after = await self.ledger.settle_unknown(key, record.token, verdict, now=self.clock())
        except LeaseLost:
            return None  # the record is gone (expired after its retention): claim again
        except LedgerError as exc:
            return dispatch_error(call, ErrorCode.LEDGER_UNAVAILABLE, f"{LEDGER_DOWN} ({exc})")
        return after.result if after.state in FINAL else None  # else: renewed meanwhile

    async def _own(
        self,
        key: LedgerKey,
        call: CommittedCall,
        context: CallContext,
        runner: Runner,
        on_cancel: Callable[[], tuple[ToolResult, bool]],
        held: contextlib.AbstractAsyncContextManager[Any] | None,
    ) -> ToolResult:
        token = context.token
        assert token is not None  # a won claim always has one
        heartbeat = asyncio.create_task(self._heartbeat(key, token), name="toollatch:lease")

        async def start() -> None:
            if held is not None:
                return  # the claim recorded it started
            try:
                await self.ledger.start(key, token, now=self.clock(), lease_s=self.lease_s)
            except LeaseLost:
                raise _Retry from None

        try:
            result = await runner(Owned(context=context, start=start, held=held))
        except asyncio.CancelledError:
            result, again = on_cancel()
            write = self.ledger.release(key, token) if again else self._store(key, token, result)
            await _shielded(write)
            raise
        finally:
            heartbeat.cancel()
        await self._store(key, token, result)
        return result

    async def _store(self, key: LedgerKey, token: int, result: ToolResult) -> None:
        try:
            await self.ledger.finish(key, token, result, now=self.clock())
        except LedgerError as exc:  # LeaseLost too: the model still gets the real result
            _log.warning("could not store the result of %r: %s", key.call_id, exc)

    async def _heartbeat(self, key: LedgerKey, token: int) -> None:
        # (until cancelled, even when a ledger's command swallowed the cancel: cancel_lost)
        while not cancel_lost():
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.ledger.renew(key, token, now=self.clock(), lease_s=self.lease_s)
            except LeaseLost:
                _log.warning("lost the claim of %r (lease expired, taken over)", key.call_id)
                return
            except LedgerError as exc:  # transient: the next beat tries again
                _log.warning("could not renew the claim of %r: %s", key.call_id, exc)


async def _shielded(write: Awaitable[None]) -> None:
    """Run ``write`` to its end even though the caller is being cancelled (bounded)."""
    task = asyncio.ensure_future(asyncio.wait_for(write, _WRITE_TIMEOUT_S))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        pass  # cancelled again: the shielded task still finishes the write
    except Exception as exc:
        _log.warning("could not record a cancelled call: %s", exc)


def default_clock() -> float:
    """``time.time()``: leases are compared across processes, so wall-clock time."""
    return time.time()
