"""Anthropic Messages history: content blocks in stream order, ``tool_result`` blocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._events import ReasoningBlock, ServerToolBlock
from .._round import CallRecord, Round, TextRun, ToolResult
from ._common import arguments_object


def assistant_messages(round_: Round) -> list[dict[str, Any]]:
    """``[{"role": "assistant", "content": [...]}]`` with thinking blocks (and signatures) and
    server-tool blocks byte-for-byte, text blocks, and ``tool_use`` blocks with parsed input."""
    content: list[dict[str, Any]] = []
    for item in round_.choices[0].content:
        if isinstance(item, TextRun):
            if item.text:  # the API rejects empty text blocks
                content.append({"type": "text", "text": item.text})
        elif isinstance(item, ReasoningBlock | ServerToolBlock):
            content.append(dict(item.data))
        elif item.name:
            content.append(
                {
                    "type": "tool_use",
                    "id": item.call_id,
                    "name": item.name,
                    "input": arguments_object(item),
                }
            )
    return [{"role": "assistant", "content": content}]


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One user message holding a ``tool_result`` block per call, in call order."""
    if not pairs:
        return []
    blocks = [
        {
            "type": "tool_result",
            "tool_use_id": call.call_id,
            "content": result.content,
            "is_error": result.is_error,
        }
        for call, result in pairs
    ]
    return [{"role": "user", "content": blocks}]
