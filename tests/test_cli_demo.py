"""Issue 35 item 3: the demo says what it is. ``toollatch run`` on the embedded scripted
model says once (the terminal's first line; ``--json``: the first event's ``notice``) that
the model is a scripted demo, and where the example tools wrote (a kept folder, or
``--workspace``, whose help states the default). Run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def toollatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _written_in(notice: str) -> Path:
    match = re.search(r"the example tools write in (\S+) \(kept", notice)
    assert match is not None, notice
    return Path(match.group(1))


def test_json_says_once_that_the_model_is_a_demo_and_where_the_file_went():
    done = toollatch("run", "--json", "Tell me a joke")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert "scripted demo" in events[0]["notice"]
    assert "whatever the message" in events[0]["notice"]
    assert [e for e in events[1:] if "notice" in e] == []
    folder = _written_in(events[0]["notice"])
    try:
        assert (folder / "notes" / "weather.md").read_text().startswith("# Weather")
    finally:
        shutil.rmtree(folder)


def test_the_terminal_view_says_it_first_and_once():
    done = toollatch("run", "Tell me a joke")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("toollatch: the model is toollatch's scripted demo")
    assert done.stdout.count("scripted demo") == 1
    folder = _written_in(" ".join(done.stdout.split()))  # (wrapped at the width)
    try:
        assert (folder / "notes" / "weather.md").is_file()
    finally:
        shutil.rmtree(folder)


def test_a_named_workspace_is_the_one_told(tmp_path):
    done = toollatch("run", "--json", "--workspace", str(tmp_path))
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout.splitlines()[0])
    assert _written_in(first["notice"]) == tmp_path
    assert (tmp_path / "notes" / "weather.md").is_file()


def test_a_real_model_and_own_tools_get_no_notice(tmp_path):
    from toollatch.scripted import Script, ScriptedServer, Text, Turn

    tools = tmp_path / "t.py"
    tools.write_text("import toollatch\n\n@toollatch.tool\ndef ping() -> str:\n    return 'pong'\n")
    script = Script(turns=(Turn(items=(Text(text="Hello."),), delay_ms=0),))
    with ScriptedServer({"real": script}, delay_scale=0) as server:
        done = toollatch("run", "--json", "--base-url", server.base_url("openai_chat"),
                         "--model", "real", "--tools", str(tools))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all("notice" not in json.loads(line) for line in done.stdout.splitlines())


def test_workspace_help_states_its_default():
    text = " ".join(toollatch("run", "--help").stdout.split())
    assert "--workspace DIR where the example write_file writes (default: a new temporary" in text
