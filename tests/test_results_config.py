"""The ``results:`` section of the configuration file: validated like the rest, mapped onto
``ResultLimits`` and the Agent, and used by ``toollatch run --config``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toollatch import ConfigError, ResultLimits
from toollatch.cli._app_config import validate
from toollatch.runtime import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_results_section_maps_onto_result_limits_and_the_agent_options(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("results: {max_bytes: 8192, tools: {read_file: 262144}}\n")
    config = load_config(path, env={})
    assert config.result_limits() == ResultLimits(max_bytes=8192, tools={"read_file": 262144})
    assert config.agent_options()["result_limits"] == config.result_limits()
    assert validate({}).result_limits() == ResultLimits()
    overridden = load_config(path, env={"TOOLLATCH_RESULTS__MAX_BYTES": "1024"})
    assert overridden.result_limits().max_bytes == 1024


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"results": {"max_bytes": 100}}, "results.max_bytes: got 100, expected greater than"),
        ({"results": {"max_bytes": "64k"}}, "results.max_bytes: got '64k', expected a valid int"),
        ({"results": {"tools": {"t": 0}}}, "results.tools.t: got 0, expected greater than"),
        ({"results": {"max": 1}}, r"results.max: unknown key"),
    ],
)
def test_a_bad_results_value_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        validate(data)


def test_toollatch_run_cuts_a_result_to_the_budget_of_its_config_file(tmp_path):
    tools = tmp_path / "big_tools.py"
    tools.write_text(
        textwrap.dedent('''
        import toollatch

        @toollatch.tool
        def get_weather(city: str, unit: str = "c") -> str:
            """Very long weather."""
            return f"{city}: " + "sunny, 21 °C. " * 400

        @toollatch.tool
        def write_file(path: str, content: str) -> str:
            """Pretend to write."""
            return "ok"
    ''')
    )
    config = tmp_path / "c.yaml"
    config.write_text("results: {max_bytes: 4096, tools: {get_weather: 512}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--tools", str(tools),
         "--config", str(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    finished = [e for e in events if e["type"] == "tool_finished"]
    cut = [e["truncated_from"] for e in finished if e["name"] == "get_weather"]
    assert len(cut) == 2 and all(n > 5000 for n in cut)
    assert all("truncated_from" not in e for e in finished if e["name"] == "write_file")
    tool_texts = [m["content"] for m in events[-1]["history"] if m.get("role") == "tool"]
    weather = [t for t in tool_texts if "sunny" in t]
    assert len(weather) == 2 and all(len(t.encode()) <= 512 for t in weather)
    assert all(t.endswith(" bytes are shown]") for t in weather)
