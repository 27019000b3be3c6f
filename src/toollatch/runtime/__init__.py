"""The runtime above the pure core: tools from Python functions, the dispatcher that runs
committed calls, model clients over httpx and the agent loop (asyncio; needs the ``[run]``
extra).

Nothing here decides whether a call may run: the core's gate does. The dispatcher accepts
only :class:`toollatch.CommittedCall` objects.
"""

from ._agent_events import (
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

__all__ = [
    "AgentEvent",
    "CallCommittedEvent",
    "CallFailedEvent",
    "CallOpenedEvent",
    "RoundEndedEvent",
    "RunEndedEvent",
    "TextEvent",
    "ToolFinishedEvent",
    "ToolStartedEvent",
]
