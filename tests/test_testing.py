"""The public testing helpers, including the adapter conformance check on every adapter."""

from __future__ import annotations

import dataclasses

import pytest

from chat_chunks import chunk, tc
from toollatch.stages import ArgsDelta, CallKey, OpenAIChatAdapter, RoundEnded, adapter_class
from toollatch.testing import ConformanceError, byte_chunks, check_adapter, chunkings, split_at

OPENAI = [
    chunk(tc(0, "c1", "get_time", "")),
    chunk(tc(0, args='{"tz"')),
    chunk(tc(0, args=': "UTC"}')),
    chunk(finish="tool_calls"),
    {"choices": [], "usage": {"total_tokens": 3}},
]


def anthropic(cid="toolu_1"):
    return [
        {
            "type": "message_start",
            "message": {
                "id": "m",
                "role": "assistant",
                "content": [],
                "usage": {"input_tokens": 1},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": cid, "name": "get_time", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"tz": '},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '"UTC"}'},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]


RESPONSES = [
    {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_time",
            "arguments": "",
        },
    },
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_1",
        "output_index": 0,
        "delta": '{"tz": "UTC"}',
    },
    {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_1",
        "output_index": 0,
        "arguments": '{"tz": "UTC"}',
    },
    {
        "type": "response.output_item.done",
        "output_index": 0,
        "item": {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_time",
            "arguments": '{"tz": "UTC"}',
            "status": "completed",
        },
    },
    {"type": "response.completed", "response": {"id": "r", "status": "completed", "usage": {}}},
]

GEMINI = [
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "get_time", "args": {"tz": "UTC"}}}],
                },
                "index": 0,
            }
        ]
    },
    {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": ""}]},
                "finishReason": "STOP",
                "index": 0,
            }
        ]
    },
]

BEDROCK = [
    {"messageStart": {"role": "assistant"}},
    {
        "contentBlockStart": {
            "start": {"toolUse": {"toolUseId": "tu_1", "name": "get_time"}},
            "contentBlockIndex": 0,
        }
    },
    {
        "contentBlockDelta": {
            "delta": {"toolUse": {"input": '{"tz": "UTC"}'}},
            "contentBlockIndex": 0,
        }
    },
    {"contentBlockStop": {"contentBlockIndex": 0}},
    {"messageStop": {"stopReason": "tool_use"}},
    {"metadata": {"usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}}},
]

TRANSCRIPTS = {
    "openai_chat": (OPENAI, "c1", 3),
    "anthropic": (anthropic(), "toolu_1", 6),
    "openai_responses": (RESPONSES, "call_1", 4),
    "gemini": (GEMINI, None, 1),
    "bedrock": (BEDROCK, "tu_1", 4),
}


@pytest.mark.parametrize("provider", sorted(TRANSCRIPTS))
def test_every_adapter_passes_the_conformance_check(provider):
    transcript, call_id, end = TRANSCRIPTS[provider]
    cls = adapter_class(provider)
    expected = [{"name": "get_time", "arguments": {"tz": "UTC"}}]
    if call_id:
        expected[0]["id"] = call_id
    round_ = check_adapter(
        lambda: cls(attempt=3), transcript, expected_calls=expected, end_index=end
    )
    assert round_.calls[0].key.attempt == 3


class _EagerAdapter(OpenAIChatAdapter):
    """A broken adapter: it ends the round as soon as a call's text looks complete."""

    # (_feed: the subclass hook that every route in, dicts and frames, goes through)
    def _feed(self, event, sse_event=None):
        out = super()._feed(event, sse_event)
        if any(isinstance(e, ArgsDelta) and e.fragment.endswith("}") for e in out):
            out = [*out, RoundEnded(ending=__import__("toollatch").RoundEnd.NORMAL)]
        return out


class _KeyAdapter(OpenAIChatAdapter):
    """A broken adapter: its keys ignore the attempt."""

    def _feed(self, event, sse_event=None):
        return [
            dataclasses.replace(e, key=CallKey(0, 0, e.key.part))
            if getattr(e, "key", None) is not None
            else e
            for e in super()._feed(event, sse_event)
        ]


def test_conformance_check_catches_wrong_calls_keys_and_junk():
    with pytest.raises(ConformanceError, match="calls differ"):
        check_adapter(OpenAIChatAdapter, OPENAI, expected_calls=[{"name": "x", "arguments": {}}])
    with pytest.raises(ConformanceError, match="attempt"):
        check_adapter(lambda: _KeyAdapter(attempt=2), OPENAI)

    class Fragile(OpenAIChatAdapter):
        def _feed(self, event, sse_event=None):
            return super()._feed(event, sse_event) if event.get("choices") != "x" else 1 / 0

    with pytest.raises(ConformanceError, match="raised ZeroDivisionError"):
        check_adapter(Fragile, OPENAI)


def test_conformance_check_catches_an_early_end():
    # The eager adapter ends the round on the chunk whose text ends with "}" — before the real
    # finish_reason — so a call could commit from a prefix: the check must say so.
    transcript = [
        chunk(tc(0, "c1", "get_time", "{}")),
        chunk(tc(0, args=" ")),
        chunk(finish="tool_calls"),
    ]
    round_ = check_adapter(OpenAIChatAdapter, transcript, end_index=2)
    assert round_.calls[0].arguments == {}
    with pytest.raises(ConformanceError, match="not at the terminal event 2"):
        check_adapter(_EagerAdapter, transcript, end_index=2)


def test_chunkers():
    data = bytes(range(20))
    assert b"".join(split_at(data, [5, 3, 5, 99, -1])) == data
    assert [len(p) for p in split_at(data, [5, 3])] == [3, 2, 15]
    assert byte_chunks(b"", 3) == [b""]
    assert all(b"".join(p) == data for p in chunkings(data))
    assert len(list(chunkings(data, random_splits=5))) == 8
