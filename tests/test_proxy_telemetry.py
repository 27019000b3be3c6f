"""`toollatch proxy`'s metrics (`GET /metrics`, a registry of its own) and OpenTelemetry spans
(an in-memory exporter), and its upstream idle timeout: real loopback HTTP, the official
`openai` SDK as the client, the scripted server (or a raw stalling reply) as the upstream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
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


@pytest.mark.parametrize(
    "answer", [b"SSH-2.0-OpenSSH_9.6\r\n\r\n", b""], ids=["not-http", "closed-unanswered"]
)
async def test_an_upstream_that_breaks_off_before_its_head_is_a_bad_answer_not_unreachable(
    answer,
):
    # reached, then it closed or sent no HTTP: that was counted as an upstream that could
    # not be reached, and said so to the client
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    made, registry, _ = telemetry()
    async with server, ProxyServer(url, telemetry=made) as proxy:
        with pytest.raises(openai.APIStatusError) as refused:
            await streamed(proxy, "two")
    assert refused.value.status_code == 502
    assert refused.value.code == "upstream_bad_answer"
    errors = "toollatch_proxy_upstream_errors_total"
    assert value(registry, errors, kind="bad_answer") == 1
    assert value(registry, errors, kind="unreachable") == 0


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


# -- a client that goes away ------------------------------------------------------------------

ERRORS = ("unreachable", "bad_answer", "status", "stream_interrupted", "idle_timeout")


@pytest.mark.parametrize(
    ("path", "stream", "head", "provider"),
    [
        ("chat/completions", True, False, "openai_chat"),
        ("chat/completions", False, False, "openai_chat"),
        ("responses", True, False, "openai_chat"),
        ("chat/completions", True, False, "anthropic"),
        ("chat/completions", True, True, "openai_chat"),
    ],
    ids=[
        "chat_before_head",
        "chat_whole_before_head",
        "responses_before_head",
        "anthropic_before_head",
        "mid_stream",
    ],
)
async def test_a_client_that_goes_away_closes_the_upstream_request_at_once(
    path, stream, head, provider, caplog
):
    # the proxy waited for the upstream's answer head (bounded by idle_timeout_s, then 504)
    # without watching its client: one that went away left the upstream request open until
    # the head came or the timeout, and was counted a 504 and an unreachable upstream. Now
    # the upstream's connection closes when the client's does, and the request counts 499
    # (200 once its stream was under way), never as an upstream error
    request_in, first_bytes = asyncio.Event(), asyncio.Event()
    closed_at: list[float] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head_in = await reader.readuntil(b"\r\n\r\n")
        size = re.search(rb"(?i)content-length: *(\d+)", head_in)
        await reader.readexactly(int(size.group(1)) if size else 0)
        request_in.set()
        if head:
            data = chunk(role="assistant", content="hi")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
            writer.write(b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(data), data))
        await reader.read()  # (its end: the proxy closed the connection)
        closed_at.append(time.monotonic())
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": messages, "input": "hi", "stream": stream}
    made, registry, _ = telemetry()
    try:
        async with (
            ProxyServer(
                base,
                idle_timeout_s=30,
                telemetry=made,
                upstream_provider=provider,
                upstream_key="sk-test",
            ) as p,
            httpx.AsyncClient(timeout=60) as http,
        ):

            async def ask() -> None:
                async with http.stream("POST", f"{p.url}/{path}", json=body) as answer:
                    async for _ in answer.aiter_raw():
                        first_bytes.set()

            asking = asyncio.create_task(ask())
            async with asyncio.timeout(10):
                await (first_bytes if head else request_in).wait()
            left = time.monotonic()
            asking.cancel()  # (httpx closes its connection)
            with contextlib.suppress(asyncio.CancelledError):
                await asking
            async with asyncio.timeout(5):  # (well within the idle timeout)
                while not closed_at or value(registry, "toollatch_proxy_streams_active"):
                    await asyncio.sleep(0.02)
    finally:
        server.close()
    assert closed_at[0] - left < 5
    route = "chat" if path.startswith("chat") else "responses"
    status = "200" if head else "499"
    assert value(registry, "toollatch_proxy_requests_total", route=route, status=status) == 1
    errors = [value(registry, "toollatch_proxy_upstream_errors_total", kind=k) for k in ERRORS]
    assert errors == [0] * len(ERRORS)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_client_that_goes_away_mid_body_counts_499_without_an_error_logged(caplog):
    # starlette's ClientDisconnect went out of the handler: "Exception in ASGI application"
    # logged with its traceback, and the request counted a 500
    made, registry, _ = telemetry()
    async with ProxyServer("http://127.0.0.1:9/v1", telemetry=made) as p:
        host, port = p.url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"model"'
        )
        await writer.drain()
        async with asyncio.timeout(5):
            while not value(registry, "toollatch_proxy_streams_active"):
                await asyncio.sleep(0.01)  # (the request is in: its body is being read)
            writer.close()
            while value(registry, "toollatch_proxy_streams_active"):
                await asyncio.sleep(0.01)
    assert value(registry, "toollatch_proxy_requests_total", route="chat", status="499") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
