"""``toollatch serve --ledger``: every served run's calls go through a ledger (SQLite in the
user's data folder by default, ``--ledger none`` for none), and a run cut off by a SIGKILL
is resumed by a second serve on the same ledger without running a completed call again."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_helpers import CLI, parse_sse, serving
from toollatch.ledger import LedgerKey
from toollatch.ledger._sqlite import SQLiteLedger
from toollatch.relay._app import run_scope
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

TOOLS = '''
import os
from toollatch import tool


@tool(eager=True)
def record(key: str) -> str:
    """Append key to the side-effect file: one line per run of the tool."""
    with open(os.environ["RECORD_LOG"], "a", encoding="utf-8") as f:
        f.write(key + "\\n")
    return "recorded " + key
'''


@pytest.fixture(autouse=True)
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's data folder of every serve started here (never the real one)."""
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    return home


def _demo(url: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Run the demo to its end: (the POST's answer, the session, run_ended's data)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        run = client.post("/runs", json={"message": "hi"}).json()
        frames, _ = parse_sse(client.get(run["events_url"]).text)
    assert frames[-1].event == "run_ended"
    assert frames[-1].data["error"] is None
    return run, client.cookies["toollatch_session"], frames[-1].data


async def _states(path: Path, scope: str, call_ids: list[str]) -> list[str | None]:
    ledger = SQLiteLedger(path)
    try:
        found = [await ledger.get(LedgerKey(scope=scope, call_id=c)) for c in call_ids]
    finally:
        await ledger.aclose()
    return [r.state if r is not None else None for r in found]


def test_serve_records_every_call_in_the_default_ledger(data_home: Path) -> None:
    with serving() as url:
        run, session, ended = _demo(url)
    path = data_home / "toollatch" / "ledger.db"
    assert path.is_file()
    ids = [c["id"] for c in ended["calls"]]
    assert len(ids) == 3
    states = asyncio.run(_states(path, run_scope(session, run["id"]), ids))
    assert states == ["completed"] * 3


def test_serve_ledger_flag_and_config_and_none(tmp_path: Path, data_home: Path) -> None:
    chosen = tmp_path / "chosen.db"
    with serving("--ledger", f"sqlite:///{chosen}") as url:
        run, session, ended = _demo(url)
    ids = [c["id"] for c in ended["calls"]]
    assert asyncio.run(_states(chosen, run_scope(session, run["id"]), ids)) == ["completed"] * 3
    # the config file's ledger.url; the flag would win over it
    configured = tmp_path / "configured.db"
    config = tmp_path / "toollatch.yaml"
    config.write_text(f"ledger:\n  url: sqlite:///{configured}\n", encoding="utf-8")
    with serving("--config", str(config)) as url:
        run, session, ended = _demo(url)
    ids = [c["id"] for c in ended["calls"]]
    assert asyncio.run(_states(configured, run_scope(session, run["id"]), ids)) == ["completed"] * 3
    # --ledger none: no ledger anywhere, and resume is refused
    with serving("--ledger", "none") as url:
        run, session, _ended = _demo(url)
        with httpx.Client(base_url=url, timeout=30) as client:
            again = client.post(
                "/runs", json={"resume": run["id"]}, headers={"x-toollatch-session": session}
            )
        assert again.status_code == 422
        assert again.json()["error"]["code"] == "no_ledger"
    assert not data_home.exists()


@pytest.mark.parametrize(
    ("url", "needle"),
    [("postgres://x/y", "unknown ledger URL"), ("sqlite:////proc/no/such/ledger.db", "ledger")],
)
def test_a_ledger_that_cannot_be_used_stops_serve_at_start(url: str, needle: str) -> None:
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--ledger", url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr
    assert done.stderr.startswith("toollatch: error:")
    assert done.stderr.count("\n") == 1


def _cut_script() -> Script:
    """Round 1: ``record(a)`` (eager: it runs once ``b`` opens), then ``b``'s arguments
    stream slowly (about 4 s), a window to kill the relay with ``a`` completed and the round
    not over; round 2: the final text."""
    slow_b = json.dumps({"key": "b" + "-" * 30})
    first = Turn(
        items=(
            Call(call_id="call_a", name="record", arguments='{"key": "a"}', fragment_chars=64),
            Call(call_id="call_b", name="record", arguments=slow_b, fragment_chars=1),
        ),
        delay_ms=100,
    )
    return Script(turns=(first, Turn(items=(Text(text="All recorded."),))))


def test_a_killed_serve_run_resumes_in_a_second_serve_without_rerunning_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "record_tools.py"
    tools.write_text(TOOLS, encoding="utf-8")
    log = tmp_path / "side_effects.txt"
    monkeypatch.setenv("RECORD_LOG", str(log))  # (the serves inherit it)
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ScriptedServer(scripts={"cut": _cut_script()}) as model:
        args = ("--tools", str(tools), "--ledger", ledger, "--model", "cut")
        args += ("--base-url", model.base_url("openai_chat"))
        with serving(*args, how=signal.SIGKILL) as url:  # mid-round: b still streaming, never run
            run, session = _run_until_a_ran(url)
        assert log.read_text().split() == ["a"]
        with serving(*args) as url:
            ended = _resume(url, run["id"], session)
    assert ended["error"] is None
    assert [c["id"] for c in ended["calls"]] == ["call_a", "call_b"]
    assert all(not c["is_error"] for c in ended["calls"])
    # a ran once, in the first serve (its stored result was replayed); b once, in the second
    assert log.read_text().split() == ["a", "b" + "-" * 30]


def _run_until_a_ran(url: str) -> tuple[dict[str, Any], str]:
    with httpx.Client(base_url=url, timeout=30) as client:
        run = client.post("/runs", json={"message": "record"}).json()
        buffer = ""
        with client.stream("GET", run["events_url"]) as stream:
            for text in stream.iter_text():
                buffer += text
                frames, _ = parse_sse(buffer.rsplit("\n\n", 1)[0] + "\n\n")
                if any(f.event == "tool_finished" and f.data["id"] == "call_a" for f in frames):
                    assert not any(f.event == "round_ended" for f in frames)
                    return run, client.cookies["toollatch_session"]
    raise AssertionError("call_a never finished")


def _resume(url: str, run_id: str, session: str) -> dict[str, Any]:
    headers = {"x-toollatch-session": session}
    with httpx.Client(base_url=url, timeout=60, headers=headers) as client:
        other = client.post(
            "/runs",
            json={"resume": run_id},
            headers={"x-toollatch-session": "x" * 43},  # another session: as if unknown
        )
        assert other.status_code == 404
        resumed = client.post("/runs", json={"resume": run_id})
        assert resumed.status_code == 201, resumed.text
        assert resumed.json()["id"] == run_id
        frames, _ = parse_sse(client.get(resumed.json()["events_url"]).text)
    assert frames[-1].event == "run_ended"
    data: dict[str, Any] = frames[-1].data
    return data


def test_the_config_files_ledger_url_is_checked() -> None:
    from toollatch import ConfigError
    from toollatch.cli._app_config import validate

    assert validate({"ledger": {"url": "redis://127.0.0.1:6379/0"}}).ledger.url is not None
    assert validate({}).ledger.url is None  # serve's default: SQLite in the data folder
    with pytest.raises(ConfigError, match=r"ledger\.url"):
        validate({"ledger": {"url": "postgres://x/y"}})


def test_serve_reads_the_environment_without_config(
    tmp_path: Path, data_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = tmp_path / "from-env.db"
    monkeypatch.setenv("TOOLLATCH_LEDGER__URL", f"sqlite:///{chosen}")  # (the server inherits it)
    with serving() as url:
        run, session, ended = _demo(url)
    ids = [c["id"] for c in ended["calls"]]
    assert asyncio.run(_states(chosen, run_scope(session, run["id"]), ids)) == ["completed"] * 3
    assert not data_home.exists()  # not the default ledger
