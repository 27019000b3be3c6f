"""``toollatch serve --durable postgresql://...``: relay runs as DBOS workflows, finished by
a surviving worker when their worker dies. Real ``toollatch serve`` processes on a real
redis-server and a real PostgreSQL (durable_helpers), the owner SIGKILLed: the run ends
normally on another worker, every call paired, each side effect once (a tool appends a
line to a file), and a reader on another worker goes on with ``Last-Event-ID`` to
``run_ended``, ids 1..N with no gap and none twice."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_helpers import PostgresServer, wait_for
from ledger_helpers import RedisServer, free_port
from relay_helpers import CLI, Frame, serve, slow_script, stop
from test_relay_lease import assert_paired, read_until
from toollatch.cli import build_parser
from toollatch.cli._app_config import load_config
from toollatch.scripted import ScriptedServer

pytest.importorskip("dbos")

TOOL = '''
import os, time
from toollatch import tool

@tool(timeout=120)
def get_weather(city: str, unit: str = "c") -> str:
    """The weather (appends a line, then waits DURABLE_TOOL_SLEEP_S: the worker may be
    killed meanwhile)."""
    with open(os.environ["DURABLE_TOOL_LOG"], "a") as log:
        log.write(city[:4] + "\\n")
    time.sleep(float(os.environ.get("DURABLE_TOOL_SLEEP_S", "0")))
    return "sunny"
'''


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def durable_workers(
    redis_server: RedisServer,
    postgres: PostgresServer,
    tmp_path: Path,
    model_url: str,
    sleeps: list[float],
    database: str,
) -> Iterator[list[tuple[subprocess.Popen[str], str]]]:
    """One ``serve --durable`` worker per entry of ``sleeps`` (its tool's wait), on one
    Redis, one PostgreSQL database and one SQLite ledger, with a 1 s lease."""
    tools = tmp_path / "durable_tools.py"
    tools.write_text(TOOL, encoding="utf-8")
    args = ("--store", redis_server.url, "--durable", postgres.url(database), "--lease", "1")
    args += ("--ledger", f"sqlite:///{tmp_path / 'ledger.db'}", "--tools", str(tools))
    args += ("--model", "slow", "--base-url", model_url)
    procs: list[tuple[subprocess.Popen[str], str]] = []
    saved = os.environ.get("DURABLE_TOOL_SLEEP_S")
    try:
        os.environ["DURABLE_TOOL_LOG"] = str(tmp_path / "side_effects.txt")
        for sleep_s in sleeps:
            os.environ["DURABLE_TOOL_SLEEP_S"] = str(sleep_s)
            procs.append(serve(*args))
        yield procs
    finally:
        os.environ.pop("DURABLE_TOOL_LOG", None)
        if saved is None:
            os.environ.pop("DURABLE_TOOL_SLEEP_S", None)
        else:
            os.environ["DURABLE_TOOL_SLEEP_S"] = saved
        for proc, _url in procs:
            if proc.poll() is None:
                stop(proc)


def lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "side_effects.txt"
    return path.read_text(encoding="utf-8").split() if path.exists() else []


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


def test_a_killed_owner_mid_tool_has_its_run_finished_by_a_survivor(
    redis_server: RedisServer, postgres: PostgresServer, tmp_path: Path
) -> None:
    with ScriptedServer(scripts={"slow": slow_script(delay_ms=5.0)}) as model:
        url = model.base_url("openai_chat")
        with durable_workers(redis_server, postgres, tmp_path, url, [60, 0, 0], "midtool") as procs:
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
    assert_whole(whole)
    ended = whole[-1].data
    assert ended["error"] is None  # finished normally, not ended by the lease
    assert [(c["id"], c["error"]) for c in ended["calls"]] == [
        ("call_slow_a", "outcome_unknown"),  # started on the dead worker: not run again
        ("call_slow_b", None),  # run once, on the survivor
    ]
    assert sorted(lines(tmp_path)) == ["Oslo", "Züri"]  # each side effect exactly once
    assert requests == 2  # the first round was not asked again: its step was recorded
