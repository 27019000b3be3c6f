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
* a signature that rode on a ``functionCall`` part is in that call's ``extras``: it goes back
  on the call's part;
* a signature that rode on a text part is a block ``{"thoughtSignature", "text_block"}``:
  it goes back on the text part it follows (Gemini streams it on the last piece of a text
  run, often an empty one), or alone as ``{"text": "", "thoughtSignature"}`` when no text
  precedes it.

Gemini usually sends no call id; the adapter then makes one up (the call's ``id_made_up``).
Such an id pairs results with calls inside toollatch but is never sent to Gemini, which pairs
them by order and name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._events import ReasoningBlock, ServerToolBlock
from .._round import CallRecord, Round, TextRun, ToolResult
from ._common import arguments_object

_TEXT_SIGNATURE = "text_block"


def assistant_messages(round_: Round) -> list[dict[str, Any]]:
    """``[{"role": "model", "parts": [...]}]`` in stream order: text, thought and server parts,
    and ``{"functionCall": {"name", "args", "id"?}, "thoughtSignature"?}`` per named call."""
    parts: list[dict[str, Any]] = []
    for item in round_.choices[0].content:
        if isinstance(item, TextRun):
            if item.text:
                parts.append({"text": item.text})
        elif isinstance(item, ServerToolBlock):
            parts.append(dict(item.data))
        elif isinstance(item, ReasoningBlock):
            _add_reasoning(parts, item.data)
        elif item.name:
            fc: dict[str, Any] = {"name": item.name, "args": arguments_object(item)}
            if not item.id_made_up:
                fc["id"] = item.call_id
            parts.append({"functionCall": fc, **item.extras})
    return [{"role": "model", "parts": parts}]


def tool_results_messages(
    round_: Round, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """One ``user`` content with a ``functionResponse`` part per call, in call order:
    ``{"name", "response": {"output": ...} | {"error": ...}, "id"?}``."""
    if not pairs:
        return []
    parts = []
    for call, result in pairs:
        key = "error" if result.is_error else "output"
        response: dict[str, Any] = {"name": call.name, "response": {key: result.content}}
        if not call.id_made_up:
            response["id"] = call.call_id
        parts.append({"functionResponse": response})
    return [{"role": "user", "parts": parts}]


def _add_reasoning(parts: list[dict[str, Any]], data: Mapping[str, Any]) -> None:
    """Append a reasoning block: a whole part, or a text signature put back on its text."""
    if _TEXT_SIGNATURE not in data:
        parts.append(dict(data))
        return
    signature = data["thoughtSignature"]
    last = parts[-1] if parts else None
    if last is not None and last.keys() == {"text"}:
        last["thoughtSignature"] = signature
    else:
        parts.append({"text": "", "thoughtSignature": signature})
