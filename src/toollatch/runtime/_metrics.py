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

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import metrics as _prometheus_metrics
from prometheus_client.asgi import make_asgi_app
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..core._assembler import CallComplete, CallReady
from ..core._errors import ErrorCode
from ..core._events import CallKey
from ..core._gate import CommittedCall
from ..core._preview import PreviewUpdated
from ..core._round import Round
from ._agent_events import (
    AgentEvent,
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    RoundEndedEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
)

_BYTES = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_WAITS = (1, 5, 15, 30, 60, 120, 300, 900, 3600)
"""Buckets of a person's answer (seconds): a click to an hour."""
_PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini", "bedrock")


@dataclass(frozen=True, slots=True)
class _Family:
    """One metric family, defined as prometheus-client's ``Counter``/``Histogram`` would be:
    ``name`` without ``_total``; ``bounds``: a histogram's upper bounds, ``+Inf`` last."""

    name: str
    help: str
    kind: str  # "counter" or "histogram"
    labels: tuple[str, ...]
    bounds: tuple[float, ...] = ()

    def histogram_le(self) -> tuple[str, ...]:
        """The ``le`` label of each bucket, spelt as prometheus-client spells it."""
        return tuple(floatToGoString(b) for b in self.bounds)  # type: ignore[no-untyped-call]


def _families(tool: tuple[str, ...]) -> tuple[_Family, ...]:
    """The exposition's families, in the order ``/metrics`` lists them."""
    b, s, inf = (*_BYTES, float("inf")), (*_SECONDS, float("inf")), "histogram"
    return (
        _Family("tool_assemble_args_bytes",
                "Argument bytes of each decided call (not overflowed).", inf, ("provider",), b),
        _Family("tool_assemble_invalid_json", "Calls failed invalid_json.", "counter",
                ("provider",)),
        _Family("tool_assemble_overflow", "Calls past the argument size limit.", "counter",
                ("provider",)),
        _Family("tool_assemble_to_commit_seconds", "From a call's close to its commit.", inf,
                ("provider", "early"), s),
        _Family("tool_execute_rejected_not_committed",
                "Attempts to run a call that was not committed (must stay 0).", "counter",
                ("provider",)),
        _Family("tool_gate_rejections", "Calls that did not commit, by error code.", "counter",
                ("provider", "code", *tool)),
        _Family("tool_stream_anomalies", "Provider misbehaviour recorded, by kind.", "counter",
                ("provider", "kind")),
        _Family("tool_execute_seconds", "Tool run time, by outcome (ok or the error code).",
                inf, ("provider", "outcome", *tool), s),
        _Family("tool_close_to_start_seconds", "From a call's close to its tool start.", inf,
                ("provider", "early"), s),
        _Family("tool_preview_bytes", "Argument bytes a call's last preview covered.", inf,
                ("provider",), b),
        _Family("tool_rounds", "Model rounds, by how they ended.", "counter",
                ("provider", "ended")),
        _Family("tool_approval_wait_seconds",
                "How long a call waited for a person (or a client's result), by answer.", inf,
                ("provider", "decision", *tool), (*_WAITS, float("inf"))),
    )  # fmt: skip


class _Count:
    """A counter series in plain Python: the loop is its only writer (observers run inside
    it), so prometheus-client's lock per increment buys nothing here."""

    __slots__ = ("created", "value")

    def __init__(self, family: _Family) -> None:
        self.value = 0.0
        self.created = time.time()  # (what prometheus-client exports as ``_created``)

    def inc(self) -> None:
        """Add one."""
        self.value += 1.0


class _Buckets:
    """A histogram series in plain Python: one bisect instead of prometheus-client's lock
    and Python loop over the bounds (counts per bucket, cumulated only when scraped)."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, family: _Family) -> None:
        self.bounds = family.bounds
        self.counts = [0.0] * len(family.bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose bound is >= it (``le``)."""
        self.sum += amount
        self.counts[bisect_left(self.bounds, amount)] += 1.0


class _Collector:
    """Yields the families from the plain series, sample for sample what prometheus-client's
    own ``Counter``/``Histogram`` would (tests/test_metrics_exposition.py compares the text)."""

    def __init__(self, families: tuple[_Family, ...]) -> None:
        self.families = families
        self.series: dict[str, dict[tuple[str, ...], Any]] = {f.name: {} for f in families}
        self.lock = threading.Lock()  # a scrape from another thread vs a new series

    def describe(self) -> Iterator[Metric]:
        """The families without samples (the registry checks their names at register)."""
        for family in self.families:
            yield Metric(family.name, family.help, family.kind)

    def collect(self) -> Iterator[Metric]:
        """Every family and its series, in the order they were first touched."""
        # prometheus-client's switch for _created (PROMETHEUS_DISABLE_CREATED_SERIES,
        # disable_created_metrics()); read where its own metrics read it.
        created = getattr(_prometheus_metrics, "_use_created", True)
        for family in self.families:
            with self.lock:
                series = list(self.series[family.name].items())
            if family.kind == "counter":
                yield _counter_family(family, series, created)
            else:
                yield _histogram_family(family, series, created)


def _counter_family(
    family: _Family, series: list[tuple[tuple[str, ...], Any]], created: bool
) -> Metric:
    metric = CounterMetricFamily(family.name, family.help, labels=family.labels)
    for labels, count in series:
        metric.add_metric(labels, count.value, count.created if created else None)
    return metric


def _histogram_family(
    family: _Family, series: list[tuple[tuple[str, ...], Any]], created: bool
) -> Metric:
    metric = HistogramMetricFamily(family.name, family.help, labels=family.labels)
    le = family.histogram_le()
    for labels, hist in series:
        cumulative, acc = [], 0.0
        for bound, count in zip(le, list(hist.counts), strict=True):
            acc += count
            cumulative.append((bound, acc))
        metric.add_metric(labels, cumulative, hist.sum)
        if created:
            named = dict(zip(family.labels, labels, strict=True))
            metric.add_sample(family.name + "_created", named, hist.created)
    return metric


class Metrics:
    """The tool path's metrics in a registry of their own (see the module docstring).

    ``tool_names``: add a ``tool`` label to the per-tool series (run time, rejections), with
    these names; any other name the model sends is ``other`` (the model picks names, so an
    open label would let it grow the series without bound).
    ``clock``: a monotonic clock in seconds (tests may pass their own).
    The observer methods are called by the agent loop (one thread); scraping
    (:meth:`exposition`, :meth:`asgi_app`, the registry) may happen from any thread.
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
        self._children: dict[tuple[str, ...], Any] = {}
        families = _families(("tool",) if self.tool_names is not None else ())
        self._family = {f.name: f for f in families}
        self._collector = _Collector(families)
        self.registry.register(self._collector)
        for provider in _PROVIDERS:
            self._child("tool_execute_rejected_not_committed", provider)  # exported as 0

    # -- AgentObserver ---------------------------------------------------------------------

    def on_round_start(self, provider: str, round_no: int) -> None:
        """A new round: forget the last one's clocks (memory stays per round)."""
        self._closed.clear()
        self._closed_by_id.clear()
        self._started.clear()
        self._early.clear()

    def on_notice(self, provider: str, notice: object) -> None:
        """Close times (``CallComplete``), eager commits, final previews."""
        # (the clock is read only where it is used: most notices are not timed)
        if isinstance(notice, CallComplete):
            self._closed.setdefault(notice.key, self._clock())
        elif isinstance(notice, CallReady) and isinstance(notice.call, CommittedCall):
            self._early.add(notice.call.call_id)
            now = self._clock()
            self._commit(provider, notice.call.key, notice.call.call_id, now, early=True)
        elif isinstance(notice, PreviewUpdated) and notice.final:
            self._child("tool_preview_bytes", provider).observe(notice.bytes_so_far)

    def on_round(self, provider: str, round_: Round) -> None:
        """Sizes, gate rejections, anomalies and batch commits of a decided round."""
        now = self._clock()
        for anomaly in round_.anomalies:
            key: tuple[str, ...] = ("tool_stream_anomalies", provider, str(anomaly.kind))
            (self._children.get(key) or self._child(*key)).inc()
        for call in round_.calls:
            if call.error is not ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES:
                # (an overflowed call's count stops where it failed: its size is unknown)
                key = ("tool_assemble_args_bytes", provider)
                (self._children.get(key) or self._child(*key)).observe(call.argument_bytes)
            if call.committed is not None:
                if not call.early:
                    self._commit(provider, call.key, call.call_id, now, early=False)
                continue
            code = call.error or ErrorCode.PROTOCOL_VIOLATION
            self._child("tool_gate_rejections", provider, str(code), *self._tool(call.name)).inc()
            if code is ErrorCode.INVALID_JSON:
                self._child("tool_assemble_invalid_json", provider).inc()
            elif code is ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES:
                self._child("tool_assemble_overflow", provider).inc()

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """Tool start and run times, rounds."""
        if isinstance(event, ToolStartedEvent):
            self._started[event.id] = now = self._clock()
            closed = self._closed_by_id.get(event.id)
            if closed is not None:
                early = "true" if event.id in self._early else "false"
                key: tuple[str, ...] = ("tool_close_to_start_seconds", provider, early)
                (self._children.get(key) or self._child(*key)).observe(now - closed)
        elif isinstance(event, ToolFinishedEvent):
            started = self._started.pop(event.id, None)
            if started is not None:
                labels = (provider, event.error or "ok", *self._tool(event.name))
                key = ("tool_execute_seconds", *labels)
                (self._children.get(key) or self._child(*key)).observe(self._clock() - started)
        elif isinstance(event, RoundEndedEvent):
            key = ("tool_rounds", provider, event.ended)
            (self._children.get(key) or self._child(*key)).inc()
        elif isinstance(event, ApprovalRequestedEvent):
            # its close-to-start time would be a person's: tool_approval_wait_seconds has it
            self._closed_by_id.pop(event.id, None)
        elif isinstance(event, ApprovalAnsweredEvent):
            labels = (provider, event.decision, *self._tool(event.name))
            self._child("tool_approval_wait_seconds", *labels).observe(event.waited_s)

    def on_not_committed(self, provider: str, detail: str) -> None:
        """Count it: this is the number that must stay 0."""
        self._child("tool_execute_rejected_not_committed", provider).inc()

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
        early_label = "true" if early else "false"
        series = ("tool_assemble_to_commit_seconds", provider, early_label)
        (self._children.get(series) or self._child(*series)).observe(now - closed)

    def _child(self, name: str, *labels: str) -> Any:
        """The series of family ``name`` with these label values (made at first use).

        The observer methods look ``(name, *labels)`` up in ``_children`` themselves and
        call this only on a miss: a Python call per series touched is a tenth of a round's
        metrics cost."""
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child(self._family[name], labels)
        return child

    def _new_child(self, family: _Family, labels: tuple[str, ...]) -> Any:
        """A new plain series, listed for scrapes (the reference test overrides this)."""
        child = _Count(family) if family.kind == "counter" else _Buckets(family)
        with self._collector.lock:
            self._collector.series[family.name][labels] = child
        return child

    def _tool(self, name: str | None) -> tuple[str, ...]:
        if self.tool_names is None:
            return ()
        return (name if name in self.tool_names else "other",)
