"""The official ``openai`` and ``anthropic`` SDKs, pointed at the scripted server, get the
scripted calls with the right ids, names and arguments (and retry a scripted 429)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from toollatch import StreamParser
from toollatch.scripted import Faults, Script, ScriptedServer, demo_script

# The SDKs are imported in the tests that use them, not at the top: every pytest-xdist worker
# collects every file, and importing both costs ~10 s of CPU.
if TYPE_CHECKING:
    from openai import OpenAI

DEMO_CALLS = [(c.call_id, c.name, json.loads(c.arguments)) for c in demo_script().turns[0].calls]
USER = [{"role": "user", "content": "Weather in Oslo and Zürich?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(delay_scale=0) as s:
        yield s


def openai_client(server: ScriptedServer, **options: object) -> OpenAI:
    from openai import OpenAI

    return OpenAI(base_url=server.base_url("openai_chat"), api_key="x", **options)  # type: ignore[arg-type]


def test_openai_chat_stream(server: ScriptedServer) -> None:
    with openai_client(server) as client:
        stream = client.chat.completions.create(
            model="scripted", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        calls: dict[int, list[str]] = {}
        usage = None
        parser = StreamParser("openai_chat")
        for chunk in stream:
            parser.feed_event(chunk)
            usage = chunk.usage or usage
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, ["", "", ""])
                    entry[0] += tc.id or ""
                    entry[1] += (tc.function.name or "") if tc.function else ""
                    entry[2] += (tc.function.arguments or "") if tc.function else ""
    got = [(i, n, json.loads(a)) for i, n, a in calls.values()]
    assert got == DEMO_CALLS
    assert usage is not None and usage.total_tokens > 0
    round_ = parser.finish()
    assert [(c.call_id, c.name, dict(c.arguments)) for c in round_.committed()] == DEMO_CALLS


def test_openai_chat_stream_helper(server: ScriptedServer) -> None:
    with openai_client(server) as client:
        with client.chat.completions.stream(model="scripted", messages=USER) as stream:
            for _ in stream:
                pass
            message = stream.get_final_completion().choices[0].message
    assert message.content == "Let me check the weather in both cities."
    got = [
        (c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
    ]
    assert got == DEMO_CALLS


def test_openai_responses_stream(server: ScriptedServer) -> None:
    with openai_client(server) as client:
        events = list(client.responses.create(model="scripted", input=USER, stream=True))  # type: ignore[arg-type]
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    got = [
        (i.call_id, i.name, json.loads(i.arguments))
        for i in final.output
        if i.type == "function_call"
    ]
    assert got == DEMO_CALLS
    assert final.output_text == "Let me check the weather in both cities."


def test_anthropic_messages_stream(server: ScriptedServer) -> None:
    from anthropic import Anthropic

    with Anthropic(base_url=server.base_url("anthropic"), api_key="x") as client:
        with client.messages.stream(model="scripted", max_tokens=512, messages=USER) as stream:  # type: ignore[arg-type]
            parser = StreamParser("anthropic")
            for event in stream:
                parser.feed_event(event)
            message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    got = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert got == DEMO_CALLS
    assert [
        (c.call_id, c.name, dict(c.arguments)) for c in parser.finish().committed()
    ] == DEMO_CALLS


def test_anthropic_sdk_gets_a_400_for_an_unpaired_tool_use(server: ScriptedServer) -> None:
    import anthropic
    from anthropic import Anthropic

    history = [
        *USER,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
        },
        {"role": "user", "content": "and?"},
    ]
    with Anthropic(base_url=server.base_url("anthropic"), api_key="x", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            with client.messages.stream(model="scripted", max_tokens=5, messages=history) as stream:  # type: ignore[arg-type]
                stream.get_final_message()
    assert caught.value.status_code == 400
    assert "toolu_1" in str(caught.value)


def test_openai_sdk_retries_a_scripted_429_and_gets_the_same_turn() -> None:
    demo = demo_script()
    first = demo.turns[0]
    flaky = Script(
        turns=(
            type(first)(items=first.items, delay_ms=0, faults=Faults(status=429, retry_after_s=0)),
            *demo.turns[1:],
        )
    )
    with ScriptedServer(scripts={"flaky": flaky}, delay_scale=0) as s:
        with openai_client(s, max_retries=2) as client:
            with client.chat.completions.stream(model="flaky", messages=USER) as stream:
                for _ in stream:
                    pass
                message = stream.get_final_completion().choices[0].message
        assert [r.status for r in s.requests] == [429, 200]
        assert s.requests[0].body == s.requests[1].body
    assert [c.id for c in message.tool_calls or []] == [c[0] for c in DEMO_CALLS]
