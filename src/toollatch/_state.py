"""The life of one tool call, as a table.

Theory of operation: a call is a small one-way state machine. It is OPEN while its argument
text streams in. When the protocol announces its end (a per-call close, or a normal round end
for providers without one) it becomes ARGS_COMPLETE. The gate then makes it COMMITTED (the only
state a tool may run from) or FAILED. Limits, protocol violations, truncation and interrupted
streams fail it early; the caller's cancel makes it CANCELLED. A committed call becomes DONE
once the rim recorded its result. Nothing else ever assigns a state: every change goes through
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
    """The caller cancelled the call before it committed (or before it ran)."""
    DONE = "done"
    """A committed call whose result was recorded."""


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
    COMPLETE = "complete"
    """The call ran and its result was recorded."""


TRANSITIONS: dict[tuple[CallState, Trigger], CallState] = {
    (CallState.OPEN, Trigger.CLOSE): CallState.ARGS_COMPLETE,
    (CallState.OPEN, Trigger.FAIL): CallState.FAILED,
    (CallState.OPEN, Trigger.CANCEL): CallState.CANCELLED,
    (CallState.ARGS_COMPLETE, Trigger.ACCEPT): CallState.COMMITTED,
    (CallState.ARGS_COMPLETE, Trigger.FAIL): CallState.FAILED,
    (CallState.ARGS_COMPLETE, Trigger.CANCEL): CallState.CANCELLED,
    (CallState.COMMITTED, Trigger.COMPLETE): CallState.DONE,
    (CallState.COMMITTED, Trigger.CANCEL): CallState.CANCELLED,
}
"""Every allowed ``(state, trigger) -> state``; any other pair is a bug in toollatch."""

TERMINAL: frozenset[CallState] = frozenset({CallState.FAILED, CallState.CANCELLED, CallState.DONE})
"""States no trigger leaves."""


def advance(state: CallState, trigger: Trigger) -> CallState:
    """The state after ``trigger``; raises :class:`InvariantBroken` if the table forbids it."""
    try:
        return TRANSITIONS[state, trigger]
    except KeyError:
        raise InvariantBroken(f"call state {state} cannot take trigger {trigger}") from None
