"""The one vocabulary of agent events (internal; public names in :mod:`toollatch.runtime`).

What ``toollatch run --json`` prints (one object per line), what the relay sends as SSE
``event:`` names, and what metrics and logs observe. Each event is plain data with a
``type`` and a JSON form (:meth:`to_json`) whose keys are fixed by the CLI contract; add keys
only compatibly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from ..tools._results import PREVIEW_CHARS, result_preview


@dataclass(frozen=True, slots=True, kw_only=True)
class TextEvent:
    """Assistant text as it streams."""

    type: ClassVar[str] = "text"
    text: str
    """The new text."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "text", "text"}``."""
        return {"type": self.type, "text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOpenedEvent:
    """A tool call began streaming (id and name as soon as the provider sent them)."""

    type: ClassVar[str] = "call_opened"
    id: str | None
    """The provider's call id (None until it is known)."""
    name: str | None
    """The tool name (None until it is known)."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "call_opened", "id", "name"}``."""
        return {"type": self.type, "id": self.id, "name": self.name}


@dataclass(frozen=True, slots=True, kw_only=True)
class CallCommittedEvent:
    """A call passed the gate and may run."""

    type: ClassVar[str] = "call_committed"
    id: str
    """The call id results pair with."""
    name: str
    """The tool name."""
    arguments: Mapping[str, Any]
    """The strictly parsed, schema-valid arguments."""
    early: bool
    """True when it was committed before the round ended (eager start)."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "call_committed", "id", "name", "arguments", "early"}``."""
        return {
            "type": self.type,
            "id": self.id,
            "name": self.name,
            "arguments": dict(self.arguments),
            "early": self.early,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFailedEvent:
    """A call did not commit (it gets an error result)."""

    type: ClassVar[str] = "call_failed"
    id: str
    """The call id its error result pairs with."""
    name: str | None
    """The tool name, if the provider sent one."""
    error: str
    """The stable error code (``invalid_json``, ``truncated``...)."""
    detail: str
    """A short explanation, never the raw arguments."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "call_failed", "id", "name", "error", "detail"}``."""
        return {
            "type": self.type,
            "id": self.id,
            "name": self.name,
            "error": self.error,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequestedEvent:
    """A committed call waits for a person (``approval_requested``) or, for a client tool,
    for the client's result (``client_call``): answer it with ``AgentRun.approve`` /
    ``deny`` or ``submit_result``. Sent again when a resumed run meets the call again."""

    type: ClassVar[str] = "approval_requested"
    id: str
    """The call id to answer."""
    name: str
    """The tool name."""
    arguments: Mapping[str, Any]
    """The committed arguments, exactly what an approval approves (never a preview)."""
    args_sha256: str
    """SHA-256 (hex) of the tool name and canonical arguments: an approval names it."""
    session: str
    """The conversation (the ledger's scope) the call belongs to."""
    expires_at: float | None
    """Unix time after which it is answered ``approval_expired`` (None: never)."""
    kind: str = "approval"
    """``approval``, or ``client`` for a client tool's call (then ``type`` is
    ``client_call``)."""

    def to_json(self) -> dict[str, Any]:
        """``{"type", "id", "name", "arguments", "args_sha256", "session", "expires_at"}``
        (``type``: ``approval_requested`` or ``client_call``)."""
        return {
            "type": "client_call" if self.kind == "client" else self.type,
            "id": self.id,
            "name": self.name,
            "arguments": dict(self.arguments),
            "args_sha256": self.args_sha256,
            "session": self.session,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalAnsweredEvent:
    """A waiting call was answered: ``approved`` (it runs now), ``denied``, ``result`` (a
    client tool's), ``expired`` or ``cancelled``; its ``tool_finished`` follows."""

    type: ClassVar[str] = "approval_answered"
    id: str
    """The call id."""
    name: str
    """The tool name."""
    decision: str
    """``approved``, ``denied``, ``result``, ``expired`` or ``cancelled``."""
    reason: str | None
    """A denial's reason."""
    waited_s: float
    """Seconds from the question to its answer (by the dispatcher's clock; across a
    restart, the downtime included)."""
    edited: bool = False
    """True when the approval changed the arguments (the call ran with the edited ones)."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "approval_answered", "id", "name", "decision", "reason", "waited_s",
        "edited"}``."""
        return {
            "type": self.type,
            "id": self.id,
            "name": self.name,
            "decision": self.decision,
            "reason": self.reason,
            "waited_s": self.waited_s,
            "edited": self.edited,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStartedEvent:
    """A committed call started running."""

    type: ClassVar[str] = "tool_started"
    id: str
    """The call id."""
    name: str
    """The tool name."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "tool_started", "id", "name"}``."""
        return {"type": self.type, "id": self.id, "name": self.name}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFinishedEvent:
    """A call's result is known (the tool returned, failed, timed out or was cancelled)."""

    type: ClassVar[str] = "tool_finished"
    id: str
    """The call id."""
    name: str
    """The tool name."""
    is_error: bool
    """True when the result is an error result."""
    error: str | None
    """The error code of an error result (``tool_error``, ``tool_timeout``, ``cancelled``...)."""
    truncated_from: int | None = None
    """The result's UTF-8 size before it was cut to its budget; None when it was not cut."""
    result: str | None = field(default=None, compare=False)
    """The result's text as the model reads it (after the run's redaction and size budget;
    an error result's message), or None when not known. Observers get it whole; the JSON
    form shows a redacted preview (:func:`~toollatch.tools._results.result_preview`). Not
    part of equality (events compared before it existed stay equal)."""
    ui: Any = field(default=None, compare=False)
    """The tool's UI payload (``ToolOutcome.ui``) when it returned one, else None; never
    sent to the model, and not in :meth:`to_json` (a frontend adds it, redacted: the relay
    does). Not part of equality."""

    def to_json(self, *, full_result: bool = False) -> dict[str, Any]:
        """``{"type": "tool_finished", "id", "name", "is_error", "error", "result"}``, plus
        ``"truncated_from"`` (bytes) when the result was cut to its size budget.

        ``result`` is a preview of the result's text (of an error result, its message):
        through the built-in secret redactor, at most ``PREVIEW_CHARS`` characters ending in
        ``…`` when cut, and then ``"result_chars"`` gives the whole text's length; with
        ``full_result`` the whole text (still redacted). None when the text is not known.
        """
        data: dict[str, Any] = {
            "type": self.type,
            "id": self.id,
            "name": self.name,
            "is_error": self.is_error,
            "error": self.error,
        }
        if self.truncated_from is not None:
            data["truncated_from"] = self.truncated_from
        data["result"] = None
        if self.result is not None:
            data["result"] = result_preview(self.result, None if full_result else PREVIEW_CHARS)
            if len(self.result) > PREVIEW_CHARS and not full_result:
                data["result_chars"] = len(self.result)
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundEndedEvent:
    """One model round ended (its calls' results are in, or it was abandoned)."""

    type: ClassVar[str] = "round_ended"
    round: int
    """The round number (1-based)."""
    ended: str
    """How the stream ended (``normal``, ``truncated``, ``interrupted``, ``cancelled``)."""
    stop_reason: str | None
    """The provider's raw stop reason."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "round_ended", "round", "ended", "stop_reason"}``."""
        return {
            "type": self.type,
            "round": self.round,
            "ended": self.ended,
            "stop_reason": self.stop_reason,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEndedEvent:
    """The run ended; always the last event."""

    type: ClassVar[str] = "run_ended"
    rounds: int
    """How many rounds ran."""
    calls: Sequence[Mapping[str, Any]]
    """Every call of the run: ``{"id", "name", "state", "is_error", "error"}``."""
    history: Sequence[Mapping[str, Any]]
    """The final history in the provider's format (valid to send again)."""
    error: str | None = None
    """Why the run stopped early: the model could not be reached or answered an error."""

    def to_json(self) -> dict[str, Any]:
        """``{"type": "run_ended", "rounds", "calls", "history", "error"}``."""
        return {
            "type": self.type,
            "rounds": self.rounds,
            "calls": [dict(c) for c in self.calls],
            "history": [dict(m) for m in self.history],
            "error": self.error,
        }


AgentEvent: TypeAlias = (
    TextEvent
    | CallOpenedEvent
    | CallCommittedEvent
    | CallFailedEvent
    | ApprovalRequestedEvent
    | ApprovalAnsweredEvent
    | ToolStartedEvent
    | ToolFinishedEvent
    | RoundEndedEvent
    | RunEndedEvent
)
"""Any agent event; dispatch on ``type`` or ``isinstance``."""
