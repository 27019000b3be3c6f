"""The stream-event vocabulary adapters emit and the assembler consumes (public namespace:
re-exports only).

Use it to write an adapter (see :mod:`toollatch.adapters`) or to drive an
:class:`~toollatch.assembly.Assembler` yourself. What ``feed()`` returns to a user (early
failures and previews) is in :mod:`toollatch.assembly`; frames are in :mod:`toollatch.decoders`.
"""

from .core._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    ArgsMeasured,
    CallClosed,
    CallIdentified,
    CallKey,
    CallOpened,
    CallSettled,
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
    "ArgsMeasured",
    "CallClosed",
    "CallIdentified",
    "CallKey",
    "CallOpened",
    "CallSettled",
    "ReasoningBlock",
    "RoundEnd",
    "RoundEnded",
    "ServerToolBlock",
    "StreamEvent",
    "StreamFailed",
    "TextDelta",
    "UsageReported",
]
