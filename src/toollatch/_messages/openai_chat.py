"""OpenAI Chat Completions history: an assistant message with ``tool_calls``, tool messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._adapters.openai_chat import extra_block
from .._round import CallRecord, Round, ToolResult
from ._common import arguments_text


def assistant_message(round_: Round) -> dict[str, Any]:
    """``{"role": "assistant", "content", "tool_calls"?, "reasoning_content"?}``.

    ``arguments`` are the exact strings the model produced (a failed call whose text is not a
    JSON object is written as ``"{}"``); nameless calls are left out.
    """
    message: dict[str, Any] = {"role": "assistant", "content": round_.text or None}
    extras = {b.block: b.data["extra_content"] for b in round_.blocks if "extra_content" in b.data}
    calls = []
    for c in round_.calls:
        if not c.name:
            continue
        entry: dict[str, Any] = {
            "id": c.history_id,
            "type": "function",
            "function": {"name": c.name, "arguments": arguments_text(c)},
        }
        extra = extras.get(extra_block(c.key))
        if extra is not None:  # Q20: Gemini's thought signature travels back with its call
            entry["extra_content"] = extra
        calls.append(entry)
    if calls:
        message["tool_calls"] = calls
    for block in round_.blocks:
        reasoning = block.data.get("reasoning_content")
        if isinstance(reasoning, str):
            message["reasoning_content"] = reasoning
    return message


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One ``{"role": "tool", "tool_call_id", "content"}`` message per call, in call order."""
    return [
        {"role": "tool", "tool_call_id": call.history_id, "content": result.content}
        for call, result in pairs
    ]
