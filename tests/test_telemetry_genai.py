"""The OpenTelemetry GenAI semantic-convention names (issue 31): an ``execute_tool {name}``
span (kind INTERNAL) per tool execution, under the call's ``toollatch.tool_call`` span, and
the ``gen_ai.execute_tool.duration`` histogram (seconds, the span's duration), read with the
SDK's in-memory exporter and metric reader after a scripted run over loopback HTTP."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from toollatch import Agent, RetryPolicy, RunLimits, model_client, tool
from toollatch.runtime import Tracing
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
def explode(key: str) -> str:
    """Fail."""
    raise RuntimeError(f"no {key}")


def script() -> Script:
    calls = (
        Call(call_id="c_ok", name="lookup", arguments='{"key": "a"}'),
        Call(call_id="c_err", name="explode", arguments='{"key": "b"}'),
        Call(call_id="c_bad", name="lookup", arguments='{"key": 1}'),  # the gate refuses it
    )
    return Script(
        turns=(
            Turn(items=(Text(text="Looking."), *calls), delay_ms=0),
            Turn(items=(Text(text="Done."),), delay_ms=0),
        )
    )


async def run(provider: str, tracing: Tracing) -> None:
    async with ScriptedServer({"t": script()}, delay_scale=0) as server:
        client = model_client(
            provider, model="t", base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
        )
        async with client:
            agent = Agent(
                client, [lookup, explode], observers=[tracing], run_limits=RunLimits(max_rounds=3)
            )
            [e async for e in agent.run("go")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_each_tool_execution_is_a_genai_execute_tool_span_and_a_duration(provider):
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    await run(provider, Tracing(tracer_provider, MeterProvider(metric_readers=[reader])))

    spans = exporter.get_finished_spans()
    calls = {s.attributes["toollatch.call.id"]: s for s in spans if s.name == "toollatch.tool_call"}
    executions = {
        s.attributes["gen_ai.tool.call.id"]: s for s in spans if s.name.startswith("execute_tool")
    }
    assert len(calls) == 3  # (Gemini's call ids are made up: compared by tool name)
    assert len(executions) == 2  # the refused call executed nothing
    refused = [c for c in calls.values() if c.attributes["toollatch.gate.decision"] == "failed"]
    assert len(refused) == 1
    assert refused[0].attributes["toollatch.call.id"] not in executions
    by_tool = {s.attributes["gen_ai.tool.name"]: s for s in executions.values()}
    ok, err = by_tool["lookup"], by_tool["explode"]
    assert ok.name == "execute_tool lookup" and err.name == "execute_tool explode"
    for call_id, span in executions.items():
        assert span.kind is SpanKind.INTERNAL
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["toollatch.call.id"] == call_id  # ours kept as extras
        assert span.parent.span_id == calls[call_id].context.span_id
    assert ok.attributes["gen_ai.tool.name"] == "lookup"
    assert "error.type" not in ok.attributes
    assert ok.attributes["toollatch.tool.outcome"] == "ok"
    assert err.attributes["gen_ai.tool.name"] == "explode"
    assert err.attributes["error.type"] == "tool_error"
    assert err.status.status_code is StatusCode.ERROR

    data = reader.get_metrics_data()
    metrics = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    [duration] = [m for m in metrics if m.name == "gen_ai.execute_tool.duration"]
    assert duration.unit == "s"
    points = {p.attributes["gen_ai.tool.name"]: p for p in duration.data.data_points}
    assert sorted(points) == ["explode", "lookup"]
    assert dict(points["explode"].attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "explode",
        "error.type": "tool_error",
    }
    assert "error.type" not in points["lookup"].attributes
    for name, span in (("lookup", ok), ("explode", err)):
        assert points[name].count == 1
        # the metric is the span's own duration (the conventions: "SHOULD be the same")
        assert points[name].sum == pytest.approx((span.end_time - span.start_time) / 1e9)
