"""What every round of one dispatcher shares (internal; the theory is in :mod:`._dispatcher`).

A :class:`DispatchState` is the one object a :class:`~._dispatch_round.DispatchRound` gets
from its :class:`~._dispatcher.Dispatcher`: the tools (an immutable view, replaced whole
between rounds), the concurrency semaphore, the group locks, the per-session lock table, the
memo of call ids (dedupe), the ledger guard, the distributed session locks, the audit and the
result shaper. Rounds use only its public methods; the dispatcher validates the options and
builds it. Imports point one way: dispatcher -> round -> state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias

from ..core._round import ToolResult
from ..ledger import ArgumentAudit, SessionLocks
from ..tools._results import ResultShaper
from ..tools._tools import Tool
from ._agent_events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
)
from ._approvals import Approvals
from ._dispatch_calls import Memo
from ._ledger_run import LedgerGuard

ToolEvent: TypeAlias = (
    ApprovalRequestedEvent | ApprovalAnsweredEvent | ToolStartedEvent | ToolFinishedEvent
)
"""The agent events the dispatcher emits."""
OnEvent: TypeAlias = Callable[[ToolEvent], None]
"""A sync callback for :data:`ToolEvent` (exceptions it raises are logged, never propagated:
an observer must not change what the tools do)."""

_log = logging.getLogger("toollatch.runtime")


class DispatchState:
    """The state a dispatcher's rounds share (see the module docstring); options are already
    checked by the :class:`~._dispatcher.Dispatcher` that builds it."""

    def __init__(
        self,
        tools: Mapping[str, Tool[Any, Any]],
        *,
        eager: frozenset[str],
        max_concurrency: int,
        default_timeout_s: float | None,
        on_event: OnEvent | None,
        max_remembered_calls: int,
        guard: LedgerGuard | None,
        session_locks: SessionLocks | None,
        audit: ArgumentAudit | None,
        results: ResultShaper,
        approvals: Approvals,
    ) -> None:
        self.tools: Mapping[str, Tool[Any, Any]] = MappingProxyType({})
        self._groups: dict[str, asyncio.Lock] = {}
        self.set_tools(tools)
        self.eager = eager
        self.default_timeout_s = default_timeout_s
        self.semaphore = asyncio.Semaphore(max_concurrency)
        self.guard = guard
        self.session_locks = session_locks
        self.audit = audit
        self.results = results
        self.approvals = approvals
        self._on_event = on_event
        self._max_remembered = max_remembered_calls
        self._sessions: dict[str, tuple[asyncio.Lock, int]] = {}
        self._memo: dict[tuple[str, str], Memo] = {}  # by (session, call id)

    # -- tools -------------------------------------------------------------------------------

    def set_tools(self, tools: Mapping[str, Tool[Any, Any]]) -> None:
        """Run ``tools`` (by name) in rounds made from now on; the group locks stay."""
        for t in tools.values():
            if t.group and t.group not in self._groups:
                self._groups[t.group] = asyncio.Lock()
        self.tools = MappingProxyType(dict(tools))

    def may_start_early(self, name: str, tools: Mapping[str, Tool[Any, Any]]) -> bool:
        """True when a call of ``name`` (one of ``tools``) may start before its round ends."""
        t = tools.get(name)
        return t is not None and (t.eager or name in self.eager)

    def timeout_s(self, tool: Tool[Any, Any]) -> float | None:
        """The run-time limit of a call of ``tool``."""
        return tool.timeout_s if tool.timeout_s is not None else self.default_timeout_s

    def group_lock(self, group: str | None) -> contextlib.AbstractAsyncContextManager[Any]:
        """The lock of a tool ``group`` (none for a tool without one)."""
        return self._groups[group] if group else contextlib.nullcontext()

    # -- sessions ----------------------------------------------------------------------------

    async def acquire_session(self, session: str) -> None:
        """Take ``session``'s in-process lock (a round holds it while its tools run)."""
        lock, users = self._sessions.get(session) or (asyncio.Lock(), 0)
        self._sessions[session] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._drop_session_user(session)
            raise

    def session_free(self, session: str) -> bool:
        """True when no round holds ``session``'s in-process lock or waits for it."""
        return session not in self._sessions

    def release_session(self, session: str) -> None:
        """Release what :meth:`acquire_session` took."""
        self._sessions[session][0].release()
        self._drop_session_user(session)

    @property
    def session_count(self) -> int:
        """Sessions a round holds or waits for (idle ones are forgotten)."""
        return len(self._sessions)

    def _drop_session_user(self, session: str) -> None:
        # Counted so the table forgets idle sessions: a server has unboundedly many.
        lock, users = self._sessions[session]
        if users <= 1:
            del self._sessions[session]
        else:
            self._sessions[session] = (lock, users - 1)

    # -- the memo of call ids ----------------------------------------------------------------

    def memo(self, session: str, call_id: str) -> Memo | None:
        """What is remembered of ``call_id`` in ``session``."""
        return self._memo.get((session, call_id))

    def remember(self, session: str, call_id: str, memo: Memo) -> None:
        """Remember ``memo`` for ``call_id``; the oldest finished ids go past the bound."""
        self._memo[session, call_id] = memo
        while len(self._memo) > self._max_remembered:
            oldest = next(iter(self._memo))
            if self._memo[oldest].result is None:
                break  # still running: it stays until it is done
            del self._memo[oldest]

    def forget(self, session: str, call_id: str, memo: Memo) -> None:
        """Forget ``call_id`` (so it may run again), if ``memo`` is still what is remembered."""
        key = (session, call_id)
        if self._memo.get(key) is memo:
            del self._memo[key]

    # -- results and events ------------------------------------------------------------------

    def budget(self, name: str, tool: Tool[Any, Any] | None) -> int:
        """The result budget of a call of ``name`` (run by ``tool``, if known)."""
        # getattr: a Tool made some other way (an MCP tool's) may not have set the option.
        declared = getattr(tool, "max_result_bytes", None)
        return self.results.limits.budget(name, declared)

    def bounded(self, result: ToolResult, tool: Tool[Any, Any] | None) -> ToolResult:
        """``result`` within its call's budget (no redaction: a result toollatch made or one
        already shaped)."""
        return self.results.bounded(result, self.budget(result.name, tool))

    def emit(self, event: ToolEvent, also: OnEvent | None = None) -> None:
        """Tell ``event`` to the dispatcher's callback, then to ``also`` (a round's own)."""
        for callback in (self._on_event, also):
            if callback is None:
                continue
            try:
                callback(event)
            except Exception:
                _log.exception("on_event callback failed for %s", event)
