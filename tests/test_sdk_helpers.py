"""The three ways in give the same Round: bytes, an SDK's ``stream=True`` objects, its helper.

The official SDKs are driven on recorded bytes by an in-memory transport (``sdk_clients``), so
every object fed here is one the SDK itself built: ``ChatCompletionChunk`` and
``RawMessageStreamEvent`` from ``create(stream=True)``; ``ChunkEvent``, ``content.delta``,
``tool_calls.function.arguments.delta``... from ``client.chat.completions.stream()``;
``text``, ``input_json``, ``thinking``, ``signature``, ``citation`` and the snapshot-carrying
``content_block_stop``/``message_stop`` from ``client.messages.stream()``;
``client.responses.stream()``'s snapshot-carrying events. Fed with ``feed_event``, each must
give exactly the Round the raw bytes give, for parallel calls and for a truncated stream; a
derived helper event fed without the event it came from raises ``UsageError`` instead of
losing its call.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest

from chat_chunks import USAGE, chunk, tc
from sdk_clients import client
from toollatch import CallState, ErrorCode, Round, RoundEnd, StreamParser, UsageError
from toollatch.testing import replay, sse

# -- streams -----------------------------------------------------------------------------------

CHAT_PARALLEL = sse(
    chunk({"role": "assistant", "content": "Checking "}),
    chunk({"content": "both."}),
    chunk(tc(0, "call_w", "get_weather", "")),
    chunk(tc(0, args='{"city": ')),
    chunk(tc(1, "call_t", "get_time", '{"tz": "Europe/Oslo"}')),
    chunk(tc(0, args='"Oslo"}')),
    chunk({}, "tool_calls"),
    USAGE,
    done=True,
)
CHAT_TRUNCATED = sse(
    chunk({"role": "assistant", "content": "Writing."}),
    chunk(tc(0, "call_f", "write_file", '{"path": "a.md", "content": "# Tod')),
    chunk({}, "length"),
    done=True,
)


def _message_start() -> dict[str, Any]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def _delta(index: int, **delta: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _start(index: int, **block: Any) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def _message_end(reason: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]


def _tool_use(index: int, call_id: str, name: str, *fragments: str) -> Iterator[dict[str, Any]]:
    yield _start(index, type="tool_use", id=call_id, name=name, input={})
    for fragment in fragments:
        yield _delta(index, type="input_json_delta", partial_json=fragment)


CITATION = {
    "type": "char_location",
    "cited_text": "Oslo is in Norway.",
    "document_index": 0,
    "document_title": "atlas",
    "start_char_index": 0,
    "end_char_index": 18,
}
ANTHROPIC_PARALLEL = sse(
    _message_start(),
    _start(0, type="thinking", thinking="", signature=""),
    _delta(0, type="thinking_delta", thinking="Two lookups."),
    _delta(0, type="signature_delta", signature="c2lnbmF0dXJl"),
    _stop(0),
    _start(1, type="text", text="", citations=[]),
    _delta(1, type="text_delta", text="Checking both."),
    _delta(1, type="citations_delta", citation=CITATION),
    _stop(1),
    *_tool_use(2, "toolu_w", "get_weather", '{"city": ', '"Oslo"}'),
    *_tool_use(3, "toolu_t", "get_time", '{"tz": "Europe/Oslo"}'),
    _stop(3),
    _stop(2),
    *_message_end("tool_use"),
    named=True,
)
ANTHROPIC_TRUNCATED = sse(
    _message_start(),
    _start(0, type="text", text=""),
    _delta(0, type="text_delta", text="Writing."),
    _stop(0),
    *_tool_use(1, "toolu_f", "write_file", '{"path": "a.md", ', '"content": "# Tod'),
    *_message_end("max_tokens"),
    named=True,
)

_RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m"}


def _responses(*calls: tuple[str, str], incomplete: bool = False) -> bytes:
    """A Responses stream of function calls ``(name, arguments)``; ``incomplete``: cut by
    ``max_output_tokens`` in the last call's arguments."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**_RESPONSE, "status": "in_progress"}}
    ]
    done_items = []
    for i, (name, arguments) in enumerate(calls):
        item = {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": name}
        added = {**item, "arguments": "", "status": "in_progress"}
        events.append({"type": "response.output_item.added", "output_index": i, "item": added})
        ids = {"item_id": f"fc_{i}", "output_index": i}
        half = len(arguments) // 2
        for delta in (arguments[:half], arguments[half:]):
            events.append({"type": "response.function_call_arguments.delta", **ids, "delta": delta})
        if incomplete and i == len(calls) - 1:
            break
        done_args = {"type": "response.function_call_arguments.done", "arguments": arguments}
        events.append({**done_args, **ids})
        done = {**item, "arguments": arguments, "status": "completed"}
        events.append({"type": "response.output_item.done", "output_index": i, "item": done})
        done_items.append(done)
    if incomplete:
        response = {
            **_RESPONSE,
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
        }
        events.append({"type": "response.incomplete", "response": response})
    else:
        response = {**_RESPONSE, "status": "completed", "output": done_items}
        events.append({"type": "response.completed", "response": response})
    return sse(*events)


RESPONSES_PARALLEL = _responses(("get_weather", '{"city": "Oslo"}'), ("get_time", '{"tz": "CET"}'))
RESPONSES_TRUNCATED = _responses(
    ("get_weather", '{"city": "Oslo"}'), ("write_file", '{"p": "a'), incomplete=True
)

# -- what each SDK yields for those bytes ----------------------------------------------------


def chat_helper(body: bytes) -> list[Any]:
    with client("openai", body).chat.completions.stream(model="m", messages=[]) as stream:
        return list(stream)


def chat_raw(body: bytes) -> list[Any]:
    return list(client("openai", body).chat.completions.create(model="m", messages=[], stream=True))


def anthropic_helper(body: bytes) -> list[Any]:
    with client("anthropic", body).messages.stream(model="m", max_tokens=9, messages=[]) as s:
        return list(s)


def anthropic_raw(body: bytes) -> list[Any]:
    messages = client("anthropic", body).messages
    return list(messages.create(model="m", max_tokens=9, messages=[], stream=True))


def responses_helper(body: bytes) -> list[Any]:
    with client("openai", body).responses.stream(model="m", input="hi") as stream:
        return list(stream)


def responses_raw(body: bytes) -> list[Any]:
    return list(client("openai", body).responses.create(model="m", input="hi", stream=True))


def fed(provider: str, events: list[Any]) -> Round:
    parser = StreamParser(provider)
    for event in events:
        parser.feed_event(event)
    return parser.finish()


def types(events: list[Any]) -> set[str]:
    return {getattr(e, "type", type(e).__name__) for e in events}


# -- the same Round, three ways in -------------------------------------------------------------

CASES = [
    ("openai_chat", CHAT_PARALLEL, chat_helper, chat_raw),
    ("openai_chat", CHAT_TRUNCATED, chat_helper, chat_raw),
    ("anthropic", ANTHROPIC_PARALLEL, anthropic_helper, anthropic_raw),
    ("anthropic", ANTHROPIC_TRUNCATED, anthropic_helper, anthropic_raw),
    ("openai_responses", RESPONSES_PARALLEL, responses_helper, responses_raw),
    ("openai_responses", RESPONSES_TRUNCATED, responses_helper, responses_raw),
]
IDS = [f"{c[0]}-{'parallel' if i % 2 == 0 else 'truncated'}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize(("provider", "body", "helper", "raw"), CASES, ids=IDS)
def test_helper_events_and_stream_true_objects_give_the_round_of_the_bytes(
    provider, body, helper, raw
):
    from_bytes = replay(body, provider)
    assert fed(provider, helper(body)) == from_bytes
    assert fed(provider, raw(body)) == from_bytes


@pytest.mark.parametrize(
    ("provider", "body", "helper"),
    [(p, b, h) for p, b, h, _ in CASES[::2]],
    ids=["openai_chat", "anthropic", "openai_responses"],
)
def test_parallel_calls_commit_through_the_helper(provider, body, helper):
    round_ = fed(provider, helper(body))
    assert round_.ended is RoundEnd.NORMAL
    assert [(c.name, c.state) for c in round_.calls] == [
        ("get_weather", CallState.COMMITTED),
        ("get_time", CallState.COMMITTED),
    ]
    assert round_.calls[0].arguments == {"city": "Oslo"}
    assert round_.anomalies == ()


@pytest.mark.parametrize(
    ("provider", "body", "helper"),
    [(p, b, h) for p, b, h, _ in CASES[1::2]],
    ids=["openai_chat", "anthropic", "openai_responses"],
)
def test_a_truncated_stream_fails_its_cut_call_through_the_helper(provider, body, helper):
    round_ = fed(provider, helper(body))
    assert round_.ended is RoundEnd.TRUNCATED
    cut = round_.calls[-1]
    assert (cut.state, cut.error, cut.arguments) == (CallState.FAILED, ErrorCode.TRUNCATED, None)
    assert round_.committed() == ()


def test_the_helpers_yield_the_event_types_this_file_is_about():
    # (what the SDK versions in use yield: a helper that stopped deriving an event type would
    # make the tests above pass without feeding it)
    assert types(chat_helper(CHAT_PARALLEL)) >= {
        "chunk",
        "content.delta",
        "content.done",
        "tool_calls.function.arguments.delta",
        "tool_calls.function.arguments.done",
    }
    assert types(anthropic_helper(ANTHROPIC_PARALLEL)) >= {
        "text",
        "citation",
        "thinking",
        "signature",
        "input_json",
        "content_block_stop",
        "message_stop",
    }
    stops = [e for e in anthropic_helper(ANTHROPIC_PARALLEL) if e.type.endswith("_stop")]
    assert all(getattr(e, "content_block", None) or getattr(e, "message", None) for e in stops)
    snapshots = [getattr(e, "snapshot", None) for e in responses_helper(RESPONSES_PARALLEL)]
    assert any(snapshots)


# -- derived events alone are refused, not dropped -----------------------------------------------


@pytest.mark.parametrize(
    ("provider", "body", "helper", "keep", "advice"),
    [
        (
            "openai_chat",
            CHAT_PARALLEL,
            chat_helper,
            "tool_calls.function.arguments.delta",
            "chunk events",
        ),
        ("openai_chat", CHAT_PARALLEL, chat_helper, "content.delta", "chunk events"),
        ("anthropic", ANTHROPIC_PARALLEL, anthropic_helper, "input_json", "raw events"),
        ("anthropic", ANTHROPIC_PARALLEL, anthropic_helper, "text", "raw events"),
    ],
)
def test_derived_helper_events_alone_raise_usage_error_naming_what_to_feed(
    provider, body, helper, keep, advice
):
    parser = StreamParser(provider)
    derived = [e for e in helper(body) if e.type == keep]
    with pytest.raises(UsageError, match=advice):
        parser.feed_event(derived[0])


def test_anthropic_derived_events_after_other_raw_events_still_raise():
    # A filter that keeps the message events and the derived input but not the raw deltas
    # would lose every argument fragment: the derived event must follow its raw delta.
    events = [
        e
        for e in anthropic_helper(ANTHROPIC_PARALLEL)
        if e.type in ("message_start", "content_block_start", "input_json")
    ]
    parser = StreamParser("anthropic")
    first_derived = next(i for i, e in enumerate(events) if e.type == "input_json")
    for event in events[:first_derived]:
        parser.feed_event(event)
    with pytest.raises(UsageError, match="input_json"):
        parser.feed_event(events[first_derived])


def test_a_refused_derived_event_leaves_the_parser_as_it_was():
    events = chat_helper(CHAT_PARALLEL)
    parser = StreamParser("openai_chat")
    derived = next(e for e in events if e.type == "content.delta")
    with pytest.raises(UsageError):
        parser.feed_event(derived)
    for event in events:
        parser.feed_event(event)
    assert parser.finish() == replay(CHAT_PARALLEL, "openai_chat")


# -- duck-typed objects: to_dict, model_dump, Mapping --------------------------------------------

CHAT_EVENTS = [
    chunk(tc(0, "call_1", "get_weather", '{"city": ')),
    chunk(tc(0, args='"Oslo"}')),
    chunk({}, "tool_calls"),
]


class ToDict:
    """An object with a plain ``to_dict()`` and no keyword arguments (not an SDK model)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        return self.data


class ModelDump:
    """An object with only pydantic's ``model_dump`` signature."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def model_dump(self, *, mode: str, exclude_unset: bool, by_alias: bool) -> dict[str, Any]:
        assert (mode, exclude_unset, by_alias) == ("json", True, True)
        return self.data


@pytest.mark.parametrize(
    "wrap",
    [dict, MappingProxyType, ToDict, ModelDump],
    ids=["dict", "Mapping", "to_dict()", "model_dump()"],
)
def test_duck_typed_events_give_the_round_of_plain_dicts(wrap):
    want = replay(sse(*CHAT_EVENTS, done=True), "openai_chat")
    assert want.committed()
    assert fed("openai_chat", [wrap(e) for e in CHAT_EVENTS]) == want


def test_a_pydantic_model_is_dumped_by_its_aliases_and_without_unset_fields():
    # Gemini's SDK (google-genai) models spell fields in snake_case and send camelCase
    # aliases; an unset field must stay absent (not null) for the adapter.
    pydantic = pytest.importorskip("pydantic")

    class Model(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(populate_by_name=True)

    class Call(Model):
        name: str
        args: dict[str, Any]
        will_continue: bool | None = pydantic.Field(default=None, alias="willContinue")

    class Part(Model):
        function_call: Call = pydantic.Field(alias="functionCall")

    class Content(Model):
        role: str
        parts: list[Part]

    class Candidate(Model):
        content: Content
        finish_reason: str | None = pydantic.Field(default=None, alias="finishReason")

    class Response(Model):
        candidates: list[Candidate]

    call = Call(name="get_weather", args={"city": "Oslo"})
    content = Content(role="model", parts=[Part(function_call=call)])
    response = Response(candidates=[Candidate(content=content, finish_reason="STOP")])
    round_ = fed("gemini", [response])
    assert [(c.name, c.arguments) for c in round_.committed()] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert round_ == fed(
        "gemini", [response.model_dump(mode="json", by_alias=True, exclude_unset=True)]
    )


@pytest.mark.parametrize("junk", [None, 3, "data: {}", b"{}", ["x"], object()])
def test_an_object_that_is_no_event_is_a_lost_event_that_fails_pending_calls(junk):
    parser = StreamParser("openai_chat")
    parser.feed_event(CHAT_EVENTS[0])
    parser.feed_event(junk)
    for event in CHAT_EVENTS[1:]:
        parser.feed_event(event)
    round_ = parser.finish()
    (call,) = round_.calls
    assert (call.state, call.error) == (CallState.FAILED, ErrorCode.PROTOCOL_VIOLATION)
