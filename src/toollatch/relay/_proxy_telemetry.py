"""What ``toollatch proxy`` tells operators: Prometheus metrics (``GET /metrics``, the
``[metrics]`` extra) and OpenTelemetry spans (the ``[otel]`` extra) per proxied request and
per held call (internal; the server is :mod:`._proxy`).

Theory of operation. :class:`ProxyTelemetry` belongs to one proxy; it has a metrics part
(a ``CollectorRegistry`` of its own, as the relay's) and a tracing part (a tracer of the given
or the global provider), each None when its extra is missing. Each HTTP request gets one
:class:`RequestWatch`, made by the proxy's ASGI entry and reached by the request's code
through a context variable (:func:`watch`), so the route handlers need no extra argument:
the entry times the request (to the last byte sent, so a stream's whole duration) and reads
its status; the upstream's opening reports a refusal or an unreachable upstream; the reader
reports each parser notice (for spans) and the decided Round (calls committed, failed by
code, the stream's own failure).

Metrics (labels are closed sets: a route, a status code, a mode, a stable error code):
``toollatch_proxy_requests_total{route,status}`` (499: the client went away before any
answer; one that leaves mid-stream keeps its 200, and neither counts an upstream error),
``toollatch_proxy_request_seconds{route,mode}`` (a streaming request: to its last byte),
``toollatch_proxy_calls_committed_total{route}``,
``toollatch_proxy_calls_failed_total{route,code}``,
``toollatch_proxy_upstream_errors_total{kind}`` (``unreachable``, ``bad_answer``: reached,
then closed or garbled before its answer's head, ``status``, ``stream_interrupted``,
``idle_timeout``), ``toollatch_proxy_streams_active``.

Spans: one SERVER span per request, ``{METHOD} {route}`` (``{METHOD}`` for a path that is no
route: the names stay a closed set) with ``http.request.method``,
``http.route``, ``http.response.status_code`` and the GenAI attributes of the inference it
relays (``gen_ai.operation.name`` ``chat``, ``gen_ai.request.model``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` /
``gen_ai.usage.output_tokens``; https://github.com/open-telemetry/semantic-conventions-genai,
model/gen-ai/spans.yaml); under it one ``toollatch.tool_call`` span per call, from its first
notice to the gate's decision (the time the call was held), with the runtime's attribute
names (``toollatch.call.id``, ``toollatch.tool``, ``toollatch.gate.decision``,
``toollatch.gate.error_code``, ``toollatch.gate.early``, ``toollatch.call.argument_bytes``)
and ``gen_ai.tool.call.id`` / ``gen_ai.tool.name``. Never an argument value or a text.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

from ..core._assembler import CallAnnounced, CallReady, CallUpdate
from ..core._events import CallKey
from ..core._round import CallRecord, Round

_SECONDS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/models": "models",
    "/healthz": "healthz",
    "/metrics": "metrics",
}
_CURRENT: ContextVar[RequestWatch | None] = ContextVar("toollatch_proxy_watch", default=None)


class _Metrics:
    """The proxy's Prometheus series, in a registry of their own."""

    def __init__(self, registry: Any | None) -> None:
        from prometheus_client import (  # noqa: PLC0415 (the [metrics] extra)
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
        )

        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "toollatch_proxy_requests", "Requests, by route and status.", ["route", "status"],
            registry=r,
        )  # fmt: skip
        self.seconds = Histogram(
            "toollatch_proxy_request_seconds",
            "Request durations (a streaming one: to its last byte), by route and calls mode.",
            ["route", "mode"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.committed = Counter(
            "toollatch_proxy_calls_committed", "Calls the gate committed.", ["route"], registry=r
        )
        self.failed = Counter(
            "toollatch_proxy_calls_failed", "Calls that did not commit, by error code.",
            ["route", "code"], registry=r,
        )  # fmt: skip
        self.upstream_errors = Counter(
            "toollatch_proxy_upstream_errors",
            "Upstream failures: unreachable, bad answer, error status, broken or silent stream.",
            ["kind"], registry=r,
        )  # fmt: skip
        self.active = Gauge("toollatch_proxy_streams_active", "Requests in flight.", registry=r)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest  # noqa: PLC0415

        return generate_latest(self.registry)


class ProxyTelemetry:
    """Metrics and spans of one proxy (see the module's doc). ``metrics``: keep Prometheus
    series (when prometheus-client is installed; ``registry``: where, default a new one);
    ``tracing``: make spans (when opentelemetry-api is installed; ``tracer_provider``: whose,
    default the global one)."""

    def __init__(
        self,
        *,
        metrics: bool = True,
        tracing: bool = True,
        registry: Any | None = None,
        tracer_provider: Any | None = None,
        mode: str = "hold",
    ) -> None:
        self.mode = mode
        self.metrics: _Metrics | None = None
        if metrics:
            try:
                self.metrics = _Metrics(registry)
            except ImportError:
                self.metrics = None
        self.tracer: Any = None
        if tracing:
            try:
                from opentelemetry import trace  # noqa: PLC0415 (the [otel] extra)
            except ImportError:
                self.tracer = None
            else:
                self.tracer = trace.get_tracer("toollatch.proxy", tracer_provider=tracer_provider)

    def exposition(self) -> bytes | None:
        """The metrics in the Prometheus text format (None without the ``[metrics]`` extra)."""
        return None if self.metrics is None else self.metrics.exposition()

    def request(self, method: str, path: str) -> RequestWatch:
        """The watch of a new request (made current: see :func:`watch`)."""
        return RequestWatch(self, method, _ROUTES.get(path, "other"), path)


def watch() -> RequestWatch | None:
    """The current request's watch (None outside a request, or without telemetry)."""
    return _CURRENT.get()


class RequestWatch:
    """One request's metrics and spans (see :class:`ProxyTelemetry`)."""

    def __init__(self, telemetry: ProxyTelemetry, method: str, route: str, path: str) -> None:
        self.telemetry, self.route = telemetry, route
        self.metrics = telemetry.metrics
        self.traced = telemetry.tracer is not None
        self.status = 0
        self._start = time.monotonic()
        self._calls: dict[CallKey, Any] = {}  # key -> its open span
        self._span: Any = None
        self._token: Any = None
        self._failed = False  # an upstream error was reported
        self._left = False  # the client went away before the answer's end
        if self.traced:
            # (a path that is no route of ours names no span: clients choose paths)
            known = route != "other"
            attributes = {"http.request.method": method} | ({"http.route": path} if known else {})
            self._span = telemetry.tracer.start_span(
                f"{method} {path}" if known else method, kind=_server_kind(), attributes=attributes
            )
        if self.metrics is not None:
            self.metrics.active.inc()

    def __enter__(self) -> RequestWatch:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        _CURRENT.reset(self._token)
        self.end()

    def upstream(self, model: str) -> None:
        """The upstream request is going out: a ``chat`` operation in the GenAI conventions'
        words (Chat Completions and Responses alike; their well-known values have no other
        for either)."""
        if self._span is not None:
            self._span.set_attribute("gen_ai.operation.name", "chat")
            if model:
                self._span.set_attribute("gen_ai.request.model", model)

    def upstream_error(self, kind: str) -> None:
        """The upstream failed: ``unreachable``, ``bad_answer``, ``status``,
        ``stream_interrupted``, ``idle_timeout``."""
        self._failed = True
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(kind).inc()
        if self._span is not None:
            self._span.add_event("toollatch.upstream_error", {"toollatch.kind": kind})

    def client_left(self) -> None:
        """The client went away before its answer's end: no upstream failure (the round it
        cut short counts none); status 499 (nginx's "client closed request") when nothing
        was sent to it yet (a stream already under way keeps its 200)."""
        self._left = True
        if not self.status:
            self.status = 499

    def notice(self, notice: CallUpdate) -> None:
        """A parser notice (spans only: a call's span opens at its first notice and ends at
        an early commit)."""
        if isinstance(notice, CallAnnounced):
            if notice.key not in self._calls:
                self._calls[notice.key] = self._call_span(notice.call_id, notice.name)
        elif isinstance(notice, CallReady):
            call = notice.call
            span = self._calls.pop(call.key, None) or self._call_span(call.call_id, call.name)
            span.set_attribute("toollatch.gate.decision", "committed")
            span.set_attribute("toollatch.gate.early", True)
            span.set_attribute("toollatch.call.argument_bytes", len(call.arguments_text.encode()))
            self._calls[call.key] = None  # decided: nothing more at the round's end
            span.end()

    def round(self, round_: Round) -> None:
        """The decided round: calls committed and failed, the stream's own failure."""
        from ._proxy_chunks import interrupted, openai_usage  # noqa: PLC0415

        if interrupted(round_) and not (self._failed or self._left):  # (no end signal)
            self.upstream_error("stream_interrupted")
        for record in round_.calls:
            self._decided(record)
        if self._span is not None:
            reasons = [c.stop_reason or str(c.ended) for c in round_.choices]
            self._span.set_attribute("gen_ai.response.finish_reasons", reasons)
            usage = openai_usage(round_.usage)
            if usage is not None:
                self._span.set_attribute("gen_ai.usage.input_tokens", usage["prompt_tokens"])
                self._span.set_attribute("gen_ai.usage.output_tokens", usage["completion_tokens"])

    def _decided(self, record: CallRecord) -> None:
        m = self.metrics
        if m is not None:
            if record.committed is not None:
                m.committed.labels(self.route).inc()
            else:
                m.failed.labels(self.route, str(record.error or "cancelled")).inc()
        if not self.traced or (record.key in self._calls and self._calls[record.key] is None):
            return
        span = self._calls.pop(record.key, None) or self._call_span(record.call_id, record.name)
        span.set_attribute("toollatch.call.argument_bytes", record.argument_bytes)
        if record.committed is not None:
            span.set_attribute("toollatch.gate.decision", "committed")
            span.set_attribute("toollatch.gate.early", False)
        else:
            code = str(record.error or "cancelled")
            span.set_attribute("toollatch.gate.decision", "failed")
            span.set_attribute("toollatch.gate.error_code", code)
            span.set_status(_error_status(code))
        span.end()

    def _call_span(self, call_id: str | None, name: str | None) -> Any:
        from opentelemetry import trace  # noqa: PLC0415

        attributes = {"toollatch.tool": name or "", "gen_ai.tool.name": name or ""}
        if call_id:
            attributes |= {"toollatch.call.id": call_id, "gen_ai.tool.call.id": call_id}
        return self.telemetry.tracer.start_span(
            "toollatch.tool_call",
            context=trace.set_span_in_context(self._span),
            attributes=attributes,
        )

    def end(self) -> None:
        """The response was sent (or the request ended otherwise)."""
        m, status = self.metrics, str(self.status or 500)
        if m is not None:
            m.active.dec()
            m.requests.labels(self.route, status).inc()
            if self.route in ("chat", "responses"):
                mode = self.telemetry.mode if self.route == "chat" else "hold"
                m.seconds.labels(self.route, mode).observe(time.monotonic() - self._start)
        if self._span is not None:
            for span in self._calls.values():  # (calls never decided: the request ended)
                if span is not None:
                    span.end()
            self._span.set_attribute("http.response.status_code", self.status or 500)
            if self.status >= 500 or not self.status:
                self._span.set_status(_error_status(status))
            self._span.end()


def _server_kind() -> Any:
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    return SpanKind.SERVER


def _error_status(description: str) -> Any:
    from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

    return Status(StatusCode.ERROR, description)
