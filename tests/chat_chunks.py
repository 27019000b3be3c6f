"""Builders of OpenAI Chat Completions chunks for hand-written transcripts."""

from __future__ import annotations

from typing import Any


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    index: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with a single choice."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish}],
        **extra,
    }


def tc(
    index: int | None = 0,
    call_id: str | None = None,
    name: str | None = None,
    args: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """A ``delta`` carrying one tool-call entry (keys left out when None)."""
    entry: dict[str, Any] = dict(extra)
    if index is not None:
        entry["index"] = index
    if call_id is not None:
        entry["id"] = call_id
        entry["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    entry["function"] = function
    return {"tool_calls": [entry]}


def fragments(index: int, text: str, size: int) -> list[dict[str, Any]]:
    """Continuation chunks carrying ``text`` in ``size``-character fragments."""
    return [chunk(tc(index, args=text[i : i + size])) for i in range(0, len(text), size)]


USAGE = {
    "id": "chatcmpl-test",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "test-model",
    "choices": [],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
}

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    {
        "name": "write_file",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
]
