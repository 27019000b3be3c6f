"""The runtime's parts for callers who assemble their own loop, and its observers (asyncio;
needs the ``[run]`` extra).

The agent loop itself (``Agent``, ``AgentRun``, ``@tool``, ``Tool``, ``model_client``, the
agent events, the model errors and every ``*Limits``) is in :mod:`toollatch`. Here:
:class:`Dispatcher` (runs :class:`toollatch.CommittedCall` objects, and an eager call only
when the core returned it as a ``CallReady``) and one round's :class:`DispatchRound`;
:class:`ModelStream`, what ``ModelClient.stream`` yields, and :class:`IdleDeadline`, the
idle deadline of its reads (one timer per stream, not one per read; the proxy's too); the
observers that watch a run
(:class:`AgentObserver`, :class:`Metrics`, :class:`Tracing`, :class:`RedactedLog`,
:class:`JsonFormatter`, :func:`configure_logging`); result shaping (:func:`redact_result`,
:func:`truncate_result` and their constants); :func:`example_tools`; and the whole-app
configuration (:class:`Config`, :func:`load_config`, ``CONFIG_EXAMPLE``); and the events of
calls that wait for a person or a client (:class:`ApprovalRequestedEvent`,
:class:`ApprovalAnsweredEvent`; agent events like those in :mod:`toollatch`, here because the
top level is full) with what a ``needs_approval`` function is told (:class:`ApprovalContext`).

Nothing here decides whether a call may run: the core's gate does.
"""

from typing import TYPE_CHECKING, Any

from ..core._redact import redact_result
from ..tools._examples import example_tools
from ..tools._results import DEFAULT_MAX_RESULT_BYTES, MIN_RESULT_BYTES, truncate_result
from ..tools._tools import ApprovalContext
from ._agent_events import ApprovalAnsweredEvent, ApprovalRequestedEvent
from ._clients import ModelStream
from ._clients._deadline import IdleDeadline
from ._dispatcher import Dispatcher, DispatchRound
from ._logs import JsonFormatter, RedactedLog, configure_logging
from ._observer import AgentObserver
from ._recorder import Recorder

__all__ = [
    "CONFIG_EXAMPLE",
    "DEFAULT_MAX_RESULT_BYTES",
    "MIN_RESULT_BYTES",
    "AgentObserver",
    "ApprovalAnsweredEvent",
    "ApprovalContext",
    "ApprovalRequestedEvent",
    "Config",
    "DispatchRound",
    "Dispatcher",
    "DurableRuns",
    "IdleDeadline",
    "JsonFormatter",
    "Metrics",
    "ModelStream",
    "Recorder",
    "RedactedLog",
    "Tracing",
    "configure_logging",
    "example_tools",
    "load_config",
    "redact_result",
    "truncate_result",
]

if TYPE_CHECKING:
    from ..cli._app_config import EXAMPLE as CONFIG_EXAMPLE
    from ..cli._app_config import Config, load_config
    from ._durable import DurableRuns
    from ._metrics import Metrics
    from ._telemetry import Tracing

_CONFIG_NAMES = frozenset({"CONFIG_EXAMPLE", "Config", "load_config"})
"""The whole-app configuration (it reads every layer's settings, ``mcp`` and the ledger's
too), kept importable from here but imported only when used: the runtime imports nothing
of the layers above it."""


def __getattr__(name: str) -> Any:
    """``Metrics`` (the ``[metrics]`` extra), ``Tracing`` (the ``[otel]`` extra) and
    ``DurableRuns`` (the ``[durable]`` extra: agent runs as DBOS workflows) are
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
    if name == "DurableRuns":
        from ._durable import DurableRuns  # noqa: PLC0415 (lazily: dbos is the durable extra)

        return DurableRuns
    raise AttributeError(f"module 'toollatch.runtime' has no attribute {name!r}")
