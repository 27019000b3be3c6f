"""The runtime above the pure core: tools from Python functions, the dispatcher that runs
committed calls, model clients over httpx and the agent loop (asyncio; needs the ``[run]``
extra).

Nothing here decides whether a call may run: the core's gate does. The dispatcher accepts
only :class:`toollatch.CommittedCall` objects; an eager call starts early only when the core
returned it as a ``CallReady`` (the provider had moved on from it).

``Agent(client, tools).run(message)`` is the whole loop: ``async for event in run`` gives
the agent events (the vocabulary ``toollatch run --json`` prints). The pieces are usable
alone: :func:`tool` and :class:`Tool`, :class:`Dispatcher`, :func:`model_client`. One
validated file configures them (:func:`load_config`); observers (:class:`Metrics`,
:class:`Tracing`, :class:`RedactedLog`) watch a run.
"""

from typing import TYPE_CHECKING, Any

from ..core._redact import redact_result
from ..tools._examples import example_tools
from ..tools._results import (
    DEFAULT_MAX_RESULT_BYTES,
    MIN_RESULT_BYTES,
    ResultLimits,
    truncate_result,
)
from ..tools._tools import Tool, ToolOutcome, schema_tool, tool
from ._agent import Agent, AgentRun, RunLimits, ToolSource, user_message
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
    ModelResponseError,
    ModelStream,
    RetryPolicy,
    StreamInterrupted,
    StreamTimeout,
    StreamTooLarge,
    model_client,
)
from ._dispatcher import Dispatcher, DispatchRound
from ._logs import JsonFormatter, RedactedLog, configure_logging
from ._observer import AgentObserver
from ._recorder import Recorder

__all__ = [
    "CONFIG_EXAMPLE",
    "DEFAULT_MAX_RESULT_BYTES",
    "MIN_RESULT_BYTES",
    "Agent",
    "AgentEvent",
    "AgentObserver",
    "AgentRun",
    "CallCommittedEvent",
    "CallFailedEvent",
    "CallOpenedEvent",
    "ClientLimits",
    "Config",
    "DispatchRound",
    "Dispatcher",
    "JsonFormatter",
    "Metrics",
    "ModelClient",
    "ModelConnectError",
    "ModelError",
    "ModelHTTPError",
    "ModelResponseError",
    "ModelStream",
    "Recorder",
    "RedactedLog",
    "ResultLimits",
    "RetryPolicy",
    "RoundEndedEvent",
    "RunEndedEvent",
    "RunLimits",
    "StreamInterrupted",
    "StreamTimeout",
    "StreamTooLarge",
    "TextEvent",
    "Tool",
    "ToolFinishedEvent",
    "ToolOutcome",
    "ToolSource",
    "ToolStartedEvent",
    "Tracing",
    "configure_logging",
    "example_tools",
    "load_config",
    "model_client",
    "redact_result",
    "schema_tool",
    "tool",
    "truncate_result",
    "user_message",
]

if TYPE_CHECKING:
    from ..cli._app_config import EXAMPLE as CONFIG_EXAMPLE
    from ..cli._app_config import Config, load_config
    from ._metrics import Metrics
    from ._telemetry import Tracing

_CONFIG_NAMES = frozenset({"CONFIG_EXAMPLE", "Config", "load_config"})
"""The whole-app configuration (it reads every layer's settings, ``mcp`` and the ledger's
too), kept importable from here but imported only when used: the runtime imports nothing
of the layers above it."""


def __getattr__(name: str) -> Any:
    """``Metrics`` (the ``[metrics]`` extra) and ``Tracing`` (the ``[otel]`` extra) are
    imported when first used, so that the runtime imports without them; ``Config``,
    ``load_config`` and ``CONFIG_EXAMPLE`` too (the application's configuration)."""
    if name in _CONFIG_NAMES:
        from ..cli._app_config import EXAMPLE, Config, load_config  # noqa: PLC0415 (the app layer's)

        return {"CONFIG_EXAMPLE": EXAMPLE, "Config": Config, "load_config": load_config}[name]
    if name == "Metrics":
        from ._metrics import Metrics  # noqa: PLC0415 (lazily: prometheus-client is an extra)

        return Metrics
    if name == "Tracing":
        from ._telemetry import Tracing  # noqa: PLC0415 (lazily: opentelemetry is an extra)

        return Tracing
    raise AttributeError(f"module 'toollatch.runtime' has no attribute {name!r}")
