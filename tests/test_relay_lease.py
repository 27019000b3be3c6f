"""A relay worker that dies with a shared store (``toollatch serve --store redis://...``):
its lease runs out, one surviving worker ends its runs in the shared log (every call
paired, ``run_ended`` naming the dead worker), and a reader on any worker sees the end.
Real ``toollatch serve`` processes on a real redis-server, the owner SIGKILLed."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger_helpers import RedisServer
from relay_helpers import (
    CLI,
    Frame,
    close_stderr,
    launch,
    listening,
    parse_sse,
    serve,
    served_run,
    slow_script,
    stop,
    stop_each,
)
from toollatch.cli import build_parser
from toollatch.cli._app_config import load_config
from toollatch.relay.store._orphans import closing_events, read_log
from toollatch.scripted import ScriptedServer

SLOW_TOOL = '''
import os, pathlib, time
from toollatch import tool

@tool
def get_weather(city: str, unit: str = "c") -> str:
    """The weather (slowly: the worker is killed while it runs)."""
    with open(os.environ["LEASE_TOOL_LOG"], "a") as log:
        log.write(city[:4] + "\\n")
    time.sleep(60)
    return "sunny"
'''


@contextlib.contextmanager
def workers(n: int, *args: str) -> Iterator[list[tuple[subprocess.Popen[str], str]]]:
    """``n`` ``toollatch serve`` processes with ``args``; the ones still alive stopped."""
    procs: list[tuple[subprocess.Popen[str], str]] = []
    launched = [launch(*args) for _ in range(n)]  # (side by side: their start-ups overlap)
    try:
        for proc in launched:
            procs.append(listening(proc))
        yield procs
    finally:
        for proc in launched[len(procs) :]:  # (one did not start: the rest not waited for)
            proc.kill()
            proc.wait()
            close_stderr(proc)
        stop_each([proc for proc, _url in procs])


def read_until(client: httpx.Client, url: str, done: object, last_id: int = 0) -> list[Frame]:
    """Frames of ``url`` after ``last_id`` until ``done(frames)`` is true or the stream ends
    (at most 40 s: a run nobody ends would keep it open with heartbeats)."""
    give_up = time.monotonic() + 40
    buffer = ""
    frames: list[Frame] = []
    headers = {"last-event-id": str(last_id)} if last_id else {}
    with client.stream("GET", url, headers=headers) as stream:
        assert stream.status_code == 200
        for text in stream.iter_text():
            buffer += text
            frames, _ = parse_sse(buffer.rsplit("\n\n", 1)[0] + "\n\n")
            if (callable(done) and done(frames)) or time.monotonic() > give_up:
                break
    return frames


@contextlib.contextmanager
def slow_workers(url: str, n: int) -> Iterator[list[tuple[subprocess.Popen[str], str]]]:
    """``n`` workers on the store ``url`` with a 1 s lease, over a model that streams a run
    of two slow calls (about 15 s)."""
    with ScriptedServer(scripts={"slower": slow_script(delay_ms=150.0)}) as model:
        args = ("--store", url, "--ledger", "none", "--lease", "1")
        args += ("--model", "slower", "--base-url", model.base_url("openai_chat"))
        with workers(n, *args) as procs:
            yield procs


def run_until(url: str, n: int) -> tuple[dict[str, Any], list[Frame], str]:
    """A run started on ``url``: its answer, its first ``n`` frames, its session."""
    with httpx.Client(base_url=url, timeout=30) as client:
        run = client.post("/runs", json={"message": "two cities"}).json()
        head = read_until(client, run["events_url"], lambda fs: len(fs) >= n)
        return run, head, client.cookies["toollatch_session"]


def assert_paired(frames: list[Frame]) -> None:
    """Every call the log opened has exactly one end; ids 1..n; ``run_ended`` once, last."""
    assert [f.id for f in frames] == list(range(1, len(frames) + 1))
    opened = [f.data["id"] for f in frames if f.event in ("call_opened", "call_committed")]
    ends = [f.data["id"] for f in frames if f.event in ("call_failed", "tool_finished")]
    assert opened and set(opened) == set(ends) and len(ends) == len(set(ends))
    assert [f.event for f in frames].count("run_ended") == 1 and frames[-1].event == "run_ended"
    assert frames[-2].event == "round_ended"
    ended = frames[-1].data
    assert {c["id"] for c in ended["calls"]} == set(ends)


def test_a_killed_workers_run_mid_stream_is_ended_once_by_a_survivor(
    redis_server: RedisServer,
) -> None:
    with slow_workers(redis_server.url, 3) as [(owner, on_a), (_b, on_b), (_c, on_c)]:
        # 9 frames: the text (7), call_opened and the first preview of its arguments, which
        # stream on for about 7 s more: the kill lands mid-stream with seconds to spare
        run, head, session = run_until(on_a, 9)
        assert [f.event for f in head[-2:]] == ["call_opened", "call_preview"]
        stop(owner, signal.SIGKILL)  # mid-stream: a call's arguments still streaming
        headers = {"x-toollatch-session": session}
        with httpx.Client(base_url=on_b, timeout=30, headers=headers) as b:
            tail = read_until(b, run["events_url"], None, last_id=len(head))
        with httpx.Client(base_url=on_c, timeout=30, headers=headers) as c:
            whole = read_until(c, run["events_url"], None)
    assert whole[: len(head)] == head and whole[len(head) :] == tail
    assert_paired(whole)
    error = whole[-1].data["error"]
    assert "stopped (its lease of 1 s expired)" in error and "ended the run" in error
    failed = [f.data for f in tail if f.event == "call_failed"]
    assert failed and all(f["error"] == "stream_interrupted" for f in failed)


def test_a_killed_workers_run_mid_tool_calls_started_tools_outcome_unknown(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_url = redis_server.url
    tools = tmp_path / "slow_tools.py"
    tools.write_text(SLOW_TOOL, encoding="utf-8")
    side_effects = tmp_path / "side_effects.txt"
    monkeypatch.setenv("LEASE_TOOL_LOG", str(side_effects))
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"  # (shared by both workers: one host)
    with ScriptedServer(scripts={"slow": slow_script(delay_ms=5.0)}) as model:
        args = ("--store", redis_url, "--ledger", ledger, "--lease", "1", "--tools", str(tools))
        args += ("--model", "slow", "--base-url", model.base_url("openai_chat"))
        with workers(2, *args) as [(owner, on_a), (_b, on_b)]:
            with httpx.Client(base_url=on_a, timeout=30) as a:
                run = a.post("/runs", json={"message": "two cities"}).json()
                started = lambda fs: sum(f.event == "tool_started" for f in fs) == 2  # noqa: E731
                head = read_until(a, run["events_url"], started)
                session = a.cookies["toollatch_session"]
            # (tool_started is told as a call starts, its thread's first line a moment later:
            # a kill in between left one city unwritten on a loaded machine)
            deadline = time.monotonic() + 30
            while len(side_effects.read_text().split() if side_effects.exists() else []) < 2:
                assert time.monotonic() < deadline, "the tools did not both start"
                time.sleep(0.02)
            stop(owner, signal.SIGKILL)  # mid-tool: both tools sleeping
            headers = {"x-toollatch-session": session}
            with httpx.Client(base_url=on_b, timeout=30, headers=headers) as b:
                whole = read_until(b, run["events_url"], None)
    assert whole[: len(head)] == head
    assert_paired(whole)
    finished = {f.data["id"]: f.data for f in whole if f.event == "tool_finished"}
    assert set(finished) == {"call_slow_a", "call_slow_b"}
    assert all(d["error"] == "outcome_unknown" and d["is_error"] for d in finished.values())
    assert sorted(side_effects.read_text().split()) == ["Oslo", "Züri"]  # each ran once


def test_the_ledger_decides_what_the_log_did_not_see_start() -> None:
    frames = [
        b'id: 1\nevent: call_committed\ndata: {"type":"call_committed","id":"x","name":"t"}\n\n',
        b'id: 2\nevent: call_committed\ndata: {"type":"call_committed","id":"y","name":"t"}\n\n',
        b'id: 3\nevent: call_committed\ndata: {"type":"call_committed","id":"z","name":"t"}\n\n',
    ]
    seen = read_log(frames)
    events = closing_events(seen, "dead", {"x": "started", "y": (False, None)})
    results = {e["id"]: e["error"] for e in events if e["type"] == "tool_finished"}
    assert results == {"x": "outcome_unknown", "y": None, "z": "cancelled"}
    assert [e["type"] for e in events[-2:]] == ["round_ended", "run_ended"]
    assert events[-1]["rounds"] == 1 and len(events[-1]["calls"]) == 3


def test_the_lease_is_a_flag_a_config_key_and_a_variable() -> None:
    assert build_parser().parse_args(["serve", "--lease", "2.5"]).lease == 2.5
    assert load_config(env={"TOOLLATCH_RELAY__LEASE_S": "3"}).relay.lease_s == 3
    assert load_config(env={}).relay.lease_s == 10
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--lease", "0"])


def test_sigterm_with_a_shared_store_finishes_short_runs_and_ends_the_rest_paired(
    redis_server: RedisServer,
) -> None:
    redis_url = redis_server.url
    scripts = {"slower": slow_script(delay_ms=150.0), "quick": slow_script(delay_ms=10.0)}
    with ScriptedServer(scripts=scripts) as model:
        args = ("--store", redis_url, "--ledger", "none", "--lease", "1")
        args += ("--shutdown-grace", "4", "--base-url", model.base_url("openai_chat"))
        args += ("--model", "slower", "--allow-model", "slower", "--allow-model", "quick")
        with workers(2, *args) as [(stopping, on_a), (_b, on_b)]:
            session = {"x-toollatch-session": "t" * 43}
            a = httpx.Client(base_url=on_a, timeout=30, headers=session)
            b = httpx.Client(base_url=on_b, timeout=30, headers=session)
            with a, b:
                long_run = a.post("/runs", json={"message": "m", "model": "slower"}).json()
                other = b.post("/runs", json={"message": "m", "model": "slower"}).json()
                with a.stream("GET", other["events_url"]) as reading:  # A reads B's run
                    chunks = reading.iter_text()
                    next(chunks)
                    short = a.post("/runs", json={"message": "m", "model": "quick"}).json()
                    stopping.send_signal(signal.SIGTERM)
                    assert stopping.stderr is not None
                    while "SIGTERM" not in stopping.stderr.readline():
                        pass  # (the signal is being handled: no run is admitted any more)
                    refused = a.post("/runs", json={"message": "m"})
                    rest = "".join(chunks)  # ends: A stops reading
                short_frames = read_until(b, short["events_url"], None)
                long_frames = read_until(b, long_run["events_url"], None)
                going = b.post(other["cancel_url"], json={})  # (B's run was never touched)
            status = stopping.wait(timeout=30)
            assert stopping.stderr is not None
            stopping.stderr.close()
    assert status == 143
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert "event: run_ended" not in rest  # B's run went on: A's read of it just ended
    assert short_frames[-1].event == "run_ended" and short_frames[-1].data["error"] is None
    assert going.json() == {"id": other["id"], "cancelled": True}
    assert_paired(long_frames)  # cancelled at the end of the grace, every call paired
    assert long_frames[-1].data["cancelled"] is True
    assert "shutting down (SIGTERM)" in long_frames[-1].data["error"]


def test_serve_workers_2_with_redis_serves_runs_on_one_port(redis_server: RedisServer) -> None:
    redis_url = redis_server.url
    proc, url = serve("--workers", "2", "--store", redis_url, "--ledger", "none")
    try:
        for _ in range(6):  # (each connection goes to one of the workers)
            _run, frames = served_run(url, "weather in Oslo?")
            assert frames[-1].event == "run_ended" and frames[-1].data["error"] is None
            assert [f.id for f in frames] == list(range(1, len(frames) + 1))
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=True
        )
        pids = set(children.stdout.split())
    finally:
        stop(proc)  # (SIGINT passed on to both workers: 130)
    assert len(pids) == 2


def test_serve_workers_2_without_a_store_exits_2_naming_store() -> None:
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--ledger", "none", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--workers 2 needs a shared run store: --store redis://" in done.stderr


def test_an_owner_paused_past_its_lease_writes_nothing_after_the_survivors_end(
    redis_server: RedisServer,
) -> None:
    with slow_workers(redis_server.url, 2) as [(owner, _on_a), (_b, on_b)]:
        run, _head, session = run_until(_on_a, 8)
        owner.send_signal(signal.SIGSTOP)  # alive, but silent past its lease
        headers = {"x-toollatch-session": session}
        with httpx.Client(base_url=on_b, timeout=30, headers=headers) as b:
            ended = read_until(b, run["events_url"], None)
            owner.send_signal(signal.SIGCONT)
            time.sleep(3)  # (its model stream goes on; its writer and lease wake up)
            stop(owner, signal.SIGTERM)  # (and it writes the end of its runs it has)
            after = {"last-event-id": str(ended[-1].id)}
            again = b.get(run["events_url"], headers=after)
            whole = read_until(b, run["events_url"], None)
    assert ended[-1].event == "run_ended" and "lease of 1 s expired" in ended[-1].data["error"]
    assert again.status_code == 204  # (nothing after the end: the log ends there)
    assert whole == ended
    assert_paired(ended)


def test_an_owner_paused_past_its_lease_with_no_survivor_writes_its_runs_end_late(
    redis_server: RedisServer,
) -> None:
    # nobody ended the run while its owner slept: once awake it finds its lease gone, cancels
    # the run and writes its end to Redis itself, so a worker started later reads it to the end
    with ScriptedServer(scripts={"slower": slow_script(delay_ms=150.0)}) as model:
        args = ("--store", redis_server.url, "--ledger", "none", "--lease", "1")
        args += ("--model", "slower", "--base-url", model.base_url("openai_chat"))
        with workers(1, *args) as [(owner, on_a)]:
            run, _head, session = run_until(on_a, 5)
            owner.send_signal(signal.SIGSTOP)
            time.sleep(2.5)  # (its lease of 1 s expires; no other worker to end its runs)
            owner.send_signal(signal.SIGCONT)
            with workers(1, *args) as [(_b, on_b)]:
                headers = {"x-toollatch-session": session}
                with httpx.Client(base_url=on_b, timeout=30, headers=headers) as b:
                    whole = read_until(b, run["events_url"], None)
                    with httpx.Client(base_url=on_a, timeout=30, headers=headers) as a:
                        own = read_until(a, run["events_url"], None)
    assert whole == own  # the same log on the owner and on the worker that reads Redis
    assert_paired(whole)
    assert whole[-1].data["cancelled"] is True
    assert "lease expired (it was paused)" in whole[-1].data["error"]
