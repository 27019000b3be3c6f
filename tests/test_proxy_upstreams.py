"""`toollatch proxy --upstream-provider` (relay/_proxy_upstreams.py): the official `openai`
SDK through the proxy, over real loopback HTTP, against the scripted server speaking
Anthropic Messages, Gemini, OpenAI Responses or Bedrock ConverseStream (binary AWS event
stream); the client's chat request is translated (the scripted server validates it as the
real API does and records it) and the answer is OpenAI chat's, with exactly the calls the
gate commits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from test_proxy import BAD, LIMA, OSLO, WEATHER, client, extension, finish_reasons
from test_proxy import streamed as chat_streamed
from test_proxy import test_a_dropped_upstream_is_an_error_not_a_normal_end as dropped_is_an_error
from test_proxy import test_an_upstream_error_status_is_passed_on as status_passed_on
from toollatch import ConfigError
from toollatch.relay import ProxyServer
from toollatch.scripted import Faults, Script, ScriptedServer, Text, Turn

PROVIDERS = ("anthropic", "gemini", "openai_responses", "bedrock")
OSLO_ARGS, LIMA_ARGS = {"city": "Oslo"}, {"city": "Lima", "unit": "c"}
"""As parsed: Gemini sends arguments as objects, so their text is compact JSON."""


def turn(*items: Any, stop: str = "normal", faults: Faults | None = None) -> Turn:
    return Turn(items=tuple(items), stop=stop, delay_ms=1.0, faults=faults or Faults())  # type: ignore[arg-type]


SCRIPTS = {
    "two": Script(turns=(turn(Text(text="Checking both."), OSLO, LIMA),)),
    "text": Script(turns=(turn(Text(text="Hello there, no tools needed.")),)),
    "cut1": Script(turns=(turn(Text(text="Let me check."), OSLO, stop="max_tokens"),)),
    "bad": Script(turns=(turn(BAD, OSLO),)),
    "busy": Script(
        turns=(turn(OSLO, faults=Faults(status=429, status_attempts=2, retry_after_s=3)),)
    ),
    "dropped": Script(turns=(turn(OSLO, LIMA, faults=Faults(drop_after_events=1)),)),
    "chat": Script(turns=(turn(OSLO, LIMA), turn(Text(text="Oslo is cold, Lima mild.")))),
}


def ids(provider: str, first: str = "call_oslo", second: str = "call_lima") -> tuple[str, str]:
    """The ids the client sees for the first two calls of a round: Gemini sends none, so
    the adapter makes them up (by position)."""
    if provider == "gemini":
        return "gemini:0:0", "gemini:0:1"
    return first, second


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(SCRIPTS, delay_scale=0.1) as server:
        yield server


@pytest.fixture(params=PROVIDERS)
async def proxy(request: Any, upstream: ScriptedServer) -> AsyncIterator[ProxyServer]:
    provider = request.param
    async with ProxyServer(upstream.base_url(provider), upstream_provider=provider) as served:
        yield served


async def streamed(proxy: ProxyServer, model: str, **kw: Any) -> tuple[list[Any], dict[int, Any]]:
    """As test_proxy's (calls merged by ``index``), arguments parsed."""
    chunks, calls = await chat_streamed(proxy, model, **kw)
    for call in calls.values():
        call["arguments"] = json.loads(call["arguments"])  # one whole object per call
    return chunks, calls


def text_of(chunks: list[Any]) -> str:
    return "".join(c.delta.content or "" for ch in chunks for c in ch.choices)


async def test_parallel_calls_reach_the_sdk_whole_and_the_key_goes_in_its_header(proxy, upstream):
    provider = proxy.upstream_provider
    chunks, calls = await streamed(proxy, "two")
    oslo, lima = ids(provider)
    assert calls == {
        0: {"id": oslo, "name": "get_weather", "arguments": OSLO_ARGS},
        1: {"id": lima, "name": "get_weather", "arguments": LIMA_ARGS},
    }
    assert len([d for ch in chunks for c in ch.choices for d in c.delta.tool_calls or ()]) == 2
    assert text_of(chunks) == "Checking both."
    assert finish_reasons(chunks) == ["tool_calls"]
    assert extension(chunks) is None
    [seen] = upstream.requests
    assert seen.provider == provider  # the provider's own endpoint, its own body
    header = {"anthropic": "x-api-key", "gemini": "x-goog-api-key"}.get(provider)
    if header is None:
        assert seen.headers["authorization"] == "Bearer sk-test-key"
    else:
        assert seen.headers[header] == "sk-test-key"
        assert "authorization" not in seen.headers
    if provider == "anthropic":
        assert seen.headers["anthropic-version"] == "2023-06-01"
    if provider == "bedrock":  # a Bedrock API key, as AWS documents it; the model in the path
        assert seen.path == "/model/two/converse-stream"
        assert seen.headers["accept"] == "application/vnd.amazon.eventstream"


async def test_a_truncated_round_never_yields_a_call_and_finishes_length(proxy):
    chunks, calls = await streamed(proxy, "cut1", max_tokens=5)
    assert calls == {}
    assert text_of(chunks) == "Let me check."
    assert finish_reasons(chunks) == ["length"]
    failed = extension(chunks)
    if proxy.upstream_provider == "gemini":
        assert failed is None  # Gemini sends no part of a cut call (scripted/_wire_gemini.py)
    else:
        assert failed is not None
        assert [(f["id"], f["code"]) for f in failed["failed"]] == [("call_oslo", "truncated")]


async def test_a_call_the_schema_refuses_is_only_in_the_extension(proxy):
    chunks, calls = await streamed(proxy, "bad")
    bad, oslo = ids(proxy.upstream_provider, "call_bad", "call_oslo")
    assert calls == {0: {"id": oslo, "name": "get_weather", "arguments": OSLO_ARGS}}
    failed = extension(chunks)
    assert failed is not None
    [verdict] = failed["failed"]
    assert (verdict["id"], verdict["code"]) == (bad, "schema_violation")
    assert "town" in verdict["message"]
    assert finish_reasons(chunks) == ["tool_calls"]


async def test_text_is_forwarded_in_deltas_and_usage_passed_through(proxy):
    chunks, calls = await streamed(proxy, "text", stream_options={"include_usage": True})
    assert calls == {}
    deltas = [c.delta.content for ch in chunks for c in ch.choices if c.delta.content]
    assert len(deltas) > 1  # as the upstream streamed it, not joined at the end
    assert "".join(deltas) == "Hello there, no tools needed."
    assert finish_reasons(chunks) == ["stop"]
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_the_stream_helper_and_a_non_streaming_request(proxy):
    oslo, lima = ids(proxy.upstream_provider)
    async with client(proxy) as c:
        async with c.chat.completions.stream(
            model="two", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
        ) as stream:
            async for _event in stream:
                pass
            final = await stream.get_final_completion()
        message = final.choices[0].message
        assert message.content == "Checking both."
        assert [(t.id, json.loads(t.function.arguments)) for t in message.tool_calls or ()] == [
            (oslo, OSLO_ARGS),
            (lima, LIMA_ARGS),
        ]
        whole = await c.chat.completions.create(
            model="bad", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
        )
        cut = await c.chat.completions.create(
            model="cut1", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
        )
    bad, oslo = ids(proxy.upstream_provider, "call_bad", "call_oslo")
    assert [t.id for t in whole.choices[0].message.tool_calls or ()] == [oslo]
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.model_extra is not None
    assert whole.model_extra["toollatch"]["failed"][0]["id"] == bad
    assert whole.model_extra["toollatch"]["failed"][0]["code"] == "schema_violation"
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    assert cut.choices[0].message.tool_calls is None
    assert cut.choices[0].finish_reason == "length"


async def test_a_multi_turn_conversation_carries_the_calls_and_their_results(proxy, upstream):
    provider = proxy.upstream_provider
    history: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo and Lima?"},
    ]
    async with client(proxy) as c:
        first = await c.chat.completions.create(
            model="chat", messages=history, tools=[WEATHER], tool_choice="required"
        )
        message = first.choices[0].message
        assert message.tool_calls is not None and len(message.tool_calls) == 2
        history.append(message.model_dump(exclude_none=True))
        for call, answer in zip(message.tool_calls, ("-3 C", "19 C"), strict=True):
            history.append({"role": "tool", "tool_call_id": call.id, "content": answer})
        second = await c.chat.completions.create(
            model="chat",
            messages=history,
            tools=[WEATHER],
            max_tokens=300,
            temperature=0.25,
            stop=["END"],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    assert second.choices[0].message.content == "Oslo is cold, Lima mild."
    assert second.choices[0].finish_reason == "stop"
    sent = [r.body for r in upstream.requests]
    assert [r.status for r in upstream.requests] == [200, 200]  # the translation was valid
    assert [r.turn for r in upstream.requests] == [0, 1]  # the history counted one turn
    TRANSLATED[provider](sent[0], sent[1])


def _anthropic(first: Any, second: Any) -> None:
    assert first["system"] == "Be brief."
    assert first["tool_choice"] == {"type": "any"}
    assert first["tools"][0]["name"] == "get_weather"
    assert first["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert second["max_tokens"] == 300
    assert (second["temperature"], second["stop_sequences"]) == (0.25, ["END"])
    assert second["tool_choice"] == {"type": "tool", "name": "get_weather"}
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_oslo", "name": "get_weather", "input": {"city": "Oslo"}},
        {
            "type": "tool_use",
            "id": "call_lima",
            "name": "get_weather",
            "input": {"city": "Lima", "unit": "c"},
        },
    ]
    assert second["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_oslo", "content": "-3 C"},
        {"type": "tool_result", "tool_use_id": "call_lima", "content": "19 C"},
    ]


def _gemini(first: Any, second: Any) -> None:
    assert first["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert first["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert first["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    assert second["generationConfig"] == {
        "maxOutputTokens": 300,
        "temperature": 0.25,
        "stopSequences": ["END"],
    }
    assert second["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    contents = second["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[1]["parts"] == [  # (the made-up ids are not sent back)
        {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}},
        {"functionCall": {"name": "get_weather", "args": {"city": "Lima", "unit": "c"}}},
    ]
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"output": "-3 C"}}},
        {"functionResponse": {"name": "get_weather", "response": {"output": "19 C"}}},
    ]


def _responses(first: Any, second: Any) -> None:
    assert first["instructions"] == "Be brief."
    assert first["tool_choice"] == "required"
    assert first["tools"][0]["name"] == "get_weather"
    assert (second["max_output_tokens"], second["temperature"]) == (300, 0.25)
    assert second["tool_choice"] == {"type": "function", "name": "get_weather"}
    items = second["input"]
    assert items[0] == {"role": "user", "content": "Weather in Oslo and Lima?"}
    assert items[1:] == [
        {
            "type": "function_call",
            "call_id": "call_oslo",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        },
        {
            "type": "function_call",
            "call_id": "call_lima",
            "name": "get_weather",
            "arguments": '{"city":"Lima","unit":"c"}',
        },
        {"type": "function_call_output", "call_id": "call_oslo", "output": "-3 C"},
        {"type": "function_call_output", "call_id": "call_lima", "output": "19 C"},
    ]


def _bedrock(first: Any, second: Any) -> None:
    assert first["system"] == [{"text": "Be brief."}]
    assert first["toolConfig"]["toolChoice"] == {"any": {}}
    [spec] = first["toolConfig"]["tools"]
    assert spec["toolSpec"]["name"] == "get_weather"
    assert spec["toolSpec"]["inputSchema"] == {"json": WEATHER["function"]["parameters"]}  # type: ignore[index]
    assert "inferenceConfig" not in first
    assert second["inferenceConfig"] == {
        "maxTokens": 300,
        "temperature": 0.25,
        "stopSequences": ["END"],
    }
    assert second["toolConfig"]["toolChoice"] == {"tool": {"name": "get_weather"}}
    assert second["toolConfig"]["tools"] == first["toolConfig"]["tools"]  # kept beside it
    messages = second["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == [{"text": "Weather in Oslo and Lima?"}]
    assert messages[1]["content"] == [
        {"toolUse": {"toolUseId": "call_oslo", "name": "get_weather", "input": OSLO_ARGS}},
        {"toolUse": {"toolUseId": "call_lima", "name": "get_weather", "input": LIMA_ARGS}},
    ]
    assert messages[2]["content"] == [
        {"toolResult": {"toolUseId": "call_oslo", "content": [{"text": "-3 C"}]}},
        {"toolResult": {"toolUseId": "call_lima", "content": [{"text": "19 C"}]}},
    ]


TRANSLATED = {
    "anthropic": _anthropic,
    "gemini": _gemini,
    "openai_responses": _responses,
    "bedrock": _bedrock,
}


async def test_an_upstream_error_status_is_passed_on_openai_shaped(proxy):
    await status_passed_on(proxy)  # test_proxy's check: a RateLimitError, its Retry-After
    async with client(proxy) as c:
        with pytest.raises(openai.RateLimitError) as caught:
            await c.chat.completions.create(
                model="busy", messages=[{"role": "user", "content": "x"}]
            )
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["message"]


async def test_a_dropped_upstream_is_an_error_not_a_normal_end(proxy):
    await dropped_is_an_error(proxy)  # test_proxy's check, on each provider's wire


async def test_what_has_no_translation_is_a_400(proxy, upstream):
    async with client(proxy) as c:
        with pytest.raises(openai.BadRequestError, match="only text parts"):
            await c.chat.completions.create(
                model="two",
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:,x"}}],
                    }
                ],
            )
    assert upstream.requests == []  # nothing was sent


async def test_the_upstream_key_replaces_the_clients_bearer(upstream):
    url = upstream.base_url("anthropic")
    async with ProxyServer(url, upstream_provider="anthropic", upstream_key="sk-up") as p:
        async with client(p) as c:
            await c.chat.completions.create(
                model="text", messages=[{"role": "user", "content": "x"}]
            )
        async with openai.AsyncOpenAI(base_url=p.url, api_key="x", max_retries=0) as c:
            with pytest.raises(openai.NotFoundError, match="OpenAI upstream"):
                await c.responses.create(model="text", input="x")
    [seen] = upstream.requests
    assert seen.headers["x-api-key"] == "sk-up"


def test_an_unknown_upstream_provider_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="upstream_provider"):
        ProxyServer("http://127.0.0.1:1", upstream_provider="vertex")
    with pytest.raises(ConfigError, match="record is not supported with a bedrock"):
        ProxyServer("http://127.0.0.1:1", upstream_provider="bedrock", record=tmp_path)


async def test_record_saves_the_providers_own_stream_replayable(upstream, tmp_path):
    """``record=`` on a non-chat upstream: the model client's recorder saves the Anthropic
    stream as it came (provider ``anthropic``), the client's key nowhere in the files."""
    key = "sk-client-0123456789abcdefghijklmnop"
    url = upstream.base_url("anthropic")
    async with ProxyServer(url, upstream_provider="anthropic", record=tmp_path) as p:
        async with openai.AsyncOpenAI(base_url=p.url, api_key=key, max_retries=0) as c:
            await c.chat.completions.create(
                model="two", messages=[{"role": "user", "content": "x"}], tools=[WEATHER]
            )
    [sse] = list(tmp_path.glob("*.sse"))
    assert json.loads(sse.with_suffix(".json").read_text())["provider"] == "anthropic"
    assert all(key.encode() not in f.read_bytes() for f in tmp_path.iterdir())
    replayed = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", str(sse),
         "--tools", str(sse.with_name(sse.stem + ".tools.json"))],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    document = json.loads(replayed.stdout)
    assert [(c["id"], c["state"]) for c in document["calls"]] == [
        ("call_oslo", "committed"),
        ("call_lima", "committed"),
    ]


async def test_no_key_for_the_providers_own_host_is_a_401_before_any_request():
    # (the model client refuses before sending: nothing leaves loopback)
    async with ProxyServer("https://api.anthropic.com", upstream_provider="anthropic") as p:
        async with httpx.AsyncClient(base_url=p.url) as h:
            body = {"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}
            answer = await h.post("/chat/completions", json=body)
            nameless = await h.post("/chat/completions", json={**body, "model": ""})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "missing_api_key"
    assert nameless.status_code == 400
    assert "model must be a non-empty string" in nameless.json()["error"]["message"]


async def test_bedrock_without_a_bearer_signs_with_the_proxys_aws_keys(upstream, monkeypatch):
    """No bearer from the client: the proxy's own AWS keys sign the ConverseStream request
    (SigV4 by botocore; the scripted server checks the header's shape and scope only)."""
    pytest.importorskip("botocore")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIDPROXY",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_REGION": "us-west-2",
        "AWS_BEARER_TOKEN_BEDROCK": "not-the-proxys-to-send",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    async with ProxyServer(upstream.base_url("bedrock"), upstream_provider="bedrock") as p:
        async with httpx.AsyncClient(base_url=p.url) as h:
            body = {"model": "text", "messages": [{"role": "user", "content": "x"}]}
            answer = await h.post("/chat/completions", json=body)
            none = await h.post("/chat/completions", json={**body, "tool_choice": "none"})
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "Hello there, no tools needed."
    [seen] = upstream.requests
    authorization = seen.headers["authorization"]
    assert authorization.startswith(
        "AWS4-HMAC-SHA256 Credential=AKIDPROXY/" + seen.headers["x-amz-date"][:8]
    )
    assert "/us-west-2/bedrock/aws4_request, SignedHeaders=" in authorization
    assert none.status_code == 400  # Bedrock has no "none": refused before sending
    assert "no Bedrock equivalent" in none.json()["error"]["message"]


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
async def test_the_model_list_is_translated_to_openais_shape(upstream, provider):
    """``GET /v1/models`` on an Anthropic or Gemini upstream: the provider's own list
    (``/v1/models`` with ``x-api-key``, ``/v1beta/models`` with ``x-goog-api-key``) read and
    answered as OpenAI's, which the SDK's ``models.list()`` reads."""
    async with ProxyServer(upstream.base_url(provider), upstream_provider=provider) as p:
        async with client(p) as c:
            listed = [m async for m in c.models.list()]
        async with httpx.AsyncClient(base_url=p.url) as h:
            raw = (await h.get("/models")).json()
    assert sorted(m.id for m in listed) == sorted([*SCRIPTS, "scripted"])
    owner = {"anthropic": "anthropic", "gemini": "google"}[provider]
    assert {(m.object, m.owned_by) for m in listed} == {("model", owner)}
    if provider == "anthropic":  # its created_at, as Unix seconds
        assert {m.created for m in listed} == {1767225600}
    assert set(raw) == {"object", "data"} and raw["object"] == "list"


async def test_a_model_list_refused_upstream_is_an_openai_error(upstream):
    url = upstream.url + "/elsewhere"  # a path the scripted server does not serve: 404
    async with ProxyServer(url, upstream_provider="gemini") as p:
        async with client(p) as c:
            with pytest.raises(openai.NotFoundError) as caught:
                await c.models.list()
    error = caught.value.response.json()["error"]
    assert (error["code"], error["message"]) == ("upstream_error", "Not Found")


async def test_a_bedrock_upstream_lists_no_models():
    async with ProxyServer("http://127.0.0.1:1", upstream_provider="bedrock") as p:
        async with httpx.AsyncClient(base_url=p.url) as h:
            answer = await h.get("/models")
    assert answer.status_code == 404
    assert "bedrock-runtime lists none" in answer.json()["error"]["message"]


async def test_calls_stream_mode_on_bedrock_sends_the_fragments_it_commits(upstream):
    """``--calls stream`` on the binary Bedrock wire: the argument text arrives in fragments
    and concatenates to the committed calls; the verdicts come at the end."""
    url = upstream.base_url("bedrock")
    async with ProxyServer(url, upstream_provider="bedrock", calls="stream") as p:
        chunks, calls = await streamed(p, "two")
        bad_chunks, _ = await streamed(p, "bad")
    assert calls == {
        0: {"id": "call_oslo", "name": "get_weather", "arguments": OSLO_ARGS},
        1: {"id": "call_lima", "name": "get_weather", "arguments": LIMA_ARGS},
    }
    fragments = [d for ch in chunks for c in ch.choices for d in c.delta.tool_calls or ()]
    assert len(fragments) > 2  # live fragments, not one whole delta per call
    assert finish_reasons(chunks) == ["tool_calls"]
    failed = extension(bad_chunks)
    assert failed is not None
    assert [(f["id"], f["code"]) for f in failed["failed"]] == [("call_bad", "schema_violation")]
