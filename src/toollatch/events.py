"""The stream-event vocabulary (public namespace: re-exports only)."""

from ._assembler import CallFailed, Notice
from ._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallClosed,
    CallIdentified,
    CallKey,
    CallOpened,
    Ending,
    Frame,
    ReasoningBlock,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)

__all__ = [
    "Anomaly",
    "AnomalyKind",
    "ArgsDelta",
    "CallClosed",
    "CallFailed",
    "CallIdentified",
    "CallKey",
    "CallOpened",
    "Ending",
    "Frame",
    "Notice",
    "ReasoningBlock",
    "RoundEnded",
    "ServerToolBlock",
    "StreamEvent",
    "StreamFailed",
    "TextDelta",
    "UsageReported",
]
