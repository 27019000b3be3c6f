"""A relay worker that dies with a shared store while it answers a chat of the AI SDK
(``POST /api/chat``) or an AG-UI thread (``POST /agui``): the surviving worker ends the run
with the chat's or the thread's own ledger scope (a call the ledger saw start is
``outcome_unknown``, not ``cancelled``), the chat and the thread keep a paired, valid history
(the dead run's finished rounds), and their next message, on the survivor, goes on from it.
Real ``toollatch serve`` processes on a real redis-server and a shared SQLite ledger, the
owner SIGKILLed while one tool runs and another waits for its group's lock."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger_helpers import RedisServer
from relay_helpers import stop
from test_agui import agui_body, agui_events, assert_well_paired
from test_relay_lease import assert_paired, read_until, workers
from toollatch import open_ledger
from toollatch.ledger import LedgerKey
from toollatch.relay._chats import ChatStore
from toollatch.relay.protocols._agui import _thread_scope
from toollatch.runtime._resume import INTERRUPTED_NOTE
from toollatch.scripted import Call, Faults, Script, ScriptedServer, Text, Turn

TOOLS = '''
import os, time
from toollatch import tool

@tool(group="weather")
def get_weather(city: str) -> str:
    """The weather, one city at a time (Rome's slowly: the worker is killed meanwhile)."""
    with open(os.environ["LEASE_TOOL_LOG"], "a") as log:
        log.write(city + "\\n")
    if city == "Rome":
        time.sleep(60)
    return "sunny"
'''

SCRIPTS = {
    "slow": Script(
        turns=(
            Turn(items=(Call(call_id="call_a", name="get_weather", arguments='{"city": "Oslo"}'),)),
            Turn(
                items=(
                    Call(call_id="call_b", name="get_weather", arguments='{"city": "Rome"}'),
                    Call(call_id="call_c", name="get_weather", arguments='{"city": "Bern"}'),
                )
            ),
            Turn(items=(Text(text="Done."),)),
        )
    ),
    "quick": Script(turns=tuple(Turn(items=(Text(text="Fine."),)) for _ in range(4))),
    "stalled": Script(
        turns=(
            Turn(
                items=(Text(text="Let me think about that for a long while.", chunk_chars=8),),
                faults=Faults(stall_ms=120_000, stall_after_events=3),
            ),
        )
    ),
}
"""``slow``: a first round whose call finishes (Oslo), then a round of two calls of one group:
Rome runs (for a minute), Bern waits for the group's lock. ``quick``: a text answer.
``stalled``: an answer that stops after a few words (its worker is killed meanwhile)."""


@contextlib.contextmanager
def two_workers(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[list[tuple[subprocess.Popen[str], str]], ScriptedServer, str, Path]]:
    """Two workers (a 1 s lease, one SQLite ledger); the model, the ledger URL, the tools' log."""
    tools = tmp_path / "group_tools.py"
    tools.write_text(TOOLS, encoding="utf-8")
    ran = tmp_path / "ran.txt"
    ran.touch()
    monkeypatch.setenv("LEASE_TOOL_LOG", str(ran))
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"  # (shared by both workers: one host)
    with ScriptedServer(scripts=SCRIPTS) as model:
        args = ("--store", redis_url, "--ledger", ledger, "--lease", "1", "--tools", str(tools))
        args += ("--base-url", model.base_url("openai_chat"), "--model", "slow")
        args += ("--allow-model", "slow", "--allow-model", "quick", "--allow-model", "stalled")
        with workers(2, *args) as procs:
            yield procs, model, ledger, ran


def wait_for(ran: Path, line: str) -> None:
    """Until the tools' log has ``line`` (a tool started), at most 30 s."""
    give_up = time.monotonic() + 30
    while line not in ran.read_text().split() and time.monotonic() < give_up:
        time.sleep(0.05)
    assert line in ran.read_text().split()


def started_in_the_ledger(ledger_url: str, scope: str, call_id: str) -> None:
    """Mark ``call_id`` (claimed by its worker, waiting for its group's lock) ``started`` in
    the ledger, under its worker's claim: as if the worker started it and died before the
    run's log had ``tool_started`` (the log may lag the ledger by one write). The record
    exists only under the run's own scope, which this checks too."""

    async def mark() -> None:
        ledger = open_ledger(ledger_url)
        try:
            key = LedgerKey(scope=scope, call_id=call_id)
            give_up = time.monotonic() + 10
            while (record := await ledger.get(key)) is None and time.monotonic() < give_up:
                await asyncio.sleep(0.05)  # (claimed as its round's calls are dispatched)
            assert record is not None and record.state == "claimed", record
            await ledger.start(key, record.token, now=time.time(), lease_s=300)
        finally:
            await ledger.aclose()

    asyncio.run(mark())


def assert_ended_by_the_survivor(frames: list[Any]) -> None:
    """Paired, ended by the survivor; Rome and Bern ``outcome_unknown`` (Bern from the
    ledger), Oslo's result kept."""
    assert_paired(frames)
    assert "stopped (its lease of 1 s expired)" in frames[-1].data["error"]
    finished = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    assert finished["call_a"]["error"] is None
    assert finished["call_b"]["error"] == "outcome_unknown"
    assert finished["call_c"]["error"] == "outcome_unknown"


def assert_goes_on_from_the_interrupted_round(sent: list[dict[str, Any]]) -> None:
    """The history the model got after the survivor ended the run (OpenAI chat format):
    Oslo's round with its result, the interrupted round (Rome, Bern) each call paired with its
    ``outcome_unknown`` result, the survivor's note, then the next user message; never two
    user turns in a row."""
    roles = [m["role"] for m in sent]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant", "user"]
    assert sent[0]["content"] == "three cities" and sent[-1]["content"] == "and?"
    assert sent[2] == {"role": "tool", "tool_call_id": "call_a", "content": "sunny"}
    calls = sent[3]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        ("call_b", "get_weather"),
        ("call_c", "get_weather"),
    ]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}
    for message, call_id in zip(sent[4:6], ("call_b", "call_c"), strict=True):
        assert message["tool_call_id"] == call_id
        assert message["content"].startswith("outcome_unknown: the worker running this call")
        assert "it may have had its effect" in message["content"]
    assert sent[6] == {"role": "assistant", "content": INTERRUPTED_NOTE}
    assert not [a for a, b in itertools.pairwise(roles) if a == b == "user"]


def ui_chunks(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of a UI message stream (``[DONE]`` as ``{"type": "[DONE]"}``)."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            body = block[6:]
            out.append({"type": body} if body == "[DONE]" else json.loads(body))
    return out


def said(message_id: str, text: str) -> dict[str, Any]:
    """A user message of the AI SDK's ``useChat``."""
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


@contextlib.contextmanager
def chat_started(url: str, headers: dict[str, str], body: dict[str, Any]) -> Iterator[Any]:
    """``POST /api/chat`` on ``url``, its stream open: the response (its run id in
    ``x-toollatch-run-id``)."""
    with (
        httpx.Client(base_url=url, timeout=30, headers=headers) as a,
        a.stream("POST", "/api/chat", json=body) as first,
    ):
        assert first.status_code == 200
        yield first


def ui_tool_calls(chunks: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """The call ids a UI message stream gave the input of, and those it gave an output
    (or an output error) of."""
    inputs = {c["toolCallId"] for c in chunks if c["type"] == "tool-input-available"}
    ends = ("tool-output-available", "tool-output-error")
    return inputs, {c["toolCallId"] for c in chunks if c["type"] in ends}


def test_a_killed_workers_ai_sdk_chat_is_ended_and_goes_on_on_the_survivor(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = secrets.token_urlsafe(32)
    headers = {"x-toollatch-session": session}
    user = said("u1", "three cities")
    body = {"id": "chat1", "messages": [user], "trigger": "submit-message", "model": "slow"}
    with two_workers(redis_server.url, tmp_path, monkeypatch) as (procs, model, ledger, ran):
        (owner, on_a), (_b, on_b) = procs
        with chat_started(on_a, headers, body) as first:
            run_id = first.headers["x-toollatch-run-id"]
            wait_for(ran, "Rome")  # (Bern waits for the group's lock)
        started_in_the_ledger(ledger, ChatStore.scope(session, "chat1"), "call_c")
        stop(owner, signal.SIGKILL)
        with httpx.Client(base_url=on_b, timeout=30, headers=headers) as b:
            resumed = b.get("/api/chat/chat1/stream")  # (the AI SDK's resume: to the end)
            frames = read_until(b, f"/runs/{run_id}/events", None)
            more = {**body, "messages": [user, said("u2", "and?")], "model": "quick"}
            after = b.post("/api/chat", json=more)
    assert_ended_by_the_survivor(frames)
    chunks = ui_chunks(resumed.text)
    inputs, outputs = ui_tool_calls(chunks)
    assert {"call_b", "call_c"} <= inputs and inputs == outputs
    assert chunks[-2]["type"] == "finish" and chunks[-1]["type"] == "[DONE]"
    assert after.status_code == 200
    answer = ui_chunks(after.text)
    assert next(c for c in answer if c["type"] == "text-delta")["delta"] == "Fine."
    assert not [c for c in answer if c["type"] == "error"]
    sent = model.requests[-1].body["messages"]  # the chat's history, as the model got it
    assert_goes_on_from_the_interrupted_round(sent)
    assert sorted(ran.read_text().split()) == ["Oslo", "Rome"]  # Bern never ran


def test_a_killed_workers_agui_thread_is_ended_and_keeps_its_history_on_the_survivor(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = secrets.token_urlsafe(32)
    headers = {"x-toollatch-session": session}
    asked = {"id": "u1", "role": "user", "content": "three cities"}
    with two_workers(redis_server.url, tmp_path, monkeypatch) as (procs, model, ledger, ran):
        (owner, on_a), (_b, on_b) = procs
        with (
            httpx.Client(base_url=on_a, timeout=30, headers=headers) as a,
            a.stream("POST", "/agui", json=agui_body("t1", "r1", asked, model="slow")) as first,
        ):
            assert first.status_code == 200
            run_id = first.headers["x-toollatch-run"]
            wait_for(ran, "Rome")  # (Bern waits for the group's lock)
        started_in_the_ledger(ledger, _thread_scope(session, "t1"), "call_c")
        stop(owner, signal.SIGKILL)
        with httpx.Client(base_url=on_b, timeout=30, headers=headers) as b:
            frames = read_until(b, f"/runs/{run_id}/events", None)
            again = b.post("/agui", json=agui_body("t1", "r1", asked, model="slow"))
            then = {"id": "u2", "role": "user", "content": "and?"}
            after = b.post("/agui", json=agui_body("t1", "r2", then, model="quick"))
    assert_ended_by_the_survivor(frames)
    events = [e for _id, e in agui_events(again.text)]  # (the run read again, on the survivor)
    assert_well_paired(events)
    ended = {e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_END"}
    results = {e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"}
    assert ended == results == {"call_a", "call_b", "call_c"}
    assert events[-1]["type"] == "RUN_ERROR"
    answer = [e for _id, e in agui_events(after.text)]
    assert after.status_code == 200 and answer[-1]["type"] == "RUN_FINISHED"
    sent = model.requests[-1].body["messages"]  # the thread's history, as the model got it
    assert_goes_on_from_the_interrupted_round(sent)
    assert sorted(ran.read_text().split()) == ["Oslo", "Rome"]  # Bern never ran


def test_a_chat_whose_run_dies_before_its_first_round_ends_gets_no_two_user_turns(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner dies while the model's first answer streams: the chat stored only the
    user's message; the survivor stores its note after it, so the next message does not
    follow a user turn (Bedrock and Anthropic reject two in a row)."""
    session = secrets.token_urlsafe(32)
    headers = {"x-toollatch-session": session}
    user = said("u1", "think")
    body = {"id": "chat2", "messages": [user], "trigger": "submit-message", "model": "stalled"}
    with two_workers(redis_server.url, tmp_path, monkeypatch) as (procs, model, _ledger, _ran):
        (owner, on_a), (_b, on_b) = procs
        with chat_started(on_a, headers, body) as first:
            run_id = first.headers["x-toollatch-run-id"]
            for line in first.iter_lines():  # (until the answer has begun)
                if '"text-delta"' in line:
                    break
        stop(owner, signal.SIGKILL)
        with httpx.Client(base_url=on_b, timeout=30, headers=headers) as b:
            frames = read_until(b, f"/runs/{run_id}/events", None)
            more = {**body, "messages": [user, said("u2", "and?")], "model": "quick"}
            after = b.post("/api/chat", json=more)
    assert "stopped (its lease of 1 s expired)" in frames[-1].data["error"]
    assert after.status_code == 200
    answer = ui_chunks(after.text)
    assert next(c for c in answer if c["type"] == "text-delta")["delta"] == "Fine."
    sent = model.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[0]["content"] == "think" and sent[-1]["content"] == "and?"
    assert sent[1] == {"role": "assistant", "content": INTERRUPTED_NOTE}
