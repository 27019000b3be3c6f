"""toollatch: commit-gated assembly of streamed LLM tool calls.

Nothing executes unless its call is COMMITTED: complete by the protocol's own end signal,
strictly parsed once, schema-valid, allowed by policy and within budget.

The top level is what a user of :class:`StreamParser` needs. The stages it composes, for
callers who own the loop, are in documented submodules: :mod:`toollatch.decoders` (bytes ->
frames), :mod:`toollatch.adapters` (native events -> stream events, provider detection),
:mod:`toollatch.events` (the stream-event vocabulary), :mod:`toollatch.assembly` (the
assembler and the gate), :mod:`toollatch.previews`, :mod:`toollatch.rounds` (every type of a
finalized round), :mod:`toollatch.messages` (history builders), :mod:`toollatch.errors` and
:mod:`toollatch.testing`. The runtime (``@toollatch.tool``, the dispatcher, the agent loop,
model clients) is :mod:`toollatch.runtime`; the scripted model server :mod:`toollatch.scripted`.
"""

from typing import TYPE_CHECKING, Any

from .core._assembler import CallFailed
from .core._errors import ConfigError, ErrorCode, ToolLatchError, UsageError
from .core._events import RoundEnd
from .core._gate import Allow, CommittedCall, Deny, Gate, RunBudget
from .core._limits import Limits
from .core._pipeline import StreamParser
from .core._preview import PreviewPolicy, PreviewUpdated, ToolPreview
from .core._round import CallRecord, Round, ToolResult
from .core._specs import ToolSpec, load_tools
from .core._state import CallState

__all__ = [
    "Allow",
    "CallFailed",
    "CallRecord",
    "CallState",
    "CommittedCall",
    "ConfigError",
    "Deny",
    "ErrorCode",
    "Gate",
    "Limits",
    "PreviewPolicy",
    "PreviewUpdated",
    "Round",
    "RoundEnd",
    "RunBudget",
    "StreamParser",
    "ToolLatchError",
    "ToolPreview",
    "ToolResult",
    "ToolSpec",
    "UsageError",
    "load_tools",
    "tool",
]

if TYPE_CHECKING:
    from .runtime import tool


def __getattr__(name: str) -> Any:
    """``toollatch.tool`` (the decorator of :mod:`toollatch.runtime`, which needs the
    ``[run]`` extra) is imported when first used, so that the core imports without it."""
    if name == "tool":
        from .runtime import tool  # noqa: PLC0415 (lazily: pydantic is an extra)

        return tool
    raise AttributeError(f"module 'toollatch' has no attribute {name!r}")
