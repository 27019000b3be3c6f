"""Durable runs on DBOS over a real PostgreSQL (started by the test, see durable_helpers):
a worker process is SIGKILLed in the middle of a tool and another process takes its run
over (DBOS's recovery of another executor's workflows): the calls that had finished are
not run again, the cut-off call is ``outcome_unknown`` (the ledger knows it had started),
and the run ends normally, every call paired."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from durable_helpers import PostgresServer, wait_for
from toollatch import UsageError
from toollatch.scripted import Call, Reasoning, Script, ScriptedServer, Text, Turn, demo_script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def told(log: Path) -> list[dict]:
    """The events both workers told, one per number: a number told twice (a replayed step)
    is the same event; the numbers run from 0 without a gap."""
    first: dict[int, dict] = {}
    tellers: dict[int, set[int]] = {}
    for line in (log.parent / (log.name + ".events")).read_text().splitlines():
        event = json.loads(line)
        tellers.setdefault(event["n"], set()).add(event.pop("pid"))
        assert first.setdefault(event["n"], event) == event
    assert sorted(first) == list(range(len(first)))
    # the survivor told round 1's events again (replayed), the dead worker the same before it
    assert len(tellers[0]) == 2
    return [first[n] for n in sorted(first)]


def summary(events: list[dict]) -> list[str]:
    """One line per event; a round's text deltas in a row (as the stream made them) one
    ``text``."""
    out: list[str] = []
    for e in events:
        if e["type"] == "text" and out and out[-1] == "text":
            continue
        if e["type"] == "tool_finished":
            out.append(f"tool_finished {e['name']} {e['error']}")
        elif e["type"] in ("call_committed", "tool_started"):
            out.append(f"{e['type']} {e['name']}")
        else:
            out.append(e["type"])
    return out


ROUND_1 = [  # (in the stream's order: a round's events are made as it streams)
    "text",
    "call_opened",
    "call_opened",
    "call_committed get_weather",
    "call_committed get_weather",
    "tool_started get_weather",
    "tool_finished get_weather None",
    "tool_started get_weather",
    "tool_finished get_weather None",
    "round_ended",
    "text",
    "call_opened",
    "call_committed write_file",
]

WHOLE_RUN = [  # the demo run's events, with the write_file call run to its end
    *ROUND_1,
    "tool_started write_file",
    "tool_finished write_file None",
    "round_ended",
    "text",
    "round_ended",
    "run_ended",
]


def kill_and_recover(
    server: ScriptedServer, postgres: PostgresServer, tmp_path: Path, run_id: str, when, env
) -> tuple[dict, list[int]]:  # type: ignore[no-untyped-def]
    """Start run ``run_id`` in a worker process, SIGKILL it once ``when()`` holds, recover
    its runs in a second worker: that worker's result (with the DBOS steps) and the model's
    answer statuses."""
    log = tmp_path / "ran.log"
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    worker = [sys.executable, str(HERE / "durable_worker.py")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    common = [postgres.url(), server.base_url("openai_chat"), ledger, str(log), run_id]
    dead, survivor = f"{run_id}-worker-1", f"{run_id}-worker-2"
    with subprocess.Popen(
        [*worker, "start", *common, dead], cwd=ROOT, env=env, stdout=subprocess.PIPE
    ) as dying:
        wait_for(when, "the moment to kill the worker")
        dying.send_signal(signal.SIGKILL)
    server.delay_scale = 0  # (the survivor's answers: a slow one was for the kill to land in)
    done = subprocess.run(
        [*worker, "recover", *common, survivor, dead],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    recovered, result = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert recovered == {"recovered": [run_id]}
    return result, [r.status for r in server.requests]


def test_a_worker_killed_mid_tool_has_its_run_finished_by_another(postgres, tmp_path):
    log = tmp_path / "ran.log"

    def writing() -> bool:  # mid-tool: its call step never returns
        return "write started" in (log.read_text() if log.exists() else "")

    with ScriptedServer(delay_scale=0) as server:
        result, models = kill_and_recover(server, postgres, tmp_path, "run-1", writing, {})
    assert result["error"] is None
    lines = log.read_text().splitlines()
    # round 1's two calls ran once (in the dead worker), the write started once and was not
    # run again: each tool had the ledger's idempotency key, one per call
    assert [line.rsplit(" ", 1)[0] for line in lines] == [
        "weather Oslo",
        "weather Zürich",
        "write started",
    ]
    keys = [line.rsplit(" ", 1)[1] for line in lines]
    assert len(set(keys)) == 3 and "None" not in keys
    calls = result["calls"]
    assert [(c["name"], c["error"]) for c in calls] == [
        ("get_weather", None),
        ("get_weather", None),
        ("write_file", "outcome_unknown"),
    ]
    assert len({c["id"] for c in calls}) == 3  # every call paired with one result
    assert result["rounds"] == 3  # the run went on after the takeover and ended normally
    # the two rounds the dead worker had played were replayed from their recorded steps: the
    # model was asked three times in all, not five
    assert models == [200, 200, 200]
    round_, call = "toollatch.model_round", "toollatch.call"
    assert result["steps"] == [round_, call, call, round_, call, round_]
    assert "its outcome is unknown" in json.dumps(result["history"])
    # the survivor's metrics count what it did: rounds 2 and 3 ended here, no tool ran here
    # (round 1's calls replayed were counted by the dead worker; the write did not start)
    assert result["counted"] == {"rounds normal": 2}
    # the events went on where the dead worker's stopped: the replayed ones under the same
    # numbers; the cut-off call's tool_finished says outcome_unknown (it did not start here;
    # the dead worker's tool_started was in the step that never returned: never told)
    assert summary(told(log)) == [
        *ROUND_1,
        "tool_finished write_file outcome_unknown",
        "round_ended",
        "text",
        "round_ended",
        "run_ended",
    ]


def test_a_worker_killed_mid_stream_has_the_round_asked_again_by_another(postgres, tmp_path):
    log = tmp_path / "ran.log"
    # the demo, its second answer slow (0.2 s per event: about 5 s): the test kills the
    # worker once that request arrived, while its stream is being read (the survivor's
    # second attempt of it comes at once: kill_and_recover)
    first, second, third = demo_script().turns
    script = Script(
        turns=(
            replace(first, delay_ms=0),
            replace(second, delay_ms=200),
            replace(third, delay_ms=0),
        )
    )
    with ScriptedServer({"scripted": script}) as server:

        def streaming() -> bool:  # mid-stream: round 2's step never returns
            return len(server.requests) == 2

        result, models = kill_and_recover(
            server, postgres, tmp_path, "run-2", streaming, {"WRITE_SLEEP_S": "0"}
        )
    assert result["error"] is None
    # round 2 was asked again (a new attempt: 4 requests); round 1 was not, nor its calls
    assert models == [200, 200, 200, 200]
    lines = [line.rsplit(" ", 1)[0] for line in log.read_text().splitlines()]
    assert lines == ["weather Oslo", "weather Zürich", "write started", "write finished"]
    calls = result["calls"]
    assert [(c["name"], c["error"]) for c in calls] == [
        ("get_weather", None),
        ("get_weather", None),
        ("write_file", None),
    ]
    round_, call = "toollatch.model_round", "toollatch.call"
    assert result["steps"] == [round_, call, call, round_, call, round_]
    assert summary(told(log)) == WHOLE_RUN
    # the survivor's metrics: round 1 and its calls were the dead worker's (replayed, not
    # counted again); round 2 (asked again), its write and round 3 were its own
    counted = result["counted"]
    assert counted.pop("seconds") >= 0  # (the write's: it ran here)
    assert counted == {"runs ok": 1, "rounds normal": 2}


def test_a_live_sink_is_told_a_rounds_events_before_its_step_ends(postgres, tmp_path):
    log = tmp_path / "ran.log"
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WRITE_SLEEP_S": "0.5"}
    with ScriptedServer(delay_scale=0) as server:
        common = [postgres.url(), server.base_url("openai_chat"), ledger, str(log), "run-3"]
        done = subprocess.run(
            [sys.executable, str(HERE / "durable_worker.py"), "live", *common, "live-worker"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ended = json.loads(done.stdout.splitlines()[-1])
    assert ended["error"] is None
    counted = ended["counted"]
    assert counted.pop("seconds") >= 0.5  # the tools' own run time (the write sleeps 0.5 s)
    assert counted == {"runs ok": 3, "rounds normal": 3}  # (each once)
    events = [json.loads(line) for line in (tmp_path / "ran.log.events").read_text().splitlines()]
    # every number told, in order; a round's events twice: live from its step, then again
    # by the workflow from the step's record (the sink keeps the first of each number)
    numbers = [e["n"] for e in events]
    firsts = {n: e for e, n in reversed(list(zip(events, numbers, strict=True)))}
    assert sorted(firsts) == list(range(len(firsts)))
    # round 1's events were told while its step ran: no step of the run was recorded yet
    tool = min(n for n in firsts if firsts[n]["type"] == "tool_started")
    round_1 = [firsts[n] for n in range(tool)]
    assert summary(round_1) == ROUND_1[:5]
    assert {e["steps"] for e in round_1} == {0}
    # each round's attempt began where the events were: 0, then after round 1's calls and
    # round_ended, then after round 2's
    starts = [int(n) for n in (tmp_path / "ran.log.attempts").read_text().split()]
    ended = [n for n in sorted(firsts) if firsts[n]["type"] == "round_ended"]
    assert starts == [0, ended[0] + 1, ended[1] + 1]
    assert summary([firsts[n] for n in sorted(firsts)]) == WHOLE_RUN


REASONING = Script(
    turns=(
        Turn(
            items=(
                Reasoning(text="Oslo first, then nothing else."),
                Text(text="Checking Oslo."),
                Call(call_id="call_think", name="get_weather", arguments='{"city": "Oslo"}'),
            )
        ),
        Turn(items=(Text(text="Sunny."),)),
    )
)


def test_a_live_sink_is_told_a_rounds_reasoning_before_its_calls(postgres, tmp_path):
    log = tmp_path / "ran.log"
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ScriptedServer({"scripted": REASONING}) as server:
        common = [postgres.url(), server.base_url("openai_chat"), ledger, str(log), "run-4"]
        done = subprocess.run(
            [sys.executable, str(HERE / "durable_worker.py"), "live", *common, "think-worker"],
            cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["error"] is None
    events = [json.loads(line) for line in (tmp_path / "ran.log.events").read_text().splitlines()]
    firsts: dict[int, dict] = {}
    for event in events:  # a number told twice (live, then from the record) is one event
        first = firsts.setdefault(event["n"], event)
        assert {**first, "steps": 0} == {**event, "steps": 0}
    assert sorted(firsts) == list(range(len(firsts)))
    told = [firsts[n] for n in sorted(firsts)]
    # as a plain run tells it (the relay's observer): the reasoning when the stream ended,
    # before the round's call_committed
    assert summary(told) == [
        "text",
        "call_opened",
        "reasoning",
        "call_committed get_weather",
        "tool_started get_weather",
        "tool_finished get_weather None",
        "round_ended",
        "text",
        "round_ended",
        "run_ended",
    ]
    (reasoning,) = [e for e in told if e["type"] == "reasoning"]
    assert reasoning["text"] == "Oslo first, then nothing else."
    assert reasoning["steps"] == 0  # told live, while the round's step ran


def test_a_durable_store_is_postgresql_and_recovery_names_executors():
    from toollatch.runtime import DurableRuns

    with pytest.raises(UsageError, match="postgresql://"):
        DurableRuns("sqlite:///x.db", executor_id="w")
    with pytest.raises(UsageError, match="executor_id"):
        DurableRuns("postgresql://127.0.0.1/x", executor_id="")
