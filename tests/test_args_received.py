"""``observe_arguments=True`` (the assembler's ``ArgsReceived`` notices, which ``toollatch
proxy --calls stream`` forwards): in order, a call's notices concatenate to exactly the text
its buffer holds, for every recorded stream of every provider at every chunking and for the
quirks a chat server shows (an object sent whole, reused and missing indices, interleaved
calls, ids and names repeated); the Round is the same as without the notices."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import CORPUS, corpus_dir
from toollatch import Limits, PreviewPolicy, StreamParser
from toollatch.stages import ArgsReceived, CallKey, detect
from toollatch.testing import chunkings, sse, summary


def _files() -> list[str]:
    path = CORPUS / "expected.json"
    return sorted(json.loads(path.read_text())) if path.is_file() else ["<corpus absent>"]


def streamed_text(
    data: bytes, chunks: list[bytes], limits: Limits | None = None, previews: Any = None
) -> tuple[Any, dict[CallKey, str]]:
    """The Round, and each call's text as its ``ArgsReceived`` notices tell it."""
    provider, framing = detect(data[:8192])
    parser = StreamParser(
        provider, framing=framing, observe_arguments=True, limits=limits, previews=previews
    )
    notices = []
    for chunk in chunks:
        notices += parser.feed(chunk)
    round_ = parser.finish()
    notices += parser.finish_notices
    texts: dict[CallKey, str] = {}
    for notice in notices:
        if isinstance(notice, ArgsReceived):
            texts[notice.key] = texts.get(notice.key, "") + notice.text
    return round_, texts


def plain_round(data: bytes, chunks: list[bytes], limits: Limits | None = None) -> Any:
    provider, framing = detect(data[:8192])
    parser = StreamParser(provider, framing=framing, limits=limits)
    for chunk in chunks:
        parser.feed(chunk)
    return parser.finish()


def check(data: bytes, limits: Limits | None = None) -> None:
    for chunks in chunkings(data, random_splits=2):
        round_, texts = streamed_text(data, chunks, limits)
        assert summary(round_) == summary(plain_round(data, chunks, limits))
        records = [r for c in round_.choices for r in c.calls]
        for record in records:
            if "/" in str(record.key.part):  # a multi_tool_use.parallel call's inner call
                continue
            assert texts.get(record.key, "") == record.arguments_text, record.key
        assert set(texts) <= {r.key for r in records}


@pytest.mark.corpus
@pytest.mark.parametrize("rel", _files())
def test_every_recorded_stream_announces_exactly_its_buffers_text(rel: str) -> None:
    check((corpus_dir() / rel).read_bytes())


def chunk(*calls: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"tool_calls": list(calls)} if calls else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


QUIRKY = {
    # Q9: arguments as an object (llama.cpp#20198): announced as its one serialized text
    "object": [
        chunk({"index": 0, "id": "a", "function": {"name": "f", "arguments": {"x": [1, "é"]}}}),
        chunk(finish="tool_calls"),
    ],
    # Q2: parallel calls sharing index 0, each whole (litellm#5231)
    "shared": [
        chunk({"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}}),
        chunk({"index": 0, "id": "b", "function": {"name": "f", "arguments": '{"x": 2}'}}),
        chunk(finish="tool_calls"),
    ],
    # Q23 / bifrost#1829: fragments of two calls interleaved; Q3/Q5 ids and names repeated
    "interleaved": [
        chunk({"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}}),
        chunk({"index": 1, "id": "b", "function": {"name": "f", "arguments": '{"y"'}}),
        chunk({"index": 0, "id": "a", "function": {"name": "f", "arguments": ": 1}"}}),
        chunk({"index": 1, "id": "b", "function": {"name": "f", "arguments": ": 2}"}}),
        chunk(finish="tool_calls"),
    ],
    # Q1 + Q7: no index, arguments before the name and id
    "no_index": [
        chunk({"function": {"arguments": '{"x": '}}),
        chunk({"id": "a", "function": {"name": "f", "arguments": "1}"}}),
        chunk(finish="stop"),
    ],
    # a fragment after an object sent whole: refused, so in no notice
    "mixed": [
        chunk({"index": 0, "id": "a", "function": {"name": "f", "arguments": {"x": 1}}}),
        chunk({"index": 0, "function": {"arguments": "junk"}}),
        chunk(finish="tool_calls"),
    ],
}


@pytest.mark.parametrize("name", sorted(QUIRKY))
def test_quirky_chat_streams_announce_exactly_the_buffers_text(name: str) -> None:
    check(sse(*QUIRKY[name], done=True))


def test_a_call_over_its_byte_limit_announces_nothing_past_the_limit() -> None:
    data = sse(
        chunk({"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x": "'}}),
        *[chunk({"index": 0, "function": {"arguments": "abcdefgh"}}) for _ in range(10)],
        chunk(finish="tool_calls"),
        done=True,
    )
    round_, texts = streamed_text(data, [data], Limits(max_argument_bytes=40))
    [record] = round_.calls
    assert record.error == "arguments_exceed_max_bytes"
    assert len(texts[record.key].encode()) <= 40  # what was announced before it failed


def test_previews_and_the_notices_together() -> None:
    data = sse(*QUIRKY["interleaved"], done=True)
    for chunks in chunkings(data):
        round_, texts = streamed_text(data, chunks, previews=PreviewPolicy())
        assert {r.key: r.arguments_text for r in round_.calls} == texts


def test_without_the_flag_no_notice() -> None:
    data = sse(*QUIRKY["interleaved"], done=True)
    parser = StreamParser("openai_chat")
    assert not [n for n in parser.feed(data) if isinstance(n, ArgsReceived)]


def test_a_call_whose_text_comes_only_with_its_close_commits_with_previews_on() -> None:
    # Responses' function_call_arguments.done (or output_item.done) carrying the whole text
    # of a call that had no delta (LM Studio): the close used to return early when appending
    # that text gave a preview update, so the call was never closed and failed never_closed.
    done = {
        "type": "response.output_item.done",
        "output_index": 0,
        "item": {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "f",
            "arguments": '{"city": "Oslo"}',
            "status": "completed",
        },
    }
    added = {**done, "type": "response.output_item.added"}
    added["item"] = {**done["item"], "arguments": "", "status": "in_progress"}
    completed = {"type": "response.completed", "response": {"status": "completed", "output": []}}
    data = sse(added, done, completed)
    parser = StreamParser("openai_responses", previews=PreviewPolicy())
    parser.feed(data)
    [record] = parser.finish().calls
    assert record.state == "committed", (record.error, record.detail)
