"""Bedrock ConverseStream end to end: the scripted server's event-stream encoder
(scripted/_wire_bedrock.py) against the recorded bytes, our decoder and botocore's parser;
the server's validation and Authorization checks; the runtime's bedrock model client
(runtime/_clients/_bedrock.py: body, path, bearer key, SigV4 by botocore) over loopback HTTP.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import httpx
import pytest

from conftest import corpus_dir
from toollatch import (
    ConfigError,
    ModelHTTPError,
    StreamParser,
    ToolResult,
    ToolSpec,
    model_client,
)
from toollatch.core._eventstream import EventStreamDecoder, decode_headers
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn
from toollatch.scripted._wire_bedrock import bedrock_events, encode_message
from toollatch.stages import assistant_messages, tool_results_messages

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
OSLO = Call(call_id="tooluse_oslo", name="get_weather", arguments='{"city": "Oslo"}')
LIMA = Call(call_id="tooluse_lima", name="get_weather", arguments='{"city": "Lima"}')
TURN = Turn(items=(Text(text="Checking both cities."), OSLO, LIMA), delay_ms=0)
CUT = Turn(items=(Text(text="Let me check."), OSLO), stop="max_tokens", delay_ms=0)
SCRIPTS = {"two": Script(turns=(TURN, Turn(items=(Text(text="Done."),), delay_ms=0)))}
USER = {"role": "user", "content": [{"text": "weather?"}]}


def messages(body: bytes) -> list[tuple[bytes, bytes]]:
    """(header block, payload) of each message, cut by the prelude's lengths alone."""
    out, pos = [], 0
    while pos < len(body):
        total = int.from_bytes(body[pos : pos + 4], "big")
        headers = int.from_bytes(body[pos + 4 : pos + 8], "big")
        out.append(
            (body[pos + 12 : pos + 12 + headers], body[pos + 12 + headers : pos + total - 4])
        )
        pos += total
    return out


def stream_of(turn: Turn) -> bytes:
    return b"".join(e.data for e in bedrock_events(turn, model="m", response_id="r"))


# -- the encoder ------------------------------------------------------------------------------


@pytest.mark.corpus
def test_the_encoder_rebuilds_the_recorded_stream_byte_for_byte():
    """Every message of the recorded Bedrock answer, re-encoded from its decoded headers and
    payload, is the recorded bytes exactly: prelude, header layout and order, both CRCs."""
    recorded = (corpus_dir() / "bedrock/nova_text_then_tool_use.eventstream").read_bytes()
    rebuilt = b""
    for block, payload in messages(recorded):
        headers = decode_headers(block)
        assert all(isinstance(v, str) for v in headers.values())
        rebuilt += encode_message([(k, str(v)) for k, v in headers.items()], payload)
    assert rebuilt == recorded


def test_our_decoder_reads_the_encoded_turn_as_bedrock_sends_it():
    frames = EventStreamDecoder().feed(stream_of(TURN))
    names = [f.event for f in frames]
    assert names[0] == "messageStart" and names[-2:] == ["messageStop", "metadata"]
    assert "contentBlockStart" not in names[: names.index("contentBlockStop")]  # text: none
    payloads = [json.loads(f.data) for f in frames]
    assert all(isinstance(p.pop("p"), str) for p in payloads)  # the padding, everywhere
    assert payloads[names.index("contentBlockStart")] == {
        "contentBlockIndex": 1,
        "start": {"toolUse": {"toolUseId": "tooluse_oslo", "name": "get_weather"}},
    }
    assert payloads[-2] == {"stopReason": "tool_use"}
    assert set(payloads[-1]["usage"]) == {"inputTokens", "outputTokens", "totalTokens"}
    for block, _ in messages(stream_of(TURN)):
        assert list(decode_headers(block)) == [":event-type", ":content-type", ":message-type"]


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_the_parser_commits_the_encoded_calls_at_any_chunking(size):
    body = stream_of(TURN)
    parser = StreamParser("bedrock", framing="eventstream", tools=[WEATHER])
    for i in range(0, len(body), size):
        parser.feed(body[i : i + size])
    round_ = parser.finish()
    assert round_.text == "Checking both cities."
    assert [(c.call_id, c.arguments, c.state.value) for c in round_.calls] == [
        ("tooluse_oslo", {"city": "Oslo"}, "committed"),
        ("tooluse_lima", {"city": "Lima"}, "committed"),
    ]
    assert round_.stop_reason == "tool_use"


def test_a_cut_turn_stops_at_max_tokens_with_the_call_left_open():
    round_ = StreamParser("bedrock", framing="eventstream", tools=[WEATHER])
    round_.feed(stream_of(CUT))
    done = round_.finish()
    assert done.stop_reason == "max_tokens"
    [call] = done.calls
    assert (call.call_id, call.state.value, call.error) == ("tooluse_oslo", "failed", "truncated")


def test_botocore_parses_every_encoded_message_alike():
    """botocore's own event-stream parser (the field's reference) reads the encoder's bytes:
    the same headers and payloads, its CRC checks passed."""
    eventstream = pytest.importorskip("botocore.eventstream")
    body = stream_of(TURN) + stream_of(CUT)
    buffer = eventstream.EventStreamBuffer()
    buffer.add_data(body)
    theirs = [(m.headers, m.payload) for m in buffer]
    ours = [(decode_headers(h), p) for h, p in messages(body)]
    assert theirs == ours
    assert len(theirs) == len(bedrock_events(TURN, model="m", response_id="r")) + len(
        bedrock_events(CUT, model="m", response_id="r")
    )


# -- the server -------------------------------------------------------------------------------


@pytest.fixture
async def server():
    async with ScriptedServer(SCRIPTS, delay_scale=0) as s:
        yield s


async def post(server: ScriptedServer, body: Any, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(
            f"{server.url}/model/two/converse-stream", json=body, headers=headers
        )


async def test_the_server_refuses_what_converse_refuses(server):
    use = {"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Oslo"}}}
    tools = {"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json": {}}}}]}
    unpaired = {"messages": [USER, {"role": "assistant", "content": [use]}, USER]}
    answer = await post(server, {**unpaired, "toolConfig": tools})
    assert answer.status_code == 400
    assert answer.headers["x-amzn-errortype"] == "ValidationException"
    assert "Expected toolResult blocks at messages.2.content" in answer.json()["message"]
    result = {"toolResult": {"toolUseId": "t1", "content": [{"text": "-3 C"}]}}
    paired = [USER, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    no_config = await post(server, {"messages": paired})
    assert no_config.status_code == 400
    assert "toolConfig field must be defined" in no_config.json()["message"]
    twice = await post(server, {"messages": [USER, USER]})
    assert "alternate" in twice.json()["message"]
    good = await post(server, {"messages": paired, "toolConfig": tools})
    assert good.status_code == 200
    assert good.headers["content-type"] == "application/vnd.amazon.eventstream"
    assert [r.turn for r in server.requests] == [None, None, None, 1]


@pytest.mark.parametrize(
    "authorization",
    [
        "AWS4-HMAC-SHA256 garbage",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=" + "a" * 64,
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/bedrock/aws4_request, "
        "SignedHeaders=content-type, Signature=" + "a" * 64,
        "Basic dXNlcjpwYXNz",
    ],
)
async def test_the_server_refuses_an_authorization_of_the_wrong_shape(server, authorization):
    headers = {"authorization": authorization, "x-amz-date": "20260101T000000Z"}
    answer = await post(server, {"messages": [USER]}, **headers)
    assert answer.status_code == 403
    assert answer.headers["x-amzn-errortype"] == "AccessDeniedException"


# -- the runtime's model client -----------------------------------------------------------------


async def round_of(client: Any, history: list[Any] | None = None) -> Any:
    parser = StreamParser(client.provider, framing=client.framing, tools=[WEATHER])
    async with client.stream(history or [USER], tools=[WEATHER], system="Be brief.") as s:
        async for chunk in s:
            parser.feed(chunk)
    return parser.finish()


SIGV4 = re.compile(
    r"AWS4-HMAC-SHA256 Credential=AKIDTEST/(\d{8})/eu-west-3/bedrock/aws4_request, "
    r"SignedHeaders=([a-z;-]+), Signature=[0-9a-f]{64}"
)


async def test_aws_keys_sign_each_request_with_sigv4_for_bedrock(server):
    pytest.importorskip("botocore")
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDTEST",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "session-token",
        "AWS_REGION": "eu-west-3",
    }
    async with model_client("bedrock", model="two", base_url=server.url, env=env) as client:
        round_ = await round_of(client)
    assert [c.call_id for c in round_.calls if c.state.value == "committed"] == [
        "tooluse_oslo",
        "tooluse_lima",
    ]
    [seen] = server.requests
    assert seen.status == 200
    signed = SIGV4.fullmatch(seen.headers["authorization"])
    assert signed is not None, seen.headers["authorization"]
    assert seen.headers["x-amz-date"].startswith(signed.group(1))
    assert {"host", "x-amz-date", "x-amz-security-token"} <= set(signed.group(2).split(";"))
    assert seen.headers["x-amz-security-token"] == "session-token"
    assert seen.body["system"] == [{"text": "Be brief."}]
    assert seen.body["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"] == {
        "json": WEATHER.parameters
    }


async def test_a_bedrock_api_key_goes_as_the_bearer_and_the_history_continues(server):
    env = {"AWS_BEARER_TOKEN_BEDROCK": "bedrock-api-key", "AWS_ACCESS_KEY_ID": "AKIDTEST"}
    async with model_client("bedrock", model="two", base_url=server.url, env=env) as client:
        first = await round_of(client)
        results = [
            ToolResult(tool_call_id=c.call_id, name=c.name, content="-3 C") for c in first.calls
        ]
        history = [USER, *assistant_messages(first), *tool_results_messages(first, results)]
        second = await round_of(client, history)
    assert second.text == "Done."
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer bedrock-api-key"] * 2
    assert [r.turn for r in server.requests] == [0, 1]  # the history was valid Converse


async def test_the_model_id_is_one_path_segment_and_errors_read_as_aws_sends_them(server):
    async with model_client("bedrock", model="us.x:0", base_url=server.url, env={}) as client:
        assert client.url.endswith("/model/us.x%3A0/converse-stream")
        with pytest.raises(ModelHTTPError) as caught:
            await round_of(client)
    assert caught.value.status == 404
    assert caught.value.message == "The model `us.x:0` does not exist"


def test_endpoint_region_and_credentials_are_checked_before_sending(monkeypatch):
    keys = {"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "s"}
    client = model_client("bedrock", model="m", env={"AWS_REGION": "ap-south-1", **keys})
    assert client.base_url == "https://bedrock-runtime.ap-south-1.amazonaws.com"
    with pytest.raises(ConfigError, match="AWS_BEARER_TOKEN_BEDROCK"):
        model_client("bedrock", model="m", env={"AWS_REGION": "ap-south-1"})
    with pytest.raises(ConfigError, match="no region"):
        model_client("bedrock", model="m", env=keys)
    with pytest.raises(ConfigError, match="needs a region"):
        model_client("bedrock", model="m", base_url="http://127.0.0.1:1", env=keys)
    custom = {"AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://127.0.0.1:1"}
    assert model_client("bedrock", model="m", env=custom).base_url == "http://127.0.0.1:1"
    host = "https://bedrock-runtime.eu-north-1.amazonaws.com"
    assert model_client("bedrock", model="m", base_url=host, env=keys).base_url == host
    with pytest.raises(ConfigError, match="record"):
        model_client("bedrock", model="m", base_url=host, env=keys, record="x")
    # without botocore, AWS keys cannot sign: the error names the extra
    for name in ("botocore", "botocore.auth", "botocore.awsrequest", "botocore.credentials"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ConfigError, match=r"toollatch\[bedrock\]"):
        model_client("bedrock", model="m", base_url=host, env=keys)
    bearer = {"AWS_BEARER_TOKEN_BEDROCK": "k"}
    assert model_client("bedrock", model="m", base_url=host, env=bearer).provider == "bedrock"
