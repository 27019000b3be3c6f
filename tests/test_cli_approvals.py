"""``toollatch run`` with calls that need a person: ``--approve all|none`` for scripts, the
y/N question on a pseudo-terminal, the ``approvals`` config section (no code), and a run
SIGKILLed while it waits, resumed and approved: the tool runs exactly once."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ledger_helpers import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def tools_file(tmp_path: Path, *, needs_approval: bool = True) -> tuple[Path, Path]:
    log = tmp_path / "ran.log"
    tools = tmp_path / "tools.py"
    flag = "needs_approval=True" if needs_approval else ""
    tools.write_text(
        textwrap.dedent(f'''
        import toollatch

        def note(what):
            with open({str(log)!r}, "a") as f:
                f.write(what + "\\n")

        @toollatch.tool(eager=True)
        def get_weather(city: str, unit: str = "c") -> str:
            """Weather."""
            note("weather " + city)
            return "21 degrees"

        @toollatch.tool({flag})
        def write_file(path: str, content: str) -> str:
            """Write (the log proves how often it ran)."""
            note("write " + path)
            return "ok"
    ''')
    )
    return tools, log


def run_cli(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> Any:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def writes(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("write")]


def test_approve_all_and_none_for_scripts(tmp_path):
    tools, log = tools_file(tmp_path)
    done = run_cli("--json", "--tools", str(tools), "--approve", "none")
    assert done.returncode == 0, done.stderr
    events = lines(done.stdout)
    asked = [e for e in events if e["type"] == "approval_requested"]
    assert [(a["name"], a["arguments"]["path"]) for a in asked] == [
        ("write_file", "notes/weather.md")
    ]
    finished = [e for e in events if e["type"] == "tool_finished" and e["name"] == "write_file"]
    assert finished[0]["error"] == "approval_denied"
    assert "not approved" in finished[0]["result"]
    assert writes(log) == []
    done = run_cli("--json", "--tools", str(tools), "--approve", "all")
    assert done.returncode == 0, done.stderr
    assert writes(log) == ["write notes/weather.md"]


def test_the_config_names_tools_that_need_approval_without_code(tmp_path):
    tools, log = tools_file(tmp_path, needs_approval=False)
    config = tmp_path / "toollatch.yaml"
    config.write_text("approvals:\n  tools: [write_file]\n")
    done = run_cli("--json", "--tools", str(tools), "--config", str(config), "--approve", "none")
    assert done.returncode == 0, done.stderr
    assert [e["name"] for e in lines(done.stdout) if e["type"] == "approval_requested"] == [
        "write_file"
    ]
    assert writes(log) == []
    # the same from the environment, and y on standard input approves
    env = {"TOOLLATCH_APPROVALS__TOOLS": "[write_file]"}
    done = run_cli("--json", "--tools", str(tools), env=env, stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert "approve? [y/N]" in done.stderr
    assert writes(log) == ["write notes/weather.md"]


def test_an_unanswered_call_expires(tmp_path):
    tools, log = tools_file(tmp_path)
    # the question waits for a line that never comes (stdin stays open): it expires
    command = ["run", "--json", "--tools", str(tools), "--approval-timeout", "0.5"]
    with subprocess.Popen(
        [sys.executable, "-m", "toollatch.cli", *command],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        out = proc.stdout.read()  # (stdin stays open meanwhile: no end of input)
        assert proc.wait(timeout=120) == 0
    answered = [e for e in lines(out) if e["type"] == "approval_answered"]
    assert [a["decision"] for a in answered] == ["expired"]
    finished = [e for e in lines(out) if e["type"] == "tool_finished"]
    assert finished[-1]["error"] == "approval_expired"
    assert writes(log) == []


def answer_on_a_terminal(tools: Path, answer: bytes) -> str:
    """Run the terminal view on a pseudo-terminal, answer the question with ``answer``."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI, its stdin/stdout/stderr the terminal
        os.chdir(ROOT)
        os.execv(
            sys.executable,
            [sys.executable, "-m", "toollatch.cli", "run", "--tools", str(tools)],
        )
    seen = b""
    answered = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal: it ended
                break
            if not chunk:
                break
            seen += chunk
            if not answered and b"approve? [y/N]" in seen:
                os.write(fd, answer)
                answered = True
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, seen.decode(errors="replace")
    return seen.decode(errors="replace")


def test_a_terminal_is_asked_with_the_full_arguments_y_approves(tmp_path):
    tools, log = tools_file(tmp_path)
    shown = answer_on_a_terminal(tools, b"y\n")
    assert "write_file" in shown and '"path": "notes/weather.md"' in shown
    assert "asking" in shown  # the call's line, drawn before the question
    assert writes(log) == ["write notes/weather.md"]


def test_a_terminal_is_asked_n_denies(tmp_path):
    tools, log = tools_file(tmp_path)
    shown = answer_on_a_terminal(tools, b"n\n")
    assert "approve? [y/N]" in shown
    assert writes(log) == []


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_run_killed_while_waiting_resumes_and_the_approved_call_runs_once(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
):
    tools, log = tools_file(tmp_path)
    if store == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        ledger = server.url
    else:
        ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    command = [sys.executable, "-m", "toollatch.cli", "run", "--json", "--tools", str(tools)]
    command += ["--ledger", ledger]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOOLLATCH_LEDGER__LEASE_S": "3"}
    with subprocess.Popen(
        [*command, "--session", "r1"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as first:
        assert first.stdout is not None
        for line in first.stdout:
            event = json.loads(line)
            if event["type"] == "approval_requested":
                asked = event
                break
        first.send_signal(signal.SIGKILL)  # waiting for a person: round 2 is not stored
    assert asked["name"] == "write_file"
    assert writes(log) == []
    done = subprocess.run(
        [*command, "--resume", "r1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        input="y\n",
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    events = lines(done.stdout)
    again = [e for e in events if e["type"] == "approval_requested"]
    # the resumed run met the same call and found its question (asked before the kill)
    assert [(e["id"], e["args_sha256"]) for e in again] == [(asked["id"], asked["args_sha256"])]
    assert again[0]["expires_at"] == asked["expires_at"]  # the stored question, not a new one
    assert events[-1]["error"] is None
    assert writes(log) == ["write notes/weather.md"]  # exactly once
    write = [c for c in events[-1]["calls"] if c["name"] == "write_file"]
    assert [(c["is_error"], c["error"]) for c in write] == [(False, None)]
