"""The ``toollatch replay`` contract: keys, states, exit codes, inputs, chunking, previews."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import toollatch.cli
from toollatch.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
KEYS = ["file", "provider", "ended", "stop_reason", "text", "calls", "anomalies", "error_results"]


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toollatch.cli", *args],
        input=stdin.decode() if stdin else None,
        capture_output=True,
        text=True,
        cwd=ROOT,
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
    result = run(
        "replay",
        "--format",
        "json",
        "--tools",
        str(EXAMPLES / "tools.json"),
        *(
            str(EXAMPLES / n)
            for n in (
                "openai_parallel_calls.sse",
                "openai_duplicated_arguments.sse",
                "openai_schema_violation.sse",
                "anthropic_truncated_at_max_tokens.sse",
                "anthropic_parallel_calls.jsonl",
            )
        ),
    )
    states = [[(c["state"], c["error"]) for c in o["calls"]] for o in json_lines(result.stdout)]
    assert states == [
        [("committed", None), ("committed", None)],
        [("failed", "invalid_json")],
        [("failed", "schema_violation"), ("committed", None)],
        [("failed", "truncated")],
        [("committed", None), ("committed", None)],
    ]


def test_without_tools_name_and_schema_checks_are_skipped():
    [obj] = json_lines(
        run("replay", "--format", "json", str(EXAMPLES / "openai_schema_violation.sse")).stdout
    )
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
    [obj] = json_lines(
        run(
            "replay",
            "--format",
            "json",
            "--max-depth",
            "1",
            str(EXAMPLES / "anthropic_parallel_calls.jsonl"),
        ).stdout
    )
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
    assert (
        main(
            [
                "replay",
                "--tools",
                str(EXAMPLES / "tools.json"),
                str(EXAMPLES / "openai_schema_violation.sse"),
            ]
        )
        == 0
    )
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
    assert previews and all(
        set(p) == {"call", "id", "name", "bytes", "deltas", "provisional", "final", "error"}
        for p in previews
    )
    assert [p["final"] for p in previews if p["id"] == "call_f1"][-1] is True


def test_previews_text_timeline():
    out = run(
        "replay",
        "--previews",
        "--preview-mode",
        "fields",
        "--preview-fields",
        "/path",
        str(EXAMPLES / "openai_parallel_calls.sse"),
    ).stdout
    lines = [line for line in out.splitlines() if line.startswith("  preview write_file")]
    assert lines and any('/path + "notes/' in line for line in lines)
    assert not any("milk" in line for line in lines)


# --- Hostile input: the CLI prints and exits as documented, never a traceback (issue 11) ---

BIG = 18446744073709551616  # 2**64: orjson refuses it


def anthropic_stream(arguments: str, *, name: str = "f", text: str = "") -> bytes:
    """One Anthropic round (JSON Lines): optional text, one closed tool call, a normal end."""
    events: list[dict] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        }
    ]
    if text:
        events += [
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
            {"type": "content_block_stop", "index": 0},
        ]
    index = len(events) // 3
    events += [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": arguments},
        },
        {"type": "content_block_stop", "index": index},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    return "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events).encode()


def run_in_process(argv: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
    """``main(argv)`` with the given stdin; returns (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    finally:
        sys.stdin = old_stdin
    return status, out.getvalue(), err.getvalue()


def assert_documented(status: int, out: str, err: str, *, json_format: bool) -> None:
    """Exit 0 with the output, or exit 2 with one error line; a crash is neither."""
    assert status in {0, 2}, (status, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if status == 2:
        assert err.startswith("toollatch: error: ") and err.count("\n") == 1, err
    else:
        assert err == ""
    if json_format:
        for line in out.splitlines():
            assert list(json.loads(line))[: len(KEYS)] == KEYS


def test_integers_over_64_bits_are_printed_exactly(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(anthropic_stream(f'{{"n": {BIG}, "m": [-{BIG}, {BIG * BIG}]}}'))
    status, out, err = run_in_process(["replay", "--format", "json", str(path)])
    assert (status, err) == (0, "")
    [obj] = json_lines(out)
    assert obj["calls"][0]["arguments"] == {"n": BIG, "m": [-BIG, BIG * BIG]}
    assert f'"n":{BIG},"m":[-{BIG},{BIG * BIG}]' in out  # integers, not floats or strings
    status, out, err = run_in_process(["replay", str(path)])
    assert (status, err) == (0, "")
    assert f'[0] f (toolu_1) COMMITTED {{"n":{BIG},"m":[-{BIG},' in out


def test_an_integer_over_64_bits_only_in_previews(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_bytes(anthropic_stream(f'{{"n": {BIG}, "rest": '))  # never valid: fails
    status, out, err = run_in_process(["replay", "--format", "json", "--previews", str(path)])
    assert (status, err) == (0, "")
    [obj] = json_lines(out)
    assert obj["calls"][0]["state"] == "failed"
    assert ["/n", "set", BIG] in [d for p in obj["previews"] for d in p["deltas"]]
    status, out, err = run_in_process(["replay", "--previews", str(path)])
    assert (status, err) == (0, "")
    assert f"/n set {BIG}" in out


def test_nesting_deeper_than_orjson_allows_is_printed(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(anthropic_stream('{"a": ' + "[" * 600 + "]" * 600 + "}"))
    status, out, err = run_in_process(
        ["replay", "--format", "json", "--max-depth", "1000", str(path)]
    )
    assert (status, err) == (0, "")
    value = json_lines(out)[0]["calls"][0]["arguments"]["a"]
    depth = 0
    while value:
        [value] = value
        depth += 1
    assert depth == 599


def non_utf8_file(tmp_path: Path) -> bytes:
    raw = os.path.join(os.fsencode(tmp_path), b"caf\xe9.jsonl")
    try:
        with open(raw, "wb") as handle:
            handle.write(anthropic_stream('{"a": 1}'))
    except (OSError, UnicodeError):
        pytest.skip("this file system refuses a file name that is not UTF-8")
    return raw


def test_a_file_name_that_is_not_utf8_is_printed_with_escapes(tmp_path):
    raw = non_utf8_file(tmp_path)
    shown = os.fsdecode(os.path.dirname(raw)) + os.sep + "caf\\xe9.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", raw],
        capture_output=True,
        cwd=ROOT,
    )
    assert (result.returncode, result.stderr) == (0, b"")
    [obj] = json_lines(result.stdout.decode("utf-8"))
    assert obj["file"] == shown and obj["calls"][0]["state"] == "committed"
    result = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", raw], capture_output=True, cwd=ROOT
    )
    assert (result.returncode, result.stderr) == (0, b"")
    assert result.stdout.decode("utf-8").startswith(f"{shown}: anthropic, ended normal")
    status, out, err = run_in_process(["replay", os.fsdecode(raw)])
    assert (status, err) == (0, "") and out.startswith(f"{shown}: ")


def test_an_unreadable_file_name_that_is_not_utf8_is_one_error_line(tmp_path):
    missing = os.path.join(os.fsencode(tmp_path), b"caf\xe9.sse")
    result = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", missing], capture_output=True, cwd=ROOT
    )
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode("ascii").startswith("toollatch: error: cannot read ")
    assert b"caf\\xe9.sse" in result.stderr and result.stderr.count(b"\n") == 1


ASCII_STDOUTS = [
    pytest.param({"PYTHONIOENCODING": "ascii"}, id="PYTHONIOENCODING=ascii"),
    pytest.param(
        {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": ""},
        id="LC_ALL=C",
    ),
]


@pytest.mark.parametrize("env", ASCII_STDOUTS)
def test_an_ascii_stdout_gets_escapes_not_a_crash(tmp_path, env):
    path = tmp_path / "unicode.jsonl"
    path.write_bytes(anthropic_stream('{"city": "Zürich ☕"}', name="wétter", text="héllo 😀"))
    full_env = {**os.environ, **env}

    def replay(*args: str) -> bytes:
        result = subprocess.run(
            [sys.executable, "-m", "toollatch.cli", "replay", *args, str(path)],
            capture_output=True,
            cwd=ROOT,
            env=full_env,
        )
        assert (result.returncode, result.stderr) == (0, b""), result.stderr
        assert result.stdout.isascii()
        return result.stdout

    [obj] = json_lines(replay("--format", "json", "--previews").decode("ascii"))
    assert obj["text"] == "héllo 😀"
    assert obj["calls"][0]["name"] == "wétter"
    assert obj["calls"][0]["arguments"] == {"city": "Zürich ☕"}
    assert any(p["name"] == "wétter" for p in obj["previews"])
    text = replay("--previews").decode("ascii")
    assert "text: h\\xe9llo \\U0001f600" in text
    assert '[0] w\\xe9tter (toolu_1) COMMITTED {"city":"Z\\xfcrich \\u2615"}' in text
    assert "preview w\\xe9tter " in text


def padded_chat_stream() -> bytes:
    """An OpenAI chat stream that auto-detection cannot see: 64 KiB of keep-alive comments."""
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
    return b": keep-alive\n\n" * 5000 + b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_auto_detection_sees_only_the_start():
    status, out, err = run_in_process(["replay", "-"], stdin=padded_chat_stream())
    assert (status, out) == (2, "")
    assert "cannot detect the provider" in err


@pytest.mark.parametrize("framing", ["sse", "jsonl"])
def test_an_explicit_provider_wins_on_stdin(framing):
    data = padded_chat_stream()
    if framing == "jsonl":
        data = b"\n" * 70000 + (EXAMPLES / "anthropic_parallel_calls.jsonl").read_bytes()
    provider = "openai_chat" if framing == "sse" else "anthropic"
    status, out, err = run_in_process(
        ["replay", "--format", "json", "--provider", provider, "-"], stdin=data
    )
    assert (status, err) == (0, "")
    [obj] = json_lines(out)
    assert obj["provider"] == provider and obj["ended"] == "normal"
    assert obj["text"] == ("hi" if framing == "sse" else "")
    assert len(obj["calls"]) == (0 if framing == "sse" else 2)


def test_an_explicit_provider_wins_in_a_subprocess_too():
    result = run(
        "replay", "--format", "json", "--provider", "openai_chat", "-", stdin=padded_chat_stream()
    )
    assert result.returncode == 0, result.stderr
    assert json_lines(result.stdout)[0]["text"] == "hi"


def test_an_explicit_provider_is_used_even_when_detection_says_otherwise(tmp_path):
    data = (EXAMPLES / "anthropic_parallel_calls.jsonl").read_bytes()
    path = tmp_path / "stream.log"  # a suffix that names no framing
    path.write_bytes(data)
    for source, stdin in (("-", data), (str(path), b"")):
        status, out, err = run_in_process(
            ["replay", "--format", "json", "--provider", "openai_chat", source], stdin=stdin
        )
        assert (status, err) == (0, "")
        [obj] = json_lines(out)
        assert obj["provider"] == "openai_chat" and obj["calls"] == []


HOSTILE_CONTENTS = {
    "empty": b"",
    "nul_bytes": b"\x00" * 64,
    "random": bytes(random.Random(11).randrange(256) for _ in range(4096)),
    "huge_integer": b'{"choices":[{"index":0,"delta":{"content":"x"}}],"n":' + b"9" * 5000 + b"}\n",
    "huge_float": b'{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":'
    b'{"n":1e999}}}]},"finishReason":"STOP"}]}\n',
    "deep_arrays": b'{"choices":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
    "deep_objects": b'data: {"type":"message_start","message":'
    + b'{"a":' * 5000
    + b"1"
    + b"}" * 5000
    + b"}\n\n",
    "lone_surrogate": b'{"type":"message_start","message":{"id":"\\ud800"}}\n',
    "bad_utf8": b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe"}}]}\n\n',
    "bare_carriage_returns": b"data: {}\r\r\r" * 100,
    "odd_types": b'{"type":{"a":1}}\n{"type":["response.x"]}\n{"choices":7}\n',
    "big_call": anthropic_stream(f'{{"n": {BIG}}}'),
}


@pytest.mark.parametrize("content", list(HOSTILE_CONTENTS), ids=list(HOSTILE_CONTENTS))
def test_hostile_file_contents(tmp_path, content):
    data = HOSTILE_CONTENTS[content]
    for suffix in (".sse", ".jsonl", ".eventstream", ".bin"):
        path = tmp_path / f"input{suffix}"
        path.write_bytes(data)
        for provider in ("auto", "openai_chat", "anthropic", "gemini", "bedrock"):
            for extra in ([], ["--format", "json"], ["--format", "json", "--previews"]):
                argv = [
                    "replay",
                    "--provider",
                    provider,
                    "--max-depth",
                    "100000",
                    *extra,
                    str(path),
                ]
                status, out, err = run_in_process(argv)
                assert_documented(status, out, err, json_format="json" in extra)
    status, out, err = run_in_process(["replay", "--format", "json", "-"], stdin=data)
    assert_documented(status, out, err, json_format=True)


@pytest.fixture
def hostile_paths(tmp_path):
    (tmp_path / "a_directory").mkdir()
    files = {
        "not_json.json": b"nope",
        "object.json": b'{"name": "f"}',
        "numbers.json": b"[1, 2]",
        "deep.json": b"[" * 100_000,
        "bad_regex.json": b'[{"name": "f", "parameters": {"type": "object", "properties": '
        b'{"a": {"type": "string", "pattern": "("}}}}]',
        "twice.json": b'[{"name": "f"}, {"name": "f"}]',
        "no_name.json": b'[{"name": 1}]',
        "schema_uri_object.json": b'[{"name": "f", "parameters": {"$schema": {"a": 1}}}]',
        "schema_uri_number.json": b'[{"name": "f", "parameters": {"$schema": 5}}]',
        "dangling_ref.json": b'[{"name": "search_notes", "parameters": {"$ref": "#/nope"}}]',
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


STREAM = str(EXAMPLES / "anthropic_parallel_calls.jsonl")


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "{dir}/a_directory"],
        ["replay", "{dir}/missing.sse"],
        ["replay", STREAM, "{dir}/a_directory"],
        ["replay", "--tools", "{dir}/a_directory", STREAM],
        ["replay", "--tools", "{dir}/missing.json", STREAM],
        ["replay", "--tools", "{dir}/not_json.json", STREAM],
        ["replay", "--tools", "{dir}/object.json", STREAM],
        ["replay", "--tools", "{dir}/numbers.json", STREAM],
        ["replay", "--tools", "{dir}/deep.json", STREAM],
        ["replay", "--tools", "{dir}/bad_regex.json", STREAM],
        ["replay", "--tools", "{dir}/twice.json", STREAM],
        ["replay", "--tools", "{dir}/no_name.json", STREAM],
        ["replay", "--tools", "{dir}/schema_uri_object.json", STREAM],
        ["replay", "--tools", "{dir}/schema_uri_number.json", STREAM],
        ["replay", "--previews", "--preview-mode", "fields", "--preview-fields", "a", STREAM],
        ["replay", "--max-args-bytes", "0", STREAM],
        ["replay", "--provider", "nope", STREAM],
        ["replay"],
        [],
    ],
)
def test_hostile_arguments_give_one_error_line(hostile_paths, argv):
    argv = [a.replace("{dir}", str(hostile_paths)) for a in argv]
    status, out, err = run_in_process(argv)
    assert (status, out) == (2, "")
    assert err.startswith("toollatch: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_schema_reference_that_cannot_be_resolved_fails_the_call(hostile_paths):
    status, out, err = run_in_process(
        ["replay", "--format", "json", "--tools", f"{hostile_paths}/dangling_ref.json", STREAM]
    )
    assert (status, err) == (0, "")
    calls = {c["name"]: c for c in json.loads(out)["calls"]}
    assert (calls["search_notes"]["state"], calls["search_notes"]["error"]) == (
        "failed",
        "schema_violation",
    )


def test_a_bug_while_replaying_is_one_error_line_after_the_files_before(monkeypatch, tmp_path):
    path = tmp_path / "second.jsonl"
    path.write_bytes(anthropic_stream("{}"))
    real = toollatch.cli._replay.replay_stream

    def broken(data, **kwargs):
        if kwargs["name"] == str(path):
            raise RuntimeError("boom\nsecond line")
        return real(data, **kwargs)

    monkeypatch.setattr(toollatch.cli._replay, "replay_stream", broken)
    status, out, err = run_in_process(["replay", "--format", "json", STREAM, str(path), STREAM])
    assert status == 2
    assert [o["file"] for o in json_lines(out)] == [STREAM]
    assert err == f"toollatch: error: {path}: internal error: RuntimeError: boom second line\n"


def test_a_tools_file_the_loader_did_not_foresee_is_one_error_line(monkeypatch, tmp_path):
    def broken(source):
        raise KeyError("x")

    monkeypatch.setattr(toollatch.cli._replay, "load_tools", broken)
    status, out, err = run_in_process(["replay", "--tools", "t.json", STREAM])
    assert (status, out) == (2, "")
    assert err == "toollatch: error: t.json: internal error: KeyError: 'x'\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--max-args-bytes", "9" * 40, STREAM],
        ["replay", "--max-depth", "9" * 40, STREAM],
        ["replay", "--chunk-bytes", "9" * 40, STREAM],
        ["replay", "--previews", "--preview-every", "9" * 40, STREAM],
        ["replay", "--previews", "--preview-fields", "/" + "a/" * 10_000, STREAM],
    ],
)
def test_extreme_option_values_still_replay(argv):
    status, out, err = run_in_process(argv)
    assert (status, err) == (0, "")
    assert "[1] search_notes (toolu_p2) COMMITTED" in out


def mutated_example(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    buffer = bytearray(data)
    for position, byte in edits:
        buffer[position % len(buffer)] = byte
    return bytes(buffer)


EXAMPLE_STREAMS = sorted(p for p in EXAMPLES.iterdir() if p.suffix in {".sse", ".jsonl"})
hostile_bytes = st.one_of(
    st.binary(max_size=2048),
    st.builds(
        mutated_example,
        st.sampled_from([p.read_bytes() for p in EXAMPLE_STREAMS]),
        st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=8),
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    data=hostile_bytes,
    suffix=st.sampled_from([".sse", ".jsonl", ".eventstream"]),
    provider=st.sampled_from(
        ["auto", "openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"]
    ),
    extra=st.sampled_from([[], ["--previews"], ["--chunk-bytes", "3"]]),
)
def test_random_bytes_through_the_cli(tmp_path_factory, data, suffix, provider, extra):
    path = tmp_path_factory.mktemp("fuzz") / f"input{suffix}"
    path.write_bytes(data)
    status, out, err = run_in_process(
        ["replay", "--format", "json", "--provider", provider, *extra, str(path)]
    )
    assert_documented(status, out, err, json_format=True)
    assert len(out.splitlines()) == (1 if status == 0 else 0)
