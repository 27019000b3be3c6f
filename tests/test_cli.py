"""The ``toollatch replay`` contract: keys, states, exit codes, inputs, chunking, previews."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toollatch.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
KEYS = ["file", "provider", "ended", "stop_reason", "text", "calls", "anomalies", "error_results"]


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", *args], input=stdin.decode() if stdin else None,
        capture_output=True, text=True, cwd=ROOT,
    )


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_json_output_has_exactly_the_contract_keys_one_object_per_file():
    files = sorted(str(p) for p in EXAMPLES.glob("*.sse"))
    result = run("replay", "--format", "json", "--tools", str(EXAMPLES / "tools.json"), *files)
    assert result.returncode == 0, result.stderr
    objects = json_lines(result.stdout)
    assert [o["file"] for o in objects] == files
    for obj in objects:
        assert list(obj) == KEYS
        assert obj["ended"] in {"normal", "truncated", "interrupted", "cancelled"}
        for call in obj["calls"]:
            assert list(call) == ["id", "name", "state", "arguments", "error"]
            assert call["state"] in {"committed", "failed", "cancelled"}
            assert (call["arguments"] is None) == (call["state"] != "committed")
            assert (call["error"] is None) == (call["state"] == "committed")
        for anomaly in obj["anomalies"]:
            assert list(anomaly) == ["kind", "detail"]
        for result_ in obj["error_results"]:
            assert list(result_) == ["tool_call_id", "name", "is_error", "content"]
            assert result_["is_error"] is True


def test_states_and_codes_of_the_examples():
    result = run("replay", "--format", "json", "--tools", str(EXAMPLES / "tools.json"),
                 *(str(EXAMPLES / n) for n in ("openai_parallel_calls.sse",
                                               "openai_duplicated_arguments.sse",
                                               "openai_schema_violation.sse",
                                               "anthropic_truncated_at_max_tokens.sse",
                                               "anthropic_parallel_calls.jsonl")))
    states = [[(c["state"], c["error"]) for c in o["calls"]] for o in json_lines(result.stdout)]
    assert states == [
        [("committed", None), ("committed", None)],
        [("failed", "invalid_json")],
        [("failed", "schema_violation"), ("committed", None)],
        [("failed", "truncated")],
        [("committed", None), ("committed", None)],
    ]


def test_without_tools_name_and_schema_checks_are_skipped():
    [obj] = json_lines(run("replay", "--format", "json",
                           str(EXAMPLES / "openai_schema_violation.sse")).stdout)
    assert [c["state"] for c in obj["calls"]] == ["committed", "committed"]


@pytest.mark.parametrize("size", ["1", "7", "64"])
def test_chunk_bytes_gives_identical_output(size):
    files = sorted(str(p) for p in EXAMPLES.iterdir() if p.suffix in {".sse", ".jsonl"})
    whole = run("replay", "--format", "json", *files).stdout
    assert run("replay", "--format", "json", "--chunk-bytes", size, *files).stdout == whole


def test_stdin_with_auto_detection():
    data = (EXAMPLES / "anthropic_parallel_calls.jsonl").read_bytes()
    [obj] = json_lines(run("replay", "--format", "json", "-", stdin=data).stdout)
    assert obj["file"] == "-" and obj["provider"] == "anthropic" and len(obj["calls"]) == 2


def test_limits_flags():
    path = str(EXAMPLES / "openai_parallel_calls.sse")
    [obj] = json_lines(run("replay", "--format", "json", "--max-calls", "1", path).stdout)
    assert [c["error"] for c in obj["calls"]] == [None, "too_many_tool_calls"]
    [obj] = json_lines(run("replay", "--format", "json", "--max-args-bytes", "40", path).stdout)
    assert [c["error"] for c in obj["calls"]] == [None, "arguments_exceed_max_bytes"]
    [obj] = json_lines(run("replay", "--format", "json", "--max-depth", "1",
                           str(EXAMPLES / "anthropic_parallel_calls.jsonl")).stdout)
    assert [c["state"] for c in obj["calls"]] == ["committed", "committed"]


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "missing.sse"],
        ["replay", "--max-calls", "0", "x.sse"],
        ["replay", "--provider", "nope", "x.sse"],
        ["replay", "--format", "yaml", "x.sse"],
        ["replay"],
        ["nothing"],
        ["replay", "--tools", "missing.json", "examples/openai_parallel_calls.sse"],
    ],
)
def test_usage_errors_exit_2_with_one_line(args):
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("toollatch: error: ")


def test_unrecognizable_input_is_a_usage_error(tmp_path):
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\nworld\n")
    result = run("replay", str(junk))
    assert result.returncode == 2 and "cannot detect the provider" in result.stderr


def test_bad_tools_file_is_a_usage_error(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text('[{"name": "x", "parameters": {"type": "nonsense"}}]')
    result = run("replay", "--tools", str(tools), str(EXAMPLES / "openai_parallel_calls.sse"))
    assert result.returncode == 2 and "invalid JSON Schema" in result.stderr


def test_text_format_is_readable(capsys):
    assert main(["replay", "--tools", str(EXAMPLES / "tools.json"),
                 str(EXAMPLES / "openai_schema_violation.sse")]) == 0
    out = capsys.readouterr().out
    assert "[0] write_file (call_a) FAILED schema_violation: /: missing required" in out
    assert '[1] search_notes (call_b) COMMITTED {"query":"ana","limit":5}' in out


def test_previews_json_extends_the_contract_compatibly():
    path = str(EXAMPLES / "openai_parallel_calls.sse")
    [plain] = json_lines(run("replay", "--format", "json", path).stdout)
    [with_previews] = json_lines(run("replay", "--format", "json", "--previews", path).stdout)
    assert list(with_previews) == [*KEYS, "previews"]
    assert {k: with_previews[k] for k in KEYS} == plain
    previews = with_previews["previews"]
    assert previews and all(set(p) == {"call", "id", "name", "bytes", "deltas", "provisional",
                                       "final", "error"} for p in previews)
    assert [p["final"] for p in previews if p["id"] == "call_f1"][-1] is True


def test_previews_text_timeline():
    out = run("replay", "--previews", "--preview-mode", "fields", "--preview-fields", "/path",
              str(EXAMPLES / "openai_parallel_calls.sse")).stdout
    lines = [line for line in out.splitlines() if line.startswith("  preview write_file")]
    assert lines and any('/path + "notes/' in line for line in lines)
    assert not any("milk" in line for line in lines)
