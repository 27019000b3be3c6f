"""``toollatch run`` on its failure paths, as a user meets them (a subprocess on the embedded
scripted server): a hung sync tool past its timeout, SIGINT and SIGTERM during a tool. The
run always ends with every call paired, ``round_ended`` and ``run_ended``, and the process
exits right after (a stuck worker thread is abandoned, never waited for)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from toollatch.scripted import Call, Faults, Script, ScriptedServer, Text, Turn

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

ROOT = Path(__file__).resolve().parents[1]
EXIT_WITHIN_S = 30.0
"""Generous (a loaded machine): before the fixes these runs never exited at all."""

HUNG = '''
import threading

import toollatch


@toollatch.tool(timeout=0.5)
def get_weather(city: str, unit: str = "c") -> str:
    """Never returns (a hung sync tool)."""
    threading.Event().wait()
    return "never"
'''

SLOW = '''
import threading

import toollatch


@toollatch.tool(group="weather", timeout=600)
def get_weather(city: str, unit: str = "c") -> str:
    """Hangs; one call at a time (the group): the second call waits, never started."""
    threading.Event().wait()
    return "never"
'''


def _tools(tmp_path: Path, source: str) -> str:
    path = tmp_path / "tools.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _tool_results(run_ended: dict[str, Any]) -> dict[str, str]:
    """The tool results in the history (OpenAI chat format), by call id."""
    return {
        m["tool_call_id"]: m["content"] for m in run_ended["history"] if m.get("role") == "tool"
    }


def test_a_hung_sync_tool_past_its_timeout_does_not_keep_the_cli_from_exiting(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--tools", _tools(tmp_path, HUNG)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    events = _events(done.stdout)
    assert events[-1]["type"] == "run_ended"
    finished = [e for e in events if e["type"] == "tool_finished"]
    assert [e["error"] for e in finished] == ["tool_timeout", "tool_timeout"]
    results = _tool_results(events[-1])
    for call_id in ("call_demo_weather_oslo", "call_demo_weather_zurich"):
        assert "did not finish within 0.5 s" in results[call_id], results


STUBBORN = '''
import asyncio

import toollatch


@toollatch.tool(timeout=600)
async def get_weather(city: str, unit: str = "c") -> str:
    """Refuses to be cancelled: the run cannot end by itself."""
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        await asyncio.Event().wait()
    return "never"
'''


def _start(tmp_path: Path, source: str, *flags: str) -> tuple[subprocess.Popen[str], list[str]]:
    """``toollatch run --tools FILE`` started, read up to its first ``tool_started``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "toollatch.cli", "run", "--tools", _tools(tmp_path, source), *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    watchdog = threading.Timer(EXIT_WITHIN_S, proc.kill)  # a broken start must not hang
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if '"tool_started"' in line:
                break
    finally:
        watchdog.cancel()
    assert lines, "no output"
    assert '"tool_started"' in lines[-1], lines
    return proc, lines


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_tool_cancels_the_run_with_every_call_paired(tmp_path, signum, status):
    proc, lines = _start(tmp_path, SLOW, "--json")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    assert proc.returncode == status, err
    assert err.count("\n") == 1, err
    assert "cancelling the run" in err
    events = _events("".join(lines) + out)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["round_ended", "run_ended"]
    assert kinds.count("run_ended") == 1
    how = "interrupted" if signum == signal.SIGINT else "terminated"
    assert events[-1]["error"] == f"{how} ({signal.Signals(signum).name}): the run was cancelled"
    # every result has its tool_finished (cancelled): the running call's and the waiting
    # one's, which never started (the history tells them apart, below)
    finished = [(e["id"], e["error"]) for e in events if e["type"] == "tool_finished"]
    assert finished == [
        ("call_demo_weather_oslo", "cancelled"),
        ("call_demo_weather_zurich", "cancelled"),
    ]
    calls = events[-1]["calls"]
    assert [(c["id"], c["error"]) for c in calls] == [
        ("call_demo_weather_oslo", "cancelled"),
        ("call_demo_weather_zurich", "cancelled"),
    ]
    results = _tool_results(events[-1])
    assert "while the tool was running; its outcome is unknown" in results["call_demo_weather_oslo"]
    assert "before the tool started; it was not run" in results["call_demo_weather_zurich"]


def test_sigint_in_the_terminal_view_shows_the_cancelled_calls_and_exits_130(tmp_path):
    marker = tmp_path / "started"
    wait = "    threading.Event().wait()"
    marked = SLOW.replace(wait, f'    open({str(marker)!r}, "w").close()\n{wait}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "toollatch.cli", "run", "--tools", _tools(tmp_path, marked)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:  # the view prints only at its end on a pipe: wait for the tool to start
        _wait_for(marker)
    finally:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    assert proc.returncode == 130, err
    assert out.count("error: cancelled") == 2, out  # the running call and the waiting one
    running = next(line for line in out.splitlines() if "call_demo_weather_oslo" in line)
    assert "ran " in running, out  # only the call that started shows how long it ran
    assert "rounds: 1" in out


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + EXIT_WITHIN_S
    while not path.exists():
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.02)


def test_a_second_signal_exits_at_once_when_the_run_cannot_end(tmp_path):
    proc, _lines = _start(tmp_path, STUBBORN, "--json")
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    watchdog = threading.Timer(EXIT_WITHIN_S, proc.kill)  # a silent process must not hang
    watchdog.start()
    try:
        assert "cancelling the run" in proc.stderr.readline()
    finally:
        watchdog.cancel()
    with pytest.raises(subprocess.TimeoutExpired):  # a tool that ignores its cancel holds it
        proc.wait(timeout=1)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    assert proc.returncode == 130
    assert "SIGINT again: exiting now" in err


ASYNC_SLOW = '''
import asyncio

import toollatch


@toollatch.tool(timeout=600)
async def get_weather(city: str, unit: str = "c") -> str:
    """Takes ten minutes: only the signal ends the run."""
    await asyncio.sleep(600)
    return "never"
'''


def _stalled_mid_call() -> Script:
    """Anthropic: call_a closes and (eager) starts when call_b opens; the stream then stalls
    inside call_b's arguments (after event 12 of 17: its second fragment) for ten minutes."""
    calls = (
        Call(call_id="call_a", name="get_weather", arguments='{"city": "Oslo"}'),
        Call(call_id="call_b", name="get_weather", arguments='{"city": "Zürich"}'),
    )
    stall = Faults(stall_ms=600_000, stall_after_events=12)
    first = Turn(items=(Text(text="Looking."), *calls), delay_ms=0, faults=stall)
    return Script(turns=(first, Turn(items=(Text(text="Done."),), delay_ms=0)))


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_stream_says_so_in_run_ended_with_every_call_paired(tmp_path, signum, status):
    """The signal comes while one call runs (started early) and the next one's arguments are
    still streaming: run_ended.error names it (it was null), both calls are paired."""
    with ScriptedServer({"stalled": _stalled_mid_call()}) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toollatch.cli", "run", "--json", "--provider", "anthropic",
             "--base-url", server.base_url("anthropic"), "--model", "stalled",
             "--tools", _tools(tmp_path, ASYNC_SLOW), "--eager", "get_weather"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines = _read_until(proc, '"tool_started"')
        assert '"call_opened","id":"call_b"' in "".join(lines), lines  # open when signalled
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    assert proc.returncode == status, err
    events = _events("".join(lines) + out)
    assert [e["type"] for e in events][-2:] == ["round_ended", "run_ended"]
    ended = events[-1]
    how = "interrupted" if signum == signal.SIGINT else "terminated"
    assert ended["error"] == f"{how} ({signal.Signals(signum).name}): the run was cancelled"
    assert [(c["id"], c["state"], c["error"]) for c in ended["calls"]] == [
        ("call_a", "committed", "cancelled"),  # it ran: its outcome is unknown
        ("call_b", "cancelled", "cancelled"),  # still streaming: never committed
    ]
    paired = {e["id"]: e["type"] for e in events if e["type"] in {"tool_finished", "call_failed"}}
    assert paired == {"call_a": "tool_finished", "call_b": "call_failed"}
    results = [
        block["tool_use_id"]
        for message in ended["history"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert results == ["call_a", "call_b"]  # the history sent next holds one result per call


def _read_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    """``proc``'s output lines up to the first holding ``marker`` (killed if it never does)."""
    assert proc.stdout is not None
    watchdog = threading.Timer(EXIT_WITHIN_S, proc.kill)  # a broken start must not hang
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                break
    finally:
        watchdog.cancel()
    assert lines and marker in lines[-1], lines
    return lines
