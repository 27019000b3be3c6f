"""Resume a run by its session id from the stored history and the ledger: in the same
process with fresh agents, and after a real process was SIGKILLed in the middle of a tool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from toollatch import Agent, RunLimits, UsageError, model_client, tool
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._history import MemoryHistory
from toollatch.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]


def counting_tools(ran: list[str]):
    @tool(eager=True)
    def get_weather(city: str, unit: str = "c") -> str:
        """Weather."""
        ran.append(city)
        return "21 degrees"

    @tool
    def write_file(path: str, content: str) -> str:
        """Pretend to write."""
        ran.append(path)
        return "ok"

    return [get_weather, write_file]


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
async def test_a_stopped_run_resumes_where_its_stored_history_ends(provider):
    ran: list[str] = []
    ledger, store = MemoryLedger(), MemoryHistory()
    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url(provider)
        async with model_client(provider, model="scripted", base_url=url) as client:
            first = Agent(
                client,
                counting_tools(ran),
                ledger=ledger,
                history_store=store,
                session="s1",
                run_limits=RunLimits(max_rounds=1),
            )
            events = [e.to_json() async for e in first.run("weather?")]
            assert events[-1]["rounds"] == 1
            stored = await store.load("s1")
            assert stored == events[-1]["history"]  # what the next request would send
            with pytest.raises(UsageError, match="already has a stored history"):
                [e async for e in first.run("again")]  # one session is one run
            again = Agent(
                client, counting_tools(ran), ledger=ledger, history_store=store, session="s1"
            )  # a fresh agent, as another process would have
            events = [e.to_json() async for e in again.run(resume=True)]
        assert [r.status for r in server.requests] == [200, 200, 200]  # valid histories
    assert events[-1]["rounds"] == 2
    assert events[-1]["error"] is None
    assert ran == ["Oslo", "Zürich", "notes/weather.md"]  # round 1's tools did not run again
    assert await store.load("s1") == events[-1]["history"]


async def test_resume_needs_a_store_and_something_stored():
    async with ScriptedServer(delay_scale=0) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            with pytest.raises(UsageError, match="history_store"):
                Agent(client, counting_tools([])).run(resume=True)
            agent = Agent(client, counting_tools([]), history_store=MemoryHistory(), session="x")
            with pytest.raises(UsageError, match="nothing to resume"):
                [e async for e in agent.run(resume=True)]


def test_a_run_killed_mid_tool_resumes_in_another_process(tmp_path):
    log = tmp_path / "ran.log"
    tools = tmp_path / "tools.py"
    tools.write_text(
        textwrap.dedent(f'''
        import time
        import toollatch

        def note(what):
            with open({str(log)!r}, "a") as f:
                f.write(what + "\\n")

        @toollatch.tool(eager=True)
        def get_weather(city: str, unit: str = "c") -> str:
            """Weather."""
            note("weather " + city)
            return "21 degrees"

        @toollatch.tool(timeout=60)
        def write_file(path: str, content: str) -> str:
            """Write, slowly: the test kills the process while this runs."""
            note("write started")
            time.sleep(30)
            note("write finished")
            return "ok"
    ''')
    )
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    command = [
        sys.executable,
        "-m",
        "toollatch.cli",
        "run",
        "--json",
        "--tools",
        str(tools),
        "--ledger",
        ledger,
    ]
    # the killed run's claim lives 1.5 s unrenewed, not 30: the resume waits that out first
    # (renewed every 0.5 s while the run lives; nothing else claims the call meanwhile)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOOLLATCH_LEDGER__LEASE_S": "1.5"}
    with subprocess.Popen(
        [*command, "--session", "r1"], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env
    ) as first:
        assert first.stdout is not None
        for line in first.stdout:
            event = json.loads(line)
            if event["type"] == "tool_started" and event["name"] == "write_file":
                break
        # tool_started is sent before the tool's worker thread runs: wait for its first write
        deadline = time.monotonic() + 30
        while "write started" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "write_file never started"
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)  # mid-tool: round 2 is neither finished nor stored
    done = subprocess.run(
        [*command, "--resume", "r1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["type"] == "run_ended"
    assert last["error"] is None
    # round 1's calls ran once; the write that was cut off is "started, outcome unknown" and
    # never ran again (write_file is not idempotent), and the model got that result
    assert log.read_text().splitlines() == ["weather Oslo", "weather Zürich", "write started"]
    write = [c for c in last["calls"] if c["name"] == "write_file"]
    assert [(c["is_error"], c["error"]) for c in write] == [(True, "outcome_unknown")]
    # the re-sent call's result has its tool_finished, though the tool did not start here
    events = [json.loads(line) for line in done.stdout.splitlines()]
    finished = [(e["name"], e["error"]) for e in events if e["type"] == "tool_finished"]
    assert ("write_file", "outcome_unknown") in finished
    assert "its outcome is unknown" in json.dumps(last["history"])
    again = subprocess.run(
        [*command, "--resume", "r2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert again.returncode == 2
    assert "nothing to resume" in again.stderr
