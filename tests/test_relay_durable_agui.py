"""``toollatch serve --durable``: AG-UI runs (``POST /agui``), resumed runs (``POST /runs
{"resume"}``) and the AI SDK's answer messages on DBOS workflows, their owner SIGKILLed:
a survivor finishes the run normally (not ended by the lease), the AG-UI client's
reconnect (the same ``threadId`` and ``runId`` with ``Last-Event-ID``) goes on to
``RUN_FINISHED``, every call id paired, each side effect once (the tool appends a line to a
file), and the thread's or the run's history is stored once (the next message's request
to the model shows it). Real ``toollatch serve`` processes on a real redis-server and a
real PostgreSQL (tests/test_relay_durable.py's harness)."""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_helpers import PostgresServer, wait_for
from ledger_helpers import RedisServer
from relay_helpers import slow_script, stop
from test_agui import agui_body, agui_events, assert_well_paired
from test_relay_durable import (
    ASKING_TOOL,
    SHARED_SECRET,
    SURVIVOR_SCALE,
    assert_attempts_paired,
    assert_finished_by_a_survivor,
    durable_workers,
    lines,
    read_all,
)
from test_relay_lease_chats import ui_chunks
from toollatch.scripted import Call, Script, Text, Turn

pytest.importorskip("dbos")

Event = tuple[int | None, dict[str, Any]]


def agui_until(
    client: httpx.Client, body: dict[str, Any], done: Any, last_id: int = 0
) -> tuple[list[Event], str]:
    """``POST /agui`` ``body`` (after ``last_id``): its events until ``done(events)`` or the
    stream's end (at most 60 s), and the relay run's id."""
    headers = {"last-event-id": str(last_id)} if last_id else {}
    give_up = time.monotonic() + 60
    text, events = "", list[Event]()
    with client.stream("POST", "/agui", json=body, headers=headers) as stream:
        assert stream.status_code == 200, stream.read()
        run_id = stream.headers["x-toollatch-run"]
        for chunk in stream.iter_text():
            text += chunk
            events = agui_events(text.rsplit("\n\n", 1)[0] + "\n\n")
            if (done is not None and done(events)) or time.monotonic() > give_up:
                break
    return events, run_id


def kinds(events: list[Event]) -> list[str]:
    return [e["type"] for _id, e in events]


def calls_ended(events: list[Event]) -> set[str]:
    return {e["toolCallId"] for _id, e in events if e["type"] == "TOOL_CALL_END"}


def calls_answered(events: list[Event]) -> set[str]:
    return {e["toolCallId"] for _id, e in events if e["type"] == "TOOL_CALL_RESULT"}


def last_id(events: list[Event]) -> int:
    return max(i for i, _e in events if i is not None)


ASKED = {"id": "u1", "role": "user", "content": "two cities"}


def test_a_killed_owner_mid_tool_has_its_agui_run_finished_by_a_survivor(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    first = agui_body("t1", "r1", ASKED)
    with durable_workers(redis_server, postgres, tmp_path, [60, 0, 0], "agui") as (model, procs):
        (owner, on_a), (_b, on_b), (_c, on_c) = procs
        with httpx.Client(base_url=on_a, timeout=30, headers=session) as a:
            head, run_id = agui_until(a, first, lambda es: len(calls_ended(es)) == 2)
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        stop(owner, signal.SIGKILL)  # mid-tool: its call step never returns
        with httpx.Client(base_url=on_b, timeout=60, headers=session) as b:
            tail, again = agui_until(b, first, None, last_id=last_id(head))  # the reconnect
        whole = read_all(on_c, {"events_url": f"/runs/{run_id}/events"}, session)
        done = sorted(lines(tmp_path))
        with httpx.Client(base_url=on_c, timeout=30, headers=session) as c:
            then = {"id": "u2", "role": "user", "content": "and?"}
            after, _next = agui_until(c, agui_body("t1", "r2", then), None)
            sent = model.requests[-1].body["messages"]  # the thread's history, as sent
    assert again == run_id
    assert_finished_by_a_survivor(whole)  # finished normally, every call paired
    assert done == ["Oslo", "Züri"]  # each side effect exactly once
    # the reconnect went on from where the dead owner's stream stopped, to RUN_FINISHED
    assert_well_paired([e for _id, e in tail])
    assert kinds(tail)[-1] == "RUN_FINISHED" and "RUN_ERROR" not in kinds(tail)
    assert calls_ended(head) == calls_answered(head + tail) == {"call_slow_a", "call_slow_b"}
    assert not calls_ended(tail)  # no call started twice
    assert next(i for i, _e in tail if i is not None) > last_id(head)
    # the thread's history was stored once, by the run's end, and the next message goes on
    assert kinds(after)[-1] == "RUN_FINISHED"
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert sent[0]["content"] == "two cities" and sent[-2]["content"] == "Both done."
    assert sent[-1]["content"] == "and?"
    assert sorted(lines(tmp_path)) == done


def test_a_killed_owner_mid_stream_has_its_agui_run_finished_by_a_survivor(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    first = agui_body("t2", "r1", ASKED)
    previewed = lambda es: any(e.get("name") == "toollatch.preview" for _i, e in es)  # noqa: E731
    with durable_workers(redis_server, postgres, tmp_path, [0, 0], "aguistream", delay_ms=60.0) as (
        model,
        procs,
    ):
        (owner, on_a), (_b, on_b) = procs
        with httpx.Client(base_url=on_a, timeout=30, headers=session) as a:
            head, run_id = agui_until(a, first, previewed)  # a call's arguments streaming
        stop(owner, signal.SIGKILL)  # mid-stream: the round's step never returns
        model.delay_scale = SURVIVOR_SCALE  # (the round asked again: its pace is moot now)
        with httpx.Client(base_url=on_b, timeout=60, headers=session) as b:
            tail, _again = agui_until(b, first, None, last_id=last_id(head))
        whole = read_all(on_b, {"events_url": f"/runs/{run_id}/events"}, session)
        statuses = [r.status for r in model.requests]
    assert not calls_ended(head)  # nothing had committed when the owner died
    assert_well_paired([e for _id, e in tail])
    assert kinds(tail)[-1] == "RUN_FINISHED"
    assert calls_ended(tail) == calls_answered(tail) == {"call_slow_a", "call_slow_b"}
    assert_attempts_paired(whole)
    assert whole[-1].data["error"] is None
    assert [c["error"] for c in whole[-1].data["calls"]] == [None, None]
    assert statuses == [200, 200, 200]  # the cut round asked again, then the last one
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]  # each once, on the survivor


LATER = Script(
    turns=(
        Turn(items=(Text(text="First things first."),)),
        *slow_script(delay_ms=5.0).turns,
    )
)
"""A text answer, then (the next message) two calls, then text."""


def test_a_resumed_durable_run_is_finished_by_a_survivor_and_stored_once(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(redis_server, postgres, tmp_path, [60, 0, 0], "resumed", script=LATER) as (
        model,
        procs,
    ):
        (owner, on_a), (_b, on_b), (_c, on_c) = procs
        with httpx.Client(base_url=on_a, timeout=30) as a:
            run = a.post("/runs", json={"message": "hello"}).json()
            session = {"x-toollatch-session": a.cookies["toollatch_session"]}
        ended = read_all(on_a, run, session)
        with httpx.Client(base_url=on_a, timeout=30, headers=session) as a:
            body = {"resume": run["id"], "message": "two cities"}
            resumed = a.post("/runs", json=body)  # on the owner, which is then killed
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        stop(owner, signal.SIGKILL)
        whole = read_all(on_b, run, session)
        done = sorted(lines(tmp_path))
        with httpx.Client(base_url=on_c, timeout=30, headers=session) as c:
            more = c.post("/runs", json={"resume": run["id"], "message": "and?"})
            last = read_all(on_c, run, session)
            sent = model.requests[-1].body["messages"]  # the run's history, as sent
    assert ended[-1].data["error"] is None
    assert resumed.status_code == 201, resumed.text
    assert resumed.json()["id"] == run["id"]
    assert_finished_by_a_survivor(whole)
    assert done == ["Oslo", "Züri"]  # each side effect exactly once
    assert more.status_code == 201, more.text
    assert last[-1].data["error"] is None
    roles = ["user", "assistant", "user", "assistant", "tool", "tool", "assistant", "user"]
    assert [m["role"] for m in sent] == roles  # each turn stored once
    assert [sent[i]["content"] for i in (0, 1, 2, 6, 7)] == [
        "hello",
        "First things first.",
        "two cities",
        "Both done.",
        "and?",
    ]
    assert sorted(lines(tmp_path)) == done


ONE_CALL = Script(
    turns=(
        Turn(items=(Call(call_id="call_one", name="get_weather", arguments='{"city": "Oslo"}'),)),
        Turn(items=(Text(text="Done."),)),
    )
)
"""A round of one call (which asks for approval), then text."""


def approved(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The AI SDK's answer message approving the call whose approval ``chunks`` requested."""
    asked = next(c for c in chunks if c["type"] == "tool-approval-request")
    part = {
        "type": "tool-get_weather",
        "toolCallId": asked["toolCallId"],
        "state": "approval-responded",
        "approval": {"id": asked["approvalId"], "approved": True},
    }
    return {"id": "m1", "role": "assistant", "parts": [part]}


def answer_chat(url: str, session: dict[str, str], body: dict[str, Any]) -> httpx.Response:
    """``POST /api/chat`` of an answer message on ``url``; while no live worker drives the
    chat's run (its owner killed, not yet taken over) it is refused 409, and sent again."""
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=url, timeout=60, headers=session) as client:
        while True:
            reply = client.post("/api/chat", json=body)
            if reply.status_code != 409 or time.monotonic() > deadline:
                return reply
            time.sleep(0.2)


def test_an_ai_sdk_answer_message_reaches_a_durable_chat_on_another_worker(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Oslo?"}]}
    chats = [
        {"id": chat, "messages": [user], "trigger": "submit-message"} for chat in ("chat1", "chat2")
    ]
    with durable_workers(
        redis_server, postgres, tmp_path, [0, 0, 0], "uianswer", env=SHARED_SECRET,
        tool=ASKING_TOOL, script=ONE_CALL,
    ) as (_model, procs):  # fmt: skip
        (owner, on_a), (_b, on_b), (_c, on_c) = procs
        asked, run_ids = [], []
        with httpx.Client(base_url=on_a, timeout=60, headers=session) as a:
            for body in chats:  # each stream ends when its run waits on the client
                started = a.post("/api/chat", json=body)
                asked.append(ui_chunks(started.text))
                run_ids.append(started.headers["x-toollatch-run-id"])
        # chat1 answered on another worker while its owner lives (handed to the owner)
        live = answer_chat(on_b, session, {**chats[0], "messages": [user, approved(asked[0])]})
        stop(owner, signal.SIGKILL)  # while chat2's run waits for its answer
        taken = answer_chat(on_c, session, {**chats[1], "messages": [user, approved(asked[1])]})
        ended = [read_all(on_c, {"events_url": f"/runs/{r}/events"}, session) for r in run_ids]
    for chunks in asked:
        assert [c["type"] for c in chunks if "approval" in c["type"]] == ["tool-approval-request"]
    for reply in (live, taken):
        assert reply.status_code == 200, reply.text
        chunks = ui_chunks(reply.text)
        outputs = [c["output"] for c in chunks if c["type"] == "tool-output-available"]
        assert outputs == ["sunny"], (reply is live, reply.text)
        assert chunks[-2]["type"] == "finish" and chunks[-1]["type"] == "[DONE]"
    for whole in ended:  # each finished normally, its call paired
        assert whole[-1].data["error"] is None
        assert [c["error"] for c in whole[-1].data["calls"]] == [None]
    assert sorted(lines(tmp_path)) == ["Oslo", "Oslo"]  # each ran once, after its answer


def test_an_agui_interrupt_is_answered_on_a_survivor_of_its_owner(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    first = agui_body("t3", "r1", ASKED)
    with durable_workers(
        redis_server, postgres, tmp_path, [0, 0, 0], "aguianswer", env=SHARED_SECRET,
        tool=ASKING_TOOL, script=ONE_CALL,
    ) as (model, procs):  # fmt: skip
        (owner, on_a), (_b, on_b), (_c, on_c) = procs
        with httpx.Client(base_url=on_a, timeout=60, headers=session) as a:
            asked = agui_events(a.post("/agui", json=first).text)  # ends: the run waits
        token = asked[-1][1]["outcome"]["interrupts"][0]["id"]
        stop(owner, signal.SIGKILL)  # while the run waits for its answer
        answer = agui_body("t3", "r2", ASKED)
        answer["resume"] = [
            {"interruptId": token, "status": "resolved", "payload": {"approved": True}}
        ]
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=on_b, timeout=60, headers=session) as b:
            while True:  # (refused until a survivor drives the run again)
                rest = b.post("/agui", json=answer)
                if rest.status_code != 409 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        with httpx.Client(base_url=on_c, timeout=30, headers=session) as c:
            then = {"id": "u2", "role": "user", "content": "and?"}
            after, _next = agui_until(c, agui_body("t3", "r3", then), None)
            sent = model.requests[-1].body["messages"]  # the thread's history, as sent
    assert rest.status_code == 200, rest.text
    events = [e for _id, e in agui_events(rest.text)]
    assert_well_paired(events)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1].get("outcome") is None
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert [(e["toolCallId"], e["content"]) for e in results] == [("call_one", "sunny")]
    assert lines(tmp_path) == ["Oslo"]  # ran once, after its answer, on a survivor
    assert kinds(after)[-1] == "RUN_FINISHED"
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[-2]["content"] == "Done." and sent[-1]["content"] == "and?"
