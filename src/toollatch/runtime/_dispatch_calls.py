"""The bookkeeping of one call in a dispatch round (internal): its slot, the dispatcher's memo
of its id, and the error results the dispatcher makes itself (never started, cancelled while
running, duplicate id, unknown tool, session lock busy or down), with the rule deciding when a
call id is forgotten so that it may run again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from ..core._errors import ErrorCode
from ..core._gate import CommittedCall
from ..core._round import ToolResult
from ..tools._results import made_error
from ..tools._tools import Tool

UNKNOWN_OUTCOME = "its outcome is unknown (it may have had its effect)"


@dataclass(slots=True)
class Memo:
    """What the dispatcher remembers of one call id."""

    fingerprint: str
    done: asyncio.Future[ToolResult] | None = None
    result: ToolResult | None = None


@dataclass(slots=True, eq=False)
class Slot:
    """One call of one round: its task and, once known, its result."""

    call: CommittedCall
    canonical: str | None = None
    """:func:`~toollatch.ledger._context.canonical_call` of ``call`` (its fingerprint, and
    what its idempotency digest hashes); None until made, or once ``call`` is replaced."""
    tool: Tool[Any, Any] | None = None
    memo: Memo | None = None
    """Set when this slot runs the call (it owns the memo's result)."""
    phase: Literal["waiting", "awaiting", "running", "joined"] = "waiting"
    """``waiting`` for its locks; ``awaiting`` an answer (a person's approval, a client's
    result: the state after COMMITTED for such a call); ``running`` once the tool started;
    ``joined`` when awaiting another round's run."""
    task: asyncio.Task[None] | None = None
    result: ToolResult | None = None
    note: str | None = None
    """Put before the result's text (what the model must know: its arguments were edited)."""


NEVER_STARTED = "the round was cancelled before the tool started; it was not run"
NEVER_ANSWERED = "the round was cancelled while the call waited for its answer; it was not run"
DUPLICATE = "this call id already ran with other arguments; this call was not run"
UNKNOWN_TOOL = "no tool of that name is registered with the dispatcher; it was not run"
LOCK_BUSY = "another worker held the session's lock too long; the call was not run"
LOCK_DOWN = "the session lock could not be taken (ledger unavailable); the call was not run"


def cancelled(slot: Slot) -> ToolResult:
    """The ``cancelled`` result of ``slot``: "never started" or "outcome unknown"."""
    if slot.phase == "awaiting":
        return dispatch_error(slot.call, ErrorCode.CANCELLED, NEVER_ANSWERED)
    if slot.phase == "waiting":
        return dispatch_error(slot.call, ErrorCode.CANCELLED, NEVER_STARTED)
    detail = f"the round was cancelled while the tool was running; {UNKNOWN_OUTCOME}"
    return dispatch_error(slot.call, ErrorCode.CANCELLED, detail)


_NOT_RUN = frozenset({ErrorCode.CANCELLED, ErrorCode.LEDGER_UNAVAILABLE, ErrorCode.TOOL_TIMEOUT})
"""Codes of a call that never started here: the id may run later (with a ledger, a later
call asks the ledger again, which knows whether another worker ran it)."""
_UNKNOWN = frozenset({ErrorCode.CANCELLED, ErrorCode.TOOL_TIMEOUT, ErrorCode.OUTCOME_UNKNOWN})


def on_cancel(slot: Slot) -> tuple[ToolResult, bool]:
    """What a ledger records for a call cancelled while it owned the claim."""
    result = cancelled(slot)
    return result, may_run_again(slot, result)


def may_run_again(slot: Slot, result: ToolResult) -> bool:
    """True when the id is forgotten: never started, or an idempotent tool's unknown outcome."""
    if result.code in _NOT_RUN and slot.phase in ("waiting", "awaiting"):
        return True
    unknown = result.code in _UNKNOWN
    return unknown and slot.tool is not None and slot.tool.idempotent


def dispatch_error(call: CommittedCall, code: ErrorCode, detail: str) -> ToolResult:
    """An error result the dispatcher makes for ``call``: ``"<code>: <detail>."``."""
    return made_error(call.call_id, call.name, code, detail)
