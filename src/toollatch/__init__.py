"""toollatch: commit-gated assembly of streamed LLM tool calls.

Nothing executes unless its call is COMMITTED: complete by the protocol's own end signal,
strictly parsed once, schema-valid, allowed by policy and within budget.

This namespace is what a user needs: the parser of one stream (:class:`StreamParser`) and
its result types, the agent loop (:class:`Agent`, ``@tool``, :func:`model_client`) and its
events, every error, every ``*Limits`` type, and the ledger openers (:func:`open_ledger`...).
Each public name has exactly one home. The others:

* :mod:`toollatch.stages`: the stages :class:`StreamParser` composes, for callers who own
  the loop (decoders, adapters, stream events, assembler and gate, partial JSON, round parts,
  history builders);
* :mod:`toollatch.runtime` (the dispatcher, observers, result shaping), :mod:`toollatch.ledger`
  (ledger, history and audit protocols and records), :mod:`toollatch.relay`,
  :mod:`toollatch.mcp`, :mod:`toollatch.scripted` and :mod:`toollatch.testing`.

The names of the runtime, the tools, the ledger and the relay are imported when first used
(they need the ``[run]`` extra), so that ``import toollatch`` needs only the core's
dependencies.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .core._assembler import CallFailed
from .core._errors import (
    ConfigError,
    ErrorCode,
    InvariantBroken,
    StreamDecodeError,
    ToolLatchError,
    UsageError,
)
from .core._events import RoundEnd
from .core._gate import Allow, CommittedCall, Deny, Policy, PolicyDecision, RunBudget
from .core._limits import Limits
from .core._pipeline import StreamParser
from .core._preview import PreviewPolicy, PreviewUpdated, ToolPreview
from .core._round import CallRecord, Round, ToolResult
from .core._specs import ToolSpec, load_tools
from .core._state import CallState

if TYPE_CHECKING:
    from .ledger._open import open_audit, open_history, open_ledger
    from .relay._config import RelayLimits
    from .runtime._agent import Agent, user_message
    from .runtime._agent_events import (
        AgentEvent,
        CallCommittedEvent,
        CallFailedEvent,
        CallOpenedEvent,
        RoundEndedEvent,
        RunEndedEvent,
        TextEvent,
        ToolFinishedEvent,
        ToolStartedEvent,
    )
    from .runtime._agent_run import AgentRun
    from .runtime._approvals import ApprovalPolicy
    from .runtime._clients import (
        ClientLimits,
        ModelClient,
        ModelConnectError,
        ModelError,
        ModelHTTPError,
        ModelResponseError,
        RetryPolicy,
        StreamInterrupted,
        StreamTimeout,
        StreamTooLarge,
        model_client,
    )
    from .runtime._run_setup import RunLimits, ToolSource
    from .tools._results import ResultLimits
    from .tools._tools import Tool, ToolOutcome, schema_tool, tool

__all__ = [
    "Agent",
    "AgentEvent",
    "AgentRun",
    "Allow",
    "ApprovalPolicy",
    "CallCommittedEvent",
    "CallFailed",
    "CallFailedEvent",
    "CallOpenedEvent",
    "CallRecord",
    "CallState",
    "ClientLimits",
    "CommittedCall",
    "ConfigError",
    "Deny",
    "ErrorCode",
    "InvariantBroken",
    "Limits",
    "ModelClient",
    "ModelConnectError",
    "ModelError",
    "ModelHTTPError",
    "ModelResponseError",
    "Policy",
    "PolicyDecision",
    "PreviewPolicy",
    "PreviewUpdated",
    "RelayLimits",
    "ResultLimits",
    "RetryPolicy",
    "Round",
    "RoundEnd",
    "RoundEndedEvent",
    "RunBudget",
    "RunEndedEvent",
    "RunLimits",
    "StreamDecodeError",
    "StreamInterrupted",
    "StreamParser",
    "StreamTimeout",
    "StreamTooLarge",
    "TextEvent",
    "Tool",
    "ToolFinishedEvent",
    "ToolLatchError",
    "ToolOutcome",
    "ToolPreview",
    "ToolResult",
    "ToolSource",
    "ToolSpec",
    "ToolStartedEvent",
    "UsageError",
    "load_tools",
    "model_client",
    "open_audit",
    "open_history",
    "open_ledger",
    "schema_tool",
    "tool",
    "user_message",
]

_LAZY: dict[str, str] = {
    **dict.fromkeys(("open_audit", "open_history", "open_ledger"), ".ledger._open"),
    "ApprovalPolicy": ".runtime._approvals",
    "RelayLimits": ".relay._config",
    **dict.fromkeys(("Agent", "user_message"), ".runtime._agent"),
    "AgentRun": ".runtime._agent_run",
    **dict.fromkeys(("RunLimits", "ToolSource"), ".runtime._run_setup"),
    **dict.fromkeys(
        (
            "AgentEvent",
            "CallCommittedEvent",
            "CallFailedEvent",
            "CallOpenedEvent",
            "RoundEndedEvent",
            "RunEndedEvent",
            "TextEvent",
            "ToolFinishedEvent",
            "ToolStartedEvent",
        ),
        ".runtime._agent_events",
    ),
    **dict.fromkeys(
        (
            "ClientLimits",
            "ModelClient",
            "ModelConnectError",
            "ModelError",
            "ModelHTTPError",
            "ModelResponseError",
            "RetryPolicy",
            "StreamInterrupted",
            "StreamTimeout",
            "StreamTooLarge",
            "model_client",
        ),
        ".runtime._clients",
    ),
    "ResultLimits": ".tools._results",
    **dict.fromkeys(("Tool", "ToolOutcome", "schema_tool", "tool"), ".tools._tools"),
}
"""Where each name above the core is defined (the same modules as the imports for type
checkers above); imported on first use, because the runtime needs the ``[run]`` extra."""


def __getattr__(name: str) -> Any:
    """A name of the runtime, the tools, the ledger or the relay, imported when first used
    (then kept in this module), so that the core imports without the ``[run]`` extra."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'toollatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily imported ones included."""
    return sorted({*globals(), *__all__})
