"""``toollatch serve --durable postgresql://...``: relay runs as DBOS workflows, finished by
a surviving worker when their worker dies. Real ``toollatch serve`` processes on a real
redis-server and a real PostgreSQL (durable_helpers), the owner SIGKILLed: the run ends
normally on another worker, every call paired, each side effect once (a tool appends a
line to a file), and a reader on another worker goes on with ``Last-Event-ID`` to
``run_ended``, ids 1..N with no gap and none twice."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from durable_helpers import PostgresServer, wait_for
from ledger_helpers import RedisServer
from relay_helpers import (
    CLI,
    Frame,
    close_stderr,
    drain,
    launch,
    listening,
    serve,
    served_run,
    slow_script,
    stop,
    stop_each,
    written,
)
from test_relay_lease import assert_paired, read_until
from test_relay_lease_chats import ui_chunks, ui_tool_calls
from toollatch import ConfigError
from toollatch.cli import build_parser
from toollatch.cli._app_config import load_config
from toollatch.runtime._resume import INTERRUPTED_NOTE
from toollatch.scripted import Reasoning, Script, ScriptedServer

pytest.importorskip("dbos")

TOOL = '''
import asyncio, os
from toollatch import tool
from toollatch.ledger import current_call

@tool(timeout=120)
async def get_weather(city: str, unit: str = "c") -> str:
    """The weather (appends a line, then waits DURABLE_TOOL_SLEEP_S: the worker may be
    killed or the run cancelled meanwhile)."""
    with open(os.environ["DURABLE_TOOL_LOG"], "a") as log:
        log.write(city[:4] + " " + str(current_call().idempotency_key) + "\\n")
    await asyncio.sleep(float(os.environ.get("DURABLE_TOOL_SLEEP_S", "0")))
    return "sunny"
'''


Workers = list[tuple[subprocess.Popen[str], str]]

DURABLE_STOP_S = 40.0
"""How long a durable worker may take to exit on Ctrl-C: DBOS's shut-down joins its threads
and closes its PostgreSQL pool, which took over 15 s once with the whole suite running."""


@contextlib.contextmanager
def durable_workers(
    redis_server: RedisServer,
    postgres: PostgresServer,
    tmp_path: Path,
    sleeps: list[float],
    database: str,
    *,
    delay_ms: float = 5.0,
    env: dict[str, str] | None = None,
    tool: str = TOOL,
    script: Script | None = None,
) -> Iterator[tuple[ScriptedServer, Workers]]:
    """A model streaming :func:`slow_script` (``delay_ms`` an event; its models ``slow``
    and ``other``), and one ``serve --durable`` worker per entry of ``sleeps`` (its tool's
    wait), on one Redis, one PostgreSQL database and one SQLite ledger, with a 1 s lease
    (``env``: more variables, e.g. the run's budgets; ``tool``: the tools file's text;
    ``script``: the model ``slow``'s, instead)."""
    tools = tmp_path / "durable_tools.py"
    tools.write_text(tool, encoding="utf-8")
    scripts = {
        "slow": script or slow_script(delay_ms=delay_ms),
        "other": slow_script(delay_ms=delay_ms),
    }
    stack = contextlib.ExitStack()
    model = stack.enter_context(ScriptedServer(scripts=scripts))
    args = ("--store", redis_server.url, "--durable", postgres.url(database), "--lease", "1")
    args += ("--ledger", f"sqlite:///{tmp_path / 'ledger.db'}", "--tools", str(tools))
    args += ("--model", "slow", "--base-url", model.base_url("openai_chat"))
    procs: Workers = []
    saved = dict(os.environ)
    try:
        os.environ.update(env or {})
        os.environ["DURABLE_TOOL_LOG"] = str(tmp_path / "side_effects.txt")
        # the first alone: started side by side on their new database, the workers ran some
        # runs not at all (a tool not started in 60 s; a killed round not asked again); the
        # others side by side once it listens, on the database it set up (their imports and
        # DBOS's launches overlap: about 1.3 s each)
        launched: list[subprocess.Popen[str]] = []
        try:
            for sleep_s in sleeps:
                os.environ["DURABLE_TOOL_SLEEP_S"] = str(sleep_s)
                if procs:
                    launched.append(launch(*args))
                else:
                    procs.append(serve(*args))
                    drain(procs[-1][0])  # (DBOS logs much while PostgreSQL is down: see drain)
            while launched:
                procs.append(listening(launched[0]))
                drain(launched.pop(0))
        finally:
            for proc in launched:  # (one did not start: the others are not left running)
                proc.kill()
                proc.wait()
                close_stderr(proc)
        yield model, procs
    finally:
        os.environ.clear()
        os.environ.update(saved)
        try:
            stop_each([proc for proc, _url in procs], wait_s=DURABLE_STOP_S)
        finally:
            stack.close()


SURVIVOR_SCALE = 0.1
"""The model's pace (``ScriptedServer.delay_scale``) once a mid-stream test killed the owner:
the stream had to be slow for the kill to land in it; the survivor's new attempt of the round
streams ten times faster (about 0.8 s, not 8 s at 60 ms an event)."""


def keyed_lines(tmp_path: Path) -> list[tuple[str, str]]:
    """The tool's side effects: (city, the idempotency key the ledger gave the call)."""
    path = tmp_path / "side_effects.txt"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [(line.split()[0], line.split()[1]) for line in text.splitlines()]


def seen(event: str) -> Any:
    """A :func:`read_until` condition: ``event`` among the frames read."""
    return lambda frames: any(f.event == event for f in frames)


def lines(tmp_path: Path) -> list[str]:
    return [city for city, _key in keyed_lines(tmp_path)]


def start_run(url: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A run posted to ``url``: its answer, and the header of its session."""
    with httpx.Client(base_url=url, timeout=30) as client:
        run = client.post("/runs", json={"message": "two cities"}).json()
        return run, {"x-toollatch-session": client.cookies["toollatch_session"]}


def read_all(url: str, run: dict[str, Any], headers: dict[str, str], after: int = 0) -> list[Frame]:
    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        return read_until(client, run["events_url"], None, last_id=after)


def assert_whole(frames: list[Frame]) -> None:
    """Ids 1..N (no gap, none twice), every call paired, one ``run_ended``, last."""
    assert_paired(frames)
    assert len({f.id for f in frames}) == len(frames)


def assert_finished_by_a_survivor(whole: list[Frame]) -> None:
    """A run whose owner was killed mid-tool (in the first call), finished normally."""
    assert_whole(whole)
    ended = whole[-1].data
    assert ended["error"] is None  # finished normally, not ended by the lease
    assert [(c["id"], c["error"]) for c in ended["calls"]] == [
        ("call_slow_a", "outcome_unknown"),  # started on the dead worker: not run again
        ("call_slow_b", None),  # run once, on the survivor
    ]


def test_a_killed_owner_mid_tool_has_its_run_finished_by_a_survivor(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(redis_server, postgres, tmp_path, [60, 0, 0], "midtool") as (model, procs):
        (owner, on_a), (_b, on_b), (_c, on_c) = procs
        run, session = start_run(on_a)
        with httpx.Client(base_url=on_a, timeout=30, headers=session) as a:
            committed = lambda fs: sum(f.event == "call_committed" for f in fs) == 2  # noqa: E731
            head = read_until(a, run["events_url"], committed)
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        stop(owner, signal.SIGKILL)  # mid-tool: its call step never returns
        tail = read_all(on_b, run, session, after=head[-1].id)
        whole = read_all(on_c, run, session)
        requests = len(model.requests)
    assert whole[: len(head)] == head and whole[len(head) :] == tail
    assert_finished_by_a_survivor(whole)
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]  # each side effect exactly once
    keys = [key for _city, key in keyed_lines(tmp_path)]
    assert len(set(keys)) == 2 and "None" not in keys  # each call had its own key
    assert requests == 2  # the first round was not asked again: its step was recorded
    # the workflow's steps, each once: the survivor's driver read the workflow's status
    # outside it (no DBOS.getStatus step taking the id the next step is replayed by)
    assert recorded_steps(postgres, "midtool") == [ROUND, CALL, CALL, ROUND]


ROUND, CALL = "toollatch.model_round", "toollatch.call"


def recorded_steps(postgres: PostgresServer, database: str) -> list[str]:
    """The steps DBOS recorded in ``database`` (one workflow's), in order."""
    query = "select function_name from dbos.operation_outputs order by function_id"
    with psycopg.connect(postgres.url(database), autocommit=True) as db:
        return [name for (name,) in db.execute(query).fetchall()]


def read_watched(url: str, run: dict[str, Any], headers: dict[str, str], watch: Any) -> list[Frame]:
    """The run's frames to its end, read from ``url``; ``watch(frames)`` told as they come."""
    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        return read_until(client, run["events_url"], watch)


def assert_attempts_paired(frames: list[Frame]) -> None:
    """Ids 1..N, ``run_ended`` once and last, and every ``call_opened`` / ``call_committed``
    ended by one ``call_failed`` / ``tool_finished`` before its id opens again (a round
    asked again may reuse its call ids: the scripted model does)."""
    assert [f.id for f in frames] == list(range(1, len(frames) + 1))
    open_: set[str] = set()
    for frame in frames:
        if frame.event in ("call_opened", "call_committed"):
            open_.add(frame.data["id"])
        elif frame.event in ("call_failed", "tool_finished"):
            assert frame.data["id"] in open_, frame  # one end per opening
            open_.remove(frame.data["id"])
    assert not open_
    assert [f.event for f in frames].count("run_ended") == 1 and frames[-1].event == "run_ended"


def test_a_killed_owner_mid_stream_has_the_round_asked_again_by_a_survivor(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(redis_server, postgres, tmp_path, [0, 0], "midstream", delay_ms=60.0) as (
        model,
        procs,
    ):
        (owner, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        seen: list[list[Frame]] = [[]]

        def watch(frames: list[Frame]) -> bool:
            seen[0] = frames
            return False

        def streaming() -> bool:  # the round's text and a call's arguments, live
            return any(f.event == "call_preview" for f in seen[0])

        with ThreadPoolExecutor(1) as pool:  # a reader on the survivor since before the death
            reading = pool.submit(read_watched, on_b, run, session, watch)
            wait_for(streaming, "the round's live events on another worker")
            stop(owner, signal.SIGKILL)  # mid-stream: the round's step never returns
            model.delay_scale = SURVIVOR_SCALE  # (the round asked again: its pace is moot now)
            before = list(seen[0])
            early = reading.result(timeout=60)
        whole = read_all(on_b, run, session)
        statuses = [r.status for r in model.requests]
    # the reader on the other worker saw the round as it streamed, before its step ended
    assert [f.event for f in before[:2]] == ["text", "text"]
    assert "call_opened" in [f.event for f in before]
    assert not any(f.event in ("call_committed", "round_ended") for f in before)
    assert early == whole  # its stream simply went on to the end: no id reused or skipped
    assert whole[: len(before)] == before
    assert_attempts_paired(whole)
    assert whole[-1].data["error"] is None
    # the dead attempt was closed (its open calls failed, its round interrupted), then the
    # new attempt went on after it, then the last round
    ended = [f.data for f in whole if f.event == "round_ended"]
    assert [(r["round"], r["ended"]) for r in ended] == [
        (1, "interrupted"),
        (1, "normal"),
        (2, "normal"),
    ]
    cut = next(i for i, f in enumerate(whole) if f.event == "round_ended")
    assert {f.data["error"] for f in whole[:cut] if f.event == "call_failed"} == {
        "stream_interrupted"
    }
    assert whole[cut + 1].event == "text"  # the new attempt's text, from its start
    # the interrupted round was asked again (a new attempt), then the last round: 3 in all
    assert statuses == [200, 200, 200]
    assert [f.data["error"] for f in whole if f.event == "tool_finished"] == [None, None]
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]  # nothing of the cut round ran


def test_a_cancel_through_a_third_worker_ends_a_durable_run_paired(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(redis_server, postgres, tmp_path, [60, 60, 60], "cancel") as (_, procs):
        (_a, on_a), (_b, on_b), (_c, on_c) = procs
        run, session = start_run(on_a)
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        with httpx.Client(base_url=on_c, timeout=30, headers=session) as c:
            cancelled = c.post(run["cancel_url"], json={})
        whole = read_all(on_b, run, session)
    assert cancelled.status_code == 202 and cancelled.json()["cancelled"] is True
    assert_whole(whole)
    ended = whole[-1].data
    assert ended["cancelled"] is True
    errors = [c["error"] for c in ended["calls"]]
    assert errors[1] == "cancelled" and errors[0] in ("cancelled", "outcome_unknown")
    assert lines(tmp_path) == ["Oslo"]  # the second call never started


def test_a_durable_round_cancelled_mid_stream_has_its_live_calls_paired(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(redis_server, postgres, tmp_path, [0, 0], "cutlive", delay_ms=60.0) as (
        model,
        procs,
    ):
        (_a, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
            head = read_until(b, run["events_url"], seen("call_preview"))  # live, on another worker
            cancelled = b.post(run["cancel_url"], json={})
        whole = read_all(on_b, run, session)
        requests = len(model.requests)
    assert cancelled.status_code == 202
    assert whole[: len(head)] == head
    assert_whole(whole)  # the calls the log opened live are paired, then round_ended
    failed = [f.data for f in whole if f.event == "call_failed"]
    assert failed and {f["error"] for f in failed} == {"cancelled"}
    assert whole[-1].data["cancelled"] is True and requests == 1
    assert lines(tmp_path) == []  # nothing of the cut round ran


def test_durable_runs_keep_the_deadline_and_the_runs_call_budget(
    redis_server: RedisServer,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"TOOLLATCH_RELAY__DEADLINE_S": "3"}
    with durable_workers(redis_server, postgres, tmp_path, [60], "deadline", env=env) as (
        _,
        [(_a, on_a)],
    ):
        run, session = start_run(on_a)
        late = read_all(on_a, run, session)
    assert_whole(late)
    assert "deadline" in late[-1].data["error"]
    # the running call was cut at the deadline, the other never started
    assert [c["error"] for c in late[-1].data["calls"]] == ["cancelled", "cancelled"]
    assert lines(tmp_path) == ["Oslo"]

    # the demo: two calls in round 1, one in round 2; a budget of 2 calls spans the run
    monkeypatch.setenv("TOOLLATCH_RELAY__MAX_TOOL_CALLS", "2")
    with ScriptedServer() as model:
        url = model.base_url("openai_chat")
        args = ("--store", redis_server.url, "--durable", postgres.url("budget"))
        args += ("--ledger", f"sqlite:///{tmp_path / 'budget.db'}", "--base-url", url)
        proc, on_a = serve(*args, "--model", "scripted")
        try:
            run, session = start_run(on_a)
            spent = read_all(on_a, run, session)
        finally:
            stop(proc, wait_s=DURABLE_STOP_S)
    assert_whole(spent)
    failed = [f.data for f in spent if f.event == "call_failed"]
    assert [(f["name"], f["error"]) for f in failed] == [("write_file", "budget_exceeded")]


def test_a_postgresql_restart_mid_run_runs_nothing_twice(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    """PostgreSQL stops while the first tool runs and starts again 3 s later: the tool
    returns meanwhile, and its step's record waits for the database (DBOS retries until it
    is back), so the run goes on where it was: it ends normally, each call run once."""
    with durable_workers(redis_server, postgres, tmp_path, [1, 1], "restart") as (_, procs):
        (_a, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        try:
            postgres.stop()
            time.sleep(3.0)  # (the tool returned: its step's record waits)
            assert lines(tmp_path) == ["Oslo"]  # (the next call's step waits for it)
        finally:
            postgres.start()
        whole = read_all(on_b, run, session)
    assert_whole(whole)
    ended = whole[-1].data
    assert ended["error"] is None and ended["rounds"] == 2  # it went on
    assert [c["error"] for c in ended["calls"]] == [None, None]
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]  # each call run once


def test_a_redis_restart_mid_tool_runs_nothing_twice(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    """Redis stops while a durable run's first tool runs and starts again 2 s later (past
    the 1 s lease, within the store's 5 s outage): every worker then reads one log, to its
    ``run_ended``, every call paired, and each tool ran at most once, both when the run
    went on. (When the owner's lease was lost and the survivor's recovery of its workflow
    reached the owner itself, which refuses it, the survivor ends the run after
    ``_durable._UNTAKEN_S``: see test_relay_durable_takeover.py.)"""
    with durable_workers(redis_server, postgres, tmp_path, [2, 2], "redis") as (_, procs):
        (_a, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        try:
            redis_server.stop()
            time.sleep(2.0)
        finally:
            redis_server.start()
        whole = read_all(on_b, run, session)
        again = read_all(on_a, run, session)
    assert_whole(whole)
    assert again == whole
    done = lines(tmp_path)
    assert len(done) == len(set(done)) and set(done) <= {"Oslo", "Züri"}  # none ran twice
    ended = whole[-1].data
    if ended["error"] is None:  # it went on: both calls ran, once
        assert sorted(done) == ["Oslo", "Züri"] and ended["rounds"] == 2


LOST_GRACE_S = 2.0
LOST_MARGIN_S = 8.0
"""A worker stopping with its PostgreSQL lost exits within its grace and this margin: the
probe of the database, its runs' steps cancelled (1 s), DBOS's shut-down, 1 s for DBOS's
threads (measured alone: 4.5 s in all with a 2 s grace; before, it waited for the database)."""


def test_a_worker_stopping_with_postgresql_lost_ends_its_chat_run_and_keeps_its_turn(
    redis_server: RedisServer,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL stops, and stays down, while a durable chat's first tool runs; the tool
    returns, and its step's record waits for the database (DBOS retries however long it is
    gone); then the worker gets SIGTERM. No survivor could recover the workflow: the worker
    ends the run itself, within its grace and a margin, every call paired, and stores the
    chat's turn (the user's message, the round it cut off with each call's fate from the
    ledger, a note), so that the chat's next message, on another worker once PostgreSQL is
    back, goes on from it (no two user turns in a row)."""
    monkeypatch.setenv("TOOLLATCH_RELAY__SHUTDOWN_GRACE_S", f"{LOST_GRACE_S:g}")
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "two cities"}]}
    body = {"id": "chat1", "messages": [user], "trigger": "submit-message"}
    with durable_workers(redis_server, postgres, tmp_path, [3, 0], "pglost") as (model, procs):
        (owner, on_a), (_b, on_b) = procs
        with (
            httpx.Client(base_url=on_a, timeout=30, headers=session) as a,
            a.stream("POST", "/api/chat", json=body) as first,
        ):
            assert first.status_code == 200
            run_id = first.headers["x-toollatch-run-id"]
            wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
            started = time.monotonic()
        try:
            postgres.stop()
            time.sleep(max(0.0, started + 3.5 - time.monotonic()))  # (the tool returned)
            took = sigterm_took(owner, LOST_GRACE_S + LOST_MARGIN_S)
        finally:
            postgres.start()
        whole = read_all(on_b, {"events_url": f"/runs/{run_id}/events"}, session)
        with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
            user2 = {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "and?"}]}
            after = b.post("/api/chat", json={**body, "messages": [user, user2]})
        sent = model.requests[-1].body["messages"]  # the chat's history, as the model got it
    assert took <= LOST_GRACE_S + LOST_MARGIN_S
    assert_whole(whole)
    assert "PostgreSQL" in whole[-1].data["error"]
    assert [c["error"] for c in whole[-1].data["calls"]] == [None, "cancelled"]
    assert lines(tmp_path) == ["Oslo"]  # the other call never ran
    assert after.status_code == 200
    assert not [c for c in ui_chunks(after.text) if c["type"] == "error"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert sent[0]["content"] == "two cities" and sent[-1]["content"] == "and?"
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_slow_a", "call_slow_b"]
    assert [m["tool_call_id"] for m in sent[2:4]] == ["call_slow_a", "call_slow_b"]
    assert sent[2]["content"] == "sunny" and "cancelled" in sent[3]["content"]
    assert sent[4] == {"role": "assistant", "content": INTERRUPTED_NOTE}


def sigterm_took(proc: subprocess.Popen[str], wait_s: float) -> float:
    """SIGTERM ``proc`` (its stderr drained: :func:`drain`): the seconds it took to exit 143;
    killed, and the test failed, when it still runs ``wait_s`` seconds later."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        status = proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        status = None
    took = time.monotonic() - began
    said = written(proc)
    close_stderr(proc)
    assert status == 143, f"still running {took:.1f} s after SIGTERM: {said[-1500:]}"
    return took


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    """``toollatch serve --port 0 *args``'s stderr; it must exit 2 before serving."""
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 2, done.stderr
    return done.stderr


PG = "postgresql://postgres@127.0.0.1:1/toollatch"


def test_serve_durable_is_refused_without_what_it_needs(tmp_path: Path) -> None:
    ledger = ("--ledger", f"sqlite:///{tmp_path / 'ledger.db'}")
    redis = ("--store", "redis://127.0.0.1:1/0")  # (never reached: refused before)
    assert "--durable needs a shared run store: --store redis://" in refused(
        "--durable", PG, *ledger
    )
    assert "--durable must be postgresql://" in refused("--durable", "mysql://db/x", *redis)
    assert "--durable needs a ledger the workers share" in refused(
        "--durable", PG, *redis, "--ledger", "none"
    )
    # approvals are taken (the refusal is the unreachable store's, not theirs)
    asks = {"TOOLLATCH_APPROVALS__DEFAULT": "ask"}
    assert "approval" not in refused("--durable", PG, *redis, *ledger, env=asks)
    # the variable, like every setting
    assert "--durable needs a shared run store" in refused(
        *ledger, env={"TOOLLATCH_RELAY__DURABLE": PG}
    )
    # the extra not installed: a dbos that cannot be imported first on the path
    fake = tmp_path / "no_extra" / "dbos"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no dbos here')\n", encoding="utf-8")
    path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
    assert "--durable needs the dbos package: pip install 'toollatch[durable]'" in refused(
        "--durable", PG, *redis, *ledger, env={"PYTHONPATH": path}
    )


def test_serve_durable_with_postgresql_unreachable_exits_2(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    stderr = refused(
        "--durable", PG, "--store", redis_server.url,
        "--ledger", f"sqlite:///{tmp_path / 'ledger.db'}",
    )  # fmt: skip
    assert "toollatch: error: durable store 127.0.0.1:1/toollatch:" in stderr


def test_durable_is_a_flag_a_config_key_and_a_variable() -> None:
    assert build_parser().parse_args(["serve", "--durable", PG]).durable == PG
    assert load_config(env={"TOOLLATCH_RELAY__DURABLE": PG}).relay.durable == PG
    assert load_config(env={}).relay.durable is None
    with pytest.raises(ConfigError):
        load_config(env={"TOOLLATCH_RELAY__DURABLE": "mysql://db/x"})


def test_a_recovered_run_no_survivor_can_drive_is_still_ended_paired(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(redis_server, postgres, tmp_path, [60], "undriven") as (model, procs):
        (owner, on_a) = procs[0]
        run, session = start_run(on_a)
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        # a survivor that does not serve the run's model: the recovered workflow fails
        # there before its first event, and nobody takes the run over
        args = ("--store", redis_server.url, "--durable", postgres.url("undriven"))
        args += ("--lease", "1", "--ledger", f"sqlite:///{tmp_path / 'ledger.db'}")
        survivor, on_b = serve(
            *args, "--model", "other", "--base-url", model.base_url("openai_chat")
        )
        try:
            stop(owner, signal.SIGKILL)
            whole = read_all(on_b, run, session)
        finally:
            stop(survivor)
    assert_whole(whole)
    assert "stopped (its lease of 1 s expired)" in whole[-1].data["error"]
    assert lines(tmp_path) == ["Oslo"]


def test_serve_workers_2_durable_start_together_and_serve_runs(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ("--store", redis_server.url, "--durable", postgres.url("workers"), "--ledger", ledger)
    proc, url = serve("--workers", "2", *args)  # (both launch DBOS on a new database at once)
    try:
        time.sleep(3.0)  # (a worker that failed to launch would have exited by now)
        for _ in range(4):
            _run, frames = served_run(url, "weather in Oslo?")
            assert_whole(frames)
            assert frames[-1].data["error"] is None
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=True
        )
    finally:
        stop(proc, wait_s=DURABLE_STOP_S)
    assert len(children.stdout.split()) == 2


HANDOVER_GRACE_S = 8.0
"""The grace of the worker that hands its run over: long enough that spending its share
twice (a stop that waited for the handed-over run again from the server's exit: 13 s and
more) stands out from the bound of a grace spent once, whatever the load."""


def test_sigterm_hands_a_durable_run_over_to_a_survivor_within_its_grace(
    redis_server: RedisServer,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLLATCH_RELAY__SHUTDOWN_GRACE_S", f"{HANDOVER_GRACE_S:g}")
    with durable_workers(redis_server, postgres, tmp_path, [30, 0], "handover") as (_, procs):
        (stopping, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        with ThreadPoolExecutor(1) as pool:  # the tool outlives the grace: handed over
            took = pool.submit(sigterm_took, stopping, DURABLE_STOP_S)
            whole = read_all(on_b, run, session)
            took_s = took.result()
    # within its grace and about a second (the runs went on for most of it, then the
    # handed-over one was left to the survivor: not waited for again)
    assert took_s < HANDOVER_GRACE_S + 2.0, f"exited {took_s:.1f} s after SIGTERM"
    assert_whole(whole)
    ended = whole[-1].data
    assert ended["error"] is None and "cancelled" not in ended  # went on, not cancelled
    errors = [c["error"] for c in ended["calls"]]
    assert errors[0] in ("outcome_unknown", "cancelled") and errors[1] is None
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]  # each side effect once


def test_a_killed_owner_mid_tool_has_its_ai_sdk_chat_finished_by_a_survivor(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "two cities"}]}
    body = {"id": "chat1", "messages": [user], "trigger": "submit-message"}
    with durable_workers(redis_server, postgres, tmp_path, [60, 0, 0], "chat") as (model, procs):
        (owner, on_a), (_b, on_b), (_c, on_c) = procs
        with (
            httpx.Client(base_url=on_a, timeout=30, headers=session) as a,
            a.stream("POST", "/api/chat", json=body) as first,
        ):
            assert first.status_code == 200
            run_id = first.headers["x-toollatch-run-id"]
            wait_for(lambda: len(lines(tmp_path)) == 1, "the first tool to start")
        stop(owner, signal.SIGKILL)  # mid-tool: its call step never returns
        with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
            resumed = b.get("/api/chat/chat1/stream")  # (the AI SDK's resume: to the end)
        whole = read_all(on_c, {"events_url": f"/runs/{run_id}/events"}, session)
        done = sorted(lines(tmp_path))
        with httpx.Client(base_url=on_c, timeout=30, headers=session) as c:
            user2 = {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "and?"}]}
            after = c.post("/api/chat", json={**body, "messages": [user, user2]})
            sent = model.requests[-1].body["messages"]  # the chat's history, as the model got it
            # regenerate() drops that answer (a new branch), then the chat goes on from it
            regen = {**body, "messages": [user, user2], "trigger": "regenerate-message"}
            again = c.post("/api/chat", json=regen)
            resent = model.requests[-1].body["messages"]
            user3 = {"id": "u3", "role": "user", "parts": [{"type": "text", "text": "more?"}]}
            third = c.post("/api/chat", json={**body, "messages": [user, user2, user3]})
            sent3 = model.requests[-1].body["messages"]
    assert_finished_by_a_survivor(whole)
    assert done == ["Oslo", "Züri"]  # each side effect exactly once
    chunks = ui_chunks(resumed.text)
    inputs, outputs = ui_tool_calls(chunks)
    assert inputs == outputs == {"call_slow_a", "call_slow_b"}
    assert chunks[-2]["type"] == "finish" and chunks[-1]["type"] == "[DONE]"
    # the chat's next message, on another survivor, continues the whole stored history
    assert after.status_code == 200
    assert not [c for c in ui_chunks(after.text) if c["type"] == "error"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert sent[0]["content"] == "two cities" and sent[-1]["content"] == "and?"
    assert sent[-2]["content"] == "Both done."
    assert sorted(lines(tmp_path)) == done  # (the later answers are text only)
    assert again.status_code == 200 and third.status_code == 200
    assert resent == sent  # asked again after the same last user message
    assert [m["role"] for m in sent3] == [m["role"] for m in sent] + ["assistant", "user"]
    assert sent3[: len(sent)] == sent and sent3[-1]["content"] == "more?"


ASKING_TOOL = TOOL.replace("@tool(timeout=120)", "@tool(timeout=120, needs_approval=True)")
CLIENT_TOOL = """
from toollatch import schema_tool

get_weather = schema_tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
     "required": ["city"]},
)  # no function: the browser's tool
"""
SHARED_SECRET = {
    "TOOLLATCH_RELAY__APPROVAL_SECRET_ENV": "DURABLE_APPROVAL_SECRET",
    "DURABLE_APPROVAL_SECRET": "one key for every worker, 32 b",
}
"""Workers answering each other's questions share the approval tokens' key."""


def questions(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.event in ("approval_requested", "client_call")]


def until_asked(n: int) -> Any:
    return lambda frames: len(questions(frames)) >= n or any(f.event == "run_ended" for f in frames)


def asked_on(on_a: str, on_b: str, n: int) -> tuple[dict[str, Any], dict[str, str], list[Frame]]:
    """A run started on worker ``on_a``, read live on ``on_b`` until it asked ``n``
    questions: the run, its session and the frames read."""
    run, session = start_run(on_a)
    with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
        return run, session, read_until(b, run["events_url"], until_asked(n))


def answer(
    url: str, run: dict[str, Any], session: dict[str, str], asked: Frame, action: str, **body: Any
) -> httpx.Response:
    """Answer the question ``asked`` on the worker ``url``; while no live worker holds the
    run (its owner killed, not yet taken over) the answer is refused 409
    ``run_not_running``, and asked again."""
    path = f"/runs/{run['id']}/calls/{asked.data['id']}/{action}"
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=url, timeout=30, headers=session) as client:
        while True:
            reply = client.post(path, json={"token": asked.data["token"], **body})
            taken = reply.status_code != 409 or reply.json()["error"]["code"] != "run_not_running"
            if taken or time.monotonic() > deadline:
                return reply
            time.sleep(0.1)


def test_a_durable_approval_is_answered_on_another_worker_and_always_allows(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(
        redis_server, postgres, tmp_path, [0, 0], "approve", env=SHARED_SECRET, tool=ASKING_TOOL
    ) as (_, procs):
        (_a, on_a), (_b, on_b) = procs
        run, session, head = asked_on(on_a, on_b, 2)
        assert lines(tmp_path) == []  # it waits: nothing ran
        first, second = questions(head)  # both asked at once, as a plain run asks them
        approved = answer(on_b, run, session, first, "approve", always=True)
        also = answer(on_a, run, session, second, "approve")  # (asked already: it waits)
        whole = read_all(on_b, run, session)
        # the session's next run: its calls run unasked (always allowed)
        with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
            again = b.post("/runs", json={"message": "two cities"}).json()
        unasked = read_all(on_a, again, session)
    assert approved.status_code == 202, approved.text
    assert also.status_code == 202, also.text
    assert_whole(whole)
    assert whole[-1].data["error"] is None
    # each question once in the log
    assert [(f.event, f.data["id"]) for f in questions(whole)] == [
        ("approval_requested", "call_slow_a"),
        ("approval_requested", "call_slow_b"),
    ]
    answered = [f.data for f in whole if f.event == "approval_answered"]
    assert [(a["id"], a["decision"]) for a in answered] == [
        ("call_slow_a", "approved"),
        ("call_slow_b", "approved"),
    ]
    assert [c["error"] for c in whole[-1].data["calls"]] == [None, None]
    assert_whole(unasked)
    assert questions(unasked) == [] and unasked[-1].data["error"] is None
    # each ran once, after its answer (then once more, unasked, in the next run)
    assert sorted(lines(tmp_path)) == ["Oslo", "Oslo", "Züri", "Züri"]


def test_a_durable_run_waiting_for_an_answer_survives_its_owner(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(
        redis_server, postgres, tmp_path, [0, 0, 0], "asked", env=SHARED_SECRET, tool=ASKING_TOOL
    ) as (model, procs):
        (owner, on_a), (_b, on_b), (_c, on_c) = procs
        run, session, head = asked_on(on_a, on_b, 2)
        stop(owner, signal.SIGKILL)  # while the run waits for both answers
        first, second = questions(head)
        approved = answer(on_c, run, session, first, "approve")  # on a survivor
        denied = answer(on_b, run, session, second, "deny", reason="not Zürich")
        whole = read_all(on_c, run, session)
        requests = len(model.requests)
    assert approved.status_code == 202, approved.text
    assert denied.status_code == 202, denied.text
    assert whole[: len(head)] == head
    assert_whole(whole)
    assert whole[-1].data["error"] is None
    # each question once in the log (the survivor waited for the same one, not a new one)
    assert [f.data["id"] for f in questions(whole)] == ["call_slow_a", "call_slow_b"]
    assert [c["error"] for c in whole[-1].data["calls"]] == [None, "approval_denied"]
    assert lines(tmp_path) == ["Oslo"]  # the approved call ran once, the denied one never
    assert requests == 2  # the first round was not asked again: its step was recorded
    # the questions' steps (recorded by the dead worker) and their answers' (run at once
    # again on the survivor) under the ids a replay finds them by, in call order
    asked, answered = "toollatch.question", "toollatch.answer"
    steps = [ROUND, asked, asked, answered, answered, CALL, CALL, ROUND]
    assert recorded_steps(postgres, "asked") == steps


def test_a_durable_client_tool_is_answered_on_another_worker(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(
        redis_server, postgres, tmp_path, [0, 0], "client", env=SHARED_SECRET, tool=CLIENT_TOOL
    ) as (_, procs):
        (_a, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
            asked = questions(read_until(b, run["events_url"], until_asked(2)))  # at once
        replies = [
            answer(on_b, run, session, call, "result", value=f"sunny {n}")
            for n, call in enumerate(reversed(asked))  # (answered in any order)
        ]
        whole = read_all(on_a, run, session)
    assert [r.status_code for r in replies] == [202, 202], [r.text for r in replies]
    assert_whole(whole)
    assert [f.event for f in questions(whole)] == ["client_call", "client_call"]
    finished = [f.data for f in whole if f.event == "tool_finished"]
    assert [(f["id"], f["is_error"]) for f in finished] == [
        ("call_slow_a", False),
        ("call_slow_b", False),
    ]
    assert whole[-1].data["error"] is None


def test_sigterm_hands_a_durable_run_waiting_for_an_answer_over(
    redis_server: RedisServer,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLLATCH_RELAY__SHUTDOWN_GRACE_S", "2")
    with durable_workers(
        redis_server, postgres, tmp_path, [0, 0], "askover", env=SHARED_SECRET, tool=ASKING_TOOL
    ) as (_, procs):
        (stopping, on_a), (_b, on_b) = procs
        run, session, head = asked_on(on_a, on_b, 2)
        stopping.send_signal(signal.SIGTERM)  # its questions outlive the grace: handed over
        status = stopping.wait(timeout=DURABLE_STOP_S)
        close_stderr(stopping)
        approved = [answer(on_b, run, session, asked, "approve") for asked in questions(head)]
        whole = read_all(on_b, run, session)
    assert status == 143
    assert [a.status_code for a in approved] == [202, 202], [a.text for a in approved]
    assert_whole(whole)
    ended = whole[-1].data
    assert ended["error"] is None and "cancelled" not in ended  # went on, not cancelled
    assert [c["error"] for c in ended["calls"]] == [None, None]
    assert [f.data["id"] for f in questions(whole)] == ["call_slow_a", "call_slow_b"]  # once
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]


def test_a_durable_run_cancelled_while_it_waits_closes_its_question(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with durable_workers(
        redis_server, postgres, tmp_path, [0, 0], "askcancel", env=SHARED_SECRET, tool=ASKING_TOOL
    ) as (_, procs):
        (_a, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
            head = read_until(b, run["events_url"], until_asked(1))
            cancelled = b.post(run["cancel_url"], json={})
        whole = read_all(on_b, run, session)
    assert cancelled.status_code == 202 and questions(head)
    assert_whole(whole)
    assert whole[-1].data["cancelled"] is True
    assert [c["error"] for c in whole[-1].data["calls"]] == ["cancelled", "cancelled"]
    assert lines(tmp_path) == []


def test_an_owner_paused_past_its_lease_writes_nothing_after_a_survivor_took_its_run_over(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    # the owner is SIGSTOPped mid-round, a survivor takes the run over and asks the round
    # again; the owner, woken while the survivor streams, still has its own round's stream
    # and events: the store refuses its writes (the run's epoch moved on), it stops driving
    # the run (no step of it runs there), and its readers get the shared log
    with durable_workers(redis_server, postgres, tmp_path, [0, 0], "paused", delay_ms=60.0) as (
        model,
        procs,
    ):
        (owner, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
            read_until(b, run["events_url"], seen("call_preview"))  # mid-stream, live
            owner.send_signal(signal.SIGSTOP)
            # the survivor's attempts at a quarter of the pace (its new attempt of the round
            # still streams ~1.4 s, while the owner wakes; the owner's stream keeps its pace)
            model.delay_scale = 0.25
            # the survivor closed its attempt
            taken = read_until(b, run["events_url"], seen("round_ended"))
            owner.send_signal(signal.SIGCONT)  # while the survivor asks the round again
            whole = read_until(b, run["events_url"], None)
        on_owner = read_all(on_a, run, session)  # (its own copy is the shared log's now)
        stop(owner, wait_s=DURABLE_STOP_S)  # (it writes what it still has: nothing)
        again = read_all(on_b, run, session)
        statuses = [r.status for r in model.requests]
    assert taken[-1].event == "round_ended" and taken[-1].data["ended"] == "interrupted"
    assert again == whole  # nothing more once it was read to its end
    assert_attempts_paired(whole)
    assert whole[-1].data["error"] is None
    ended = [f.data for f in whole if f.event == "round_ended"]
    assert [(r["round"], r["ended"]) for r in ended] == [
        (1, "interrupted"),
        (1, "normal"),
        (2, "normal"),
    ]
    after = whole[len(taken) :]
    assert after[0].event == "text"  # the new attempt's text, from its start
    assert "".join(f.data["text"] for f in after if f.event == "text").startswith("Checking")
    assert statuses == [200, 200, 200]
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]  # each tool once, on the survivor
    assert on_owner == whole


def test_a_durable_run_tells_its_reasoning_live_as_a_plain_run_does(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    first, final = slow_script(delay_ms=5.0).turns
    thinking = "Two cities: Oslo, then Zürich."
    script = Script(turns=(replace(first, items=(Reasoning(text=thinking), *first.items)), final))
    with durable_workers(redis_server, postgres, tmp_path, [0, 0], "think", script=script) as (
        _,
        procs,
    ):
        (_a, on_a), (_b, on_b) = procs
        run, session = start_run(on_a)
        whole = read_all(on_b, run, session)  # (the shared log, on another worker)
        user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "two cities"}]}
        body = {"id": "chat1", "messages": [user], "trigger": "submit-message"}
        with httpx.Client(base_url=on_a, timeout=30, headers=session) as a:
            chat = a.post("/api/chat", json=body)
    assert_whole(whole)
    assert whole[-1].data["error"] is None
    # as a plain run's log has it: the round's reasoning when its stream ended, before its
    # call_committed events (a round without text in its reasoning tells none)
    events = [f.event for f in whole]
    assert [f.data["text"] for f in whole if f.event == "reasoning"] == [thinking]
    assert events.index("reasoning") < events.index("call_committed")
    assert events.index("call_opened") < events.index("reasoning")
    # and the AI SDK's stream makes a reasoning part of it
    chunks = ui_chunks(chat.text)
    deltas = [c["delta"] for c in chunks if c["type"] == "reasoning-delta"]
    assert deltas == [thinking]
