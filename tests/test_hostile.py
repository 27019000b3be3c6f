"""One event dropped, duplicated or made unreadable: no call commits with other arguments.

For every provider, Hypothesis builds a stream of one to three calls (arguments split into
fragments where the provider streams them), then mutates one event. Whatever the mutation and
however the bytes are cut into reads:

* a call commits only with the arguments its delivered fragments spell (a dropped or repeated
  fragment changes what was sent; nothing else may change it);
* an unreadable event fails every call that was pending when it came (it may have carried a
  fragment of any of them);
* the outcome is the same for the whole stream in one read and cut into random reads.

The unmutated stream must commit every call (asserted, and counted so that the property
cannot pass without ever seeing a commit).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from toollatch import CallState, StreamParser
from toollatch.testing import summary


@dataclass
class Stream:
    """Events of one provider's stream, as the JSON text of each, with what they carry."""

    provider: str
    framing: str
    texts: list[str] = field(default_factory=list)
    names: list[str | None] = field(default_factory=list)  # SSE event names
    fragments: dict[int, tuple[str, str]] = field(default_factory=dict)  # event -> (call, text)
    opens: dict[str, int] = field(default_factory=dict)  # call name -> its first event
    whole: bool = False  # each call in one event: a repeated event is a second, equal call
    texts_at_close: dict[str, str] | None = None  # the whole text again at each call's close

    def add(self, native: dict[str, Any] | str, name: str | None = None) -> int:
        self.texts.append(native if isinstance(native, str) else json.dumps(native))
        self.names.append(name)
        return len(self.texts) - 1

    def fragment(self, call: str, text: str, native: dict[str, Any], name: str | None = None):
        self.fragments[self.add(native, name)] = (call, text)

    def wire(self, texts: list[str], names: list[str | None]) -> bytes:
        if self.framing == "jsonl":
            return "".join(f"{t}\n" for t in texts).encode()
        return "".join(
            (f"event: {n}\n" if n else "") + f"data: {t}\n\n"
            for t, n in zip(texts, names, strict=True)
        ).encode()


Calls = list[tuple[str, str, list[str]]]  # (name, argument text, its fragments)


def _openai_chat(calls: Calls) -> Stream:
    s = Stream("openai_chat", "sse")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    for i, (name, _, pieces) in enumerate(calls):
        head = {
            "index": i,
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        s.opens[name] = s.add(chunk({"tool_calls": [head]}))
        for piece in pieces:
            entry = {"index": i, "function": {"arguments": piece}}
            s.fragment(name, piece, chunk({"tool_calls": [entry]}))
    s.add(chunk({}, "tool_calls"))
    s.add("[DONE]")
    return s


def _anthropic(calls: Calls) -> Stream:
    s = Stream("anthropic", "sse")

    def add(native: dict[str, Any]) -> int:
        return s.add(native, native["type"])

    add({"type": "message_start", "message": {"id": "m", "role": "assistant", "content": []}})
    for i, (name, _, pieces) in enumerate(calls):
        block = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}
        s.opens[name] = add({"type": "content_block_start", "index": i, "content_block": block})
        for piece in pieces:
            native = {
                "type": "content_block_delta",
                "index": i,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
            s.fragment(name, piece, native, "content_block_delta")
        add({"type": "content_block_stop", "index": i})
    add({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}})
    add({"type": "message_stop"})
    return s


def _openai_responses(calls: Calls) -> Stream:
    s = Stream("openai_responses", "sse", texts_at_close={n: t for n, t, _ in calls})

    def add(native: dict[str, Any]) -> int:
        return s.add(native, native["type"])

    add({"type": "response.created", "response": {"id": "r", "status": "in_progress"}})
    for i, (name, text, pieces) in enumerate(calls):
        item = {
            "type": "function_call",
            "id": f"fc_{i}",
            "call_id": f"call_{i}",
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        s.opens[name] = add({"type": "response.output_item.added", "output_index": i, "item": item})
        for piece in pieces:
            native = {
                "type": "response.function_call_arguments.delta",
                "item_id": f"fc_{i}",
                "output_index": i,
                "delta": piece,
            }
            s.fragment(name, piece, native, native["type"])
        add(
            {
                "type": "response.function_call_arguments.done",
                "item_id": f"fc_{i}",
                "output_index": i,
                "arguments": text,
            }
        )
        add(
            {
                "type": "response.output_item.done",
                "output_index": i,
                "item": {**item, "arguments": text, "status": "completed"},
            }
        )
    add({"type": "response.completed", "response": {"id": "r", "status": "completed"}})
    return s


def _bedrock(calls: Calls) -> Stream:
    s = Stream("bedrock", "jsonl")
    s.add({"messageStart": {"role": "assistant"}})
    for i, (name, _, pieces) in enumerate(calls):
        start = {"toolUse": {"toolUseId": f"tooluse_{i}", "name": name}}
        s.opens[name] = s.add({"contentBlockStart": {"contentBlockIndex": i, "start": start}})
        for piece in pieces:
            delta = {"contentBlockIndex": i, "delta": {"toolUse": {"input": piece}}}
            s.fragment(name, piece, {"contentBlockDelta": delta})
        s.add({"contentBlockStop": {"contentBlockIndex": i}})
    s.add({"messageStop": {"stopReason": "tool_use"}})
    return s


def _gemini(calls: Calls) -> Stream:
    # Gemini sends each call whole (its arguments as an object): one fragment per call.
    s = Stream("gemini", "sse", whole=True)
    for name, text, _ in calls:
        part = {"functionCall": {"name": name, "args": json.loads(text)}}
        native = {"candidates": [{"content": {"role": "model", "parts": [part]}}]}
        s.fragment(name, text, native)
        s.opens[name] = len(s.texts) - 1
    s.add({"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP"}]})
    return s


BUILDERS: dict[str, Callable[[Calls], Stream]] = {
    "openai_chat": _openai_chat,
    "anthropic": _anthropic,
    "openai_responses": _openai_responses,
    "bedrock": _bedrock,
    "gemini": _gemini,
}

_keys = st.sampled_from(["path", "cmd", "n", "mode", "tags"])
_leaves = st.text(alphabet='ab/.é"\\ ', max_size=6) | st.integers(-99, 999) | st.booleans()
_objects = st.dictionaries(_keys, _leaves | st.lists(_leaves, max_size=2), min_size=1, max_size=4)


@st.composite
def _calls(draw: st.DrawFn) -> Calls:
    out: Calls = []
    for i in range(draw(st.integers(1, 3))):
        text = json.dumps(draw(_objects), ensure_ascii=False)
        cuts = sorted(draw(st.sets(st.integers(1, len(text) - 1), max_size=5)))
        bounds = [0, *cuts, len(text)]
        out.append((f"f{i}", text, [text[a:b] for a, b in itertools.pairwise(bounds)]))
    return out


@st.composite
def _mutated(draw: st.DrawFn, provider: str) -> tuple[Stream, str, int, list[str], list[int]]:
    stream = BUILDERS[provider](draw(_calls()))
    how = draw(st.sampled_from(["none", "drop", "duplicate", "unreadable"]))
    at = draw(st.integers(0, len(stream.texts) - 1))
    texts = list(stream.texts)
    if how == "drop":
        del texts[at]
    elif how == "duplicate":
        texts.insert(at, texts[at])
    elif how == "unreadable":  # a proper prefix of a JSON text is never JSON
        texts[at] = texts[at][: draw(st.integers(1, len(texts[at]) - 1))]
    cuts = draw(st.lists(st.integers(0, 10_000), max_size=6))
    return stream, how, at, texts, cuts


def _delivered(stream: Stream, how: str, at: int) -> dict[str, str]:
    """Each call's argument text as the mutated stream spells it (a provider that repeats the
    whole text at the close spells it there: the fragments must agree with it, or the call
    fails)."""
    if stream.texts_at_close is not None:
        return stream.texts_at_close
    pieces = [(i, *stream.fragments[i]) for i in sorted(stream.fragments)]
    if how == "drop":
        pieces = [p for p in pieces if p[0] != at]
    elif how == "duplicate" and not stream.whole:
        pieces += [p for p in pieces if p[0] == at]
        pieces.sort(key=lambda p: p[0])
    elif how == "unreadable":
        pieces = [p for p in pieces if p[0] != at]
    texts: dict[str, str] = {}
    for _, call, text in pieces:
        texts[call] = texts.get(call, "") + text
    return texts


def _names(texts: list[str], stream: Stream, how: str, at: int) -> list[str | None]:
    names = list(stream.names)
    if how == "drop":
        del names[at]
    elif how == "duplicate":
        names.insert(at, names[at])
    return names


def _check(stream: Stream, how: str, at: int, texts: list[str], cuts: list[int]) -> int:
    """The property for one mutated stream; returns how many calls committed."""
    provider = stream.provider
    wire = stream.wire(texts, _names(texts, stream, how, at))
    whole = StreamParser(provider, framing=stream.framing)
    whole.feed(wire)
    round_ = whole.finish()
    pieces = StreamParser(provider, framing=stream.framing)
    bounds = [0, *sorted(c % (len(wire) + 1) for c in cuts), len(wire)]
    for a, b in itertools.pairwise(bounds):
        pieces.feed(wire[a:b])
    assert summary(pieces.finish()) == summary(round_)  # failures too: the reads do not matter

    delivered = _delivered(stream, how, at)
    committed = round_.committed()
    for call in committed:
        # (no fragment at all is a call without arguments: every provider sends it so)
        assert call.arguments == json.loads(delivered.get(call.name) or "{}")
        if how == "unreadable":
            # (an unreadable opening event: later events may still show the whole call)
            assert at <= stream.opens[call.name], "an unreadable event while it was pending"
    if how == "none":
        assert sorted(c.name for c in committed) == sorted(stream.opens)
    return len(committed)


@pytest.mark.parametrize("provider", sorted(BUILDERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_one_bad_event_never_commits_other_arguments(provider: str, data: st.DataObject) -> None:
    stream, how, at, texts, cuts = data.draw(_mutated(provider))
    if _check(stream, how, at, texts, cuts):
        event(f"{how}: a call committed")


@pytest.mark.parametrize("provider", sorted(BUILDERS))
def test_the_property_reaches_its_asserts_for_every_mutation(provider: str) -> None:
    # Fixed cases where calls do commit after each mutation, so the asserts above run (the
    # property's own examples are counted by Hypothesis's `event` statistics).
    calls = [
        (f"f{i}", f'{{"n": {i}, "path": "a/b"}}', ['{"n": ', f'{i}, "path": "a/b"}}'])
        for i in range(3)
    ]
    stream = BUILDERS[provider](calls)
    last = stream.opens["f2"]
    for how, at in (("none", 0), ("drop", last - 1), ("duplicate", 0), ("unreadable", 0)):
        texts = list(stream.texts)
        if how == "drop":
            del texts[at]
        elif how == "duplicate":
            texts.insert(at, texts[at])
        elif how == "unreadable":
            texts[at] = texts[at][:5]
        assert _check(stream, how, at, texts, [7, 100, 1000]) >= 1, how


# -- a whole arguments object is the call's whole text (ArgsDelta.whole) ----------------------


def _chat(*natives):
    parser = StreamParser("openai_chat")
    for native in natives:
        parser.feed_event(native)
    return parser.finish()


def _entry(**fields):
    return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **fields}]}}]}


_CHAT_HEAD = _entry(id="call_0", type="function", function={"name": "f", "arguments": ""})
_CHAT_END = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}


@pytest.mark.parametrize(
    "middle",
    [
        [
            _entry(function={"arguments": '{"a":'}),
            _entry(function={"arguments": {"b": 1}}),
            _entry(function={"arguments": "}"}),
        ],  # text + object + text would parse
        [_entry(function={"arguments": {"b": 1}}), _entry(function={"arguments": "x"})],
        [_entry(function={"arguments": {"b": 1}}), _entry(function={"arguments": {"c": 2}})],
        [
            _entry(function={"arguments": '{"'}),
            _entry(function={"arguments": []}),
            _entry(function={"arguments": 'a": 1}'}),
        ],  # a list is not arguments
        [
            _entry(function={"arguments": '{"a": 1'}),
            _entry(function=None),
            _entry(function={"arguments": "}"}),
        ],  # an entry that carries nothing: lost
        [
            _entry(function={"arguments": '{"a": 1'}),
            {"choices": None},
            _entry(function={"arguments": "}"}),
        ],  # a required member null: lost
        [
            _entry(function={"arguments": '{"a": 1'}),
            {"choices": [{"index": 0, "delta": None}]},
            _entry(function={"arguments": "}"}),
        ],
    ],
    ids=[
        "object-inside-text",
        "text-after-object",
        "two-objects",
        "list",
        "empty-entry",
        "choices-null",
        "delta-null",
    ],
)
def test_chat_arguments_that_are_not_one_text_never_commit(middle):
    round_ = _chat(_CHAT_HEAD, *middle, _CHAT_END)
    assert round_.committed() == ()
    assert round_.calls[0].state is CallState.FAILED


def test_chat_a_whole_arguments_object_alone_commits_as_sent():
    round_ = _chat(_CHAT_HEAD, _entry(function={"arguments": {"b": 1}}), _CHAT_END)
    assert [c.arguments for c in round_.committed()] == [{"b": 1}]
