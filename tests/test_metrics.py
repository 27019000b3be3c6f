"""Prometheus metrics fed by the agent loop: scraped over loopback HTTP after scripted runs,
per provider; each instance its own registry; the not-committed counter stays 0 and counts
a refused start."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loopback_http import loopback
from toollatch import (
    Agent,
    Limits,
    RetryPolicy,
    RunLimits,
    StreamParser,
    UsageError,
    model_client,
    tool,
)
from toollatch.runtime import Metrics
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn
from toollatch.stages import CallReady

BROKEN_CHAT = (
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":'
    b'{"name":"get_weather","arguments":"{\\"city\\": 1}}"}}]},"finish_reason":"tool_calls"}]}'
    b"\n\ndata: [DONE]\n\n"
)
PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]


@tool(eager=True)
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool
def write_file(path: str, content: str) -> str:
    """Write a file (not really)."""
    return f"wrote {len(content)} chars"


def script() -> Script:
    return Script(
        turns=(
            Turn(
                items=(
                    Text(text="Working."),
                    Call(call_id="c_weather", name="get_weather", arguments='{"city": "Oslo"}'),
                    Call(call_id="c_broken", name="get_weather", arguments='{"city": "Rome"}}'),
                    Call(
                        call_id="c_file",
                        name="write_file",
                        arguments='{"path": "b", "content": "y"}',
                    ),
                    # (the oversized call last: a call after it, with nothing left pending, is not
                    # read, as the round is over at the size limit; issue 28 R1)
                    Call(
                        call_id="c_big",
                        name="write_file",
                        arguments='{"path": "a", "content": "' + "x" * 400 + '"}',
                        fragment_chars=50,
                    ),
                ),
                delay_ms=0,
            ),
            Turn(items=(Text(text="Done."),), delay_ms=0),
        )
    )


async def play(provider: str, metrics: Metrics) -> None:
    async with ScriptedServer({"m": script()}, delay_scale=0) as server:
        client = model_client(
            provider, model="m", base_url=server.base_url(provider), retry=RetryPolicy(attempts=1)
        )
        async with client:
            agent = Agent(
                client,
                [get_weather, write_file],
                observers=[metrics],
                limits=Limits(max_argument_bytes=200),
                run_limits=RunLimits(max_rounds=3),
            )
            run = agent.run("go")
            [e async for e in run]
        assert run.error is None


async def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with loopback() as server:
        app = metrics.asgi_app()

        async def reply(scope, receive, send):
            async def body():  # (the loopback server has read the request body already)
                return {"type": "http.request", "body": b"", "more_body": False}

            await app(scope, body, send)

        server.replies.append(reply)
        async with httpx.AsyncClient() as client:
            response = await client.get(server.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_scripted_run_is_counted_and_scraped_over_http(provider):
    metrics = Metrics()
    await play(provider, metrics)
    s = await scrape(metrics)
    p = {"provider": provider}
    broken = "arguments_not_object" if provider == "gemini" else "invalid_json"
    assert value(s, "tool_execute_rejected_not_committed_total", **p) == 0
    # exported at 0 (a missing series would read 0 too: check it is there)
    assert ("tool_execute_rejected_not_committed_total", (("provider", provider),)) in s
    assert value(s, "tool_assemble_invalid_json_total", **p) == (provider != "gemini")
    assert value(s, "tool_assemble_overflow_total", **p) == 1
    assert value(s, "tool_gate_rejections_total", code=broken, **p) == 1
    assert value(s, "tool_gate_rejections_total", code="arguments_exceed_max_bytes", **p) == 1
    assert value(s, "tool_assemble_args_bytes_count", **p) == 3  # the overflowed one: unknown
    assert value(s, "tool_assemble_args_bytes_bucket", le="16.0", **p) == 1
    assert value(s, "tool_assemble_args_bytes_bucket", le="64.0", **p) == 3
    committed = sum(
        value(s, "tool_assemble_to_commit_seconds_count", early=e, **p) for e in ("true", "false")
    )
    assert committed == 2
    assert value(s, "tool_close_to_start_seconds_count", early="false", **p) == 1
    assert value(s, "tool_close_to_start_seconds_count", early="true", **p) == 1
    assert value(s, "tool_execute_seconds_count", outcome="ok", **p) == 2
    assert value(s, "tool_rounds_total", ended="normal", **p) == 2


async def test_each_instance_has_its_own_registry():
    first, second = Metrics(), Metrics()
    await play("openai_chat", first)
    s1, s2 = await scrape(first), await scrape(second)
    assert value(s1, "tool_rounds_total", provider="openai_chat", ended="normal") == 2
    assert value(s2, "tool_rounds_total", provider="openai_chat", ended="normal") == 0


async def test_the_tool_label_only_takes_known_names():
    metrics = Metrics(tool_names=["get_weather"])
    await play("anthropic", metrics)
    s = await scrape(metrics)
    p = {"provider": "anthropic"}
    assert value(s, "tool_execute_seconds_count", outcome="ok", tool="get_weather", **p) == 1
    assert value(s, "tool_execute_seconds_count", outcome="ok", tool="other", **p) == 1
    assert value(s, "tool_gate_rejections_total", code="invalid_json", tool="get_weather", **p) == 1
    assert not any(("tool", "write_file") in labels for _, labels in s)


async def test_starting_a_call_that_is_not_committed_is_refused_and_counted():
    """The dispatcher's UsageError path: the loop tells the metrics before it propagates."""
    metrics = Metrics()
    async with ScriptedServer(delay_scale=0) as server:
        client = model_client(
            "openai_chat", model="scripted", base_url=server.base_url("openai_chat")
        )
        async with client:
            agent = Agent(client, [get_weather], observers=[metrics])
            run = agent.run("go")
            async with agent.dispatcher.round() as dispatch:
                parser = StreamParser("openai_chat", tools=agent.dispatcher.specs)
                parser.feed(BROKEN_CHAT)
                failed = parser.finish().calls[0]  # a CallRecord that did not commit
                assert failed.committed is None
                forged = CallReady.__new__(CallReady)
                object.__setattr__(forged, "call", failed)
                with pytest.raises(UsageError, match="only CommittedCall"):
                    run._notices([forged], dispatch)
    s = await scrape(metrics)
    assert value(s, "tool_execute_rejected_not_committed_total", provider="openai_chat") == 1
