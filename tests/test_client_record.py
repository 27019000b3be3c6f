"""`model_client(record=DIR)` (and `toollatch run --record`): each response saved as a fixture
`toollatch replay` reads unchanged, the API key never in the files; on all four wires."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripted_helpers import PROVIDERS, first_history
from toollatch import StreamParser, ToolSpec, load_tools, model_client
from toollatch.core._eventstream import EventStreamDecoder
from toollatch.runtime._recorder import Recorder
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

KEY = "sk-record-0123456789abcdefghijkl"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_each_response_is_a_replayable_fixture_without_the_key(provider, tmp_path):
    async with ScriptedServer(delay_scale=0) as server:
        client = model_client(
            provider, model="scripted", base_url=server.base_url(provider), api_key=KEY,
            record=tmp_path,
        )  # fmt: skip
        async with client:
            parser = StreamParser(provider)
            async with client.stream(first_history(provider)) as stream:
                async for chunk in stream:
                    parser.feed(chunk)
    round_ = parser.finish()
    [sse] = list(tmp_path.glob("*.sse"))
    meta = json.loads(sse.with_suffix(".json").read_text())
    assert meta["provider"] == provider
    assert meta["status"] == 200
    for path in tmp_path.iterdir():
        assert KEY.encode() not in path.read_bytes()
    replayed = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", "--provider",
         provider, str(sse)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    calls = json.loads(replayed.stdout)["calls"]
    expected = [(r.call_id, r.name) for c in round_.choices for r in c.calls]
    assert [(c["id"], c["name"]) for c in calls] == expected
    assert expected


WEATHER = ToolSpec(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 2}},
        "required": ["city"],
    },
)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_requests_tools_are_saved_as_replay_reads_them(provider, tmp_path):
    # each wire names its tools its own way (Gemini: tools[].functionDeclarations); the
    # .tools.json beside the answer is what `replay --tools` reads, so the replay checks the
    # calls against the schema the model was given (one that rejects them proves it did)
    async with ScriptedServer(delay_scale=0) as server:
        client = model_client(provider, model="scripted", base_url=server.base_url(provider),
                              record=tmp_path)  # fmt: skip
        async with client, client.stream(first_history(provider), tools=[WEATHER]) as stream:
            async for _ in stream:
                pass
    [sse] = list(tmp_path.glob("*.sse"))
    tools = sse.with_name(sse.stem + ".tools.json")
    assert load_tools(tools) == (WEATHER,)
    assert {state for _, _, state in replay_calls(sse, "--tools", str(tools))} == {"committed"}
    [spec] = load_tools(tools)
    strict = json.loads(json.dumps(spec.parameters))
    strict["properties"]["city"]["minLength"] = 99
    tools.write_text(json.dumps([{"name": spec.name, "parameters": strict}]))
    assert {state for _, _, state in replay_calls(sse, "--tools", str(tools))} == {"failed"}


def test_geminis_openapi_types_and_other_tools_become_json_schema(tmp_path):
    body = {
        "tools": [
            {"googleSearch": {}},
            {"functionDeclarations": [
                {"name": "a", "description": "A", "parameters": {
                    "type": "OBJECT", "required": ["type"],
                    "properties": {"type": {"type": "STRING", "enum": ["OBJECT"]},
                                   "n": {"type": "ARRAY", "items": {"type": "INTEGER"}}}}},
                {"name": "b", "parametersJsonSchema": {"type": "object", "maxProperties": 1}},
                {"name": "c"},
            ]},
        ]
    }  # fmt: skip
    recorder = Recorder(tmp_path, body, known=(), provider="gemini")
    recorder.begin(200, "http://127.0.0.1:1/v1beta/models/m:streamGenerateContent?key=k")
    recorder.close()
    a, b, c = load_tools(recorder.stem.with_name(recorder.stem.name + ".tools.json"))
    assert (a.name, a.description, b.name, c.name) == ("a", "A", "b", "c")
    assert a.parameters == {
        "type": "object", "required": ["type"],
        "properties": {"type": {"type": "string", "enum": ["OBJECT"]},
                       "n": {"type": "array", "items": {"type": "integer"}}},
    }  # fmt: skip
    assert b.parameters == {"type": "object", "maxProperties": 1}
    assert c.parameters == {"type": "object"}


def test_toollatch_run_record_keeps_each_round_of_the_demo(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--workspace",
         str(tmp_path / "ws"), "--record", str(tmp_path / "rec")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rounds = [json.loads(line) for line in done.stdout.splitlines()]
    ended = rounds[-1]
    assert ended["type"] == "run_ended"
    recorded = sorted((tmp_path / "rec").glob("*.sse"))
    assert len(recorded) == ended["rounds"]  # one fixture per model request
    first = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", str(recorded[0])],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(first.stdout)["calls"]  # the demo's first round has its calls


BEARER = "bedrock-api-key-0123456789abcdef"
SECRET_ARGS = json.dumps({"city": "Oslo", "token": KEY, "auth": BEARER})
SECRETS = Script(
    turns=(
        Turn(
            items=(
                Text(text=f"I will pass {KEY} along."),
                Call(call_id="call_s", name="get_weather", arguments=SECRET_ARGS,
                     fragment_chars=len(SECRET_ARGS)),
                Call(call_id="call_o", name="get_weather", arguments='{"city": "Lima"}'),
            ),
            delay_ms=0.0,
        ),
    )
)  # fmt: skip


def replay_calls(path, *extra):
    replayed = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", *extra, str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [(c["id"], c["name"], c["state"]) for c in json.loads(replayed.stdout)["calls"]]


async def test_a_bedrock_answer_is_recorded_as_an_eventstream_without_its_secrets(tmp_path):
    """The key in the text and in a call's arguments (and the bearer) never reach the file;
    its frames pass our decoder and botocore's; replay commits the calls the client saw."""
    from botocore.eventstream import EventStreamBuffer

    async with ScriptedServer({"secrets": SECRETS}, delay_scale=0) as server:
        client = model_client(
            "bedrock", model="secrets", base_url=server.base_url("bedrock"), api_key=BEARER,
            record=tmp_path,
        )  # fmt: skip
        async with client:
            parser = StreamParser("bedrock", framing="eventstream")
            async with client.stream([{"role": "user", "content": [{"text": "x"}]}]) as stream:
                async for chunk in stream:
                    parser.feed(chunk)
    round_ = parser.finish()
    [recorded] = list(tmp_path.glob("*.eventstream"))
    assert not list(tmp_path.glob("*.sse"))
    assert json.loads(recorded.with_suffix(".json").read_text())["provider"] == "bedrock"
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert KEY.encode() not in data and BEARER.encode() not in data, path.name
    data = recorded.read_bytes()
    frames = EventStreamDecoder().feed(data)
    theirs = EventStreamBuffer()
    theirs.add_data(data)
    assert len(list(theirs)) == len(frames) > 0  # botocore checks both CRCs
    seen = [(r.call_id, r.name, r.state) for c in round_.choices for r in c.calls]
    assert seen == [("call_s", "get_weather", "committed"), ("call_o", "get_weather", "committed")]
    assert replay_calls(recorded) == seen  # detected as bedrock by its bytes
    assert replay_calls(recorded, "--provider", "bedrock") == seen


def test_toollatch_run_bedrock_record_keeps_each_round_replayable(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "run", "--json", "--provider", "bedrock",
         "--workspace", str(tmp_path / "ws"), "--record", str(tmp_path / "rec")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["type"] == "run_ended"
    recorded = sorted((tmp_path / "rec").glob("*.eventstream"))
    assert len(recorded) == events[-1]["rounds"]
    committed = [(e["id"], e["name"]) for e in events if e["type"] == "call_committed"]
    replayed = [(i, n) for path in recorded for i, n, s in replay_calls(path) if s == "committed"]
    assert replayed == committed and committed


async def test_a_signed_bedrock_recording_masks_the_aws_keys_it_was_signed_with(tmp_path):
    """No bearer: the AWS keys sign the request (SigV4), and the recorder masks them like an
    API key (an answer that echoes one, here in its text, does not carry it to the file)."""
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    env = {"AWS_ACCESS_KEY_ID": "AKIDRECORDTEST", "AWS_SECRET_ACCESS_KEY": secret}
    echo = Script(
        turns=(Turn(items=(Text(text=f"echo {secret}", chunk_chars=100),), delay_ms=0.0),)
    )
    async with ScriptedServer({"echo": echo}, delay_scale=0) as server:
        client = model_client(
            "bedrock", model="echo", base_url=server.base_url("bedrock"),
            env={**env, "AWS_REGION": "us-east-1"}, record=tmp_path,
        )  # fmt: skip
        async with client:
            async with client.stream([{"role": "user", "content": [{"text": "x"}]}]) as stream:
                received = b"".join([chunk async for chunk in stream])
    assert secret.encode() in received  # (the answer did hold it)
    [recorded] = list(tmp_path.glob("*.eventstream"))
    assert secret.encode() not in recorded.read_bytes()
    [frame] = [f for f in EventStreamDecoder().feed(recorded.read_bytes()) if "echo" in f.data]
    assert "echo xxxxxxxxxxxxx/xxxxxxx/" in frame.data
