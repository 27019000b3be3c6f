"""Gemini wire encoder: a :class:`Turn` -> the ``streamGenerateContent?alt=sse`` stream (pure).

Shape as in https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent
and the recorded ``gemini/*.sse``: ``data: {GenerateContentResponse}`` events separated by
CRLF CRLF (as Google sends them), no ``event:`` lines, no ``[DONE]``; each chunk holds
``candidates[0].content.parts`` (``text``, ``{"text", "thought": true}``, or a whole
``functionCall {name, args}``: Gemini never streams argument text); the last chunk carries
``finishReason`` (``STOP`` also for tool calls, ``MAX_TOKENS``) and ``usageMetadata``.

Gemini pairs results with calls by order and name, and this server, like the Gemini
Developer API, sends no ``functionCall.id``. A truncated turn leaves the cut call out
(a call arrives whole or not at all). Argument text that is not a JSON object is sent as a
JSON string in ``args`` (the nearest a Gemini stream can come to invalid arguments).
"""

from __future__ import annotations

import json
from typing import Any

from ._script import Call, Item, Reasoning, Text, Turn
from ._wire import WireEvent, cut, pieces, sse, usage_counts


def gemini_events(turn: Turn, *, model: str, response_id: str) -> list[WireEvent]:
    """The Gemini stream for ``turn`` (see the module docstring)."""
    shown = cut(turn)
    parts_per_chunk: list[tuple[list[dict[str, Any]], bool]] = []
    for item in shown.items:
        if item is shown.cut_call:
            continue
        parts_per_chunk += _parts(item)
    if not parts_per_chunk:
        parts_per_chunk.append(([{"text": ""}], False))
    prompt, completion = usage_counts(shown.items)
    usage = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion,
        "totalTokenCount": prompt + completion,
    }
    out = []
    last = len(parts_per_chunk) - 1
    for n, (parts, is_call) in enumerate(parts_per_chunk):
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        body: dict[str, Any] = {"candidates": [candidate]}
        if n == last:
            candidate["finishReason"] = "MAX_TOKENS" if shown.truncated else "STOP"
            body["usageMetadata"] = usage
        body["modelVersion"] = model
        body["responseId"] = response_id
        out.append(WireEvent(sse(body, eol="\r\n"), in_arguments=is_call))
    return out


def _parts(item: Item) -> list[tuple[list[dict[str, Any]], bool]]:
    """The chunks for one item: ``(parts, is_call)``, one chunk per text piece or call."""
    if isinstance(item, Text):
        return [([{"text": p}], False) for p in pieces(item.text, item.chunk_chars)]
    if isinstance(item, Reasoning):
        return [([{"text": item.text, "thought": True}], False)]
    return [([{"functionCall": {"name": item.name, "args": _args(item)}}], True)]


def gemini_parts(item: Item) -> list[dict[str, Any]]:
    """The parts of one item in a whole answer (text in one part, not in pieces)."""
    if isinstance(item, Text):
        return [{"text": item.text}]
    if isinstance(item, Reasoning):
        return [{"text": item.text, "thought": True}]
    return [{"functionCall": {"name": item.name, "args": _args(item)}}]


def _args(call: Call) -> Any:
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return call.arguments
    return value if isinstance(value, dict) else call.arguments
