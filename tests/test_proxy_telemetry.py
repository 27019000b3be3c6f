"""`toollatch proxy`'s metrics (`GET /metrics`, a registry of its own) and OpenTelemetry spans
(an in-memory exporter), and its upstream idle timeout: real loopback HTTP, the official
`openai` SDK as the client, the scripted server (or a raw stalling reply) as the upstream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from starlette.responses import StreamingResponse

from loopback_http import loopback
from test_proxy import SCRIPTS, extension, streamed
from toollatch.relay import ProxyServer
from toollatch.relay._proxy_telemetry import ProxyTelemetry
from toollatch.scripted import ScriptedServer


def telemetry(mode: str = "hold") -> tuple[ProxyTelemetry, CollectorRegistry, InMemorySpanExporter]:
    registry, exporter = CollectorRegistry(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    made = ProxyTelemetry(registry=registry, tracer_provider=provider, mode=mode)
    return made, registry, exporter


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def drain(proxy: ProxyServer, model: str) -> None:
    """A streamed request read to its end (an in-stream error is fine)."""
    with contextlib.suppress(openai.APIError):
        await streamed(proxy, model)


async def test_metrics_count_requests_calls_by_code_and_upstream_errors():
    made, registry, _ = telemetry()
    async with ScriptedServer(SCRIPTS, delay_scale=0.1) as upstream:
        async with ProxyServer(upstream.base_url("openai_chat"), telemetry=made) as proxy:
            for model in ("two", "bad", "cut1", "dropped", "busy"):
                await drain(proxy, model)
            async with httpx.AsyncClient() as http:
                scraped = await http.get(proxy.url.removesuffix("/v1") + "/metrics")
    assert value(registry, "toollatch_proxy_requests_total", route="chat", status="200") == 4
    assert value(registry, "toollatch_proxy_requests_total", route="chat", status="429") == 1
    assert value(registry, "toollatch_proxy_calls_committed_total", route="chat") == 3
    failed = "toollatch_proxy_calls_failed_total"
    assert value(registry, failed, route="chat", code="schema_violation") == 1
    assert value(registry, failed, route="chat", code="truncated") == 1
    assert value(registry, failed, route="chat", code="stream_interrupted") >= 1
    errors = "toollatch_proxy_upstream_errors_total"
    assert value(registry, errors, kind="status") == 1
    assert value(registry, errors, kind="stream_interrupted") == 1
    durations = "toollatch_proxy_request_seconds_count"
    assert value(registry, durations, route="chat", mode="hold") == 5
    assert value(registry, "toollatch_proxy_streams_active") == 0
    assert scraped.status_code == 200
    assert "toollatch_proxy_calls_failed_total" in scraped.text
    assert "Oslo" not in scraped.text  # never a value


async def test_an_unreachable_upstream_is_counted_and_unknown_paths_stay_one_series():
    made, registry, exporter = telemetry()
    async with ProxyServer("http://127.0.0.1:9/v1", telemetry=made) as proxy:
        with pytest.raises(openai.APIStatusError):
            await streamed(proxy, "two")
        async with httpx.AsyncClient() as http:
            for n in range(3):
                await http.get(proxy.url + f"/nonesuch/{n}")
    assert value(registry, "toollatch_proxy_upstream_errors_total", kind="unreachable") == 1
    assert value(registry, "toollatch_proxy_requests_total", route="chat", status="502") == 1
    assert value(registry, "toollatch_proxy_requests_total", route="other", status="404") == 3
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["GET", "GET", "GET", "POST /v1/chat/completions"]


async def test_spans_per_request_and_per_held_call():
    made, _, exporter = telemetry()
    async with ScriptedServer(SCRIPTS, delay_scale=0.1) as upstream:
        async with ProxyServer(upstream.base_url("openai_chat"), telemetry=made) as proxy:
            await drain(proxy, "cut")
            cut_spans = exporter.get_finished_spans()
            exporter.clear()
            await drain(proxy, "bad")
            bad_spans = exporter.get_finished_spans()
    [cut] = [s for s in cut_spans if s.name == "POST /v1/chat/completions"]
    assert cut.attributes["http.response.status_code"] == 200
    assert cut.attributes["gen_ai.operation.name"] == "chat"
    assert cut.attributes["gen_ai.request.model"] == "cut"
    assert cut.attributes["gen_ai.response.finish_reasons"] == ("length",)
    calls = {s.attributes["toollatch.call.id"]: s for s in cut_spans if s.name != cut.name}
    assert set(calls) == {"call_oslo", "call_lima"}
    oslo, lima = calls["call_oslo"], calls["call_lima"]
    # Oslo committed early (the upstream moved on), Lima cut by max_tokens
    assert oslo.attributes["toollatch.gate.decision"] == "committed"
    assert oslo.attributes["toollatch.gate.early"] is True
    assert oslo.attributes["gen_ai.tool.name"] == "get_weather"
    assert lima.attributes["toollatch.gate.decision"] == "failed"
    assert lima.attributes["toollatch.gate.error_code"] == "truncated"
    assert {oslo.parent.span_id, lima.parent.span_id} == {cut.context.span_id}
    assert oslo.end_time <= lima.end_time  # held until committed, not until the round's end
    [bad] = [s for s in bad_spans if s.name == "POST /v1/chat/completions"]
    refused = [s for s in bad_spans if s.attributes.get("toollatch.call.id") == "call_bad"]
    assert [s.attributes["toollatch.gate.error_code"] for s in refused] == ["schema_violation"]
    assert refused[0].parent.span_id == bad.context.span_id
    for span in [*cut_spans, *bad_spans]:
        assert "Oslo" not in json.dumps(dict(span.attributes or {}))


# -- the upstream's idle timeout --------------------------------------------------------------


def chunk(**delta: Any) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


def paced(gaps: list[float]):
    """A chat stream whose pieces come after ``gaps`` seconds each, then its end."""

    async def reply(scope, receive, send):
        async def body():
            for gap in gaps:
                await asyncio.sleep(gap)
                yield chunk(content="x")
            yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
            yield b"data: [DONE]\n\n"

        await StreamingResponse(body(), media_type="text/event-stream")(scope, receive, send)

    return reply


async def test_a_silent_upstream_fails_the_round_idle_timeout_and_is_counted():
    made, registry, _ = telemetry()
    async with loopback() as lb:
        lb.replies.append(paced([0.0, 1.5]))
        async with ProxyServer(lb.url + "/v1", idle_timeout_s=0.3, telemetry=made) as p:
            with pytest.raises(openai.APIError, match=r"no bytes for 0\.3 s"):
                await streamed(p, "m")
    assert value(registry, "toollatch_proxy_upstream_errors_total", kind="idle_timeout") == 1


async def test_a_slow_but_steady_upstream_is_not_idle():
    # every gap under the timeout, their sum well over it: the deadline is per silence
    async with loopback() as lb:
        lb.replies.append(paced([0.1] * 8))
        async with ProxyServer(lb.url + "/v1", idle_timeout_s=0.4) as p:
            chunks, _ = await streamed(p, "m")
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert text == "x" * 8
    assert extension(chunks) is None
