"""Issue 35 item 5: failure details where users look. A schema violation's detail names the
property and the rule (a call with ``town`` instead of ``city`` names both); ``toollatch
run`` shows the detail of a call the gate refused (terminal and ``--json``), and the page
marks a refused call's preview as not what was checked (Chromium: test_relay_browser.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn
from toollatch.stages import CallKey, Gate, Rejection

ROOT = Path(__file__).resolve().parents[1]
WEATHER = {
    "name": "get_weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TOWN = (
    '/: unexpected property "town" (additionalProperties: false; allowed: "city", "unit"); '
    'missing required property "city" (required)'
)


def _detail(arguments: str) -> str:
    verdict = Gate([WEATHER]).check(
        key=CallKey(0, 0, 0), position=0, call_id="c", name="get_weather", text=arguments
    )
    assert isinstance(verdict, Rejection)
    return verdict.detail


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ('{"town": "Oslo"}', TOWN),
        ('{"city": "Oslo", "x": 1, "y": 2}',
         '/: unexpected properties "x", "y" (additionalProperties: false; allowed: "city", '
         '"unit")'),
        ("{}", '/: missing required property "city" (required)'),
        ('{"city": 3}', "/city: fails schema keyword 'type' (\"string\")"),
        ('{"city": "Oslo", "' + "k" * 100 + '": 1}',
         '/: unexpected property "' + "k" * 40 + '"… (additionalProperties: false; allowed: '
         '"city", "unit")'),
    ],
)  # fmt: skip
def test_a_schema_violation_names_the_property_and_the_rule(arguments, detail):
    assert _detail(arguments) == detail


def test_the_detail_never_holds_an_argument_value():
    assert "sk-secret-value" not in _detail('{"town": "sk-secret-value"}')


@pytest.fixture(scope="module")
def server():
    call = Call(call_id="call_town", name="get_weather", arguments='{"town": "Oslo"}')
    script = Script(turns=(Turn(items=(Text(text="Checking."), call), delay_ms=0),
                           Turn(items=(Text(text="Sorry."),), delay_ms=0)))  # fmt: skip
    with ScriptedServer({"town": script}, delay_scale=0) as running:
        yield running


def _run(server: ScriptedServer, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--base-url",
         server.base_url("openai_chat"), "--model", "town", "--workspace", str(tmp_path),
         *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_run_shows_the_detail_of_a_refused_call(server, tmp_path):
    done = _run(server, tmp_path)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # (wrapped or cut at the width: read it joined)
    assert "failed: schema_violation" in text
    assert '↳ /: unexpected property "town" (additionalProperties: false; allowed:' in text


def test_run_json_carries_the_same_detail(server, tmp_path):
    done = _run(server, tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    failed = [json.loads(x) for x in done.stdout.splitlines() if '"call_failed"' in x]
    assert [(e["error"], e["detail"]) for e in failed] == [("schema_violation", TOWN)]
