"""Prometheus metrics of the tool path (internal; the ``[metrics]`` extra).

:class:`Metrics` is an :class:`AgentObserver`: pass it to ``Agent(observers=[metrics])``.
Each instance has its own ``CollectorRegistry`` (two agents, or two tests, never share
counts); serve it with :meth:`Metrics.asgi_app` (the relay mounts it at ``/metrics``) or
write :meth:`Metrics.exposition` yourself. Labels are low-cardinality by construction:
``provider`` (five values), an error code or anomaly kind (closed enums), an outcome, and
the tool name only with ``tool_names`` (yours, so their number is known).
Never an argument value, a call id or a text.

A call is timed with the monotonic clock from its close (the core's ``CallComplete``) to
its commit (``CallReady`` for an eager call, the decided Round otherwise) and to its start
(``tool_started``): the eager saving is the ``early="true"`` series of
``tool_close_to_start_seconds`` against the ``early="false"`` one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.asgi import make_asgi_app

from .._errors import ErrorCode
from .._events import CallKey
from .._gate import CommittedCall
from .._preview import PreviewUpdated
from .._round import Round
from ..assembly import CallComplete, CallReady
from ._agent_events import AgentEvent, RoundEndedEvent, ToolFinishedEvent, ToolStartedEvent

_BYTES = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The tool path's metrics in a registry of their own (see the module docstring).

    ``tool_names``: add a ``tool`` label to the per-tool series (run time, rejections), with
    these names; any other name the model sends is ``other`` (the model picks names, so an
    open label would let it grow the series without bound).
    ``clock``: a monotonic clock in seconds (tests may pass their own).
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        tool_names: Collection[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.tool_names = None if tool_names is None else frozenset(tool_names)
        self._clock = clock
        self._closed: dict[CallKey, float] = {}
        self._closed_by_id: dict[str, float] = {}
        self._started: dict[str, float] = {}
        self._early: set[str] = set()
        self._children: dict[tuple[Any, ...], Any] = {}
        self._define()

    def _define(self) -> None:
        r, tool = self.registry, ("tool",) if self.tool_names is not None else ()
        self.args_bytes = Histogram(
            "tool_assemble_args_bytes", "Argument bytes of each decided call (not overflowed).",
            ("provider",), buckets=_BYTES, registry=r,
        )  # fmt: skip
        self.invalid_json = Counter(
            "tool_assemble_invalid_json", "Calls failed invalid_json.", ("provider",), registry=r
        )
        self.overflow = Counter(
            "tool_assemble_overflow", "Calls past the argument size limit.", ("provider",),
            registry=r,
        )  # fmt: skip
        self.to_commit = Histogram(
            "tool_assemble_to_commit_seconds", "From a call's close to its commit.",
            ("provider", "early"), buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.not_committed = Counter(
            "tool_execute_rejected_not_committed",
            "Attempts to run a call that was not committed (must stay 0).", ("provider",),
            registry=r,
        )  # fmt: skip
        self.rejections = Counter(
            "tool_gate_rejections", "Calls that did not commit, by error code.",
            ("provider", "code", *tool), registry=r,
        )  # fmt: skip
        self.anomalies = Counter(
            "tool_stream_anomalies", "Provider misbehaviour recorded, by kind.",
            ("provider", "kind"), registry=r,
        )  # fmt: skip
        self.run_seconds = Histogram(
            "tool_execute_seconds", "Tool run time, by outcome (ok or the error code).",
            ("provider", "outcome", *tool), buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.close_to_start = Histogram(
            "tool_close_to_start_seconds", "From a call's close to its tool start.",
            ("provider", "early"), buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.preview_bytes = Histogram(
            "tool_preview_bytes", "Argument bytes a call's last preview covered.",
            ("provider",), buckets=_BYTES, registry=r,
        )  # fmt: skip
        self.rounds = Counter(
            "tool_rounds", "Model rounds, by how they ended.", ("provider", "ended"), registry=r
        )
        for provider in ("openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"):
            self.not_committed.labels(provider)  # exported as 0 from the start

    # -- AgentObserver ---------------------------------------------------------------------

    def on_round_start(self, provider: str, round_no: int) -> None:
        """A new round: forget the last one's clocks (memory stays per round)."""
        self._closed.clear()
        self._closed_by_id.clear()
        self._started.clear()
        self._early.clear()

    def on_notice(self, provider: str, notice: object) -> None:
        """Close times (``CallComplete``), eager commits, final previews."""
        now = self._clock()
        if isinstance(notice, CallComplete):
            self._closed.setdefault(notice.key, now)
        elif isinstance(notice, CallReady) and isinstance(notice.call, CommittedCall):
            self._early.add(notice.call.call_id)
            self._commit(provider, notice.call.key, notice.call.call_id, now, early=True)
        elif isinstance(notice, PreviewUpdated) and notice.final:
            self._child(self.preview_bytes, provider).observe(notice.bytes_so_far)

    def on_round(self, provider: str, round_: Round) -> None:
        """Sizes, gate rejections, anomalies and batch commits of a decided round."""
        now = self._clock()
        for anomaly in round_.anomalies:
            self._child(self.anomalies, provider, str(anomaly.kind)).inc()
        for call in round_.calls:
            if call.error is not ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES:
                # (an overflowed call's count stops where it failed: its size is unknown)
                self._child(self.args_bytes, provider).observe(call.argument_bytes)
            if call.committed is not None:
                if not call.early:
                    self._commit(provider, call.key, call.call_id, now, early=False)
                continue
            code = call.error or ErrorCode.PROTOCOL_VIOLATION
            self._child(self.rejections, provider, str(code), *self._tool(call.name)).inc()
            if code is ErrorCode.INVALID_JSON:
                self._child(self.invalid_json, provider).inc()
            elif code is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES:
                self._child(self.overflow, provider).inc()

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """Tool start and run times, rounds."""
        now = self._clock()
        if isinstance(event, ToolStartedEvent):
            self._started[event.id] = now
            closed = self._closed_by_id.get(event.id)
            if closed is not None:
                early = "true" if event.id in self._early else "false"
                self._child(self.close_to_start, provider, early).observe(now - closed)
        elif isinstance(event, ToolFinishedEvent):
            started = self._started.pop(event.id, None)
            if started is not None:
                outcome = event.error or "ok"
                labels = (provider, outcome, *self._tool(event.name))
                self._child(self.run_seconds, *labels).observe(now - started)
        elif isinstance(event, RoundEndedEvent):
            self._child(self.rounds, provider, event.ended).inc()

    def on_not_committed(self, provider: str, detail: str) -> None:
        """Count it: this is the number that must stay 0."""
        self._child(self.not_committed, provider).inc()

    # -- export ----------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)

    def asgi_app(self) -> Any:
        """An ASGI app serving :meth:`exposition` (mount it at ``/metrics``)."""
        return make_asgi_app(self.registry)

    def _commit(
        self, provider: str, key: CallKey, call_id: str, now: float, *, early: bool
    ) -> None:
        closed = self._closed.get(key)
        if closed is None:
            closed = now  # a call that arrived whole (no separate close): commit at once
        self._closed_by_id[call_id] = closed
        self._child(self.to_commit, provider, "true" if early else "false").observe(now - closed)

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: prometheus-client's lookup takes ~7 us, a
        third of a round's metrics cost (the label sets are few, so the cache is small)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _tool(self, name: str | None) -> tuple[str, ...]:
        if self.tool_names is None:
            return ()
        return (name if name in self.tool_names else "other",)
