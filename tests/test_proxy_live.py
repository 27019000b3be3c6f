"""`toollatch proxy --calls stream` (relay/_proxy_live.py): argument text reaches the client
as it streams, normalized: the official `openai` SDK, through the proxy, over real loopback
HTTP, assembles for every call exactly the text toollatch's own call buffer holds, against the
scripted server's quirk profiles and the recorded quirky streams; the verdicts come at the end
as in hold mode.

The SDK's accumulation (deltas merged by ``index``, ``id``/``type``/``name`` from a call's
first delta) is `openai/lib/streaming/chat/_completions.py`'s (repo openai/openai-python), the
`.stream()` helper's final completion is built by the same state.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from loopback_http import loopback
from test_proxy import (
    SCRIPTS,
    WEATHER,
    chat_recordings,
    extension,
    finish_reasons,
    raw_reply,
    recorded,
    sdk_calls,
)
from toollatch import StreamParser
from toollatch.relay import ProxyServer
from toollatch.scripted import ScriptedServer
from toollatch.scripted._quirks import PROFILES

MESSAGES = [{"role": "user", "content": "weather?"}]


def raw_body(base: str, model: str) -> bytes:
    """The upstream's own answer, bytes as sent."""
    body = {"model": model, "stream": True, "messages": MESSAGES}
    return httpx.post(base + "/chat/completions", json=body, timeout=10).content


def our_calls(body: bytes, tools: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """Every call toollatch's parser assembles from ``body``: id, name, its buffer's text,
    its state."""
    parser = StreamParser("openai_chat", tools=tools)
    parser.feed(body)
    round_ = parser.finish()
    return [(r.call_id, r.name or "", r.arguments_text, str(r.state)) for r in round_.calls]


async def created(proxy: ProxyServer, model: str) -> list[Any]:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="k", max_retries=0) as c:
        stream = await c.chat.completions.create(
            model=model, messages=MESSAGES, tools=[WEATHER], stream=True
        )
        return [chunk async for chunk in stream]


async def helper_final(proxy: ProxyServer, model: str) -> Any:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="k", max_retries=0) as c:
        async with c.chat.completions.stream(
            model=model, messages=MESSAGES, tools=[WEATHER]
        ) as stream:
            async for _event in stream:
                pass
            return await stream.get_final_completion()


def assembled(chunks: list[Any]) -> list[tuple[str, str, str]]:
    calls = sdk_calls(chunks)
    return [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]


def call_deltas(chunks: list[Any]) -> list[Any]:
    return [d for ch in chunks for c in ch.choices for d in c.delta.tool_calls or ()]


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(SCRIPTS, delay_scale=0.1) as server:
        yield server


@pytest.mark.parametrize("profile", ["none", *sorted(PROFILES)])
async def test_every_quirk_profile_streams_exactly_our_buffers_text(profile):
    quirks = None if profile == "none" else profile
    async with ScriptedServer(SCRIPTS, delay_scale=0.1, quirks=quirks) as upstream:
        base = upstream.base_url("openai_chat")
        for model in ("two", "bad"):
            ours = our_calls(await asyncio.to_thread(raw_body, base, model), [WEATHER])
            async with ProxyServer(base, calls="stream") as proxy:
                chunks = await created(proxy, model)
                final = await helper_final(proxy, model)
            # every call the upstream sent, as the client assembles it = our buffer's text
            assert assembled(chunks) == [c[:3] for c in ours], (profile, model)
            helper = [
                (t.id, t.function.name, t.function.arguments)
                for t in final.choices[0].message.tool_calls or ()
            ]
            assert helper == [c[:3] for c in ours], (profile, model)
            # the head once, first; fragments after it carry neither id nor name
            heads = [d for d in call_deltas(chunks) if d.id is not None]
            assert [d.index for d in heads] == list(range(len(ours)))
            assert all(d.type == "function" and d.function.name for d in heads)
            tails = [d for d in call_deltas(chunks) if d.id is None]
            assert all(d.function.name is None for d in tails)
            # the verdicts, as in hold mode
            refused = [(c[0], c[3]) for c in ours if c[3] != "committed"]
            verdicts = extension(chunks)
            got = [(f["id"], "failed") for f in verdicts["failed"]] if verdicts else []
            assert got == refused, (profile, model)
            assert finish_reasons(chunks) == ["tool_calls"]
            assert final.choices[0].finish_reason == "tool_calls"


async def test_fragments_go_out_as_they_come_not_whole(upstream):
    async with ProxyServer(upstream.base_url("openai_chat"), calls="stream") as proxy:
        chunks = await created(proxy, "two")
    deltas = call_deltas(chunks)
    assert len(deltas) > 2  # more than one delta per call: live
    assert assembled(chunks) == [
        ("call_oslo", "get_weather", '{"city": "Oslo"}'),
        ("call_lima", "get_weather", '{"city": "Lima", "unit": "c"}'),
    ]
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert text == "Checking both."
    assert extension(chunks) is None


async def test_a_cut_round_shows_the_cut_call_then_refuses_it(upstream):
    async with ProxyServer(upstream.base_url("openai_chat"), calls="stream") as proxy:
        cut = await created(proxy, "cut")
        cut1 = await created(proxy, "cut1")
        whole = await asyncio.to_thread(
            httpx.post,
            proxy.url + "/chat/completions",
            json={"model": "cut", "messages": MESSAGES, "tools": [WEATHER]},
        )
    # the contract of stream mode: Lima's head and first fragments reached the client, and
    # the last chunk says it did not commit
    [oslo, lima] = assembled(cut)
    assert oslo == ("call_oslo", "get_weather", '{"city": "Oslo"}')
    assert lima[0] == "call_lima" and lima[2] and lima[2] != '{"city": "Lima", "unit": "c"}'
    assert [(f["id"], f["code"]) for f in extension(cut)["failed"]] == [("call_lima", "truncated")]
    assert finish_reasons(cut) == ["tool_calls"]  # Oslo committed
    # no call committed: the finish reason says why
    assert [c[0] for c in assembled(cut1)] == ["call_oslo"]
    assert finish_reasons(cut1) == ["length"]
    assert [(f["id"], f["code"]) for f in extension(cut1)["failed"]] == [("call_oslo", "truncated")]
    # a non-streaming request holds committed calls only, whatever the mode
    message = whole.json()["choices"][0]["message"]
    assert [t["id"] for t in message["tool_calls"]] == ["call_oslo"]


@pytest.mark.parametrize("name", chat_recordings())
async def test_recorded_quirky_streams_reach_the_sdk_as_our_buffers_hold_them(name):
    body, tools, round_ = recorded(name)
    async with loopback() as lb:
        lb.replies.append(raw_reply(body))
        async with ProxyServer(lb.url + "/v1", calls="stream") as p:
            async with openai.AsyncOpenAI(base_url=p.url, api_key="k", max_retries=0) as c:
                stream = await c.chat.completions.create(
                    model="m", messages=MESSAGES, tools=tools or openai.NOT_GIVEN, stream=True
                )
                chunks: list[Any] = []
                try:
                    async for chunk in stream:
                        chunks.append(chunk)
                except openai.APIError:
                    pass  # an interrupted recording: an error after what was streamed
    ours = {(c.index, r.call_id): r for c in round_.choices for r in c.calls}
    got = sdk_calls(chunks)
    for (choice, _index), call in got.items():
        record = ours[choice, call["id"]]
        assert (call["name"], call["arguments"]) == (record.name, record.arguments_text), name
    sent = {(choice, call["id"]) for (choice, _), call in got.items()}
    committed = {k for k, r in ours.items() if r.committed is not None}
    assert committed <= sent, name
    by_choice: dict[int, list[int]] = {}
    for choice, index in sorted(got):
        by_choice.setdefault(choice, []).append(index)
    assert all(v == list(range(len(v))) for v in by_choice.values())


def wrapper_stream() -> bytes:
    """Q19: a hallucinated ``multi_tool_use.parallel`` call (LiteLLM's
    handle_parallel_tool_calls.py) wrapping a good call and one the schema refuses."""
    wrapper = json.dumps(
        {
            "tool_uses": [
                {"recipient_name": "functions.get_weather", "parameters": {"city": "Oslo"}},
                {"recipient_name": "functions.get_weather", "parameters": {"town": "Bergen"}},
            ]
        }
    )
    head = {"index": 0, "id": "call_W", "type": "function"}
    head["function"] = {"name": "multi_tool_use.parallel", "arguments": ""}
    chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]}]
    for n in range(0, len(wrapper), 9):
        entry = {"index": 0, "function": {"arguments": wrapper[n : n + 9]}}
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [entry]}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return events + b"data: [DONE]\n\n"


async def test_a_parallel_wrapper_is_held_and_its_committed_calls_sent_whole():
    body = wrapper_stream()
    parser = StreamParser("openai_chat", tools=[WEATHER])
    parser.feed(body)
    [oslo, bergen] = parser.finish().calls
    async with loopback() as lb:
        lb.replies.append(raw_reply(body))
        async with ProxyServer(lb.url + "/v1", calls="stream") as proxy:
            chunks = await created(proxy, "m")
    # the wrapper never reaches the client as a call; its committed inner call does, whole
    assert assembled(chunks) == [("call_W_0", "get_weather", oslo.arguments_text)]
    assert [(f["id"], f["code"]) for f in extension(chunks)["failed"]] == [
        (bergen.call_id, "schema_violation")
    ]
    assert finish_reasons(chunks) == ["tool_calls"]
