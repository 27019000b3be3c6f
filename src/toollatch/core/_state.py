"""The life of one tool call, as a table.

Theory of operation: a call is a small one-way state machine. It is OPEN while its argument
text streams in. When the protocol announces its end (a per-call close, or a normal round end
for providers without one) it becomes ARGS_COMPLETE. The gate then makes it COMMITTED (the only
state a tool may run from) or FAILED. Limits, protocol violations, truncation and interrupted
streams fail it early; the caller's cancel makes it CANCELLED. A decided call keeps its first
outcome: a later failure or cancel of a decided call is a listed no-op (a COMMITTED call
exists before the round ends only for eager tools, which may be running), so the
callers need no guards of their own. Running a committed call is the runtime's business, not
a state of the core's. Nothing else ever assigns a state: every change goes through
:func:`advance`, which raises :class:`InvariantBroken` for a pair the table does not allow.
"""

from __future__ import annotations

from enum import StrEnum

from ._errors import InvariantBroken


class CallState(StrEnum):
    """Where a call is in its life (see the module docstring)."""

    OPEN = "open"
    """Arguments are still streaming; the text is opaque."""
    ARGS_COMPLETE = "args_complete"
    """The protocol announced the end of the arguments; waiting for the gate."""
    COMMITTED = "committed"
    """The gate accepted the call: it may run."""
    FAILED = "failed"
    """The call will never run; it carries an error code and an error result."""
    CANCELLED = "cancelled"
    """The caller cancelled the call before it committed."""


class Trigger(StrEnum):
    """What can happen to a call."""

    CLOSE = "close"
    """The protocol announced the call's end."""
    ACCEPT = "accept"
    """The gate accepted the arguments."""
    FAIL = "fail"
    """A limit, a protocol violation, the gate, truncation or interruption failed the call."""
    CANCEL = "cancel"
    """The caller cancelled."""


TRANSITIONS: dict[tuple[CallState, Trigger], CallState] = {
    (CallState.OPEN, Trigger.CLOSE): CallState.ARGS_COMPLETE,
    (CallState.OPEN, Trigger.FAIL): CallState.FAILED,
    (CallState.OPEN, Trigger.CANCEL): CallState.CANCELLED,
    (CallState.ARGS_COMPLETE, Trigger.ACCEPT): CallState.COMMITTED,
    (CallState.ARGS_COMPLETE, Trigger.FAIL): CallState.FAILED,
    (CallState.ARGS_COMPLETE, Trigger.CANCEL): CallState.CANCELLED,
    # A decided call keeps its first outcome (e.g. the round end fails what a limit failed).
    (CallState.FAILED, Trigger.FAIL): CallState.FAILED,
    (CallState.FAILED, Trigger.CANCEL): CallState.FAILED,
    (CallState.CANCELLED, Trigger.FAIL): CallState.CANCELLED,
    (CallState.CANCELLED, Trigger.CANCEL): CallState.CANCELLED,
    # An eager call committed before its round ended may already be running: a later
    # failure of the stream or a cancel does not undo that (the dispatcher cancels the run).
    (CallState.COMMITTED, Trigger.FAIL): CallState.COMMITTED,
    (CallState.COMMITTED, Trigger.CANCEL): CallState.COMMITTED,
}
"""Every allowed ``(state, trigger) -> state``; any other pair is a bug in toollatch."""

TERMINAL: frozenset[CallState] = frozenset(
    {CallState.COMMITTED, CallState.FAILED, CallState.CANCELLED}
)
"""States no trigger leaves (FAILED and CANCELLED take failures and cancels as no-ops)."""


def advance(state: CallState, trigger: Trigger) -> CallState:
    """The state after ``trigger``; raises :class:`InvariantBroken` if the table forbids it."""
    try:
        return TRANSITIONS[state, trigger]
    except KeyError:
        raise InvariantBroken(f"call state {state} cannot take trigger {trigger}") from None
