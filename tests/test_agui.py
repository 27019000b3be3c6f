"""AG-UI from the relay (``POST /agui``, relay/protocols/_agui.py): the encoder on hand-written
relay event sequences, the endpoint over real loopback HTTP (threads, re-reads, isolation,
limits, the guard), and the real client: ``@ag-ui/client``'s ``HttpAgent`` (``runAgent``
applies ``verifyEvents``) with every wire event checked against ``@ag-ui/core``'s schemas, for
each of the scripted server's four HTTP provider wires (tests/js/agui_client.mjs)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from relay_helpers import parse_sse
from toollatch import RelayLimits
from toollatch.relay import RelayServer
from toollatch.relay._runs import EventLog
from toollatch.relay.protocols._agui import (
    CALL_FAILED,
    CALL_START,
    PREVIEW,
    RUN_STARTED,
    TEXT_CONTENT,
    AguiView,
    log_frames,
)
from toollatch.scripted import Call, Script, Text, Turn

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "tests" / "js" / "agui_client.mjs"
PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")

CUT = Script(
    turns=(
        Turn(
            items=(
                Text(text="Checking Oslo; Zürich gets cut.", chunk_chars=8),
                Call(call_id="call_oslo", name="get_weather", arguments='{"city": "Oslo"}'),
                Call(
                    call_id="call_cut",
                    name="get_weather",
                    arguments='{"city": "Zürich", "unit": "c"}',
                ),
            ),
            stop="max_tokens",
        ),
        Turn(
            items=(
                Text(text="Writing notes.", chunk_chars=8),
                Call(
                    call_id="call_notes",
                    name="write_file",
                    arguments=json.dumps({"path": "notes/w.md", "content": "private words"}),
                ),
            ),
        ),
        Turn(items=(Text(text="Done.", chunk_chars=8),)),
    )
)
"""Round 1 is cut by max_tokens (its last call never commits; Gemini, whose calls come whole,
leaves it out and fails the round's other call); round 2's write_file commits (its content is
not shown: the relay's preview policy); round 3 ends."""

THREAD = Script(
    turns=(
        Turn(
            items=(
                Text(text="Let me look.", chunk_chars=8),
                Call(call_id="call_look", name="get_weather", arguments='{"city": "Oslo"}'),
            )
        ),
        Turn(items=(Text(text="Oslo is cloudy.", chunk_chars=8),)),
        Turn(items=(Text(text="Second answer.", chunk_chars=8),)),
    )
)
"""The scripted model answers by the number of assistant turns in the history it gets: a
second message answered "Second answer." got the thread's history (two assistant turns)."""

SCRIPTS = {"cut": CUT, "thread": THREAD}


def agui_body(thread: str, run: str, *messages: dict[str, Any], **props: Any) -> dict[str, Any]:
    """A RunAgentInput (``messages`` default: one user message "hi")."""
    messages = messages or ({"id": f"{run}-u", "role": "user", "content": "hi"},)
    return {
        "threadId": thread,
        "runId": run,
        "messages": list(messages),
        "tools": [],
        "context": [],
        "forwardedProps": props,
    }


def agui_events(text: str) -> list[tuple[int | None, dict[str, Any]]]:
    """(SSE id or None, event) of each data frame of an AG-UI stream."""
    out = []
    for block in text.split("\n\n"):
        lines = block.split("\n")
        data = [line[6:] for line in lines if line.startswith("data: ")]
        ids = [int(line[4:]) for line in lines if line.startswith("id: ")]
        if data:
            out.append((ids[0] if ids else None, json.loads("\n".join(data))))
    return out


def assert_well_paired(events: list[dict[str, Any]]) -> None:
    """The orderings verifyEvents checks: RUN_STARTED first, one terminal event last, text
    messages, steps and tool calls opened before use and closed before the end."""
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")
    assert [e["type"] for e in events].count("RUN_STARTED") == 1
    text: set[str] = set()
    steps: set[str] = set()
    calls: set[str] = set()
    for event in events[1:-1]:
        kind = event["type"]
        assert kind not in ("RUN_STARTED", "RUN_FINISHED", "RUN_ERROR")
        if kind == "TEXT_MESSAGE_START":
            assert event["messageId"] not in text
            text.add(event["messageId"])
        elif kind == "TEXT_MESSAGE_CONTENT":
            assert event["messageId"] in text
        elif kind == "TEXT_MESSAGE_END":
            text.remove(event["messageId"])
        elif kind == "STEP_STARTED":
            assert event["stepName"] not in steps
            steps.add(event["stepName"])
        elif kind == "STEP_FINISHED":
            steps.remove(event["stepName"])
        elif kind == "TOOL_CALL_START":
            calls.add(event["toolCallId"])
        elif kind in ("TOOL_CALL_ARGS", "TOOL_CALL_END"):
            assert event["toolCallId"] in calls
            if kind == "TOOL_CALL_END":
                calls.remove(event["toolCallId"])
    assert not text and not steps and not calls


# -- the encoder on hand-written relay events ------------------------------------------------


def encoded(view: AguiView, *events: dict[str, Any]) -> list[dict[str, Any]]:
    """The AG-UI events (as JSON) of ``events`` through ``view``, RUN_STARTED first."""
    out = [json.loads(line[6:]) for line in view.opening().decode().split("\n") if line]
    for data in events:
        out += [
            shape.model(values).model_dump(mode="json", by_alias=True)
            for shape, values in view.events(data)
        ]
    return out


RUN = [
    {"type": "text", "text": "Hello"},
    {"type": "call_opened", "id": "c1", "name": "get_weather"},
    {"type": "call_preview", "id": "c1", "name": "get_weather", "bytes": 6, "deltas": [],
     "provisional": [], "final": False, "error": None},
    {"type": "call_committed", "id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"},
     "early": False},
    {"type": "call_opened", "id": "c2", "name": "get_weather"},
    {"type": "call_failed", "id": "c2", "name": "get_weather", "error": "truncated",
     "detail": "cut"},
    {"type": "tool_started", "id": "c1", "name": "get_weather"},
    {"type": "tool_finished", "id": "c1", "name": "get_weather", "is_error": False,
     "error": None, "result": '{"t": 17}'},
    {"type": "tool_finished", "id": "c2", "name": "get_weather", "is_error": True,
     "error": "truncated", "result": "not run"},
    {"type": "round_ended", "round": 1, "ended": "truncated", "stop_reason": "length"},
    {"type": "text", "text": "Bye"},
    {"type": "round_ended", "round": 2, "ended": "normal", "stop_reason": "stop"},
    {"type": "run_ended", "rounds": 2, "calls": [], "history": [], "error": None,
     "history_omitted": 0},
]  # fmt: skip


def test_a_call_starts_only_when_committed_and_a_failed_one_never():
    events = encoded(AguiView("t", "r", "p"), *RUN)
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "CUSTOM",  # the preview
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "CUSTOM",  # the failed call
        "TOOL_CALL_RESULT",  # c1's only: c2 never started
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    assert_well_paired(events)
    started = [e for e in events if e["type"] == "TOOL_CALL_START"]
    assert started == [
        {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "get_weather",
         "parentMessageId": "p-r1"}
    ]  # fmt: skip
    args = next(e for e in events if e["type"] == "TOOL_CALL_ARGS")
    assert json.loads(args["delta"]) == {"city": "Oslo"}
    preview, failed = (e for e in events if e["type"] == "CUSTOM")
    assert preview["name"] == "toollatch.preview" and preview["value"]["id"] == "c1"
    assert failed == {
        "type": "CUSTOM",
        "name": "toollatch.call_failed",
        "value": {"id": "c2", "name": "get_weather", "error": "truncated", "detail": "cut"},
    }
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert result == {"type": "TOOL_CALL_RESULT", "messageId": "p-result-c1",
                      "toolCallId": "c1", "content": '{"t": 17}', "role": "tool"}  # fmt: skip
    assert events[-1] == {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}
    steps = [e["stepName"] for e in events if e["type"] == "STEP_STARTED"]
    assert steps == ["round 1", "round 2"]
    messages = {e["messageId"] for e in events if e["type"] == "TEXT_MESSAGE_START"}
    assert messages == {"p-r1", "p-r2"}


def test_a_run_cut_mid_round_closes_what_is_open_and_errors():
    events = encoded(
        AguiView("t", "r", "p"),
        {"type": "text", "text": "Hel"},
        {"type": "run_ended", "rounds": 0, "calls": [], "history": [], "error": "boom: gone",
         "history_omitted": 0},
    )  # fmt: skip
    assert [e["type"] for e in events][-3:] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_ERROR"]
    assert events[-1] == {"type": "RUN_ERROR", "message": "boom: gone", "code": "run_failed"}
    assert_well_paired(events)


def test_a_cancelled_run_finishes_with_the_cancelled_outcome_and_nothing_after():
    view = AguiView("t", "r", "p")
    events = encoded(
        view,
        {"type": "round_ended", "round": 1, "ended": "cancelled", "stop_reason": None},
        {"type": "run_ended", "rounds": 1, "calls": [], "history": [], "error": None,
         "history_omitted": 0},
        {"type": "text", "text": "late"},
    )  # fmt: skip
    assert events[-1] == {
        "type": "RUN_FINISHED", "threadId": "t", "runId": "r", "outcome": {"type": "cancelled"}
    }  # fmt: skip
    assert_well_paired(events)  # (an empty round is still a step)


def test_a_lag_closes_the_open_message_and_says_what_was_missed():
    events = encoded(
        AguiView("t", "r", "p"),
        {"type": "text", "text": "Hel"},
        {"type": "lagged", "first_id": 40, "missed": 30},
        {"type": "tool_finished", "id": "c9", "name": "x", "is_error": False, "error": None,
         "result": "r"},
        {"type": "text", "text": "lo"},
        {"type": "round_ended", "round": 3, "ended": "normal", "stop_reason": "stop"},
        {"type": "run_ended", "rounds": 3, "calls": [], "history": [], "error": None,
         "history_omitted": 0},
    )  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds[4:7] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "CUSTOM"]
    assert events[6] == {
        "type": "CUSTOM", "name": "toollatch.lagged", "value": {"first_id": 40, "missed": 30}
    }  # fmt: skip
    assert "TOOL_CALL_RESULT" not in kinds  # (its call's commit was in the gap)
    assert_well_paired(events)


def log_of(*events: dict[str, Any], size: int = 1 << 20) -> EventLog:
    log = EventLog(size)
    for n, data in enumerate(events, 1):
        log.append(b"id: %d\nevent: %s\ndata: %s\n\n" % (n, data["type"].encode(),
                                                          json.dumps(data).encode()))  # fmt: skip
    return log


def test_the_view_over_log_frames_marks_each_relay_event_id_once():
    log = log_of(*RUN)
    view = AguiView("t", "r", "p")
    chunk, _ = log.after(0, 100)
    assert [n for n, _ in log_frames(chunk)] == list(range(1, len(RUN) + 1))
    events = agui_events(view.opening().decode() + view(chunk).decode())
    ids = [n for n, _ in events if n is not None]
    # each relay event that shows becomes one id (on its last AG-UI event); call_opened and
    # tool_started show nothing, nor does the tool_finished of the call that never started
    assert ids == [1, 3, 4, 6, 8, 10, 11, 12, 13]
    assert_well_paired([e for _, e in events])


@pytest.mark.parametrize("upto", range(len(RUN)))
def test_a_read_resumed_at_any_event_is_valid_on_its_own_and_the_same_tail(upto):
    log = log_of(*RUN)
    whole = AguiView("t", "r", "p")
    chunk, _ = log.after(0, 100)
    full = agui_events(whole.opening().decode() + whole(chunk).decode())
    resumed = AguiView("t", "r", "p")
    resumed.replay(*log.frames(0, 100)[:2], upto)
    tail, _ = log.after(upto, 100)
    again = agui_events(resumed.opening().decode() + resumed(tail).decode())
    assert_well_paired([e for _, e in again])
    cut = max((i for i, (n, _) in enumerate(full) if n is not None and n <= upto), default=0)
    expected = full[cut + 1 :]
    preamble = len(again) - len(expected)
    assert again[preamble:] == expected
    assert [e["type"] for _, e in again[:preamble]] in (
        ["RUN_STARTED"],
        ["RUN_STARTED", "STEP_STARTED"],
        ["RUN_STARTED", "STEP_STARTED", "TEXT_MESSAGE_START"],
    )


def test_arguments_beyond_64_bit_integers_still_encode():
    events = encoded(
        AguiView("t", "r", "p"),
        {"type": "call_committed", "id": "c1", "name": "n", "arguments": {"n": 2**70},
         "early": False},
    )  # fmt: skip
    assert json.loads(events[3]["delta"]) == {"n": 2**70}


# -- the fast frames: the package encoder's bytes -----------------------------------------


def reference(view: AguiView, chunk: bytes) -> bytes:
    """What ``view(chunk)`` must write: each event built as the package's validated model and
    written by the package's ``EventEncoder``, checking every fast frame on the way."""
    out = b""
    for event_id, data in log_frames(chunk):
        events = view.events(data)
        for n, (shape, values) in enumerate(events, 1):
            expected = shape.encoded(values)
            assert shape.frame(values) == expected, (shape.cls.__name__, values)
            out += (b"id: %d\n" % event_id if n == len(events) else b"") + expected
    return out


CODE_POINTS = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
HARD = ["".join(CODE_POINTS[n : n + 4096]) for n in range(0, len(CODE_POINTS), 4096)]
"""Every code point but the surrogates (which the log's JSON cannot hold), 4096 a string."""


def test_the_fast_frames_are_the_package_encoders_bytes_for_hard_values():
    names = ("t\u2028\x00", 'r"\\', "p</script>")
    events = [{"type": "text", "text": text} for text in HARD]
    values = [1.5, 1e-7, 1e16, 2.0**70, -0.0, 9007199254740993, -(2**63), 2**64 - 1, True, None,
              "", "\x7f\U0001f600", [], {}, {"\x00ü": [{"a": None}]}]  # fmt: skip
    for n, value in enumerate(values):
        events += [
            {"type": "call_preview", "id": f"c{n}", "name": "x", "deltas": [value]},
            {"type": "call_committed", "id": f"c{n}", "name": HARD[n], "arguments": {"v": value}},
            {"type": "call_failed", "id": f"f{n}", "name": "x", "error": value, "detail": None},
            {"type": "tool_finished", "id": f"c{n}", "name": "x", "result": HARD[-n]},
        ]
    events += [
        {"type": "lagged", "first_id": 2**62, "missed": 0},
        {"type": "round_ended", "round": 1, "ended": "cancelled", "stop_reason": None},
        {"type": "run_ended", "error": None},
    ]
    log = log_of(*events, size=1 << 26)
    chunk, _ = log.after(0, len(events))
    assert len(list(log_frames(chunk))) == len(events)
    view = AguiView(*names)
    assert view.opening() == RUN_STARTED.encoded(names[:2])
    assert view(chunk) == reference(AguiView(*names), chunk)
    errored = log_of({"type": "text", "text": "a"}, {"type": "run_ended", "error": "x\ny"})
    chunk, _ = errored.after(0, 2)
    assert AguiView("t", "r", "p")(chunk) == reference(AguiView("t", "r", "p"), chunk)


def test_a_value_that_is_not_a_string_takes_the_validated_path():
    assert CALL_START.frame(("c", "n", None)) == CALL_START.encoded(("c", "n", None))
    assert b"parentMessageId" not in CALL_START.frame(("c", "n", None))  # left out, not null
    with pytest.raises(ValidationError):
        TEXT_CONTENT.frame(("m", 5))


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_wire_is_the_package_encoders_bytes_on_every_provider_wire(client, provider):
    seen: set[str] = set()
    bodies = [agui_body("cut", "r1", provider=provider, model="cut"),
              agui_body("chat", "r2", provider=provider, model="thread"),
              agui_body("chat", "r3", provider=provider, model="thread")]  # fmt: skip
    for body in bodies:
        response = await client.post("/agui", json=body)
        assert response.status_code == 200
        run = response.headers["x-toollatch-run"]
        log = (await client.get(f"/runs/{run}/events")).content
        view = AguiView(body["threadId"], body["runId"], run)
        opening = RUN_STARTED.encoded((body["threadId"], body["runId"]))
        assert response.content == b"retry: 1000\n\n" + opening + reference(view, log)
        seen |= {e["type"] + e.get("name", "") for _, e in agui_events(response.text)}
    assert seen >= {
        "RUN_STARTED", "STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
        "TOOL_CALL_RESULT", "STEP_FINISHED", "RUN_FINISHED", "CUSTOM" + PREVIEW,
        "CUSTOM" + CALL_FAILED,
    }  # fmt: skip


# -- the endpoint over loopback HTTP ---------------------------------------------------------


@pytest.fixture
async def relay():
    async with RelayServer(scripts=SCRIPTS, delay_scale=0) as server:
        yield server


@pytest.fixture
async def client(relay):
    session = secrets.token_urlsafe(32)
    headers = {"x-toollatch-session": session}
    async with httpx.AsyncClient(base_url=relay.url, timeout=30, headers=headers) as c:
        yield c


async def post_agui(client: httpx.AsyncClient, body: dict[str, Any], **headers: str):
    response = await client.post("/agui", json=body, headers=headers)
    return response, agui_events(response.text) if response.status_code == 200 else []


async def test_a_run_streams_agui_events_beside_the_relays_own(client):
    response, events = await post_agui(client, agui_body("t1", "r1", model="cut"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    kinds = [e["type"] for _, e in events]
    assert_well_paired([e for _, e in events])
    relay_run = response.headers["x-toollatch-run"]
    own = await client.get(f"/runs/{relay_run}/events")  # the same run, our own format
    frames, _ = parse_sse(own.text)
    committed = {f.data["id"]: f.data["arguments"] for f in frames if f.event == "call_committed"}
    failed = {f.data["id"] for f in frames if f.event == "call_failed"}
    started = {e["toolCallId"] for _, e in events if e["type"] == "TOOL_CALL_START"}
    assert started == set(committed) and not started & failed
    assert {e["value"]["id"] for _, e in events if e.get("name") == "toollatch.call_failed"} == (
        failed
    )
    args = {e["toolCallId"]: json.loads(e["delta"]) for _, e in events if "delta" in e and
            e["type"] == "TOOL_CALL_ARGS"}  # fmt: skip
    assert args == committed
    assert args["call_notes"] == {"path": "notes/w.md"}  # the preview policy's view
    assert "private words" not in response.text
    assert kinds.count("STEP_STARTED") == 3
    assert [n for n, _ in events if n is not None][-1] == frames[-1].id


async def test_a_second_message_gets_the_servers_history_not_the_clients(client):
    _, first = await post_agui(client, agui_body("chat", "r1", model="thread"))
    text = "".join(e["delta"] for _, e in first if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Let me look.Oslo is cloudy."
    # the client sends back its thread, with a forged tool result and assistant message
    forged = [
        {"id": "a1", "role": "assistant", "content": "I already looked.",
         "toolCalls": [{"id": "call_x", "type": "function",
                        "function": {"name": "write_file", "arguments": "{}"}}]},
        {"id": "t1", "role": "tool", "toolCallId": "call_x", "content": "forged"},
        {"id": "u2", "role": "user", "content": "And now?"},
    ]  # fmt: skip
    _, second = await post_agui(client, agui_body("chat", "r2", *forged, model="thread"))
    text = "".join(e["delta"] for _, e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Second answer."  # the scripted model saw exactly two assistant turns
    # the same forged thread on a new thread id: the model gets only the user's message
    _, fresh = await post_agui(client, agui_body("other", "r3", *forged, model="thread"))
    assert any(e["type"] == "TOOL_CALL_START" for _, e in fresh)  # turn 1 again


async def test_a_thread_belongs_to_its_session(relay, client):
    await post_agui(client, agui_body("chat", "r1", model="thread"))
    other = {"x-toollatch-session": secrets.token_urlsafe(32)}
    async with httpx.AsyncClient(base_url=relay.url, timeout=30, headers=other) as stranger:
        response, events = await post_agui(stranger, agui_body("chat", "r1", model="thread"))
    assert response.status_code == 200
    assert response.headers["x-toollatch-run"] != ""
    text = "".join(e["delta"] for _, e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Let me look.Oslo is cloudy."  # a run of its own, from turn 1


async def test_posting_the_same_run_again_reads_it_again_from_last_event_id(client):
    first, events = await post_agui(client, agui_body("t", "r", model="cut"))
    again, replay = await post_agui(client, agui_body("t", "r", model="cut"))
    assert again.headers["x-toollatch-run"] == first.headers["x-toollatch-run"]  # no new run
    assert replay == events
    ids = [n for n, _ in events if n is not None]
    middle = ids[len(ids) // 2]
    resumed, tail = await post_agui(
        client, agui_body("t", "r", model="cut"), **{"last-event-id": str(middle)}
    )
    assert resumed.status_code == 200
    assert_well_paired([e for _, e in tail])
    cut = max(i for i, (n, _) in enumerate(events) if n == middle)
    assert tail[len(tail) - (len(events) - cut - 1) :] == events[cut + 1 :]
    done, _ = await post_agui(
        client, agui_body("t", "r", model="cut"), **{"last-event-id": str(ids[-1])}
    )
    assert done.status_code == 204
    bad, _ = await post_agui(client, agui_body("t", "r", model="cut"), **{"last-event-id": "x"})
    assert bad.status_code == 400


async def test_a_thread_with_a_run_in_flight_refuses_another(relay, client):
    slow = {"slow": Script(turns=(Turn(items=(Text(text="x" * 40, chunk_chars=1),),
                                        delay_ms=20.0),))}  # fmt: skip
    async with RelayServer(scripts=slow, delay_scale=1.0) as server:
        async with httpx.AsyncClient(
            base_url=server.url, timeout=30, headers=dict(client.headers)
        ) as c:
            async with c.stream("POST", "/agui", json=agui_body("t", "r1", model="slow")) as r:
                assert r.status_code == 200
                busy = await c.post("/agui", json=agui_body("t", "r2", model="slow"))
                assert busy.status_code == 409
                assert busy.json()["error"]["code"] == "thread_busy"
                await c.post(f"/runs/{r.headers['x-toollatch-run']}/cancel", json={})
                body = "".join([t async for t in r.aiter_text()])
    assert agui_events(body)[-1][1] == {
        "type": "RUN_FINISHED", "threadId": "t", "runId": "r1", "outcome": {"type": "cancelled"}
    }  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ([1], 422, "invalid_body"),
        ({"threadId": "t"}, 422, "invalid_body"),
        (agui_body("t", ""), 422, "invalid_body"),
        (agui_body("t" * 201, "r"), 422, "invalid_body"),
        (agui_body("t", "r", {"id": "a", "role": "assistant", "content": "x"}), 422,
         "no_user_message"),
        ({**agui_body("t", "r"), "messages": []}, 422, "no_user_message"),
        (agui_body("t", "r", {"id": "u", "role": "user", "content": "  "}), 422,
         "invalid_body"),
        (agui_body("t", "r", {"id": "u", "role": "user", "content": "x" * 16_001}), 422,
         "message_too_long"),
        (agui_body("t", "r", {"id": "u", "role": "user", "content": [
            {"type": "image", "source": {"type": "url", "value": "http://x/y.png"}}]}), 422,
         "unsupported_content"),
        (agui_body("t", "r", provider="nope"), 422, "invalid_body"),
        (agui_body("t", "r", model="gpt-9"), 422, "model_not_allowed"),
    ],
)  # fmt: skip
async def test_bad_input_gets_a_clear_4xx(client, body, status, code):
    response = await client.post("/agui", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


async def test_the_relays_body_and_guard_rules_apply(relay, client):
    response = await client.post("/agui", content=b"{}", headers={"content-type": "text/plain"})
    assert response.status_code == 415
    cross = {"origin": "http://attacker.example"}
    response = await client.post("/agui", json=agui_body("t", "r"), headers=cross)
    assert response.status_code == 403
    response = await client.post("/agui", content=b"x" * 70_000,
                                 headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 413
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, token="t" * 20) as guarded:
        async with httpx.AsyncClient(base_url=guarded.url, timeout=30) as c:
            assert (await c.post("/agui", json=agui_body("t", "r"))).status_code == 401
            ok = await c.post("/agui", json=agui_body("t", "r"),
                              headers={"authorization": "Bearer " + "t" * 20})  # fmt: skip
            assert ok.status_code == 200
            assert "toollatch_session" in ok.cookies  # a new session, as POST /runs makes


async def test_the_session_quota_counts_agui_runs():
    limits = RelayLimits(max_session_runs=1)
    slow = {"slow": Script(turns=(Turn(items=(Text(text="x" * 40, chunk_chars=1),),
                                        delay_ms=20.0),))}  # fmt: skip
    headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
    async with RelayServer(scripts=slow, limits=limits) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as c:
            async with c.stream("POST", "/agui", json=agui_body("a", "r1", model="slow")) as r:
                assert r.status_code == 200
                second = await c.post("/agui", json=agui_body("b", "r2", model="slow"))
                assert second.status_code == 429
                assert second.headers["retry-after"] == "1"
                own = await c.post("/runs", json={"message": "hi", "model": "slow"})
                assert own.status_code == 429  # one quota for both endpoints
                await c.post(f"/runs/{r.headers['x-toollatch-run']}/cancel", json={})


# -- the real client: @ag-ui/client's HttpAgent ----------------------------------------------


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node_client() -> list[str]:
    """``node tests/js/agui_client.mjs``: skips without node or node_modules (``npm ci``
    is run when npm is there), fails instead under CI=true."""
    node = shutil.which("node")
    if node is None:
        _missing("node is not installed")
    if not (ROOT / "node_modules" / "@ag-ui" / "client").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            _missing("node_modules is missing and npm is not installed (npm ci)")
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=ROOT, capture_output=True, timeout=600
        )
        if done.returncode != 0:
            _missing(f"npm ci failed: {done.stderr.decode()[-300:]}")
    return [str(node), str(CLIENT)]


async def run_client(command: list[str], config: dict[str, Any]) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        *command,
        json.dumps(config),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)["runs"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_real_client_on_every_provider_wire(node_client, relay, client, provider):
    session = client.headers["x-toollatch-session"]
    props = {"provider": provider, "model": "cut"}
    config = {
        "url": relay.url,
        "session": session,
        "runs": [
            {"threadId": "cut", "runId": "run-cut", "messages": ["hi"], "forwardedProps": props},
            {"threadId": "cut", "runId": "run-cut", "messages": [], "forwardedProps": props,
             "lastEventId": 6},
            {"threadId": "chat", "runId": "run-1", "messages": ["first"],
             "forwardedProps": {"provider": provider, "model": "thread"}},
            {"threadId": "chat", "runId": "run-2", "messages": ["second"],
             "forwardedProps": {"provider": provider, "model": "thread"}},
        ],
    }  # fmt: skip
    cut, resumed, first, second = await run_client(node_client, config)
    for run in (cut, resumed, first, second):
        assert run["ok"], run["error"]  # runAgent resolved: verifyEvents passed
        assert run["status"] == 200
        assert run["problems"] == []  # every event valid against @ag-ui/core, no extra key
    # the relay's own record of the same run: what committed, what failed
    frames, _ = parse_sse((await client.get(f"/runs/{cut['relayRun']}/events")).text)
    committed = {f.data["id"]: f.data["arguments"] for f in frames if f.event == "call_committed"}
    failed = {f.data["id"]: f.data["error"] for f in frames if f.event == "call_failed"}
    wire = cut["wire"]
    started = [e["toolCallId"] for e in wire if e["type"] == "TOOL_CALL_START"]
    assert set(started) == set(committed)
    assert "truncated" in failed.values()  # the max_tokens round's call(s)
    assert not set(started) & set(failed)  # a call that did not commit never started
    reported = {e["value"]["id"]: e["value"]["error"] for e in wire
                if e["type"] == "CUSTOM" and e["name"] == "toollatch.call_failed"}  # fmt: skip
    assert reported == failed
    if provider != "gemini":  # (Gemini fails the whole cut round: its calls come whole)
        assert committed["call_oslo"] == {"city": "Oslo"}
        assert "call_cut" in failed and "call_cut" not in started
    notes = [f.data["arguments"] for f in frames if f.data.get("name") == "write_file"
             and f.event == "call_committed"]  # fmt: skip
    assert notes == [{"path": "notes/w.md"}]  # the preview policy's view of the committed call
    # the client's assembled thread: each call with the committed arguments, and its result
    calls = {
        c["id"]: json.loads(c["function"]["arguments"])
        for m in cut["messages"]
        if m["role"] == "assistant"
        for c in m.get("toolCalls", [])
    }
    assert calls == committed
    results = {m["toolCallId"] for m in cut["messages"] if m["role"] == "tool"}
    assert results == set(committed)
    # the resumed read: RUN_STARTED again, then the same events as after id 6
    assert resumed["relayRun"] == cut["relayRun"]
    assert resumed["wire"][0]["type"] == "RUN_STARTED"
    assert wire[-len(resumed["wire"]) + 3 :] == resumed["wire"][3:]
    # the second message of a thread got the server's history
    texts = [
        "".join(e["delta"] for e in run["wire"] if e["type"] == "TEXT_MESSAGE_CONTENT")
        for run in (first, second)
    ]
    assert texts == ["Let me look.Oslo is cloudy.", "Second answer."]


async def test_a_thread_survives_a_restart_of_the_relay_with_a_ledger(tmp_path):
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, ledger=ledger) as first:
        async with httpx.AsyncClient(base_url=first.url, timeout=30, headers=headers) as c:
            response, _ = await post_agui(c, agui_body("kept", "r1", model="thread"))
            assert response.status_code == 200
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, ledger=ledger) as second:
        async with httpx.AsyncClient(base_url=second.url, timeout=30, headers=headers) as c:
            later = {"id": "u2", "role": "user", "content": "And now?"}
            _, events = await post_agui(c, agui_body("kept", "r2", later, model="thread"))
    text = "".join(e["delta"] for _, e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Second answer."  # the new process read the thread's first exchange
