"""Fault injection with real processes, on SQLite and on a real Redis.

A worker (``ledger_worker.py``) SIGKILLs itself after the claim, after the record says
started, or after the tool's side effect but before the result is stored; a second worker
then runs the same round (a restart), and a third. Side effects and tool runs are lines in
files, so a duplicate is visible. Expected: a call killed before its tool started runs once;
a started call of a non-idempotent tool is "outcome unknown", never run again; an idempotent
one runs again with the same idempotency key and its effect happens once. Then 2 and 4
workers race on the same call ids: exactly one runs each.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledger_helpers import RedisServer, json_outputs

WORKER = Path(__file__).with_name("ledger_worker.py")
LEASE_S = 0.5


@pytest.fixture(params=["sqlite", "redis"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    server: RedisServer = request.getfixturevalue("redis_server")
    # A fresh database number per test would run out; a fresh session per test is enough.
    return server.url


class Scene:
    """The files and the config shared by the workers of one test."""

    def __init__(self, tmp_path: Path, url: str, calls: list[list[Any]]) -> None:
        self.effects = tmp_path / "effects.txt"
        self.attempts = tmp_path / "attempts.txt"
        self.config: dict[str, Any] = {
            "ledger": url, "calls": calls, "effects": str(self.effects),
            "attempts": str(self.attempts), "lease_s": LEASE_S,
            "session": f"run-{tmp_path.name}",  # unique per test: Redis is shared
        }  # fmt: skip

    def spawn(self, **extra: Any) -> subprocess.Popen[str]:
        config = json.dumps({**self.config, **extra})
        return subprocess.Popen(
            [sys.executable, str(WORKER), config], stdout=subprocess.PIPE, text=True
        )

    def run(self, **extra: Any) -> list[dict[str, Any]]:
        proc = self.spawn(**extra)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        return list(json.loads(out))

    def killed(self, **extra: Any) -> None:
        proc = self.spawn(**extra)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, out

    def lines(self, which: Path) -> list[str]:
        return which.read_text().splitlines() if which.exists() else []


@pytest.mark.parametrize("point", ["claim", "start"])
@pytest.mark.parametrize("name", ["charge", "put"])
def test_killed_before_the_tool_ran(tmp_path: Path, ledger_url: str, point: str, name: str) -> None:
    args = {"n": 5} if name == "charge" else {"k": "x"}
    calls = [["c1", name, args]]
    if point == "claim":  # a call is claimed apart from its start only when it must wait
        calls.insert(0, ["c0", "hold_slot", {"seconds": 0.5}])
    scene = Scene(tmp_path, ledger_url, calls)
    scene.config["max_concurrency"] = 1
    scene.killed(kill=point, kill_call="c1")
    assert scene.lines(scene.effects) == []
    assert scene.lines(scene.attempts) == []
    *_, second = scene.run()
    if point == "start" and name == "charge":
        # The record says started: the ledger cannot know the tool did nothing.
        assert second["is_error"]
        assert second["code"] == "outcome_unknown"
        assert "outcome is unknown" in second["content"]
        assert scene.lines(scene.effects) == []
    else:
        expected = "charged 5" if name == "charge" else "put x"
        assert (second["is_error"], second["content"]) == (False, expected)
        assert len(scene.lines(scene.effects)) == 1
    assert scene.run()[-1] == second  # the stored result, never a third run
    assert len(scene.lines(scene.effects)) <= 1


def test_killed_after_the_side_effect_non_idempotent_is_unknown(
    tmp_path: Path, ledger_url: str
) -> None:
    scene = Scene(tmp_path, ledger_url, [["c1", "charge", {"n": 5}]])
    scene.killed(kill="effect", kill_call="c1")
    assert len(scene.lines(scene.effects)) == 1
    started = time.monotonic()
    second = scene.run()
    assert time.monotonic() - started >= LEASE_S * 0.5  # it waited for the dead worker's lease
    assert second[0]["is_error"]
    assert second[0]["code"] == "outcome_unknown"
    assert "outcome is unknown" in second[0]["content"]
    assert "not run again" in second[0]["content"]
    assert len(scene.lines(scene.effects)) == 1  # never a silent re-run
    assert scene.run() == second
    assert len(scene.lines(scene.effects)) == 1


def test_killed_after_the_side_effect_idempotent_runs_again_effect_once(
    tmp_path: Path, ledger_url: str
) -> None:
    scene = Scene(tmp_path, ledger_url, [["c1", "put", {"k": "x"}]])
    scene.killed(kill="effect", kill_call="c1")
    second = scene.run()
    assert second[0]["is_error"] is False
    assert second[0]["content"] == "put x"
    attempts = scene.lines(scene.attempts)
    assert len(attempts) == 2
    assert attempts[0].endswith("rerun=False")
    assert attempts[1].endswith("rerun=True")  # the tool knew the first run may have happened
    assert len(scene.lines(scene.effects)) == 1  # deduped downstream by the idempotency key
    assert scene.run() == second
    assert len(scene.lines(scene.attempts)) == 2


@pytest.mark.parametrize("workers", [2, 4])
def test_racing_workers_run_each_call_once(tmp_path: Path, ledger_url: str, workers: int) -> None:
    calls = [[f"c{i}", "charge", {"n": i}] for i in range(12)]
    scene = Scene(tmp_path, ledger_url, calls)
    # On SQLite the workers also race to create the brand-new file (its WAL switch answers
    # "database is locked" at once to all but one: the set-up retries, see _sqlite.py).
    start_at = time.time() + 2.0  # after every interpreter has started
    # A lease long enough for a loaded CI machine: this test is about racing claims, not
    # about expiry (a heartbeat late past a 0.5 s lease would rightly make a call "stale").
    procs = [
        scene.spawn(start_at=start_at, tool_sleep=0.02, worker=f"w{i}", lease_s=10.0)
        for i in range(workers)
    ]
    outputs = json_outputs(procs, timeout=90)
    effects = Counter(line.split()[0] for line in scene.lines(scene.effects))
    assert effects == Counter({f"c{i}": 1 for i in range(12)})
    assert len({line.split()[1] for line in scene.lines(scene.effects)}) >= 1
    for out in outputs:  # every worker answers every call with the one run's result
        assert [r["content"] for r in out] == [f"charged {i}" for i in range(12)]
