"""Issue 35 item 1: what the tools returned is shown where a user looks. ``toollatch run``'s
terminal view has a short, redacted, one-line result (or the error message) per call;
``--json``'s ``tool_finished`` carries a bounded, redacted ``result`` preview (the whole
result, still redacted, with ``--full-results``). Run as a user runs it: a subprocess on a
pipe, against a scripted model server on loopback."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toollatch import ToolFinishedEvent
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn
from toollatch.tools._results import PREVIEW_CHARS, result_preview

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-live-Q8d2F7s9K1m3N5p7"
TOOLS = textwrap.dedent(f'''
    import toollatch

    @toollatch.tool
    def account(user: str) -> dict:
        """An account, with its key."""
        return {{"user": user, "api_key": "{SECRET}", "plan": "pro"}}

    @toollatch.tool
    def save(path: str) -> str:
        """Fails as a read-only disk does."""
        raise OSError(f"read-only file system: {{path}}")

    @toollatch.tool
    def big() -> str:
        """A long result on several lines."""
        return "line one\\nline two\\n" + "y" * 5000
''')


def _script() -> Script:
    calls = (
        Call(call_id="call_acc", name="account", arguments='{"user": "ana"}'),
        Call(call_id="call_save", name="save", arguments='{"path": "/ro/notes.md"}'),
        Call(call_id="call_big", name="big", arguments="{}"),
    )
    return Script(turns=(Turn(items=(Text(text="Working."), *calls), delay_ms=0),
                         Turn(items=(Text(text="Done."),), delay_ms=0)))  # fmt: skip


@pytest.fixture(scope="module")
def server():
    with ScriptedServer({"results": _script()}, delay_scale=0) as running:
        yield running


def _run(server: ScriptedServer, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--base-url",
         server.base_url("openai_chat"), "--model", "results", "--tools", str(tools), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def _finished(out: str) -> dict[str, dict]:
    events = [json.loads(line) for line in out.splitlines()]
    return {e["id"]: e for e in events if e["type"] == "tool_finished"}


def test_json_tool_finished_carries_a_bounded_redacted_preview(server, tmp_path):
    done = _run(server, tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    finished = _finished(done.stdout)
    assert finished["call_acc"]["result"] == ('{"user":"ana","api_key":"[redacted]","plan":"pro"}')
    assert finished["call_save"]["is_error"] is True
    assert finished["call_save"]["result"] == (
        "tool_error: OSError: read-only file system: /ro/notes.md"
    )
    big = finished["call_big"]
    assert len(big["result"]) == PREVIEW_CHARS
    assert big["result"].endswith("…")
    assert big["result"].startswith("line one\nline two\nyyy")
    assert big["result_chars"] == 5018
    tool_lines = [line for line in done.stdout.splitlines() if '"tool_finished"' in line]
    assert not any(SECRET in line for line in tool_lines)


def test_full_results_gives_the_whole_result_still_redacted(server, tmp_path):
    done = _run(server, tmp_path, "--json", "--full-results")
    assert done.returncode == 0, done.stderr
    finished = _finished(done.stdout)
    assert finished["call_big"]["result"] == "line one\nline two\n" + "y" * 5000
    assert "result_chars" not in finished["call_big"]
    assert "[redacted]" in finished["call_acc"]["result"]
    assert SECRET not in json.dumps(finished)


TOOL_NAMES = ("account", "save", "big")


def _result_lines(out: str) -> dict[str, str]:
    """Each call row's tool name and the result line under it. (The row is found by its
    tool's name: its id column may be cut to "c…" or less when the timings column is wider,
    "waited 194 ms" on a loaded machine.)"""
    lines = out.splitlines()
    return {
        name: below
        for row, below in itertools.pairwise(lines)
        if not row.startswith("  ↳ ") and below.startswith("  ↳ ")
        for name in row.split()
        if name in TOOL_NAMES
    }


def test_the_terminal_view_shows_each_result_on_one_line(server, tmp_path):
    done = _run(server, tmp_path)
    assert done.returncode == 0, done.stderr
    results = _result_lines(done.stdout)
    assert results["account"] == '  ↳ {"user":"ana","api_key":"[redacted]","plan":"pro"}'
    assert results["save"] == "  ↳ OSError: read-only file system: /ro/notes.md"
    assert "error: tool_error" in done.stdout
    assert results["big"].startswith("  ↳ line one line two yyy")  # one line
    assert results["big"].endswith("y…")  # bounded, ellipsised
    assert len(results["big"]) < 200
    assert SECRET not in done.stdout


def test_a_narrow_terminal_width_cuts_the_result_line_not_the_table(server, tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS)
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--base-url",
         server.base_url("openai_chat"), "--model", "results", "--tools", str(tools)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "60"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 60 for line in done.stdout.splitlines()), done.stdout
    results = _result_lines(done.stdout)
    assert results["big"].startswith("  ↳ line one")
    assert results["big"].rstrip().endswith("…")
    assert set(results) == {"account", "save", "big"}  # the tool names are still shown


def test_the_preview_redacts_and_bounds_what_it_is_given():
    assert result_preview('{"token": "abc"}') == '{"token":"[redacted]"}'
    assert result_preview("x" * 1000, 10) == "x" * 9 + "…"
    assert result_preview(f"key {SECRET}", None) == "[redacted]"
    event = ToolFinishedEvent(id="c", name="t", is_error=False, error=None, result="z" * 300)
    assert event.to_json()["result"] == "z" * (PREVIEW_CHARS - 1) + "…"
    assert event.to_json(full_result=True)["result"] == "z" * 300
    unknown = ToolFinishedEvent(id="c", name="t", is_error=False, error=None).to_json()
    assert unknown["result"] is None
    assert "result_chars" not in unknown
