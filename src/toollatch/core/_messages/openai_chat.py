"""OpenAI Chat Completions history: an assistant message with ``tool_calls``, tool messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._round import CallRecord, Round, ToolResult
from ._common import arguments_text


def assistant_messages(round_: Round) -> list[dict[str, Any]]:
    """``[{"role": "assistant", "content", "tool_calls"?, "reasoning_content"?}]``.

    ``arguments`` are the exact strings the model produced (a failed call whose text is not a
    JSON object is written as ``"{}"``); nameless calls are left out.
    """
    message: dict[str, Any] = {"role": "assistant", "content": round_.text or None}
    calls = []
    for c in round_.calls:
        if not c.name:
            continue
        entry: dict[str, Any] = {
            "id": c.call_id,
            "type": "function",
            "function": {"name": c.name, "arguments": arguments_text(c)},
            **c.extras,  # Q20: Gemini's thought signature (extra_content) goes back with it
        }
        calls.append(entry)
    if calls:
        message["tool_calls"] = calls
    for block in round_.blocks:
        reasoning = block.data.get("reasoning_content")
        if isinstance(reasoning, str):
            message["reasoning_content"] = reasoning
    return [message]


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One ``{"role": "tool", "tool_call_id", "content"}`` message per call, in call order."""
    return [
        {"role": "tool", "tool_call_id": call.call_id, "content": result.content}
        for call, result in pairs
    ]
