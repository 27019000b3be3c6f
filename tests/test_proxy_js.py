"""`toollatch proxy` with the AI SDK's OpenAI-compatible provider as the client (node, the
pinned `ai` and `@ai-sdk/openai-compatible`): on every quirk profile of the scripted server it
gets exactly the committed calls, and never a call the gate refused; with ``--calls stream``
the same calls, from fragments."""

from __future__ import annotations

import json

import pytest

from node_helpers import node_command, run_node
from toollatch.relay import ProxyServer
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn
from toollatch.scripted._quirks import PROFILES

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
    "additionalProperties": False,
}
OSLO = Call(call_id="call_oslo", name="get_weather", arguments='{"city": "Oslo"}')
LIMA = Call(call_id="call_lima", name="get_weather", arguments='{"city": "Lima", "unit": "c"}')
BAD = Call(call_id="call_bad", name="get_weather", arguments='{"town": "Rome"}')
SCRIPTS = {
    "two": Script(turns=(Turn(items=(Text(text="Checking."), OSLO, LIMA), delay_ms=0.5),)),
    "bad": Script(turns=(Turn(items=(BAD, OSLO), delay_ms=0.5),)),
    "cut": Script(turns=(Turn(items=(OSLO,), stop="max_tokens", delay_ms=0.5),)),
}


@pytest.fixture(scope="module")
def client() -> list[str]:
    return node_command("openai_compatible_client.mjs", "@ai-sdk/openai-compatible")


async def calls_through(client, quirks, model, calls="hold"):
    async with ScriptedServer(SCRIPTS, delay_scale=0.1, quirks=quirks) as upstream:
        async with ProxyServer(upstream.base_url("openai_chat"), calls=calls) as proxy:
            config = {"baseURL": proxy.url, "model": model, "tools": {"get_weather": SCHEMA}}
            return await run_node(client, config)


@pytest.mark.parametrize("calls", ["hold", "stream"])
@pytest.mark.parametrize("quirks", [None, *sorted(PROFILES)])
async def test_the_ai_sdk_gets_the_committed_calls_on_every_profile(client, quirks, calls):
    seen = await calls_through(client, quirks, "two", calls)
    assert seen["errors"] == []
    assert [(c["id"], c["name"], c["input"], c["invalid"]) for c in seen["calls"]] == [
        ("call_oslo", "get_weather", {"city": "Oslo"}, False),
        ("call_lima", "get_weather", {"city": "Lima", "unit": "c"}, False),
    ]
    assert seen["finishReason"] == "tool-calls"


async def test_the_ai_sdk_never_sees_a_refused_or_truncated_call(client):
    bad = await calls_through(client, "ollama", "bad")
    assert [c["id"] for c in bad["calls"]] == ["call_oslo"]
    cut = await calls_through(client, None, "cut")
    assert cut["calls"] == []
    assert cut["finishReason"] == "length"
    assert json.dumps(cut).count("call_oslo") == 0


async def test_the_ai_sdk_through_the_proxy_on_an_anthropic_upstream(client):
    """`--upstream-provider anthropic`: the AI SDK's chat request translated to Anthropic
    Messages, the answer given back as OpenAI chat with the committed calls only."""
    found = {}
    for model in ("two", "bad"):
        async with ScriptedServer(SCRIPTS, delay_scale=0.1) as upstream:
            url = upstream.base_url("anthropic")
            async with ProxyServer(url, upstream_provider="anthropic") as proxy:
                config = {"baseURL": proxy.url, "model": model, "tools": {"get_weather": SCHEMA}}
                found[model] = await run_node(client, config)
            assert [r.path for r in upstream.requests] == ["/v1/messages"]
    assert found["two"]["errors"] == []
    assert [(c["id"], c["input"], c["invalid"]) for c in found["two"]["calls"]] == [
        ("call_oslo", {"city": "Oslo"}, False),
        ("call_lima", {"city": "Lima", "unit": "c"}, False),
    ]
    assert found["two"]["finishReason"] == "tool-calls"
    assert [c["id"] for c in found["bad"]["calls"]] == ["call_oslo"]  # never the refused one


async def test_stream_mode_shows_the_ai_sdk_a_call_the_gate_refuses(client):
    # the contract of --calls stream: the client sees every call's fragments as they come,
    # a refused one too; the verdicts come in the last chunk's toollatch key, which the AI
    # SDK does not read (hold, the default, never sends the call)
    bad = await calls_through(client, None, "bad", calls="stream")
    assert [c["id"] for c in bad["calls"]] == ["call_bad", "call_oslo"]
