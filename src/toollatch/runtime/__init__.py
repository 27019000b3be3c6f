"""The runtime above the pure core: tools from Python functions, the dispatcher that runs
committed calls, model clients over httpx and the agent loop (asyncio; needs the ``[run]``
extra).

Nothing here decides whether a call may run: the core's gate does. The dispatcher accepts
only :class:`toollatch.CommittedCall` objects; an eager call starts early only when the core
returned it as a ``CallReady`` (the provider had moved on from it).

``Agent(client, tools).run(message)`` is the whole loop: ``async for event in run`` gives
the agent events (the vocabulary ``toollatch run --json`` prints). The pieces are usable
alone: :func:`tool` and :class:`Tool`, :class:`Dispatcher`, :func:`model_client`.
"""

from ._agent import Agent, AgentRun, RunLimits, user_message
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
from ._clients import (
    ClientLimits,
    ModelClient,
    ModelConnectError,
    ModelError,
    ModelHTTPError,
    ModelStream,
    RetryPolicy,
    StreamInterrupted,
    StreamTimeout,
    model_client,
)
from ._dispatcher import Dispatcher, DispatchRound
from ._examples import example_tools
from ._tools import Tool, ToolOutcome, tool

__all__ = [
    "Agent",
    "AgentEvent",
    "AgentRun",
    "CallCommittedEvent",
    "CallFailedEvent",
    "CallOpenedEvent",
    "ClientLimits",
    "DispatchRound",
    "Dispatcher",
    "ModelClient",
    "ModelConnectError",
    "ModelError",
    "ModelHTTPError",
    "ModelStream",
    "RetryPolicy",
    "RoundEndedEvent",
    "RunEndedEvent",
    "RunLimits",
    "StreamInterrupted",
    "StreamTimeout",
    "TextEvent",
    "Tool",
    "ToolFinishedEvent",
    "ToolOutcome",
    "ToolStartedEvent",
    "example_tools",
    "model_client",
    "tool",
    "user_message",
]
