"""toollatch: commit-gated assembly of streamed LLM tool calls.

Nothing executes unless its call is COMMITTED: complete by the protocol's own end signal,
strictly parsed once, schema-valid, allowed by policy and within budget.
"""

from ._assembler import Assembler, CallFailed, Notice
from ._errors import (
    ConfigError,
    ErrorCode,
    InvariantBroken,
    StreamDecodeError,
    ToolLatchError,
    UsageError,
)
from ._events import AnomalyKind, CallKey, Frame, RoundEnd
from ._eventstream import EventStreamDecoder
from ._gate import Allow, CommittedCall, Deny, Gate, Policy, PolicyDecision, Rejection, RunBudget
from ._limits import Limits
from ._lines import JSONLinesDecoder
from ._partial_json import PartialJSON, PathDelta
from ._pipeline import StreamParser
from ._preview import PreviewPolicy, PreviewUpdated, ToolPreview
from ._registry import adapter_class, detect, providers
from ._round import CallRecord, Choice, Round, Segment, TextSegment, ToolResult
from ._specs import ToolSpec, load_tools
from ._sse import SSEDecoder
from ._state import CallState

__all__ = [
    "Allow",
    "AnomalyKind",
    "Assembler",
    "CallFailed",
    "CallKey",
    "CallRecord",
    "CallState",
    "Choice",
    "CommittedCall",
    "ConfigError",
    "Deny",
    "ErrorCode",
    "EventStreamDecoder",
    "Frame",
    "Gate",
    "InvariantBroken",
    "JSONLinesDecoder",
    "Limits",
    "Notice",
    "PartialJSON",
    "PathDelta",
    "Policy",
    "PolicyDecision",
    "PreviewPolicy",
    "PreviewUpdated",
    "Rejection",
    "Round",
    "RoundEnd",
    "RunBudget",
    "SSEDecoder",
    "Segment",
    "StreamDecodeError",
    "StreamParser",
    "TextSegment",
    "ToolLatchError",
    "ToolPreview",
    "ToolResult",
    "ToolSpec",
    "UsageError",
    "adapter_class",
    "detect",
    "load_tools",
    "providers",
]
