"""The configuration file: validation errors name key, value and expectation; environment
overrides; the mapping onto the library's own option objects; the CLI (config example|check,
run --config with flags winning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from toollatch import ClientLimits, ConfigError, ErrorCode, Limits, RetryPolicy, RunLimits
from toollatch.cli import build_parser
from toollatch.cli._app_config import EXAMPLE, configured, validate
from toollatch.cli._serve_command import _relay_limits
from toollatch.runtime import Config, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toollatch.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_the_seeds_block_is_accepted_as_the_issue_writes_it(tmp_path):
    path = write(
        tmp_path,
        """
agent_stream_assemble:
  max_tool_argument_bytes: 262144
  max_tool_calls_in_flight_assemble: 32
  assemble_idle_timeout_s: 60
  execute_before_stream_end: false      # eager master switch; tools still need eager=True
  ui_forward_partial_args: true
  arguments_must_be_object: true
  on_invalid_json: error_result         # error_result | drop_with_protocol_repair
  on_args_overflow: error_result
  finalize_order: provider_index
""",
    )
    config = load_config(path, env={})
    # the seeds' block turns eager start off; everything else it says is a default
    eager_off = Config().agent_stream_assemble.model_copy(
        update={"execute_before_stream_end": False}
    )
    assert config == Config(agent_stream_assemble=eager_off)
    assert config.limits() == Limits()
    assert config.run_limits() == RunLimits(call_stall_s=60)


def test_the_example_is_every_default_and_lists_every_key():
    data = yaml.safe_load(EXAMPLE)
    assert validate(data) == Config()
    dumped = Config().model_dump()
    assert {s: set(v) for s, v in data.items()} == {s: set(v) for s, v in dumped.items()}


@pytest.mark.parametrize(
    ("text", "key", "value", "expected"),
    [
        (
            "agent_stream_assemble: {on_invalid_json: drop}",
            "agent_stream_assemble.on_invalid_json",
            "'drop'",
            "'error_result' or 'drop_with_protocol_repair'",
        ),
        (
            "agent_stream_assemble: {max_tool_argument_bytes: '12'}",
            "agent_stream_assemble.max_tool_argument_bytes",
            "'12'",
            "a valid integer",
        ),
        (
            "agent_stream_assemble: {max_tool_argument_bytes: 0}",
            "agent_stream_assemble.max_tool_argument_bytes",
            "0",
            "greater than or equal to 1",
        ),
        (
            "agent_stream_assemble: {arguments_must_be_object: false}",
            "agent_stream_assemble.arguments_must_be_object",
            "False",
            "True",
        ),
        (
            "agent_stream_assemble: {finalize_order: arrival}",
            "agent_stream_assemble.finalize_order",
            "'arrival'",
            "'provider_index'",
        ),
        (
            "dispatcher: {default_timeout_s: .nan}",
            "dispatcher.default_timeout_s",
            "nan",
            "a finite number",
        ),
        ("dispatcher: {eager: [1]}", "dispatcher.eager.0", "1", "a valid string"),
        ("relay: {port: 70000}", "relay.port", "70000", "less than or equal to 65535"),
        (
            "previews: {tools: {w: {fields: [path]}}}",
            "previews.tools.w.fields.0",
            "'path'",
            "match pattern '^/'",
        ),
        ("model: {provider: openai}", "model.provider", "'openai'", "'anthropic'"),
        ("model: {api_key_env: 'sk-123 456'}", "model.api_key_env", "'sk-123 456'", "pattern"),
    ],
)
def test_a_bad_value_names_the_key_the_value_and_what_was_expected(
    tmp_path, text, key, value, expected
):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    line = next(x for x in str(info.value).splitlines() if x.strip().startswith(key + ":"))
    assert f"got {value}" in line and expected in line and "toollatch.yaml" in line


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("relay: {prot: 1}", "relay.prot"),
        ("metrix: {}", "metrix"),
        (
            "agent_stream_assemble: {max_tool_argument_byte: 1}",
            "agent_stream_assemble.max_tool_argument_byte",
        ),
    ],
)
def test_an_unknown_key_is_an_error_naming_it(tmp_path, text, key):
    with pytest.raises(ConfigError, match=rf"{key}: unknown key"):
        load_config(write(tmp_path, text), env={})


def test_every_problem_is_reported_not_only_the_first(tmp_path):
    path = write(tmp_path, "relay: {port: -1, host: 3}\ndispatcher: {max_concurrency: 0}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert "relay.port" in text and "relay.host" in text and "dispatcher.max_concurrency" in text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("relay: {port: 1}\nrelay: {host: x}\n", "'relay' is given twice"),
        ("relay:\n  port: 1\n  port: 2\n", "'port' is given twice .line 3"),
        ("- a\n- b\n", "expected a mapping of sections"),
        ("relay: [\n", "not valid YAML"),
        ("relay: 3\n", "relay: got 3"),
    ],
)
def test_a_malformed_file_is_a_config_error(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text), env={})


def test_an_empty_file_and_no_file_are_the_defaults(tmp_path):
    assert load_config(write(tmp_path, ""), env={}) == Config()
    assert load_config(None, env={}) == Config()
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml", env={})


def test_environment_overrides_win_over_the_file_and_are_validated_the_same(tmp_path):
    path = write(tmp_path, "agent_stream_assemble: {max_tool_argument_bytes: 1000}\n")
    env = {
        "TOOLLATCH_AGENT_STREAM_ASSEMBLE__MAX_TOOL_ARGUMENT_BYTES": "2048",
        "TOOLLATCH_AGENT_STREAM_ASSEMBLE__EXECUTE_BEFORE_STREAM_END": "true",
        "TOOLLATCH_DISPATCHER__EAGER": "[get_weather, search]",
        "TOOLLATCH_RELAY__DEADLINE_S": "null",
        "TOOLLATCH_SOMETHING_ELSE": "not config: no double underscore",
    }
    config = load_config(path, env=env)
    assert config.limits().max_argument_bytes == 2048
    assert config.agent_stream_assemble.execute_before_stream_end is True
    assert config.dispatcher.eager == ("get_weather", "search")
    bad = {"TOOLLATCH_RELAY__PORT": "many"}
    with pytest.raises(ConfigError, match=r"relay.port: got 'many', .*\(TOOLLATCH_RELAY__PORT\)"):
        load_config(path, env=bad)
    with pytest.raises(ConfigError, match=r"relay.porrt: unknown key \(TOOLLATCH_RELAY__PORRT\)"):
        load_config(path, env={"TOOLLATCH_RELAY__PORRT": "1"})
    with pytest.raises(ConfigError, match=r"relayy: unknown key \(TOOLLATCH_RELAYY__PORT\)"):
        load_config(path, env={"TOOLLATCH_RELAYY__PORT": "1"})
    with pytest.raises(ConfigError, match="TOOLLATCH_<SECTION>__<KEY>"):
        load_config(path, env={"TOOLLATCH_RELAY__PORT__X": "1"})


def test_sections_map_onto_the_library_objects(tmp_path):
    path = write(
        tmp_path,
        """
agent_stream_assemble:
  max_tool_argument_bytes: 4096
  max_tool_calls_in_flight_assemble: 4
  assemble_idle_timeout_s: null
  ui_forward_partial_args: true
  on_invalid_json: drop_with_protocol_repair
dispatcher: {max_concurrency: 2, default_timeout_s: 5, eager: [get_weather], session: s1}
previews:
  every_bytes: 64
  tools: {write_file: {mode: fields, fields: [/path]}}
model: {connect_s: 1, first_byte_s: 2, idle_s: 3, max_tokens: 100, max_body_bytes: 4096,
        stream_retries: 0}
relay: {max_rounds: 3, max_tool_calls: 5, deadline_s: 9.5}
""",
    )
    config = load_config(path, env={})
    assert config.limits() == Limits(max_argument_bytes=4096, max_calls_per_round=4)
    assert config.run_limits() == RunLimits(
        max_rounds=3, max_tool_calls=5, deadline_s=9.5, call_stall_s=None
    )
    assert config.client_limits() == ClientLimits(
        connect_s=1, first_byte_s=2, idle_s=3, max_body_bytes=4096
    )
    assert config.retry_policy() == RetryPolicy(stream_retries=0)
    assert Config().retry_policy() == RetryPolicy()
    policy = config.preview_policy()
    assert policy is not None and policy.every_bytes == 64
    assert policy.rule("write_file").fields == ("/path",)
    assert policy.rule("other").mode == "none"
    assert config.dropped_codes() == {ErrorCode.INVALID_JSON, ErrorCode.ARGUMENTS_NOT_OBJECT}
    options = config.agent_options()
    assert options["eager"] == ("get_weather",) and options["eager_start"] is True
    assert (options["max_concurrency"], options["default_timeout_s"]) == (2, 5)
    assert options["session"] == "s1" and options["max_tokens"] == 100
    off = validate({"agent_stream_assemble": {"ui_forward_partial_args": False}})
    assert off.preview_policy() is None


def test_config_example_prints_the_commented_example():
    done = cli("config", "example")
    assert done.returncode == 0, done.stderr
    assert done.stdout == EXAMPLE and "# eager master switch" in done.stdout


def test_config_check_prints_the_effective_config_or_the_errors(tmp_path):
    good = write(tmp_path, "relay: {port: 9000}\n")
    done = cli("config", "check", str(good), env={"TOOLLATCH_DISPATCHER__MAX_CONCURRENCY": "3"})
    assert done.returncode == 0, done.stderr
    effective = yaml.safe_load(done.stdout)
    assert effective["relay"]["port"] == 9000 and effective["dispatcher"]["max_concurrency"] == 3
    assert effective["agent_stream_assemble"]["on_invalid_json"] == "error_result"
    bad = write(tmp_path, "relay: {port: 9000, bogus: 1}\nmodel: {provider: x}\n")
    done = cli("config", "check", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    assert "relay.bogus: unknown key" in done.stderr and "model.provider: got 'x'" in done.stderr
    assert "Traceback" not in done.stderr
    assert cli("config", "check").returncode == 2  # FILE is required


def run_json(*args: str, env: dict[str, str] | None = None) -> list[dict]:
    done = cli("run", "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_run_config_file_sets_the_run_and_flags_win_over_it(tmp_path):
    # The file turns eager start off (as the seeds' block does) and the run limit to 1 round.
    path = write(
        tmp_path,
        "agent_stream_assemble: {execute_before_stream_end: false}\n"
        "relay: {max_rounds: 1}\nmodel: {provider: anthropic}\n",
    )
    events = run_json("--config", str(path), "--workspace", str(tmp_path))
    committed = [e for e in events if e["type"] == "call_committed"]
    assert committed and not any(e["early"] for e in committed)
    assert events[-1]["rounds"] == 1
    assert events[-1]["history"][0] == {
        "role": "user",
        "content": events[-1]["history"][0]["content"],
    }  # anthropic's user turn (gemini's would have parts)
    # flags win: --max-rounds, --eager (turns the switch on), --provider
    events = run_json(
        "--config",
        str(path),
        "--max-rounds",
        "3",
        "--eager",
        "get_weather",
        "--provider",
        "gemini",
        "--workspace",
        str(tmp_path),
    )
    assert events[-1]["rounds"] == 3
    assert "parts" in events[-1]["history"][0]
    assert any(e["early"] for e in events if e["type"] == "call_committed")


def test_run_without_config_keeps_the_library_defaults(tmp_path):
    events = run_json("--workspace", str(tmp_path))
    assert any(e["early"] for e in events if e["type"] == "call_committed")
    assert events[-1]["rounds"] == 3


def test_run_with_a_bad_config_is_a_usage_error(tmp_path):
    done = cli("run", "--config", str(write(tmp_path, "relay: {max_rounds: 0}\n")))
    assert done.returncode == 2
    assert "relay.max_rounds: got 0" in done.stderr and "Traceback" not in done.stderr
    path = write(tmp_path, "model: {api_key_env: TOOLLATCH_TEST_UNSET_KEY}\n")
    done = cli("run", "--config", str(path))
    assert done.returncode == 2 and "TOOLLATCH_TEST_UNSET_KEY is not set" in done.stderr


def test_the_environment_is_read_with_or_without_a_file(tmp_path):
    assert configured(None, env={"HOME": "/h", "TOOLLATCH_MCP_LOG": "x"}) is None  # (not config)
    c = configured(None, env={"TOOLLATCH_RELAY__MAX_ROUNDS": "2"})
    assert c is not None
    assert c.relay.max_rounds == 2
    path = write(tmp_path, "relay: {max_rounds: 5}\n")
    assert configured(path, env={}).relay.max_rounds == 5  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="TOOLLATCH_RELAY__MAX_ROUNDS"):
        configured(None, env={"TOOLLATCH_RELAY__MAX_ROUNDS": "0"})


def test_run_reads_the_environment_without_config_and_flags_win_over_it(tmp_path):
    # precedence: flag > environment > file > default (the demo conversation has 3 rounds)
    ws = str(tmp_path / "ws")
    one = {"TOOLLATCH_RELAY__MAX_ROUNDS": "1"}
    assert run_json("--workspace", ws, env=one)[-1]["rounds"] == 1  # no --config needed
    path = write(tmp_path, "relay: {max_rounds: 2}\n")
    assert run_json("--config", str(path), "--workspace", ws)[-1]["rounds"] == 2
    assert run_json("--config", str(path), "--workspace", ws, env=one)[-1]["rounds"] == 1
    flagged = run_json("--config", str(path), "--max-rounds", "3", "--workspace", ws, env=one)
    assert flagged[-1]["rounds"] == 3
    db = tmp_path / "env-ledger.db"
    run_json("--workspace", ws, env={"TOOLLATCH_LEDGER__URL": f"sqlite:///{db}"})
    assert db.is_file()  # the ledger the environment names, without --config
    done = cli("run", "--workspace", ws, env={"TOOLLATCH_RELAY__MAX_ROUNDS": "0"})
    assert done.returncode == 2
    assert "TOOLLATCH_RELAY__MAX_ROUNDS" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_takes_every_relay_limit_from_the_config():
    """Each ``RelayLimits`` bound has a ``relay:`` key (so a ``TOOLLATCH_RELAY__`` variable)
    that reaches the relay; ``--max-run-events`` wins over its key."""
    env = {
        "TOOLLATCH_RELAY__MAX_STORED_RUNS": "300",
        "TOOLLATCH_RELAY__MAX_RUN_EVENTS": "500",
        "TOOLLATCH_RELAY__MAX_KEPT_BYTES": "4096",
        "TOOLLATCH_RELAY__MAX_BODY_BYTES": "2048",
        "TOOLLATCH_RELAY__MAX_MESSAGE_CHARS": "100",
        "TOOLLATCH_RELAY__HEARTBEAT_S": "2.5",
        "TOOLLATCH_RELAY__SSE_BATCH": "8",
    }
    relay = configured(None, env=env).relay  # type: ignore[union-attr]
    limits = _relay_limits(relay, build_parser().parse_args(["serve"]))
    assert (limits.max_stored_runs, limits.max_run_events, limits.max_kept_bytes) == (
        300,
        500,
        4096,
    )
    assert (limits.max_body_bytes, limits.max_message_chars) == (2048, 100)
    assert (limits.heartbeat_s, limits.sse_batch) == (2.5, 8)
    flagged = build_parser().parse_args(["serve", "--max-run-events", "7"])
    assert _relay_limits(relay, flagged).max_run_events == 7
    crowded = configured(None, env={"TOOLLATCH_RELAY__MAX_ACTIVE_RUNS": "400"}).relay  # type: ignore[union-attr]
    assert _relay_limits(crowded, build_parser().parse_args(["serve"])).max_stored_runs == 400
    with pytest.raises(ConfigError, match="TOOLLATCH_RELAY__MAX_RUN_EVENTS"):
        configured(None, env={"TOOLLATCH_RELAY__MAX_RUN_EVENTS": "0"})
