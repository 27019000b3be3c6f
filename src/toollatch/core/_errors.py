"""Typed errors and the stable error codes.

Who is at fault decides the channel:

* the caller misused the API -> :class:`UsageError` / :class:`ConfigError` (raised);
* the model or the provider misbehaved -> never raised out of the core: it becomes an
  ``Anomaly`` event and a failed call carrying an :class:`ErrorCode`;
* a bug in toollatch -> :class:`InvariantBroken` (raised).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable machine-readable reasons a call did not run (or failed while running).

    The string values are a public contract: they appear in error results sent back to the
    model, in ``toollatch replay --format json`` output and in metrics. Never rename one.
    """

    INVALID_JSON = "invalid_json"
    ARGUMENTS_NOT_OBJECT = "arguments_not_object"
    ARGUMENTS_EXCEED_MAX_BYTES = "arguments_exceed_max_bytes"
    DEPTH_EXCEEDED = "depth_exceeded"
    TOO_MANY_TOOL_CALLS = "too_many_tool_calls"
    MISSING_ID_OR_NAME = "missing_id_or_name"
    UNKNOWN_TOOL = "unknown_tool"
    SCHEMA_VIOLATION = "schema_violation"
    POLICY_DENIED = "policy_denied"
    BUDGET_EXCEEDED = "budget_exceeded"
    TRUNCATED = "truncated"
    STREAM_INTERRUPTED = "stream_interrupted"
    CANCELLED = "cancelled"
    PROTOCOL_VIOLATION = "protocol_violation"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    IDLE_TIMEOUT = "idle_timeout"
    TOOL_ERROR = "tool_error"
    TOOL_TIMEOUT = "tool_timeout"
    OUTCOME_UNKNOWN = "outcome_unknown"
    """The tool was started (or its request was sent) and no answer came: it may have had
    its effect. Never re-run unless the tool is idempotent."""
    LEDGER_UNAVAILABLE = "ledger_unavailable"
    """The durable call ledger could not be reached, so the call was not run."""
    APPROVAL_DENIED = "approval_denied"
    """A person denied the call (its reason follows); it was not run."""
    APPROVAL_EXPIRED = "approval_expired"
    """Nobody answered the call (an approval, or a client tool's result) in time; it was
    not run."""


class ToolLatchError(Exception):
    """Base class of every exception toollatch raises on purpose."""


class UsageError(ToolLatchError):
    """The caller used the API in a way its contract forbids (e.g. feeding a finished stage)."""


class ConfigError(ToolLatchError):
    """A configuration value is invalid: a limit out of range, a malformed tool definition."""


class StreamDecodeError(ToolLatchError):
    """Bytes that cannot be framed: a line or event over its size limit, a corrupt binary frame.

    Raised by the pure decoders; :class:`toollatch.StreamParser` turns it into a failed
    stream (``StreamFailed`` + ``Anomaly``) so that it never escapes a replay or a client.
    """


class InvariantBroken(ToolLatchError):
    """A bug in toollatch: an internal rule that must always hold did not. Please report it."""
