"""OpenAI Responses API history: input items in stream order, ``function_call_output`` items.

The Responses API has no single "assistant message": a model turn is a list of output items
(reasoning, messages, function calls, hosted tool calls), and the next request passes them back
as *input items*. Reference: https://platform.openai.com/docs/api-reference/responses/create
(``input`` item types ``message``, ``reasoning``, ``function_call``, ``function_call_output``)
and https://platform.openai.com/docs/guides/function-calling (results are paired by
``call_id``).

Both builders return input items, to append to the next request's ``input``::

    request["input"] += assistant_messages(round_)
    request["input"] += tool_results_messages(round_, results)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._events import ReasoningBlock, ServerToolBlock
from .._round import CallRecord, Round, TextRun, ToolResult
from ._common import arguments_text


def assistant_messages(round_: Round) -> list[dict[str, Any]]:
    """Choice 0's output items in stream order, as input items for the next request.

    * reasoning items and hosted-tool items (``tool_search_call``, ``web_search_call``...)
      exactly as the provider sent them in ``response.output_item.done`` (a reasoning item
      keeps its ``encrypted_content``);
    * each run of text as ``{"type": "message", "role": "assistant", "content":
      [{"type": "output_text", "text"}]}``;
    * each named call as ``{"type": "function_call", "call_id", "name", "arguments"}`` with
      the exact argument text (``"{}"`` when it is not a JSON object), plus the provider's
      item ``id`` when it sent one (the API links a reasoning item to the item after it).
    """
    items: list[dict[str, Any]] = []
    for item in round_.choices[0].content:
        if isinstance(item, TextRun):
            if item.text:
                items.append(_text_item(item.text))
        elif isinstance(item, ReasoningBlock | ServerToolBlock):
            items.append(dict(item.data))
        elif item.name:
            items.append(_function_call_item(item))
    return items


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One ``{"type": "function_call_output", "call_id", "output"}`` item per call, in call
    order (an error result's ``output`` is its ``"<code>: <detail>"`` text)."""
    return [
        {"type": "function_call_output", "call_id": call.call_id, "output": result.content}
        for call, result in pairs
    ]


def _text_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def _function_call_item(call: CallRecord) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": arguments_text(call),
    }
    # The adapter keys a call by its item id, or by its output index when a server sent none.
    if isinstance(call.key.part, str) and call.key.part:
        item["id"] = call.key.part
    return item
