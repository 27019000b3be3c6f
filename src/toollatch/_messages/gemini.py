"""Gemini history: a ``model`` content with its parts, ``functionResponse`` parts for results.

References: https://ai.google.dev/gemini-api/docs/function-calling (the model's content is
appended to ``contents`` as is, followed by a ``user`` content holding one
``functionResponse`` part per call), https://ai.google.dev/gemini-api/docs/thought-signatures
(every ``thoughtSignature`` goes back exactly as received, on the part that carried it; a
missing one on a function call is a 400 for Gemini 3), and
https://googleapis.github.io/js-genai/classes/types.FunctionResponse.html (``response`` uses
the ``"output"`` key for a function's output and ``"error"`` for error details; ``id`` echoes
the call's id when the call had one).

What the adapter hands over, and how it is written back:

* thought parts, bare-signature parts and server-tool parts (``executableCode``,
  ``codeExecutionResult``...) are :class:`ReasoningBlock` / :class:`ServerToolBlock` whose data
  *is* the part: copied as is;
* a signature that rode on a ``functionCall`` part is a block ``{"thoughtSignature",
  "call_position"}``: it goes back on that call's part (matched by the call's position);
* a signature that rode on a text part is a block ``{"thoughtSignature", "text_block"}``:
  it goes back on the text part it follows (Gemini streams it on the last piece of a text
  run, often an empty one), or alone as ``{"text": "", "thoughtSignature"}`` when no text
  precedes it.

Gemini usually sends no call id; the adapter then makes one up (and records a
``SYNTHESIZED_ID`` anomaly). Such an id pairs results with calls inside toollatch but is never
sent to Gemini, which pairs them by order and name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._events import AnomalyKind, CallKey, ReasoningBlock, ServerToolBlock
from .._round import CallRecord, Round, TextSegment, ToolResult
from ._common import arguments_object

_CALL_SIGNATURE = "call_position"
_TEXT_SIGNATURE = "text_block"


def assistant_message(round_: Round) -> dict[str, Any]:
    """``{"role": "model", "parts": [...]}`` in stream order: text, thought and server parts,
    and ``{"functionCall": {"name", "args", "id"?}, "thoughtSignature"?}`` per named call."""
    content = round_.choices[0].content
    signatures = _call_signatures(content)
    synthesized = _synthesized(round_)
    parts: list[dict[str, Any]] = []
    for segment in content:
        if isinstance(segment, TextSegment):
            if segment.text:
                parts.append({"text": segment.text})
        elif isinstance(segment, ServerToolBlock):
            parts.append(dict(segment.data))
        elif isinstance(segment, ReasoningBlock):
            _add_reasoning(parts, segment.data)
        elif segment.name:
            part: dict[str, Any] = {"functionCall": _function_call(segment, synthesized)}
            signature = signatures.get(segment.key.part)
            if signature is not None:
                part["thoughtSignature"] = signature
            parts.append(part)
    return {"role": "model", "parts": parts}


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One ``user`` content with a ``functionResponse`` part per call, in call order:
    ``{"name", "response": {"output": ...} | {"error": ...}, "id"?}``."""
    if not pairs:
        return []
    synthesized = _synthesized(round_)
    parts = []
    for call, result in pairs:
        key = "error" if result.is_error else "output"
        response: dict[str, Any] = {"name": call.name, "response": {key: result.content}}
        if call.call_id and call.key not in synthesized:
            response["id"] = call.call_id
        parts.append({"functionResponse": response})
    return [{"role": "user", "parts": parts}]


def _function_call(call: CallRecord, synthesized: frozenset[CallKey]) -> dict[str, Any]:
    fc: dict[str, Any] = {"name": call.name, "args": arguments_object(call)}
    if call.call_id and call.key not in synthesized:
        fc["id"] = call.call_id
    return fc


def _add_reasoning(parts: list[dict[str, Any]], data: Mapping[str, Any]) -> None:
    """Append a reasoning block: a whole part, or a text signature put back on its text."""
    if _CALL_SIGNATURE in data:
        return  # written on its functionCall part
    if _TEXT_SIGNATURE not in data:
        parts.append(dict(data))
        return
    signature = data["thoughtSignature"]
    last = parts[-1] if parts else None
    if last is not None and last.keys() == {"text"}:
        last["thoughtSignature"] = signature
    else:
        parts.append({"text": "", "thoughtSignature": signature})


def _call_signatures(content: Sequence[object]) -> dict[int | str, Any]:
    """Call position -> the first thoughtSignature recorded for that call."""
    found: dict[int | str, Any] = {}
    for segment in content:
        if isinstance(segment, ReasoningBlock) and _CALL_SIGNATURE in segment.data:
            found.setdefault(segment.data[_CALL_SIGNATURE], segment.data["thoughtSignature"])
    return found


def _synthesized(round_: Round) -> frozenset[CallKey]:
    """Keys of the calls whose id toollatch made up (the adapter says so with an anomaly)."""
    return frozenset(
        a.key
        for a in round_.anomalies
        if a.kind is AnomalyKind.SYNTHESIZED_ID and a.key is not None
    )
