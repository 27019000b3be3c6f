"""How a run ends when it does not end of itself (issue 28): the run deadline in
``toollatch run`` (text and ``--json``) and on the relay; ``toollatch serve`` on SIGTERM and
SIGINT with an events reader open. Every call paired, ``round_ended`` and ``run_ended``
(naming why), and an exit status that says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_helpers import Frame, parse_sse, read_events, serve, slow_script, start_run
from toollatch import RunLimits
from toollatch.cli import build_parser
from toollatch.relay import RelayServer
from toollatch.runtime import load_config

ROOT = Path(__file__).resolve().parents[1]
EXIT_WITHIN_S = 60.0
"""Generous (a loaded machine); the runs below end in about a second."""

SLOW = '''
import asyncio

import toollatch


@toollatch.tool(timeout=600)
async def get_weather(city: str, unit: str = "c") -> str:
    """Takes ten minutes: only the deadline ends the run."""
    await asyncio.sleep(600)
    return "never"
'''


def _tools(tmp_path: Path, source: str) -> str:
    path = tmp_path / "tools.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--tools", _tools(tmp_path, SLOW), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN_S,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


# -- the run deadline ----------------------------------------------------------------------


def test_run_json_at_its_deadline_ends_with_the_reason_every_call_paired_and_exits_124(
    tmp_path,
):
    done = _run(tmp_path, "--json", "--deadline", "1")
    assert done.returncode == 124, done.stderr
    events = _events(done.stdout)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["round_ended", "run_ended"]
    ended = events[-1]
    assert "deadline passed (1 s)" in ended["error"]
    assert [(c["id"], c["error"]) for c in ended["calls"]] == [
        ("call_demo_weather_oslo", "cancelled"),
        ("call_demo_weather_zurich", "cancelled"),
    ]
    finished = [e["id"] for e in events if e["type"] == "tool_finished"]
    assert finished == ["call_demo_weather_oslo", "call_demo_weather_zurich"]
    assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
    assert done.stderr.startswith("toollatch: error: the run's deadline passed")


def test_run_in_the_terminal_view_at_its_deadline_exits_124_naming_it(tmp_path):
    done = _run(tmp_path, "--deadline", "1")
    assert done.returncode == 124, done.stderr
    assert "deadline passed (1 s)" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.count("error: cancelled") == 2, done.stdout


async def test_a_relay_run_at_its_deadline_sends_run_ended_naming_it_every_call_paired():
    scripts = {"slow": slow_script(delay_ms=100)}
    limits = RunLimits(deadline_s=1.5)
    async with (
        RelayServer(scripts=scripts, run_limits=limits) as relay,
        httpx.AsyncClient(base_url=relay.url, timeout=30) as client,
    ):
        run = await start_run(client, model="slow")
        frames = await read_events(client, run["events_url"])
    kinds = [f.event for f in frames]
    assert kinds[-2:] == ["round_ended", "run_ended"]
    ended = frames[-1].data
    assert "deadline passed (1.5 s)" in ended["error"]
    opened = {f.data["id"] for f in frames if f.event == "call_opened"}
    assert opened
    assert {c["id"] for c in ended["calls"]} == opened
    assert all(c["error"] == "cancelled" for c in ended["calls"])


@pytest.mark.parametrize("flags", [["--deadline", "0"], []])
def test_without_a_deadline_passing_the_run_exits_0(tmp_path, flags):
    # (the scripted demo with the examples: a run that ends of itself, deadline or none)
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--workspace", str(tmp_path),
         *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=EXIT_WITHIN_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _events(done.stdout)[-1]["error"] is None


# -- toollatch serve on SIGTERM / SIGINT ---------------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_serve_on_a_signal_ends_every_run_on_its_open_events_stream_then_exits(
    tmp_path, signum, status
):
    proc, url = serve("--tools", _tools(tmp_path, SLOW), "--ledger", "none")
    try:
        with httpx.Client(base_url=url, timeout=EXIT_WITHIN_S) as client:
            run = client.post("/runs", json={"message": "hi"}).json()
            frames: list[Frame] = []
            buffer = ""
            signalled = False
            with client.stream("GET", run["events_url"]) as response:
                assert response.status_code == 200
                for text in response.iter_text():
                    buffer += text
                    *blocks, buffer = buffer.split("\n\n")
                    for block in blocks:
                        frames += parse_sse(block + "\n\n")[0]
                        if not signalled and frames and frames[-1].event == "tool_started":
                            proc.send_signal(signum)  # a tool running, a call waiting
                            signalled = True  # (once: a second signal means "exit at once")
        status_seen = proc.wait(timeout=EXIT_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.stderr.close()
        proc.wait()
    assert status_seen == status, err
    assert "Traceback" not in err
    kinds = [f.event for f in frames]
    assert kinds[-2:] == ["round_ended", "run_ended"], kinds
    ended = frames[-1].data
    name = signal.Signals(signum).name
    assert ended["error"] == f"the relay is shutting down ({name}): the run was cancelled"
    opened = [f.data["id"] for f in frames if f.event == "call_opened"]
    assert opened
    assert [c["id"] for c in ended["calls"]] == opened
    assert all(c["error"] == "cancelled" for c in ended["calls"])
    finished = [f.data["id"] for f in frames if f.event == "tool_finished"]
    assert sorted(finished) == sorted(opened)  # the running call's and the waiting one's


def test_serve_takes_its_shutdown_grace_from_flag_config_and_environment(tmp_path):
    args = build_parser().parse_args(["serve", "--shutdown-grace", "2.5"])
    assert args.shutdown_grace == 2.5
    assert load_config(env={"TOOLLATCH_RELAY__SHUTDOWN_GRACE_S": "3"}).relay.shutdown_grace_s == 3
    assert load_config(env={}).relay.shutdown_grace_s == 10
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--shutdown-grace", "0"])
