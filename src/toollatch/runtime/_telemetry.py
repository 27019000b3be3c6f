"""OpenTelemetry spans of the tool path (internal; needs the ``[otel]`` extra; redacted logs
are in ``_logs``).

:class:`Tracing` is an :class:`AgentObserver` for ``Agent(observers=[...])``: a
``toollatch.run`` span per run, a ``toollatch.round`` span per round under it, a
``toollatch.tool_call`` span per call under its round, from the call's opening to its result.
The gate's decision is in attributes (``toollatch.gate.decision`` ``committed``/``failed``,
``toollatch.gate.error_code``, ``toollatch.gate.early``), with sizes
(``toollatch.call.argument_bytes``), never an argument value, a text or an error detail (a
schema error's detail may quote a value). A call that waited for a person or a client has
the event ``toollatch.approval.requested`` (``toollatch.client.requested``) and, once
answered, ``toollatch.approval.waited_s`` (seconds from the question to its answer, by the
dispatcher's clock), ``toollatch.approval.decision`` and ``toollatch.approval.edited``; its
``execute_tool`` span, if it ran, starts after the wait.

The OpenTelemetry GenAI semantic conventions (status Development) are emitted too, so a
tracing backend groups our tool calls like any agent framework's: each execution of a tool
(``tool_started`` to ``tool_finished``) is a span ``execute_tool {gen_ai.tool.name}`` (kind
INTERNAL) under the call's ``toollatch.tool_call`` span, with ``gen_ai.operation.name`` =
``execute_tool``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``error.type`` (our stable
error code: ``tool_error``, ``tool_timeout``, ``cancelled``, ``outcome_unknown``...) on a
failed one, and our ``toollatch.call.id`` / ``toollatch.tool`` / ``toollatch.tool.outcome``
as extras; and the histogram ``gen_ai.execute_tool.duration`` (unit ``s``, the span's own
duration, with ``gen_ai.operation.name``, ``gen_ai.tool.name`` and ``error.type``). A call
the gate refused, or whose result came without running it here (a stored result, a cancel
before it started), has no ``execute_tool`` span: it executed nothing.
Names and units from https://github.com/open-telemetry/semantic-conventions-genai
(model/gen-ai/spans.yaml, model/gen-ai/metrics.yaml: "the metric value SHOULD be the same
as the span duration").
"""

from __future__ import annotations

import time

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from ..core._round import Round
from ._agent_events import (
    AgentEvent,
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    CallCommittedEvent,
    CallFailedEvent,
    CallOpenedEvent,
    RoundEndedEvent,
    RunEndedEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
)
from ._logs import _size

EXECUTE_TOOL = "execute_tool"
"""``gen_ai.operation.name`` of a tool's execution (the GenAI semantic conventions)."""
EXECUTE_TOOL_DURATION = "gen_ai.execute_tool.duration"
"""The GenAI histogram of tool execution durations, in seconds."""


class Tracing:
    """Spans of runs, rounds and tool calls, and the GenAI ``execute_tool`` spans and
    duration histogram (see the module docstring); ``tracer_provider`` and
    ``meter_provider`` default to the global ones."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("toollatch", tracer_provider=tracer_provider)
        meter = metrics.get_meter("toollatch", meter_provider=meter_provider)
        self._duration = meter.create_histogram(
            EXECUTE_TOOL_DURATION, unit="s", description="The duration of a single tool execution."
        )
        self._run: Span | None = None
        self._round: Span | None = None
        self._calls: dict[str, Span] = {}
        self._executions: dict[str, tuple[Span, int, str]] = {}  # id -> span, start ns, tool

    def on_round_start(self, provider: str, round_no: int) -> None:
        """Open the run span (first round) and the round's span."""
        if self._run is None:
            self._run = self._tracer.start_span(
                "toollatch.run", attributes={"toollatch.provider": provider}
            )
        context = trace.set_span_in_context(self._run)
        self._round = self._tracer.start_span(
            "toollatch.round",
            context=context,
            attributes={"toollatch.provider": provider, "toollatch.round": round_no},
        )

    def on_notice(self, provider: str, notice: object) -> None:
        """Notices are not spans (the events carry what a span needs)."""

    def on_round(self, provider: str, round_: Round) -> None:
        """The round's anomaly count and call count."""
        if self._round is not None:
            self._round.set_attribute("toollatch.round.calls", len(round_.calls))
            self._round.set_attribute("toollatch.round.anomalies", len(round_.anomalies))

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """Open, decorate and close spans as the events come."""
        if isinstance(event, CallOpenedEvent) and event.id is not None:
            self._call(event.id, event.name)
        elif isinstance(event, CallCommittedEvent):
            span = self._call(event.id, event.name)
            span.set_attribute("toollatch.gate.decision", "committed")
            span.set_attribute("toollatch.gate.early", event.early)
            span.set_attribute("toollatch.call.argument_bytes", _size(event.arguments))
        elif isinstance(event, CallFailedEvent):
            span = self._call(event.id, event.name)
            span.set_attribute("toollatch.gate.decision", "failed")
            span.set_attribute("toollatch.gate.error_code", event.error)
            span.set_status(Status(StatusCode.ERROR, event.error))
            self._calls.pop(event.id).end()
        elif isinstance(event, ApprovalRequestedEvent):
            self._call(event.id, event.name).add_event(f"toollatch.{event.kind}.requested")
        elif isinstance(event, ApprovalAnsweredEvent):
            span = self._call(event.id, event.name)
            span.set_attribute("toollatch.approval.waited_s", event.waited_s)
            span.set_attribute("toollatch.approval.decision", event.decision)
            span.set_attribute("toollatch.approval.edited", event.edited)
        elif isinstance(event, ToolStartedEvent):
            self._started(event)
        elif isinstance(event, ToolFinishedEvent):
            self._finished(event)
        elif isinstance(event, RoundEndedEvent):
            self._round_ended(event)
        elif isinstance(event, RunEndedEvent) and self._run is not None:
            self._run.set_attribute("toollatch.run.rounds", event.rounds)
            self._run.set_attribute("toollatch.run.failed", event.error is not None)
            self._run.end()
            self._run = None

    def on_not_committed(self, provider: str, detail: str) -> None:
        """Mark the round: something tried to run an uncommitted call."""
        if self._round is not None:
            self._round.add_event("toollatch.rejected_not_committed")

    def _call(self, call_id: str, name: str | None) -> Span:
        span = self._calls.get(call_id)
        if span is None:
            context = trace.set_span_in_context(self._round) if self._round else None
            span = self._tracer.start_span(
                "toollatch.tool_call",
                context=context,
                attributes={"toollatch.call.id": call_id, "toollatch.tool": name or ""},
            )
            self._calls[call_id] = span
        return span

    def _started(self, event: ToolStartedEvent) -> None:
        call = self._call(event.id, event.name)
        call.add_event("toollatch.tool.started")
        start = time.time_ns()
        span = self._tracer.start_span(
            f"{EXECUTE_TOOL} {event.name}",
            context=trace.set_span_in_context(call),
            kind=SpanKind.INTERNAL,
            start_time=start,
            attributes={
                "gen_ai.operation.name": EXECUTE_TOOL,
                "gen_ai.tool.name": event.name,
                "gen_ai.tool.call.id": event.id,
                "toollatch.call.id": event.id,
                "toollatch.tool": event.name,
            },
        )
        self._executions[event.id] = (span, start, event.name)

    def _executed(self, call_id: str, outcome: str, error: str | None) -> None:
        """End the call's ``execute_tool`` span (if it ran) and record its duration."""
        started = self._executions.pop(call_id, None)
        if started is None:
            return
        span, start, name = started
        span.set_attribute("toollatch.tool.outcome", outcome)
        attributes = {"gen_ai.operation.name": EXECUTE_TOOL, "gen_ai.tool.name": name}
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
            attributes["error.type"] = error
        end = max(time.time_ns(), start)
        span.end(end_time=end)
        self._duration.record((end - start) / 1e9, attributes)

    def _finished(self, event: ToolFinishedEvent) -> None:
        error = (event.error or "tool_error") if event.is_error else None
        self._executed(event.id, event.error or "ok", error)
        span = self._calls.pop(event.id, None)
        if span is None:
            return
        span.set_attribute("toollatch.tool.outcome", event.error or "ok")
        if event.is_error:
            span.set_status(Status(StatusCode.ERROR, event.error or "error"))
        span.end()

    def _round_ended(self, event: RoundEndedEvent) -> None:
        for call_id in list(self._executions):  # (every started call gets its result first)
            self._executed(call_id, "not_run", "not_run")
        for span in self._calls.values():  # committed calls that never ran (aborted)
            span.set_attribute("toollatch.tool.outcome", "not_run")
            span.end()
        self._calls.clear()
        if self._round is not None:
            self._round.set_attribute("toollatch.round.ended", event.ended)
            if event.stop_reason is not None:
                self._round.set_attribute("toollatch.round.stop_reason", event.stop_reason)
            self._round.end()
            self._round = None
