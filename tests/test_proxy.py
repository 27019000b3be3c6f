"""`toollatch proxy` (relay/_proxy.py): the official `openai` SDK as the client, through the
proxy, over real loopback HTTP, against the scripted model server and against raw recorded
quirky streams; the client must assemble exactly the calls the gate commits.

The OpenAI SDK's accumulation rule (a tool call's deltas merged by ``index``; ``id``, ``type``
and ``name`` from its first delta) is what `openai/lib/streaming/chat/_completions.py`
implements (repo openai/openai-python); the in-stream ``{"error": ...}`` object raised as an
``APIError`` is `openai/_streaming.py`'s.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.responses import StreamingResponse

from conftest import CORPUS, corpus_dir
from loopback_http import gzipping, loopback, sse, stream_reply
from toollatch import ConfigError, StreamParser
from toollatch.relay import ProxyServer
from toollatch.relay._guard import RelayAccess
from toollatch.relay._http import upstream_http
from toollatch.scripted import Call, Faults, Script, ScriptedServer, Text, Turn
from toollatch.scripted._quirks import PROFILES, QuirkProfile

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
OSLO = Call(call_id="call_oslo", name="get_weather", arguments='{"city": "Oslo"}')
LIMA = Call(call_id="call_lima", name="get_weather", arguments='{"city": "Lima", "unit": "c"}')
BAD = Call(call_id="call_bad", name="get_weather", arguments='{"town": "Rome"}')


def script(*items: Any, stop: str = "normal", faults: Faults | None = None) -> Script:
    turn = Turn(items=tuple(items), stop=stop, delay_ms=1.0, faults=faults or Faults())  # type: ignore[arg-type]
    return Script(turns=(turn,))


SCRIPTS = {
    "two": script(Text(text="Checking both."), OSLO, LIMA),
    "text": script(Text(text="Hello there, no tools needed.")),
    "cut": script(Text(text="Let me check."), OSLO, LIMA, stop="max_tokens"),
    "cut1": script(Text(text="Let me check."), OSLO, stop="max_tokens"),
    "bad": script(BAD, OSLO),
    "busy": script(OSLO, faults=Faults(status=429, retry_after_s=3)),
    "dropped": script(OSLO, LIMA, faults=Faults(drop_after_events=4)),
}


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(SCRIPTS, delay_scale=0.1) as server:
        yield server


@pytest.fixture
async def proxy(upstream: ScriptedServer) -> AsyncIterator[ProxyServer]:
    async with ProxyServer(upstream.base_url("openai_chat")) as served:
        yield served


def client(proxy: ProxyServer, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test-key", max_retries=0, **kw)


async def streamed(proxy: ProxyServer, model: str, **kw: Any) -> tuple[list[Any], dict[str, Any]]:
    """Every chunk of a streamed request, and the calls as the SDK's users assemble them
    (merged by ``index``)."""
    async with client(proxy) as c:
        stream = await c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER],
            stream=True,
            **kw,
        )
        chunks = [chunk async for chunk in stream]
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = call["id"] or delta.id
                if delta.function is not None:
                    call["name"] = call["name"] or delta.function.name
                    call["arguments"] += delta.function.arguments or ""
    return chunks, calls


def finish_reasons(chunks: list[Any]) -> list[str]:
    return [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]


def extension(chunks: list[Any]) -> dict[str, Any] | None:
    extras = [getattr(ch, "model_extra", None) or {} for ch in chunks]
    found = [e["toollatch"] for e in extras if "toollatch" in e]
    assert len(found) <= 1
    return found[0] if found else None


async def test_committed_calls_reach_the_sdk_whole_in_call_order(proxy):
    chunks, calls = await streamed(proxy, "two")
    assert calls == {
        0: {"id": "call_oslo", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        1: {"id": "call_lima", "name": "get_weather", "arguments": '{"city": "Lima", "unit": "c"}'},
    }
    call_deltas = [d for ch in chunks for c in ch.choices for d in c.delta.tool_calls or ()]
    assert len(call_deltas) == 2  # one delta per call, never a fragment
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert text == "Checking both."
    assert finish_reasons(chunks) == ["tool_calls"]
    assert extension(chunks) is None


async def test_a_truncated_round_sends_no_call_and_finishes_length(proxy):
    chunks, calls = await streamed(proxy, "cut1")  # the only call cut mid-arguments
    assert calls == {}
    assert finish_reasons(chunks) == ["length"]
    failed = extension(chunks)
    assert failed is not None
    assert [(f["id"], f["code"]) for f in failed["failed"]] == [("call_oslo", "truncated")]


async def test_a_call_the_upstream_moved_on_from_is_sent_before_the_cut_one_fails(proxy):
    chunks, calls = await streamed(proxy, "cut")
    # Oslo was complete and the upstream had moved on to Lima: committed there (the core's
    # eager rule) and sent at once; Lima, cut by max_tokens, is never sent
    assert calls == {0: {"id": "call_oslo", "name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert finish_reasons(chunks) == ["tool_calls"]
    failed = extension(chunks)
    assert failed is not None
    assert [(f["id"], f["code"]) for f in failed["failed"]] == [("call_lima", "truncated")]
    first_call = next(
        n for n, ch in enumerate(chunks) if any(c.delta.tool_calls for c in ch.choices)
    )
    assert first_call < len(chunks) - 1  # before the round's end, not with it


async def test_a_call_the_schema_refuses_is_reported_never_sent(proxy):
    chunks, calls = await streamed(proxy, "bad")
    assert calls == {0: {"id": "call_oslo", "name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    failed = extension(chunks)
    assert failed is not None
    [verdict] = failed["failed"]
    assert verdict["id"] == "call_bad"
    assert verdict["code"] == "schema_violation"
    assert "town" in verdict["message"]
    assert finish_reasons(chunks) == ["tool_calls"]


async def test_text_only_and_usage_when_asked(proxy):
    chunks, calls = await streamed(proxy, "text", stream_options={"include_usage": True})
    assert calls == {}
    assert "".join(c.delta.content or "" for ch in chunks for c in ch.choices) == (
        "Hello there, no tools needed."
    )
    assert finish_reasons(chunks) == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None


async def test_the_stream_helper_and_a_non_streaming_request(proxy):
    async with client(proxy) as c:
        async with c.chat.completions.stream(
            model="two", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
        ) as stream:
            async for _event in stream:
                pass
            final = await stream.get_final_completion()
        message = final.choices[0].message
        assert [(t.id, t.function.arguments) for t in message.tool_calls or ()] == [
            ("call_oslo", '{"city": "Oslo"}'),
            ("call_lima", '{"city": "Lima", "unit": "c"}'),
        ]
        whole = await c.chat.completions.create(
            model="bad", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
        )
    assert [t.id for t in whole.choices[0].message.tool_calls or ()] == ["call_oslo"]
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.model_extra is not None
    assert whole.model_extra["toollatch"]["failed"][0]["code"] == "schema_violation"


async def test_a_call_without_tools_in_the_request_is_refused(proxy):
    async with client(proxy) as c:
        whole = await c.chat.completions.create(
            model="two", messages=[{"role": "user", "content": "weather?"}]
        )
    assert whole.choices[0].message.tool_calls is None
    codes = {f["code"] for f in (whole.model_extra or {})["toollatch"]["failed"]}
    assert codes == {"unknown_tool"}


async def test_an_upstream_error_status_is_passed_on(proxy):
    async with client(proxy) as c:
        with pytest.raises(openai.RateLimitError) as caught:
            await c.chat.completions.create(
                model="busy", messages=[{"role": "user", "content": "x"}], tools=[WEATHER]
            )
    assert caught.value.response.headers.get("retry-after") == "3"


async def test_a_dropped_upstream_is_an_error_not_a_normal_end(proxy):
    async with client(proxy) as c:
        stream = await c.chat.completions.create(
            model="dropped",
            messages=[{"role": "user", "content": "x"}],
            tools=[WEATHER],
            stream=True,
        )
        seen: list[Any] = []

        async def read_all() -> None:
            async for chunk in stream:
                seen.append(chunk)

        with pytest.raises(openai.APIError, match="stream broke"):
            await read_all()
    assert not [d for ch in seen for c in ch.choices for d in c.delta.tool_calls or ()]


async def test_models_pass_through_and_the_guard(proxy):
    async with httpx.AsyncClient(base_url=proxy.url) as h:
        models = await h.get("/models")
        assert models.status_code == 200
        assert "two" in {m["id"] for m in models.json()["data"]}
        foreign = await h.get("/models", headers={"host": "evil.example"})
        assert foreign.status_code == 400
        assert foreign.json()["error"]["code"] == "host_not_allowed"
        cross = await h.post(
            "/chat/completions", json={"messages": []}, headers={"origin": "https://evil.example"}
        )
        assert cross.status_code == 403
        not_json = await h.post(
            "/chat/completions", content=b"{", headers={"content-type": "application/json"}
        )
        assert not_json.status_code == 400
        assert not_json.json()["error"]["code"] == "invalid_json"


async def test_each_host_header_is_checked_once_and_the_answers_stay_right(proxy, monkeypatch):
    """The Host check's answer is kept per Host header (parsed once, not per request): the
    same answers as before, allowed and refused; past the bound the kept answers are
    forgotten and checked again."""
    checked: list[str] = []
    check = RelayAccess.host_allowed

    def counted(self: RelayAccess, header: str) -> bool:
        checked.append(header)
        return check(self, header)

    monkeypatch.setattr(RelayAccess, "host_allowed", counted)
    port = proxy.url.split(":")[2].split("/")[0]
    async with httpx.AsyncClient(base_url=proxy.url) as h:
        for _ in range(3):
            assert (await h.get("/models")).status_code == 200
            refused = await h.get("/models", headers={"host": "evil.example"})
            assert refused.json()["error"]["code"] == "host_not_allowed"
        assert checked == [f"127.0.0.1:{port}", "evil.example"]
        for n in range(70):  # (more than are kept)
            refused = await h.get("/models", headers={"host": f"evil{n}.example"})
            assert refused.status_code == 400
        assert (await h.get("/models")).status_code == 200
        assert (await h.get("/models", headers={"host": "evil.example"})).status_code == 400
    assert len(checked) == 2 + 70 + 2  # (the first two forgotten with the rest)


async def test_a_token_guards_the_proxy(upstream):
    async with ProxyServer(
        upstream.base_url("openai_chat"), token="t" * 32, upstream_key="sk-up"
    ) as p:
        async with openai.AsyncOpenAI(base_url=p.url, api_key="wrong-token", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError):
                await c.models.list()
        async with openai.AsyncOpenAI(base_url=p.url, api_key="t" * 32, max_retries=0) as c:
            listed = await c.models.list()
            assert listed.data
            await c.chat.completions.create(
                model="text", messages=[{"role": "user", "content": "x"}]
            )
    seen = upstream.requests[-1]
    assert seen.headers.get("authorization") == "Bearer sk-up"  # the upstream key, not the token


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="token"):
        ProxyServer("http://127.0.0.1:1/v1", host="0.0.0.0")
    with pytest.raises(ConfigError, match="calls"):
        ProxyServer("http://127.0.0.1:1/v1", calls="sometimes")
    with pytest.raises(ConfigError, match="upstream"):
        ProxyServer("ftp://x")


# -- raw recorded streams with quirks, served as they were recorded -------------------------


def chat_recordings() -> list[str]:
    """The corpus's OpenAI-chat-format recordings (OpenAI's own and compatible servers')."""
    if not (CORPUS / "expected.json").is_file():
        return ["(corpus missing)"]
    expected = json.loads((CORPUS / "expected.json").read_text())
    return sorted(k for k, v in expected.items() if v.get("format") == "openai_chat")


def as_sse(path: Path) -> bytes:
    """The recording as the upstream sent it (JSON Lines recordings: one SSE event a line)."""
    body = path.read_bytes()
    if path.suffix == ".jsonl":
        return b"".join(b"data: " + line + b"\n\n" for line in body.splitlines() if line.strip())
    return body


def raw_reply(body: bytes):
    async def reply(scope, receive, send):
        async def chunks():
            for n in range(0, len(body), 97):  # odd-sized reads, across event boundaries
                yield body[n : n + 97]
                await asyncio.sleep(0)

        await StreamingResponse(chunks(), media_type="text/event-stream")(scope, receive, send)

    return reply


def sdk_calls(chunks: list[Any]) -> dict[tuple[int, int], dict[str, Any]]:
    """The calls as an SDK user assembles them: by choice and ``index``."""
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or ():
                call = seen.setdefault(
                    (choice.index, d.index), {"id": None, "name": None, "arguments": ""}
                )
                call["id"] = call["id"] or d.id
                call["name"] = call["name"] or d.function.name
                call["arguments"] += d.function.arguments or ""
    return seen


def recorded(name: str) -> tuple[bytes, list[dict[str, Any]], Any]:
    """A corpus recording as the upstream sent it, tools of its calls' names, and the Round
    toollatch's parser makes of it (every tool eager, as the proxy's gate)."""
    corpus = corpus_dir()
    expected = json.loads((corpus / "expected.json").read_text())[name]
    names = sorted({c["name"] for c in expected["calls"] if c.get("name")})
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in names
    ]
    body = as_sse(corpus / name)
    parser = StreamParser("openai_chat", tools=tools, eager=names)
    parser.feed(body)
    return body, tools, parser.finish()


@pytest.mark.parametrize("name", chat_recordings())
async def test_recorded_streams_reach_the_sdk_as_the_gate_commits_them(name):
    body, tools, round_ = recorded(name)
    committed = {
        (c.index, n): {"id": r.call_id, "name": r.name, "arguments": r.committed.arguments_text}
        for c in round_.choices
        for n, r in enumerate(x for x in c.calls if x.committed is not None)
    }
    async with loopback() as lb:
        lb.replies.append(raw_reply(body))
        async with ProxyServer(lb.url + "/v1") as p:
            async with openai.AsyncOpenAI(base_url=p.url, api_key="k", max_retries=0) as c:
                stream = await c.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "x"}],
                    tools=tools or openai.NOT_GIVEN,
                    stream=True,
                )
                chunks: list[Any] = []
                try:
                    async for chunk in stream:
                        chunks.append(chunk)
                except openai.APIError:
                    pass  # an interrupted recording: an error, after its committed calls only
    assert sdk_calls(chunks) == committed
    assert len(finish_reasons(chunks)) <= len(round_.choices)  # one finish per choice at most


# -- proxy --record ------------------------------------------------------------------------

CLIENT_KEY = "sk-client-0123456789abcdefghijklmnop"
LEAKED = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def leaky_stream() -> bytes:
    """A chat stream whose text and arguments carry credentials: the client's own key (as
    an upstream that echoes a request might) and a GitHub token inside a call's arguments."""
    args = json.dumps({"city": "Oslo", "note": f"token {LEAKED} and {CLIENT_KEY}"})
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": f"key {CLIENT_KEY}"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": args[:20]},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args[20:]}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    return (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )


async def test_record_saves_a_replayable_fixture_without_the_keys(tmp_path):
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    async with loopback() as lb:
        lb.replies.append(raw_reply(leaky_stream()))
        async with ProxyServer(lb.url + "/v1", record=tmp_path / "rec") as p:
            async with openai.AsyncOpenAI(base_url=p.url, api_key=CLIENT_KEY, max_retries=0) as c:
                stream = await c.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "x"}],
                    tools=[tool],
                    stream=True,
                )
                chunks = [chunk async for chunk in stream]
        assert lb.seen[0].headers["authorization"] == f"Bearer {CLIENT_KEY}"  # forwarded upstream
    [(_, sent)] = sdk_calls(chunks).items()
    assert LEAKED in sent["arguments"]  # the client gets the model's arguments unchanged
    files = sorted((tmp_path / "rec").iterdir())
    assert sorted(f.name.split(".", 1)[1] for f in files) == ["json", "sse", "tools.json"]
    for f in files:
        data = f.read_bytes()
        assert CLIENT_KEY.encode() not in data, f.name
        assert LEAKED.encode() not in data, f.name
        assert b"authorization" not in data.lower(), f.name
    sse = next(f for f in files if f.suffix == ".sse")
    meta = json.loads(sse.with_suffix(".json").read_text())
    assert meta["status"] == 200
    assert meta["provider"] == "openai_chat"
    assert meta["masked"] >= 3
    replayed = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", str(sse),
         "--tools", str(sse.with_name(sse.stem + ".tools.json"))],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    [call] = json.loads(replayed.stdout)["calls"]
    assert call["state"] == "committed"  # masked, yet still a JSON object
    assert call["id"] == "call_1"
    assert call["arguments"]["city"] == "Oslo"
    assert call["arguments"]["note"] != json.loads(sent["arguments"])["note"]  # the keys went


# -- the scripted server's quirk profiles, behind the proxy --------------------------------

PROFILE_SCRIPTS = {"two": SCRIPTS["two"]}


def raw_chunks(url: str) -> list[dict[str, Any]]:
    body = {"model": "two", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    answer = httpx.post(url + "/chat/completions", json=body, timeout=10)
    payloads = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    return [json.loads(p) for p in payloads if p != "[DONE]"]


def shows(profile: QuirkProfile, chunks: list[dict[str, Any]]) -> None:
    """The quirk codes of ``profile`` are really on the wire."""
    entries = [
        e for c in chunks for ch in c["choices"] for e in ch["delta"].get("tool_calls") or ()
    ]
    finishes = [
        ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")
    ]
    if "Q1" in profile.codes:
        assert all("index" not in e for e in entries)
    if "Q2" in profile.codes:
        assert {e["index"] for e in entries} == {0}
        assert len({e["id"] for e in entries}) == 2
    if "Q3" in profile.codes:
        assert all(e.get("id") for e in entries)
    if "Q5" in profile.codes:
        assert all(e["function"].get("name") for e in entries)
    if "Q6" in profile.codes:
        assert any(e["function"].get("name") == "" for e in entries)
    if "Q8" in profile.codes:
        assert len(entries) == 2  # one entry per call: the whole arguments at once
    if "Q12" in profile.codes:
        assert finishes == ["stop"]
    if "Q13" in profile.codes:
        last = chunks[-1]["choices"][0]
        assert last["finish_reason"] and (
            last["delta"].get("tool_calls") or last["delta"].get("content")
        )
    if profile.name == "tgi":
        assert finishes == []


@pytest.mark.parametrize("name", sorted(PROFILES))
async def test_every_quirk_profile_reaches_the_sdk_as_clean_calls(name):
    profile = PROFILES[name]
    async with ScriptedServer(PROFILE_SCRIPTS, delay_scale=0.1, quirks=name) as upstream:
        base = upstream.base_url("openai_chat")
        chunks = await asyncio.to_thread(raw_chunks, base)
        shows(profile, chunks)
        async with ProxyServer(base) as proxy:
            seen, calls = await streamed(proxy, "two")
    assert calls == {
        0: {"id": "call_oslo", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        1: {"id": "call_lima", "name": "get_weather", "arguments": '{"city": "Lima", "unit": "c"}'},
    }, name
    assert finish_reasons(seen) == ["tool_calls"]


def test_an_unknown_quirk_profile_is_a_config_error():
    with pytest.raises(ConfigError, match="ollama"):
        ScriptedServer(quirks="nonesuch")


# -- POST /v1/responses --------------------------------------------------------------------

RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}


@pytest.fixture
async def responses_proxy(upstream: ScriptedServer) -> AsyncIterator[ProxyServer]:
    async with ProxyServer(upstream.base_url("openai_responses")) as served:
        yield served


async def responses_of(proxy: ProxyServer, model: str) -> tuple[list[Any], Any]:
    async with client(proxy) as c:
        async with c.responses.stream(
            model=model, input="weather?", tools=[RESPONSES_WEATHER]
        ) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
    return events, final


def function_calls(response: Any) -> list[tuple[str, str]]:
    return [(i.call_id, i.arguments) for i in response.output if i.type == "function_call"]


async def test_responses_stream_gets_committed_calls_only(responses_proxy):
    events, final = await responses_of(responses_proxy, "two")
    assert function_calls(final) == [
        ("call_oslo", '{"city": "Oslo"}'),
        ("call_lima", '{"city": "Lima", "unit": "c"}'),
    ]
    assert final.output_text == "Checking both."
    assert final.status == "completed"
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) == 2  # one whole delta per call
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))


async def test_responses_refused_and_truncated_calls_never_reach_the_client(responses_proxy):
    _, bad = await responses_of(responses_proxy, "bad")
    assert function_calls(bad) == [("call_oslo", '{"city": "Oslo"}')]
    assert bad.model_extra["toollatch"]["failed"][0]["code"] == "schema_violation"
    async with client(responses_proxy) as c:  # (the SDK's stream helper wants "completed")
        stream = await c.responses.create(
            model="cut1", input="x", tools=[RESPONSES_WEATHER], stream=True
        )
        events = [event async for event in stream]
    assert not [e for e in events if e.type.startswith("response.function_call")]
    cut = events[-1]
    assert cut.type == "response.incomplete"
    assert cut.response.incomplete_details.reason == "max_output_tokens"
    assert cut.response.model_extra["toollatch"]["failed"][0]["code"] == "truncated"


async def test_responses_without_a_stream_and_a_broken_upstream(responses_proxy):
    async with client(responses_proxy) as c:
        whole = await c.responses.create(model="two", input="weather?", tools=[RESPONSES_WEATHER])
        assert [i.call_id for i in whole.output if i.type == "function_call"] == [
            "call_oslo",
            "call_lima",
        ]
        stream = await c.responses.create(
            model="dropped", input="x", tools=[RESPONSES_WEATHER], stream=True
        )
        seen: list[Any] = []

        async def read_all() -> None:
            async for event in stream:
                seen.append(event)

        with pytest.raises(openai.APIError, match="stream broke"):
            await read_all()
    assert not [
        e for e in seen if e.type == "response.output_item.added" and e.item.type == "function_call"
    ]


async def test_the_relays_connection_bounds_hold_for_the_proxy(upstream):
    from toollatch import RelayLimits

    bounds = RelayLimits(header_timeout_s=0.3, body_timeout_s=0.3, max_header_bytes=2048)
    async with ProxyServer(upstream.base_url("openai_chat"), connections=bounds) as p:
        port = int(p.url.rsplit(":", 1)[1].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        await writer.drain()
        head = await asyncio.wait_for(reader.read(200), 5)
        assert head.startswith(b"HTTP/1.1 408"), head
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.read(200), 5)
        assert head.startswith(b"HTTP/1.1 431"), head
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )  # the body never comes
        await writer.drain()
        head = await asyncio.wait_for(reader.read(400), 5)
        assert head.startswith(b"HTTP/1.1 408"), head
        assert b"body_timeout" in head or b"body" in head
        writer.close()


# -- many streams at once ------------------------------------------------------------------


async def test_more_streams_than_httpxs_default_pool_all_reach_the_upstream_at_once():
    # httpx's default pool holds 100 connections: stream 101 waited for one, then failed 502
    # after the pool timeout; the proxy opens one upstream connection per stream in flight
    many = 110
    arrived = 0
    everyone = asyncio.Event()

    async def wait_for_everyone() -> None:
        nonlocal arrived
        arrived += 1
        if arrived == many:
            everyone.set()
        await everyone.wait()

    chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
    async with loopback() as lb:
        lb.replies += [
            stream_reply([wait_for_everyone, sse([chunk, "[DONE]"])]) for _ in range(many)
        ]
        async with ProxyServer(lb.url + "/v1") as p:
            limits = httpx.Limits(max_connections=None)
            async with httpx.AsyncClient(limits=limits, timeout=30.0) as c:

                async def one() -> bytes:
                    body = {"model": "m", "messages": [], "stream": True}
                    async with c.stream("POST", f"{p.url}/chat/completions", json=body) as r:
                        return await r.aread()

                try:
                    async with asyncio.timeout(60):  # (slow only on a loaded machine)
                        answers = await asyncio.gather(*(one() for _ in range(many)))
                except TimeoutError:
                    pytest.fail(f"{arrived} of {many} streams reached the upstream")
    assert all(b'"content":"ok"' in a and a.endswith(b"data: [DONE]\n\n") for a in answers)


async def test_responses_answers_are_recorded_as_responses_fixtures(upstream, tmp_path):
    async with ProxyServer(upstream.base_url("openai_responses"), record=tmp_path) as p:
        _, final = await responses_of(p, "two")
    assert len(function_calls(final)) == 2
    [sse] = list(tmp_path.glob("*.sse"))
    assert json.loads(sse.with_suffix(".json").read_text())["provider"] == "openai_responses"
    replayed = subprocess.run(
        [sys.executable, "-m", "toollatch.cli", "replay", "--format", "json", "--provider",
         "openai_responses", str(sse)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert [c["id"] for c in json.loads(replayed.stdout)["calls"]] == ["call_oslo", "call_lima"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_cookie_one_clients_upstream_set_never_goes_with_anothers_request(host):
    # the upstream client is shared: httpx keeps a Set-Cookie in the client's jar and sends
    # it with every later request, so client B's request carried client A's cookie; aiohttp's
    # session (the transport) keeps one too, from a host name (never from an IP address)
    chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
    body = sse([chunk, "[DONE]"])
    async with loopback() as lb:
        lb.replies += [
            StreamingResponse(
                iter([body]),
                media_type="text/event-stream",
                headers={"set-cookie": "tenant=alice; Path=/"},
            ),
            stream_reply([body]),
        ]
        async with ProxyServer(lb.url.replace("127.0.0.1", host) + "/v1") as p:
            for key in ("sk-alice", "sk-bob"):
                async with httpx.AsyncClient(timeout=30.0) as c:
                    answer = await c.post(
                        f"{p.url}/chat/completions",
                        json={"model": "m", "messages": [], "stream": True},
                        headers={"authorization": f"Bearer {key}"},
                    )
                    assert answer.status_code == 200 and answer.text.endswith("[DONE]\n\n")
    assert [s.headers["authorization"] for s in lb.seen] == ["Bearer sk-alice", "Bearer sk-bob"]
    assert "cookie" not in lb.seen[1].headers


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "gemini"])
@pytest.mark.parametrize("always", [False, True], ids=["when_accepted", "always"])
async def test_an_upstream_that_gzips_its_stream_still_gives_the_committed_calls(provider, always):
    # the proxy parses the upstream's bytes as read, and its requests carried httpx's default
    # Accept-Encoding (gzip): a gateway gzipped the stream and not one event parsed (the
    # round "interrupted"). Now it asks for identity, and decodes an upstream that gzips anyway
    scripted = ScriptedServer(SCRIPTS, delay_scale=0)  # (its app, served gzipped)
    async with loopback(gzipping(scripted.app, always=always)) as lb:
        base = f"{lb.url}/v1" if provider.startswith("openai") else lb.url
        async with ProxyServer(base, upstream_provider=provider) as p:
            chunks, calls = await streamed(p, "two")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_weather", {"city": "Lima", "unit": "c"}),
    ]
    assert finish_reasons(chunks) == ["tool_calls"]
    # (the model client, for another provider's upstream, inflates a body itself, bounded)
    wanted = "identity" if provider == "openai_chat" else "gzip, deflate"
    assert scripted.requests[-1].headers["accept-encoding"] == wanted


async def test_an_error_body_gzipped_anyway_is_passed_on_decoded():
    scripted = ScriptedServer(SCRIPTS, delay_scale=0)
    async with loopback(gzipping(scripted.app, always=True)) as lb:
        async with ProxyServer(f"{lb.url}/v1") as p, client(p) as c:
            with pytest.raises(openai.RateLimitError) as caught:
                await c.chat.completions.create(
                    model="busy", messages=[{"role": "user", "content": "x"}], tools=[WEATHER]
                )
    assert caught.value.response.headers.get("content-encoding") is None
    assert isinstance(caught.value.body, dict) and caught.value.body.get("message"), caught.value


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_request_and_an_answer_over_a_mib_go_through_whole(stream):
    # aiohttp warns ResourceWarning ("Sending a large body directly with raw bytes might lock
    # the event loop") of a raw request body over 1 MiB: under -W error (this suite's
    # filterwarnings) the proxy answered 500 to a long conversation. The upstream now gets
    # the same request in pieces, its Content-Length kept (not chunked)
    question = "q" * (3 << 20)
    text = "t" * (3 << 20)
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        "[DONE]",
    ]
    body = {"model": "m", "messages": [{"role": "user", "content": question}], "stream": stream}
    async with loopback() as lb:
        lb.replies.append(stream_reply([sse(events)]))
        async with ProxyServer(f"{lb.url}/v1") as p, httpx.AsyncClient(timeout=60) as c:
            answer = await c.post(f"{p.url}/chat/completions", json=body)
    assert answer.status_code == 200, answer.text[:300]
    if stream:
        assert answer.text.endswith("data: [DONE]\n\n") and text in answer.text
    else:
        assert answer.json()["choices"][0]["message"]["content"] == text
    [seen] = lb.seen
    assert seen.json()["messages"] == body["messages"]
    assert seen.headers["content-length"] == str(len(seen.body))
    assert "transfer-encoding" not in seen.headers


@pytest.mark.parametrize("reads", [False, True], ids=["never_reads", "reads_never_answers"])
async def test_an_upstream_that_never_answers_is_a_504_within_the_idle_timeout(reads):
    # aiohttp writes a body in a task of its own, without a write timeout, and the upstream
    # client has no read timeout (a slow model): an upstream that took the connection and
    # then never read the request, or never answered it, held the client's request for ever
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while reads and await reader.read(1 << 16):
            pass

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    big = "x" * (8 << 20)  # (more than the sockets' buffers hold: the write itself stalls)
    try:
        async with ProxyServer(base, idle_timeout_s=0.5) as p, client(p) as c:
            started = time.monotonic()
            for content in ("x", big):
                with pytest.raises(openai.APIStatusError) as caught:
                    async with asyncio.timeout(20):
                        await c.chat.completions.create(
                            model="m", messages=[{"role": "user", "content": content}]
                        )
                assert caught.value.status_code == 504
                assert caught.value.body["code"] == "upstream_timeout", caught.value.body
            with pytest.raises(openai.APIStatusError) as listed:
                async with asyncio.timeout(20):
                    await c.models.list()
            assert listed.value.status_code == 504
            assert time.monotonic() - started < 10
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_an_upstream_that_never_answers_the_tls_handshake_fails_in_the_connect_timeout():
    # (aiohttp's sock_connect, httpx's connect timeout, bounds the handshake too)
    held: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/models"
    timeout = httpx.Timeout(connect=0.5, read=None, write=0.5, pool=5.0)
    try:
        async with upstream_http(timeout) as http:
            started = time.monotonic()
            with pytest.raises(httpx.ConnectTimeout):
                async with asyncio.timeout(10):
                    await http.get(url)
            assert time.monotonic() - started < 4
    finally:
        for writer in held:
            writer.close()
        server.close()
