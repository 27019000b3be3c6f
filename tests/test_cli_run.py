"""``toollatch run``: the CLI contract (other tools rely on ``--json``), run as a user runs it
(a subprocess), on the embedded scripted server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEYS = {
    "text": {"type", "text"},
    "call_opened": {"type", "id", "name"},
    "call_committed": {"type", "id", "name", "arguments", "early"},
    "call_failed": {"type", "id", "name", "error", "detail"},
    "tool_started": {"type", "id", "name"},
    "tool_finished": {"type", "id", "name", "is_error", "error", "result"},
    "round_ended": {"type", "round", "ended", "stop_reason"},
    "run_ended": {"type", "rounds", "calls", "history", "error"},
}


def toollatch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def events_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize(
    "provider", ["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"]
)
def test_run_json_with_no_other_argument_plays_two_rounds_with_two_parallel_calls(
    provider, tmp_path
):
    done = toollatch("run", "--json", "--provider", provider, "--workspace", str(tmp_path))
    assert done.returncode == 0, done.stderr
    events = events_of(done.stdout)
    assert "scripted demo" in events[0].pop("notice")  # (the first event says it once)
    for event in events:
        assert set(event) == KEYS[event["type"]], event
    assert events[-1]["type"] == "run_ended"
    assert [e["type"] for e in events].count("run_ended") == 1
    rounds = [i for i, e in enumerate(events) if e["type"] == "round_ended"]
    assert len(rounds) >= 2
    first = events[: rounds[0]]
    assert len([e for e in first if e["type"] == "call_committed"]) == 2
    assert len([e for e in first if e["type"] == "tool_finished"]) == 2
    calls = events[-1]["calls"]
    assert [(c["name"], c["state"], c["is_error"]) for c in calls] == [
        ("get_weather", "committed", False),
        ("get_weather", "committed", False),
        ("write_file", "committed", False),
    ]
    assert events[-1]["error"] is None
    assert (tmp_path / "notes" / "weather.md").is_file()


def test_run_shows_a_terminal_view_and_exits_0():
    done = toollatch("run")
    assert done.returncode == 0, done.stderr
    assert "Let me check the weather in both cities." in done.stdout
    assert "get_weather" in done.stdout
    assert "write_file" in done.stdout
    assert "rounds: 3" in done.stdout


def test_run_with_a_tools_file_registers_its_functions(tmp_path):
    tools = tmp_path / "my_tools.py"
    tools.write_text(
        textwrap.dedent('''
        import toollatch

        @toollatch.tool
        def get_weather(city: str, unit: str = "c") -> str:
            """Made-up weather."""
            return f"always 21 degrees in {city}"

        @toollatch.tool(side_effects="write")
        def write_file(path: str, content: str) -> str:
            """Pretend to write."""
            return f"pretended to write {len(content)} characters to {path}"

        def not_a_tool():
            pass
    ''')
    )
    done = toollatch("run", "--json", "--tools", str(tools))
    assert done.returncode == 0, done.stderr
    events = events_of(done.stdout)
    history = json.dumps(events[-1]["history"])
    assert "always 21 degrees in Oslo" in history
    assert "pretended to write" in history
    # the file's get_weather is not eager: both calls commit at the round's end
    assert [e["early"] for e in events if e["type"] == "call_committed"][:2] == [False, False]
    eager = events_of(
        toollatch("run", "--json", "--tools", str(tools), "--eager", "get_weather").stdout
    )
    assert [e["early"] for e in eager if e["type"] == "call_committed"][:2] == [True, True]


def test_an_unreachable_model_exits_1_with_one_line():
    done = toollatch("run", "--json", "--base-url", "http://127.0.0.1:9/v1", "--model", "m")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("toollatch: error: model:")
    assert "Traceback" not in done.stderr
    assert events_of(done.stdout)[-1]["rounds"] == 0


@pytest.mark.parametrize(
    "args",
    [
        ["--provider", "vertex"],
        ["--max-rounds", "0"],
        ["--base-url", "http://127.0.0.1:9/v1"],  # no --model
        ["--tools", "no/such/file.py"],
        ["--eager", "no_such_tool"],
    ],
)
def test_usage_errors_exit_2_with_one_line(args):
    done = toollatch("run", *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().count("\n") == 0 or done.stderr.startswith("usage:")
    assert "Traceback" not in done.stderr


def test_max_rounds_ends_the_run_with_a_paired_history():
    done = toollatch("run", "--json", "--max-rounds", "1")
    assert done.returncode == 0, done.stderr
    last = events_of(done.stdout)[-1]
    assert last["rounds"] == 1
    tool_messages = [m for m in last["history"] if m.get("role") == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [
        "call_demo_weather_oslo",
        "call_demo_weather_zurich",
    ]


def test_run_with_a_ledger_runs_a_call_id_once_across_processes(tmp_path):
    log = tmp_path / "ran.log"
    tools = tmp_path / "logged_tools.py"
    tools.write_text(
        textwrap.dedent(f'''
        import toollatch

        @toollatch.tool
        def get_weather(city: str, unit: str = "c") -> str:
            """Made-up weather, logged."""
            with open({str(log)!r}, "a") as f:
                f.write(city + "\\n")
            return "21 degrees"

        @toollatch.tool
        def write_file(path: str, content: str) -> str:
            """Pretend to write."""
            return "ok"
    ''')
    )
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ["run", "--json", "--tools", str(tools), "--ledger", ledger]
    done = toollatch(*args, "--session", "s1")
    assert done.returncode == 0, done.stderr
    again = toollatch(*args, "--session", "s1")  # one session is one run: not started twice
    assert again.returncode == 2
    assert "already has a stored history" in again.stderr
    resumed = toollatch(*args, "--resume", "s1")  # the run goes on from its stored history
    assert resumed.returncode == 0, resumed.stderr
    assert events_of(resumed.stdout)[-1]["rounds"] == 1  # the model has nothing more to call
    # (the two calls run at once, in two threads: either may log first)
    assert sorted(log.read_text().splitlines()) == ["Oslo", "Zürich"]  # once each, not twice
    assert toollatch(*args).returncode == 0  # no --session: a new run, a new scope
    assert sorted(log.read_text().splitlines()) == ["Oslo", "Oslo", "Zürich", "Zürich"]
    bad = toollatch("run", "--ledger", "ftp://nowhere")
    assert bad.returncode == 2
    assert "--ledger" in bad.stderr


def test_the_example_config_runs_exactly_as_no_config(tmp_path):
    """``toollatch config example`` says its values are the defaults: a run with that file is
    the run without one (the eager example tool still starts early, and so on)."""
    from toollatch.runtime import load_config

    example = toollatch("config", "example")
    assert example.returncode == 0, example.stderr
    path = tmp_path / "toollatch.yaml"
    path.write_text(example.stdout, encoding="utf-8")
    assert load_config(path) == load_config(None)
    plain = toollatch("run", "--json", "--workspace", str(tmp_path / "a"))
    configured = toollatch(
        "run", "--json", "--workspace", str(tmp_path / "b"), "--config", str(path)
    )
    assert plain.returncode == configured.returncode == 0, configured.stderr

    def shape(out: str) -> list[tuple[str, object]]:
        return [(e["type"], e.get("early")) for e in events_of(out) if e["type"] != "text"]

    assert shape(configured.stdout) == shape(plain.stdout)
    assert ("call_committed", True) in shape(plain.stdout)


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    done = toollatch("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"toollatch {version('toollatch')}"
