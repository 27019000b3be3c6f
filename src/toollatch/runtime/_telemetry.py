"""OpenTelemetry spans and redacted logs of the tool path (internal; spans need the
``[otel]`` extra, logs only the standard library).

Both are :class:`AgentObserver` objects for ``Agent(observers=[...])``.

:class:`Tracing`: a ``toollatch.run`` span per run, a ``toollatch.round`` span per round
under it, a ``toollatch.tool_call`` span per call under its round, from the call's opening
to its result. The gate's decision is in attributes (``toollatch.gate.decision``
``committed``/``failed``, ``toollatch.gate.error_code``, ``toollatch.gate.early``), with sizes
(``toollatch.call.argument_bytes``), never an argument value, a text or an error detail (a
schema error's detail may quote a value).

:class:`RedactedLog`: one log record per agent event on the ``toollatch`` logger, with ids,
tool names, error codes and sizes only; argument values appear only where the preview
policy shows them (``full``: all; ``fields``: those pointers; ``none``, the default: none).
:class:`JsonFormatter` writes one JSON object per line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from .._preview import PreviewPolicy
from .._round import Round
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


def _size(arguments: Mapping[str, Any]) -> int:
    return len(json.dumps(arguments, ensure_ascii=False, separators=(",", ":")).encode())


class Tracing:
    """Spans of runs, rounds and tool calls (see the module docstring); ``tracer_provider``
    defaults to the global one."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("toollatch", tracer_provider=tracer_provider)
        self._run: Span | None = None
        self._round: Span | None = None
        self._calls: dict[str, Span] = {}

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
        elif isinstance(event, ToolStartedEvent):
            self._call(event.id, event.name).add_event("toollatch.tool.started")
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

    def _finished(self, event: ToolFinishedEvent) -> None:
        span = self._calls.pop(event.id, None)
        if span is None:
            return
        span.set_attribute("toollatch.tool.outcome", event.error or "ok")
        if event.is_error:
            span.set_status(Status(StatusCode.ERROR, event.error or "error"))
        span.end()

    def _round_ended(self, event: RoundEndedEvent) -> None:
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


class RedactedLog:
    """One record per agent event on ``logger`` (default ``toollatch``), redacted (see the
    module docstring). Text chunks are logged at DEBUG with their size only."""

    def __init__(
        self, logger: logging.Logger | None = None, *, previews: PreviewPolicy | None = None
    ) -> None:
        self.logger = logger or logging.getLogger("toollatch")
        self.previews = previews

    def on_round_start(self, provider: str, round_no: int) -> None:
        """Log the round's request."""
        self._log(logging.INFO, "round_started", provider=provider, round=round_no)

    def on_notice(self, provider: str, notice: object) -> None:
        """Notices are not logged."""

    def on_round(self, provider: str, round_: Round) -> None:
        """Anomalies by kind (never their detail)."""
        for anomaly in round_.anomalies:
            self._log(logging.WARNING, "anomaly", provider=provider, kind=str(anomaly.kind))

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """The event's redacted fields."""
        if isinstance(event, TextEvent):
            self._log(logging.DEBUG, "text", provider=provider, chars=len(event.text))
            return
        fields: dict[str, Any] = {"provider": provider}
        data = event.to_json()
        for key in ("id", "name", "early", "error", "is_error", "round", "ended", "rounds"):
            if key in data:
                fields[key] = data[key]
        if isinstance(event, CallCommittedEvent):
            fields["argument_bytes"] = _size(event.arguments)
            shown = self._shown(event.name, event.arguments)
            if shown is not None:
                fields["arguments"] = shown
        if isinstance(event, RunEndedEvent):
            fields["calls"] = len(event.calls)
            fields["error"] = None if event.error is None else "model_error"
        failed = isinstance(event, CallFailedEvent) or (
            isinstance(event, ToolFinishedEvent) and event.is_error
        )
        self._log(logging.WARNING if failed else logging.INFO, event.type, **fields)

    def on_not_committed(self, provider: str, detail: str) -> None:
        """An error: a call that was not committed was about to run."""
        self._log(logging.ERROR, "rejected_not_committed", provider=provider)

    def _shown(self, name: str, arguments: Mapping[str, Any]) -> Any:
        if self.previews is None:
            return None
        rule = self.previews.rule(name)
        if rule.mode == "full":
            return dict(arguments)
        if rule.mode == "fields":
            found = {p: _pointer(arguments, p) for p in rule.fields}
            return {p: v for p, v in found.items() if v is not _MISSING}
        return None

    def _log(self, level: int, event: str, **fields: Any) -> None:
        if self.logger.isEnabledFor(level):
            text = " ".join(f"{k}={v}" for k, v in fields.items() if k != "arguments")
            self.logger.log(
                level, "%s %s", event, text, extra={"toollatch": {"event": event, **fields}}
            )


_MISSING = object()


def _pointer(document: Any, pointer: str) -> Any:
    """The value at RFC 6901 ``pointer`` in ``document``, or ``_MISSING``."""
    value = document
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, Mapping) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return _MISSING
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message`` and the
    record's ``toollatch`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        data: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(getattr(record, "toollatch", {}))
        return json.dumps(data, ensure_ascii=False, default=str)


def configure_logging(format: str = "text", level: str = "INFO") -> logging.Handler:
    """Send the ``toollatch`` logger to standard error in ``format`` (``text``/``json``) at
    ``level`` (the ``logging`` section of the config); returns the handler added."""
    handler = logging.StreamHandler()
    if format == "json":
        handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("toollatch")
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
