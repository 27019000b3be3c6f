"""Whole (non-streaming) answers: a :class:`Turn` -> one provider's response body (pure).

What a client gets when it asks without streaming (the official SDKs' default): OpenAI's
``chat.completion`` (https://platform.openai.com/docs/api-reference/chat/object), the
Responses ``response`` object (the same object the stream's ``response.completed`` carries),
Anthropic's ``message`` (https://docs.anthropic.com/en/api/messages) and Gemini's
``GenerateContentResponse`` of ``:generateContent``.

A turn truncated at ``max_tokens`` keeps what the provider would have said before the cut:
OpenAI's formats carry the cut call's half text (arguments are a string there; chat reports
``length``, Responses ``incomplete``); Anthropic and Gemini carry arguments as an object, so
the cut call is left out, as Gemini's stream does. Argument text that is not a JSON object
cannot be an object: Anthropic gets :class:`NotWhole` (the server answers 400: the turn is
for streaming only), Gemini gets it as a JSON string, as its stream does.
"""

from __future__ import annotations

import json
from typing import Any

from ._script import Call, Reasoning, Text, Turn
from ._wire import CREATED, cut, usage_counts
from ._wire_gemini import gemini_parts
from ._wire_responses import response_object


class NotWhole(ValueError):
    """The turn cannot be answered without streaming (its message says why)."""


def whole_body(provider: str, turn: Turn, *, model: str, response_id: str) -> dict[str, Any]:
    """The non-streaming response body of ``provider`` for ``turn``; raises NotWhole."""
    if provider == "openai_chat":
        return _chat(turn, model, response_id)
    if provider == "openai_responses":
        return response_object(turn, model=model, response_id=response_id)
    if provider == "anthropic":
        return _anthropic(turn, model, response_id)
    return _gemini(turn, model, response_id)


def _chat(turn: Turn, model: str, response_id: str) -> dict[str, Any]:
    shown = cut(turn)
    text = "".join(i.text for i in shown.items if isinstance(i, Text))
    reasoning = "".join(i.text for i in shown.items if isinstance(i, Reasoning))
    calls = [
        {
            "id": c.call_id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in shown.items
        if isinstance(c, Call)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    finish = "length" if shown.truncated else ("tool_calls" if calls else "stop")
    prompt, completion = usage_counts(shown.items)
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "system_fingerprint": "fp_scripted",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _anthropic(turn: Turn, model: str, response_id: str) -> dict[str, Any]:
    shown = cut(turn)
    content: list[dict[str, Any]] = []
    for item in shown.items:
        if isinstance(item, Text):
            content.append({"type": "text", "text": item.text})
        elif isinstance(item, Reasoning):
            content.append({"type": "thinking", "thinking": item.text, "signature": "scripted"})
        elif item is not shown.cut_call:
            content.append(
                {"type": "tool_use", "id": item.call_id, "name": item.name, "input": _object(item)}
            )
    has_calls = any(block["type"] == "tool_use" for block in content)
    stop = "max_tokens" if shown.truncated else ("tool_use" if has_calls else "end_turn")
    prompt, completion = usage_counts(shown.items)
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }


def _object(call: Call) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise NotWhole(
            f"call {call.call_id!r} has argument text that is not a JSON object; "
            "this turn can only be streamed: send `stream: true`"
        )
    return value


def _gemini(turn: Turn, model: str, response_id: str) -> dict[str, Any]:
    shown = cut(turn)
    parts: list[dict[str, Any]] = []
    for item in shown.items:
        if item is not shown.cut_call:
            parts += gemini_parts(item)
    prompt, completion = usage_counts(shown.items)
    candidate = {
        "content": {"parts": parts or [{"text": ""}], "role": "model"},
        "finishReason": "MAX_TOKENS" if shown.truncated else "STOP",
        "index": 0,
    }
    return {
        "candidates": [candidate],
        "usageMetadata": {
            "promptTokenCount": prompt,
            "candidatesTokenCount": completion,
            "totalTokenCount": prompt + completion,
        },
        "modelVersion": model,
        "responseId": response_id,
    }
