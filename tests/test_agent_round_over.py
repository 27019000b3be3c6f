"""Issue 28 R1 over real loopback HTTP: a server that keeps streaming after a size limit was
passed. Once the only call failed ``arguments_exceed_max_bytes`` (or the text passed
``max_text_bytes``), the round ends ``limited``: the client stops reading and closes the
response, every call is paired with its error result, and the loop goes on as after any
failed call (the next request carries the result). Without the fix the server is read until
the guard deadline, so the round ends ``cancelled`` and the assertions fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.responses import StreamingResponse

from loopback_http import Reply, loopback
from toollatch import Agent, Limits, RetryPolicy, RunLimits, model_client
from toollatch.runtime import example_tools
from toollatch.scripted import Call, Text, Turn
from toollatch.scripted._server import _encode

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"]
GUARD_S = 30.0
"""The run's deadline in these tests: only a run that never stops reading meets it."""
MAX_ARGUMENT_BYTES = 4096


class Endless:
    """A 200 whose body is ``head`` and then ``filler`` forever, until the client leaves;
    ``sent`` counts the fillers written, ``ended`` is set when the body stops."""

    def __init__(self, head: list[bytes], filler: bytes) -> None:
        self.head, self.filler = head, filler
        self.sent = 0
        self.ended = asyncio.Event()

    def reply(self) -> Reply:
        async def body() -> AsyncIterator[bytes]:
            try:
                for piece in self.head:
                    yield piece
                while True:
                    self.sent += 1
                    yield self.filler
                    await asyncio.sleep(0)  # (let the client, in this loop, read)
            finally:
                self.ended.set()

        return StreamingResponse(body(), 200, media_type="text/event-stream")


def wire(provider: str, turn: Turn) -> list[bytes]:
    return [e.data for e in _encode(provider, turn, model="s", body={}, response_id="r")]


def runaway_call(provider: str) -> Endless:
    """A ``write_file`` call whose arguments never end (Gemini, whose call arrives whole: a
    call over the limit, then text chunks forever)."""
    if provider == "gemini":
        big = '{"path": "a.md", "content": "' + "x" * (2 * MAX_ARGUMENT_BYTES) + '"}'
        call = Call(call_id="c1", name="write_file", arguments=big)
        head = wire(provider, Turn(items=(call,), delay_ms=0))[:1]
        return Endless(head, wire(provider, Turn(items=(Text(text="more "),), delay_ms=0))[0])
    args = '{"path": "a.md", "content": "' + "x" * 400 + '"}'
    call = Call(call_id="c1", name="write_file", arguments=args, fragment_chars=100)
    events = _encode(provider, Turn(items=(call,), delay_ms=0), model="s", body={}, response_id="r")
    first = next(n for n, e in enumerate(events) if e.in_arguments)
    filler = events[first + 2].data  # (100 x's: neither the first fragment nor the last)
    assert b"x" * 50 in filler
    return Endless([e.data for e in events[: first + 1]], filler)


def endless_text(provider: str) -> Endless:
    events = wire(provider, Turn(items=(Text(text="hello " * 40, chunk_chars=60),), delay_ms=0))
    first = next(n for n, e in enumerate(events) if b"hello" in e)
    return Endless(events[: first + 1], events[first + 1])


def answer(provider: str) -> Reply:
    body = b"".join(wire(provider, Turn(items=(Text(text="Sorry, too long."),), delay_ms=0)))
    return StreamingResponse(iter([body]), 200, media_type="text/event-stream")


async def run_agent(
    provider: str, url: str, tmp_path: Any, *, limits: Limits, max_rounds: int
) -> list[dict[str, Any]]:
    client = model_client(
        provider, model="m", base_url=url, api_key="k", retry=RetryPolicy(attempts=1)
    )
    async with client:
        agent = Agent(
            client,
            example_tools(tmp_path),
            limits=limits,
            run_limits=RunLimits(max_rounds=max_rounds, deadline_s=GUARD_S),
        )
        return [e.to_json() async for e in agent.run("write it")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_runaway_call_ends_its_round_and_its_error_result_goes_back(provider, tmp_path):
    endless = runaway_call(provider)
    async with loopback() as server:
        server.replies += [endless.reply(), answer(provider)]
        events = await run_agent(
            provider,
            server.url,
            tmp_path,
            max_rounds=2,
            limits=Limits(max_argument_bytes=MAX_ARGUMENT_BYTES),
        )
        await asyncio.wait_for(endless.ended.wait(), GUARD_S)  # the client closed the response
    rounds = [(e["ended"], e["stop_reason"]) for e in events if e["type"] == "round_ended"]
    assert rounds == [("limited", None), ("normal", rounds[1][1])]
    failed = [e for e in events if e["type"] == "call_failed"]
    assert [e["error"] for e in failed] == ["arguments_exceed_max_bytes"]
    call_id = failed[0]["id"]  # (c1; Gemini sends no ids: toollatch makes one up)
    last = events[-1]
    assert last["type"] == "run_ended"
    assert last["error"] is None
    assert [(c["id"], c["is_error"], c["error"]) for c in last["calls"]] == [
        (call_id, True, "arguments_exceed_max_bytes")
    ]
    # the second request carried the paired error result (the scripted wire of each provider)
    assert len(server.seen) == 2
    second = server.seen[1].body
    assert b"arguments_exceed_max_bytes" in second
    # bounded work: the fillers the server got out before the client closed (socket buffers
    # and the reads in flight), not an endless stream
    assert endless.sent < 20_000


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_endless_text_past_the_cap_ends_the_round_and_the_run(provider, tmp_path):
    endless = endless_text(provider)
    async with loopback() as server:
        server.replies.append(endless.reply())
        events = await run_agent(
            provider, server.url, tmp_path, max_rounds=3, limits=Limits(max_text_bytes=2048)
        )
        await asyncio.wait_for(endless.ended.wait(), GUARD_S)
    rounds = [e["ended"] for e in events if e["type"] == "round_ended"]
    assert rounds == ["limited"]  # no call: the run ends, as after a truncated answer
    text = "".join(e["text"] for e in events if e["type"] == "text")
    assert 0 < len(text.encode()) <= 2048
    assert events[-1]["error"] is None
    assert len(server.seen) == 1
    assert endless.sent < 20_000
