"""Amazon Bedrock Converse history: ``ContentBlock`` unions in stream order, ``toolResult``.

References: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ContentBlock.html
(one member per block: ``text``, ``reasoningContent``, ``toolUse``, ``toolResult``...) and
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ToolResultBlock.html
(``toolUseId``, ``content`` as a list of ``ToolResultContentBlock``, ``status``
``success | error``). Tool results go back in a ``user`` message, one ``toolResult`` block per
``toolUse`` of the assistant message (https://docs.aws.amazon.com/bedrock/latest/userguide/tool-use.html).

The adapter already hands reasoning (``{"reasoningContent": ...}``, signature included) and
server-tool blocks (``{"toolUse": {..., "type": "server_tool_use"}}``, ``{"toolResult": ...}``)
over in this shape; they are copied as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._events import ReasoningBlock, ServerToolBlock
from .._round import CallRecord, Round, TextRun, ToolResult
from ._common import arguments_object


def assistant_messages(round_: Round) -> list[dict[str, Any]]:
    """``[{"role": "assistant", "content": [...]}]``: non-blank ``{"text"}`` blocks, reasoning and
    server-tool blocks byte-for-byte, and ``{"toolUse": {"toolUseId", "name", "input"}}`` per
    named call with the parsed input (``{}`` when the text is not a JSON object)."""
    content: list[dict[str, Any]] = []
    for item in round_.choices[0].content:
        if isinstance(item, TextRun):
            # Converse rejects blank (even whitespace-only) text blocks with a
            # ValidationException "The text field in the ContentBlock object ... is blank".
            if item.text.strip():
                content.append({"text": item.text})
        elif isinstance(item, ReasoningBlock | ServerToolBlock):
            content.append(dict(item.data))
        elif item.name:
            tool_use = {
                "toolUseId": item.call_id,
                "name": item.name,
                "input": arguments_object(item),
            }
            content.append({"toolUse": tool_use})
    return [{"role": "assistant", "content": content}]


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One user message holding a ``toolResult`` block per call, in call order, with the
    result as one text block and ``status`` ``error`` or ``success``."""
    if not pairs:
        return []
    blocks = [
        {
            "toolResult": {
                "toolUseId": call.call_id,
                "content": [{"text": result.content}],
                "status": "error" if result.is_error else "success",
            }
        }
        for call, result in pairs
    ]
    return [{"role": "user", "content": blocks}]
