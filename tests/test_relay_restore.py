"""A restarted relay resumes the runs that were waiting for an answer (issue 32): a
``toollatch serve`` SIGKILLed while a question waits is started again on the same ledger
(SQLite, Redis) and, with no ``POST /runs {"resume"}`` from anyone, the run is live again:
its events show the question, the relay route and the AI SDK's ``useChat`` answer it, and the
approved call runs exactly once (a tool appending to a file), also across a further restart."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_helpers import parse_sse, serving
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

TOOLS = '''
import os
from toollatch import tool


@tool(needs_approval=True)
def record(key: str) -> str:
    """Append key to the side-effect file: one line per run of the tool."""
    with open(os.environ["RECORD_LOG"], "a", encoding="utf-8") as f:
        f.write(key + "\\n")
    return "recorded " + key
'''

SCRIPT = Script(
    turns=(
        Turn(items=(Call(call_id="call_r", name="record", arguments='{"key": "r"}'),)),
        Turn(items=(Text(text="Recorded."),)),
    )
)

SESSION = "s" * 43


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The tools file, the side-effect log and a scripted model (the serve's env set)."""
    tools = tmp_path / "record_tools.py"
    tools.write_text(TOOLS, encoding="utf-8")
    log = tmp_path / "side_effects.txt"
    monkeypatch.setenv("RECORD_LOG", str(log))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("APPROVAL_KEY", "a-fixed-key-of-32-bytes-for-test")
    with ScriptedServer(scripts={"rec": SCRIPT}) as model:
        yield {"tools": tools, "log": log, "model": model, "tmp": tmp_path}


def serve_args(setup: dict[str, Any], ledger: str, *, fixed_key: bool = True) -> tuple[str, ...]:
    config = setup["tmp"] / "toollatch.yaml"
    text = "relay:\n  approval_secret_env: APPROVAL_KEY\n" if fixed_key else "relay: {}\n"
    config.write_text(text, encoding="utf-8")
    args = ("--config", str(config), "--tools", str(setup["tools"]), "--ledger", ledger)
    return (*args, "--model", "rec", "--base-url", setup["model"].base_url("openai_chat"))


def until(client: httpx.Client, url: str, event: str) -> list[dict[str, Any]]:
    """The events of ``url`` up to the first ``event`` (the stream is left then)."""
    buffer = ""
    with client.stream("GET", url) as stream:
        assert stream.status_code == 200, stream.read()
        for text in stream.iter_text():
            buffer += text
            frames, _ = parse_sse(buffer.rsplit("\n\n", 1)[0] + "\n\n")
            if any(f.event == event for f in frames):
                return [{"event": f.event, **f.data} for f in frames]
    raise AssertionError(f"no {event}")


def asked(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in events if e["event"] == "approval_requested")


def client_for(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, headers={"x-toollatch-session": SESSION})


def kill_while_asking(args: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """Start a run in a served relay and SIGKILL it while the run's question waits."""
    with serving(*args, how=signal.SIGKILL) as url, client_for(url) as client:
        run = client.post("/runs", json={"message": "record"})
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        first = asked(until(client, f"/runs/{run_id}/events", "approval_requested"))
    return run_id, first


def approve_after_restart(args: tuple[str, ...], run_id: str, first: dict[str, Any]) -> list[Any]:
    """In a restarted relay: the question is live with no resume, approving it ends the run."""
    with serving(*args) as url, client_for(url) as client:
        own = client.post("/runs", json={"resume": run_id})  # (it resumed by itself)
        assert (own.status_code, own.json()["error"]["code"]) == (409, "run_in_flight")
        again = asked(until(client, f"/runs/{run_id}/events", "approval_requested"))
        assert (again["id"], again["args_sha256"], again["expires_at"]) == (
            first["id"],
            first["args_sha256"],
            first["expires_at"],
        )
        assert again["token"] == first["token"]  # (the fixed secret: the old token holds)
        ok = client.post(f"/runs/{run_id}/calls/call_r/approve", json={"token": first["token"]})
        assert ok.status_code == 202, ok.text
        frames, _ = parse_sse(client.get(f"/runs/{run_id}/events").text)
    return frames


def check_ran_once(setup: dict[str, Any], frames: list[Any]) -> None:
    assert setup["log"].read_text().split() == ["r"]  # exactly once
    assert frames[-1].event == "run_ended" and frames[-1].data["error"] is None
    finished = [f.data for f in frames if f.event == "tool_finished"]
    assert [(f["id"], f["is_error"]) for f in finished] == [("call_r", False)]


def test_sqlite_a_killed_relay_resumes_the_waiting_run_by_itself(setup: dict[str, Any]) -> None:
    args = serve_args(setup, f"sqlite:///{setup['tmp'] / 'ledger.db'}")
    run_id, first = kill_while_asking(args)
    assert not setup["log"].exists()  # killed while waiting: never ran
    frames = approve_after_restart(args, run_id, first)
    check_ran_once(setup, frames)
    # started once more: nothing waits any more, so nothing is resumed and nothing runs again
    with serving(*args) as url, client_for(url) as client:
        gone = client.get(f"/runs/{run_id}/events")
        assert gone.status_code == 404, gone.text
    assert setup["log"].read_text().split() == ["r"]


def test_a_random_key_announces_the_resumed_question_with_a_new_token(
    setup: dict[str, Any],
) -> None:
    args = serve_args(setup, f"sqlite:///{setup['tmp'] / 'ledger.db'}", fixed_key=False)
    run_id, first = kill_while_asking(args)
    with serving(*args) as url, client_for(url) as client:
        again = asked(until(client, f"/runs/{run_id}/events", "approval_requested"))
        assert again["id"] == first["id"] and again["token"] != first["token"]
        old = client.post(f"/runs/{run_id}/calls/call_r/approve", json={"token": first["token"]})
        assert (old.status_code, old.json()["error"]["code"]) == (403, "invalid_approval_token")
        ok = client.post(f"/runs/{run_id}/calls/call_r/approve", json={"token": again["token"]})
        assert ok.status_code == 202, ok.text
        frames, _ = parse_sse(client.get(f"/runs/{run_id}/events").text)
    check_ran_once(setup, frames)


def test_another_session_cannot_see_or_answer_a_resumed_run(setup: dict[str, Any]) -> None:
    args = serve_args(setup, f"sqlite:///{setup['tmp'] / 'ledger.db'}")
    run_id, first = kill_while_asking(args)
    with serving(*args) as url:
        other = {"x-toollatch-session": "o" * 43}
        with httpx.Client(base_url=url, timeout=60, headers=other) as stranger:
            assert stranger.get(f"/runs/{run_id}/events").status_code == 404
            no = stranger.post(
                f"/runs/{run_id}/calls/call_r/approve", json={"token": first["token"]}
            )
            assert (no.status_code, no.json()["error"]["code"]) == (404, "not_found")
        with client_for(url) as client:
            deny = client.post(
                f"/runs/{run_id}/calls/call_r/deny", json={"token": first["token"], "reason": "no"}
            )
            assert deny.status_code == 202, deny.text
            frames, _ = parse_sse(client.get(f"/runs/{run_id}/events").text)
    finished = [f.data for f in frames if f.event == "tool_finished"]
    assert [(f["id"], f["error"]) for f in finished] == [("call_r", "approval_denied")]
    assert not setup["log"].exists()


def test_redis_a_killed_relay_resumes_the_waiting_run_by_itself(
    setup: dict[str, Any], redis_server: Any
) -> None:
    import redis

    made = redis.Redis.from_url(redis_server.url)
    made.flushdb()
    made.close()
    args = serve_args(setup, redis_server.url)
    run_id, first = kill_while_asking(args)
    assert not setup["log"].exists()
    frames = approve_after_restart(args, run_id, first)
    check_ran_once(setup, frames)


CHAT_SESSION = "c" * 43


def across_a_restart(
    setup: dict[str, Any],
    command: list[str],
    config: dict[str, Any],
    before_go: Callable[[str], None] | None = None,
) -> Any:
    """Run the node client ``command`` with ``config`` against a served relay that is
    SIGKILLed once the client has its question (it creates ``askedFile``) and started again
    on the same ledger (its URL written to ``goFile``, after ``before_go(url)``); the
    client's JSON output."""
    args = serve_args(setup, f"sqlite:///{setup['tmp'] / 'ledger.db'}")
    asked_file, go_file = setup["tmp"] / "asked", setup["tmp"] / "go"
    config = {**config, "askedFile": str(asked_file), "goFile": str(go_file)}
    with serving(*args, how=signal.SIGKILL) as url:
        config["url"] = url
        node = subprocess.Popen(
            [*command, json.dumps(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            deadline = time.monotonic() + 60
            while not asked_file.exists():
                assert node.poll() is None, node.communicate()
                assert time.monotonic() < deadline, "the client never got its question"
                time.sleep(0.05)
        except BaseException:
            node.kill()
            raise
    assert not setup["log"].exists()  # killed while asking: nothing ran
    try:
        with serving(*args) as url:
            if before_go is not None:
                before_go(url)
            go_file.write_text(url, encoding="utf-8")
            out, err = node.communicate(timeout=120)
            assert node.returncode == 0, err.decode()
            return json.loads(out)
    finally:
        if node.poll() is None:
            node.kill()


CHAT_SESSION = "c" * 43


def test_use_chat_answers_a_run_resumed_by_a_restarted_relay(setup: dict[str, Any]) -> None:
    """The real ``ai`` Chat sends a message and gets the approval request; the relay is
    SIGKILLed and started again; the Chat then approves (its next POST /api/chat) against
    the new relay: the tool runs once and the resumed stream shows its output and the answer."""
    from node_helpers import node_command

    command = node_command("ui_message_approvals.mjs", "ai")
    config = {
        "session": CHAT_SESSION, "chatId": "chat-r", "text": "record", "model": "rec",
        "clientTool": None, "clientOutput": None, "approve": ["call_r"], "deny": [],
    }  # fmt: skip
    resumed: list[str] = []

    def read_the_chat(url: str) -> None:  # the browser's resumed stream, before it answers
        with client_for(url) as client:
            client.headers["x-toollatch-session"] = CHAT_SESSION
            stream = client.get("/api/chat/chat-r/stream")
            assert stream.status_code == 200, stream.text
            resumed.append(stream.text)

    got = across_a_restart(setup, command, config, read_the_chat)
    chunks = [json.loads(line[6:]) for line in resumed[0].splitlines() if line[:7] == "data: {"]
    request = next(c for c in chunks if c["type"] == "tool-approval-request")
    assert request["toolCallId"] == "call_r"
    assert chunks[-1]["type"] == "finish"  # (it ends while the run waits on the client)
    assert got["error"] is None and got["status"] == "ready", got
    assert got["requests"] == 2  # the message, then the approval (to the new relay)
    assert setup["log"].read_text().split() == ["r"]  # exactly once
    assistant = got["messages"][-1]
    tools = {p["toolCallId"]: p for p in assistant["parts"] if "toolCallId" in p}
    assert tools["call_r"]["state"] == "output-available", tools
    assert tools["call_r"]["output"] == "recorded r"
    texts = [p["text"] for p in assistant["parts"] if p["type"] == "text"]
    assert texts == ["Recorded."]


def test_agui_resumes_a_thread_answered_with_edited_arguments_after_a_restart(
    setup: dict[str, Any],
) -> None:
    """AG-UI's HttpAgent: run 1 ends with the interrupt; the relay is SIGKILLed and started
    again; run 2 resolves the interrupt with ``payload.editedArgs`` against the new relay:
    the edited call passes the gate and runs once, and run 2's stream shows its result."""
    from node_helpers import node_command

    command = node_command("agui_approvals.mjs", "@ag-ui/client")
    frontend = {
        "name": "pick_color",
        "description": "Ask the user for a color.",
        "parameters": {"type": "object", "properties": {"hint": {"type": "string"}}},
    }
    config = {
        "session": "g" * 43, "threadId": "t-r", "text": "record", "model": "rec",
        "tool": frontend, "clientOutput": "red", "approved": True,
        "editedArgs": {"key": "edited"},
    }  # fmt: skip
    got = across_a_restart(setup, command, config)
    first, second = got["runs"]
    assert first["ok"] and second["ok"], (first["error"], second["error"])
    assert first["problems"] == [] and second["problems"] == []
    assert [i["toolCallId"] for i in got["interrupts"]] == ["call_r"]
    assert first["relayRun"] == second["relayRun"]  # the same relay run, resumed
    assert setup["log"].read_text().split() == ["edited"]  # the edited call, once
    results = [e["content"] for e in second["wire"] if e["type"] == "TOOL_CALL_RESULT"]
    assert len(results) == 1 and "edited arguments" in results[0], results
    assert results[0].endswith("recorded edited")
    texts = [e["delta"] for e in second["wire"] if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert texts == ["Recorded."]
    assert second["wire"][-1]["type"] == "RUN_FINISHED"


def test_workers_sharing_a_redis_store_resume_only_a_dead_workers_run(
    setup: dict[str, Any], redis_server: Any
) -> None:
    """With several workers (a shared run store), a worker that starts while the run's owner
    lives leaves the run alone (the owner answers it); once the owner is SIGKILLed, the next
    worker to start resumes it, and the call runs once."""
    import redis

    from toollatch.relay.store._redis import _meta

    made = redis.Redis.from_url(redis_server.url)
    made.flushdb()
    made.close()
    args = (*serve_args(setup, redis_server.url), "--store", redis_server.url)
    with serving(*args, how=signal.SIGKILL) as owner_url, client_for(owner_url) as owner:
        run = owner.post("/runs", json={"message": "record"})
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        first = asked(until(owner, f"/runs/{run_id}/events", "approval_requested"))
        store = redis.Redis.from_url(redis_server.url)
        owner_before = store.hget(_meta(run_id), "owner")
        with serving(*args) as url, client_for(url) as client:
            # the live owner keeps its run: this worker forwards the answer to it, and the
            # owner checks the token (a worker that had taken the run would own it now)
            again = client.post(f"/runs/{run_id}/calls/call_r/approve", json={"token": "x"})
            code = again.json()["error"]["code"]
            assert (again.status_code, code) == (403, "invalid_approval_token")
            assert store.hget(_meta(run_id), "owner") == owner_before
        store.close()
    assert not setup["log"].exists()
    frames = approve_after_restart(args, run_id, first)
    check_ran_once(setup, frames)


def pending(url: str) -> list[Any]:
    """The pending questions of the Redis ledger at ``url`` (read as a restart reads them)."""
    import asyncio

    from toollatch import open_ledger

    async def read() -> list[Any]:
        ledger: Any = open_ledger(url)
        try:
            return list(await ledger.pending_questions(100))
        finally:
            await ledger.aclose()

    return asyncio.run(read())


def killed_owner(
    args: tuple[str, ...],
    owner_args: tuple[str, ...],
    url: str,
    before_kill: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, Any], bytes]:
    """Start a run on a worker of ``owner_args`` and SIGKILL it while the run's question
    waits (a survivor must already be serving; ``before_kill(run_id)`` called then); the run
    id, its question, its dead owner."""
    import redis

    from toollatch.relay.store._redis import _meta

    with serving(*owner_args, how=signal.SIGKILL) as owner_url, client_for(owner_url) as owner:
        run = owner.post("/runs", json={"message": "record"})
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        first = asked(until(owner, f"/runs/{run_id}/events", "approval_requested"))
        store = redis.Redis.from_url(url)
        dead = store.hget(_meta(run_id), "owner")
        store.close()
        if before_kill is not None:
            before_kill(run_id)
    assert isinstance(dead, bytes) and [q.key.call_id for q in pending(url)] == ["call_r"]
    return run_id, first, dead


def read_in_background(url: str, path: str) -> tuple[threading.Thread, list[str]]:
    """A reader of ``path`` at ``url`` in a thread, returned once it has read the question:
    what it got (the body) once its stream ends, or after 40 s (a run nobody ends keeps it
    open with heartbeats)."""
    got: list[str] = []
    asking = threading.Event()

    def read() -> None:
        body, give_up = "", time.monotonic() + 40
        with client_for(url) as client, client.stream("GET", path) as stream:
            for text in stream.iter_text():
                body += text
                if "event: approval_requested" in body:
                    asking.set()
                if "event: run_ended" in body or time.monotonic() > give_up:
                    break
        got.append(body)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert asking.wait(30), "the reader never saw the question"
    return reader, got


def lease_args(setup: dict[str, Any], url: str) -> tuple[str, ...]:
    """A worker on the Redis ledger and run store at ``url``, with a 1 s lease."""
    import redis

    made = redis.Redis.from_url(url)
    made.flushdb()
    made.close()
    return (*serve_args(setup, url), "--store", url, "--lease", "1")


def test_a_survivor_resumes_a_dead_owners_waiting_run_instead_of_ending_it(
    setup: dict[str, Any], redis_server: Any
) -> None:
    """The lease (issue 34) meets the restore (issue 32): a worker SIGKILLed while its run
    waits for an approval, a second worker alive with a 1 s lease and the shared ledger: the
    survivor that wins the dead worker's run resumes it (its question live again, the same
    one), approving there runs the tool once, every call is paired, the reader sees the end."""
    import redis

    from toollatch.relay.store._redis import _meta

    args = lease_args(setup, redis_server.url)
    store = redis.Redis.from_url(redis_server.url)
    readers: list[tuple[threading.Thread, list[str]]] = []
    try:
        with serving(*args) as survivor_url:
            run_id, first, dead = killed_owner(
                args,
                args,
                redis_server.url,
                lambda r: readers.append(read_in_background(survivor_url, f"/runs/{r}/events")),
            )
            deadline = time.monotonic() + 20  # (the lease: about 4/3 s)
            while store.hget(_meta(run_id), "owner") == dead or (
                store.hget(_meta(run_id), "status") != b"running"
            ):
                assert store.hget(_meta(run_id), "status") != b"done", "ended, not resumed"
                assert time.monotonic() < deadline, "the survivor never took the run"
                time.sleep(0.05)
            with client_for(survivor_url) as client:
                again = asked(until(client, f"/runs/{run_id}/events", "approval_requested"))
                assert (again["id"], again["args_sha256"], again["token"]) == (
                    first["id"],
                    first["args_sha256"],
                    first["token"],
                )
                ok = client.post(
                    f"/runs/{run_id}/calls/call_r/approve", json={"token": first["token"]}
                )
                assert ok.status_code == 202, ok.text
                frames, _ = parse_sse(client.get(f"/runs/{run_id}/events").text)
                ((reader, got),) = readers  # (on the survivor since before the owner died)
                reader.join(45)
    finally:
        store.close()
    check_ran_once(setup, frames)
    early, _ = parse_sse(got[0])
    assert early[-1].event == "run_ended" and early[-1].data["error"] is None
    opened = {f.data["id"] for f in frames if f.event == "call_committed"}
    assert opened == {f.data["id"] for f in frames if f.event == "tool_finished"}
    assert pending(redis_server.url) == []


def test_a_survivor_that_cannot_resume_the_run_ends_it_and_settles_its_question(
    setup: dict[str, Any], redis_server: Any
) -> None:
    """A survivor that wins the dead worker's run but cannot resume it (here it does not
    serve the run's model) ends it as the lease does (the call paired ``cancelled``) and
    settles its question ``cancelled`` first: a relay started later on the same ledger does
    not resume that ended run, and the tool never runs."""
    args = lease_args(setup, redis_server.url)
    at = args.index("--model")
    elsewhere = (*args[:at], "--model", "other", *args[at + 2 :])
    with serving(*elsewhere) as survivor_url, client_for(survivor_url) as client:
        run_id, _first, dead = killed_owner(elsewhere, args, redis_server.url)
        events = until(client, f"/runs/{run_id}/events", "run_ended")
    finished = [e for e in events if e["event"] == "tool_finished"]
    assert [(e["id"], e["error"]) for e in finished] == [("call_r", "cancelled")]
    assert dead.decode() in events[-1]["error"]
    assert pending(redis_server.url) == []  # settled before the end was written
    with serving(*args) as url, client_for(url) as client:  # a restart resumes nothing
        frames, _ = parse_sse(client.get(f"/runs/{run_id}/events").text)
    assert frames[-1].event == "run_ended" and dead.decode() in frames[-1].data["error"]
    assert [f.event for f in frames].count("approval_requested") == 1  # (the first asking)
    assert not setup["log"].exists()
