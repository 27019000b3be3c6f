"""Anthropic Messages history: content blocks in stream order, ``tool_result`` blocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._events import ReasoningBlock, ServerToolBlock
from .._round import CallRecord, Round, TextSegment, ToolResult
from ._common import arguments_object


def assistant_message(round_: Round) -> dict[str, Any]:
    """``{"role": "assistant", "content": [...]}`` with thinking blocks (and signatures) and
    server-tool blocks byte-for-byte, text blocks, and ``tool_use`` blocks with parsed input."""
    content: list[dict[str, Any]] = []
    for segment in round_.choices[0].content:
        if isinstance(segment, TextSegment):
            if segment.text:  # the API rejects empty text blocks
                content.append({"type": "text", "text": segment.text})
        elif isinstance(segment, ReasoningBlock | ServerToolBlock):
            content.append(dict(segment.data))
        elif segment.name:
            content.append(
                {
                    "type": "tool_use",
                    "id": segment.history_id,
                    "name": segment.name,
                    "input": arguments_object(segment),
                }
            )
    return {"role": "assistant", "content": content}


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One user message holding a ``tool_result`` block per call, in call order."""
    if not pairs:
        return []
    blocks = [
        {
            "type": "tool_result",
            "tool_use_id": call.history_id,
            "content": result.content,
            "is_error": result.is_error,
        }
        for call, result in pairs
    ]
    return [{"role": "user", "content": blocks}]
