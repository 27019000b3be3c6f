"""Answers posted to a worker that does not own the run (``POST /runs/{id}/calls/{call_id}/
approve|deny|result`` and cancel, a shared Redis store): handed to the owner over Redis,
applied there with the owner's own checks, and its reply (202, 403, 409...) is the answer."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx

from ledger_helpers import RedisServer
from relay_helpers import read_events
from test_agui import agui_body, agui_events
from test_relay_approvals import ASK, COLOR, answer, ran, until_asked, write_file
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, Text, Turn


@contextlib.asynccontextmanager
async def two_workers(url: str) -> AsyncIterator[tuple[RelayServer, RelayServer]]:
    """Two relays on one Redis, each with its own approval secret (the owner checks)."""
    options: dict[str, Any] = {"scripts": {"ask": ASK}, "delay_scale": 0, "store": url}
    async with (
        RelayServer(tools=[write_file, COLOR], **options) as a,
        RelayServer(tools=[write_file, COLOR], **options) as b,
    ):
        yield a, b


async def test_answers_posted_to_another_worker_reach_the_owner_with_its_checks(
    redis_server: RedisServer,
) -> None:
    redis_url = redis_server.url
    ran.clear()
    headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
    async with two_workers(redis_url) as (a, b):
        on_a = httpx.AsyncClient(base_url=a.url, timeout=30, headers=headers)
        on_b = httpx.AsyncClient(base_url=b.url, timeout=30, headers=headers)
        stranger = httpx.AsyncClient(
            base_url=b.url, timeout=30, headers={"x-toollatch-session": "s" * 43}
        )
        async with on_a, on_b, stranger:
            run = (await on_a.post("/runs", json={"message": "go", "model": "ask"})).json()
            frames = await until_asked(on_b, run["events_url"], 2)  # (read on B)
            asked = {f.data["id"]: f.data for f in frames if "token" in f.data}
            write, color = asked["call_w"], asked["call_c"]
            other = await answer(stranger, run, "call_w", "approve", token=write["token"])
            assert (other.status_code, other.json()["error"]["code"]) == (404, "not_found")
            forged = await answer(on_b, run, "call_w", "approve", token=color["token"])
            assert (forged.status_code, forged.json()["error"]["code"]) == (
                403,
                "invalid_approval_token",
            )
            unasked = await answer(on_b, run, "call_x", "approve", token=write["token"])
            assert (unasked.status_code, unasked.json()["error"]["code"]) == (409, "not_asked")
            bad = await answer(on_b, run, "call_w", "approve", token=write["token"], x=1)
            assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_body")
            assert ran == []
            ok = await answer(on_b, run, "call_w", "approve", token=write["token"])
            assert ok.status_code == 202, ok.text
            assert ok.json() == {"id": run["id"], "call_id": "call_w", "answered": "approve"}
            again = await answer(on_b, run, "call_w", "approve", token=write["token"])
            assert (again.status_code, again.json()["error"]["code"]) == (409, "already_answered")
            result = await answer(on_b, run, "call_c", "result", token=color["token"], value="red")
            assert result.status_code == 202, result.text
            frames = await read_events(on_b, run["events_url"])
            late = await answer(on_b, run, "call_c", "result", token=color["token"], value="x")
            assert (late.status_code, late.json()["error"]["code"]) == (409, "run_not_running")
            cancel = await on_b.post(run["cancel_url"], json={})
    answered = [
        (f.data["id"], f.data["decision"]) for f in frames if f.event == "approval_answered"
    ]
    assert answered == [("call_w", "approved"), ("call_c", "result")]
    assert ran == ["a.md"]  # exactly once, on its owner
    assert frames[-1].event == "run_ended" and frames[-1].data["error"] is None
    assert cancel.json() == {"id": run["id"], "cancelled": False}  # (over: nothing to cancel)


async def test_a_cancel_through_another_worker_says_whether_the_owner_cancelled(
    redis_server: RedisServer,
) -> None:
    redis_url = redis_server.url
    headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
    async with two_workers(redis_url) as (a, b):
        on_a = httpx.AsyncClient(base_url=a.url, timeout=30, headers=headers)
        on_b = httpx.AsyncClient(base_url=b.url, timeout=30, headers=headers)
        async with on_a, on_b:
            run = (await on_a.post("/runs", json={"message": "go", "model": "ask"})).json()
            await until_asked(on_b, run["events_url"], 2)  # (waits on its answers: running)
            first = await on_b.post(run["cancel_url"], json={})
            frames = await read_events(on_b, run["events_url"])
    assert (first.status_code, first.json()) == (202, {"id": run["id"], "cancelled": True})
    assert frames[-1].event == "run_ended" and frames[-1].data["cancelled"] is True


def chunks_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.split("\n") if line[:7] == "data: {"]


async def test_an_ai_sdk_answer_posted_to_another_worker_is_applied_by_the_owner(
    redis_server: RedisServer,
) -> None:
    redis_url = redis_server.url
    ran.clear()
    headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "go"}]}
    async with two_workers(redis_url) as (a, b):
        on_a = httpx.AsyncClient(base_url=a.url, timeout=30, headers=headers)
        on_b = httpx.AsyncClient(base_url=b.url, timeout=30, headers=headers)
        async with on_a, on_b:
            body = {"id": "c1", "messages": [user], "trigger": "submit-message", "model": "ask"}
            first = await on_a.post("/api/chat", json=body)  # ends when the run waits on us
            asked = chunks_of(first.text)
            assert asked[-1] == {"type": "finish", "finishReason": "tool-calls"}
            token = next(c["approvalId"] for c in asked if c["type"] == "tool-approval-request")
            parts = [
                {
                    "type": "tool-write_file",
                    "toolCallId": "call_w",
                    "state": "approval-responded",
                    "approval": {"id": token, "approved": True},
                },
                {
                    "type": "tool-pick_color",
                    "toolCallId": "call_c",
                    "state": "output-available",
                    "output": "red",
                },
            ]
            reply = {"id": "m1", "role": "assistant", "parts": parts}
            forged = {**reply, "parts": [{**parts[0], "approval": {"id": "x", "approved": True}}]}
            answer_body = {**body, "messages": [user, forged]}
            refused = await on_b.post("/api/chat", json=answer_body)
            answer_body = {**body, "messages": [user, reply]}
            rest = await on_b.post("/api/chat", json=answer_body)  # B: not the run's owner
    assert refused.status_code == 403, refused.text
    assert rest.status_code == 200, rest.text
    chunks = chunks_of(rest.text)
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}
    outputs = {c["toolCallId"] for c in chunks if c["type"] == "tool-output-available"}
    assert outputs == {"call_w", "call_c"}
    assert ran == ["a.md"]  # ran once, on its owner


async def test_an_agui_answer_posted_to_another_worker_is_applied_by_the_owner(
    redis_server: RedisServer,
) -> None:
    redis_url = redis_server.url
    ran.clear()
    only = Script(
        turns=(
            Turn(items=(Call(call_id="call_w", name="write_file",
                             arguments='{"path": "b.md", "content": "x"}'),)),
            Turn(items=(Text(text="Done."),)),
        )
    )  # fmt: skip
    headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
    options: dict[str, Any] = {"scripts": {"w": only}, "delay_scale": 0, "store": redis_url}
    async with (
        RelayServer(tools=[write_file], **options) as a,
        RelayServer(tools=[write_file], **options) as b,
    ):
        on_a = httpx.AsyncClient(base_url=a.url, timeout=30, headers=headers)
        on_b = httpx.AsyncClient(base_url=b.url, timeout=30, headers=headers)
        async with on_a, on_b:
            first = await on_a.post("/agui", json=agui_body("t", "r1", model="w"))
            finished = agui_events(first.text)[-1][1]
            assert finished["type"] == "RUN_FINISHED"
            token = finished["outcome"]["interrupts"][0]["id"]
            body = agui_body("t", "r2", model="w")
            wrong = {**body, "resume": [{"interruptId": "x" * 64, "status": "resolved"}]}
            refused = await on_b.post("/agui", json=wrong)
            body["resume"] = [
                {"interruptId": token, "status": "resolved", "payload": {"approved": True}}
            ]
            rest = await on_b.post("/agui", json=body)  # B: not the run's owner
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "thread_busy")
    assert rest.status_code == 200, rest.text
    assert rest.headers["x-toollatch-run"] == first.headers["x-toollatch-run"]
    events = [e for _n, e in agui_events(rest.text)]
    texts = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert texts == ["Done."] and events[-1]["type"] == "RUN_FINISHED"
    assert ran == ["b.md"]  # ran once, on its owner
