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
    Frame,
    ReasoningBlock,
    RoundEnd,
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
    "Frame",
    "Notice",
    "ReasoningBlock",
    "RoundEnd",
    "RoundEnded",
    "ServerToolBlock",
    "StreamEvent",
    "StreamFailed",
    "TextDelta",
    "UsageReported",
]
