"""OpenAI Responses wire encoder: a :class:`Turn` -> the Responses SSE stream (pure).

Shape as in https://platform.openai.com/docs/api-reference/responses-streaming and the
recorded ``openai_responses/function_call_llm_cli.sse``: every event has an ``event:`` line
naming its ``type`` and a ``sequence_number`` counting from 0; ``response.created`` and
``response.in_progress`` first; per output item ``response.output_item.added`` ... ``.done``
(text: ``content_part.added``, ``output_text.delta``/``.done``, ``content_part.done``;
function calls: ``function_call_arguments.delta``/``.done``, item id ``fc_<call_id>``);
then ``response.completed``, or ``response.incomplete`` with ``incomplete_details.reason:
"max_output_tokens"`` right after the cut call's last fragment.
"""

from __future__ import annotations

from typing import Any

from ._script import Call, Item, Reasoning, Text, Turn
from ._wire import CREATED, WireEvent, cut, pieces, sse, usage_counts


class _Stream:
    """Numbers the events as they are added (``sequence_number``)."""

    def __init__(self) -> None:
        self.events: list[WireEvent] = []
        self.item_ids: set[str] = set()

    def add(self, kind: str, body: dict[str, Any], in_arguments: bool = False) -> None:
        payload = {"type": kind, **body, "sequence_number": len(self.events)}
        self.events.append(WireEvent(sse(payload, event=kind), in_arguments=in_arguments))


def responses_events(turn: Turn, *, model: str, response_id: str) -> list[WireEvent]:
    """The Responses stream for ``turn`` (see the module docstring)."""
    shown = cut(turn)
    stream = _Stream()
    stream.add("response.created", {"response": _response(response_id, model, "in_progress")})
    stream.add("response.in_progress", {"response": _response(response_id, model, "in_progress")})
    done_items: list[dict[str, Any]] = []
    for index, item in enumerate(shown.items):
        if isinstance(item, Text):
            done_items.append(_message(stream, index, item, response_id))
        elif isinstance(item, Reasoning):
            done_items.append(_reasoning(stream, index, item, response_id))
        elif item is shown.cut_call:
            _function_call(stream, index, item, finished=False)
        else:
            done_items.append(_function_call(stream, index, item, finished=True))
    final = _final(shown.truncated, shown.items, response_id, model, done_items)
    kind = "response.incomplete" if shown.truncated else "response.completed"
    stream.add(kind, {"response": final})
    return stream.events


def response_object(turn: Turn, *, model: str, response_id: str) -> dict[str, Any]:
    """The whole ``response`` object for ``turn``, as a request without streaming gets it:
    the object the stream's last event carries, the cut call included (``incomplete``)."""
    stream = _Stream()  # the items are built as the stream builds them; its events unused
    shown = cut(turn)
    output: list[dict[str, Any]] = []
    for index, item in enumerate(shown.items):
        if isinstance(item, Text):
            output.append(_message(stream, index, item, response_id))
        elif isinstance(item, Reasoning):
            output.append(_reasoning(stream, index, item, response_id))
        else:
            done = _function_call(stream, index, item, finished=True)
            if item is shown.cut_call:
                done["status"] = "incomplete"
            output.append(done)
    return _final(shown.truncated, shown.items, response_id, model, output)


def _final(
    truncated: bool,
    items: tuple[Item, ...],
    response_id: str,
    model: str,
    output: list[dict[str, Any]],
) -> dict[str, Any]:
    prompt, completion = usage_counts(items)
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }
    if truncated:
        final = _response(response_id, model, "incomplete", output, usage)
        final["incomplete_details"] = {"reason": "max_output_tokens"}
        return final
    return _response(response_id, model, "completed", output, usage)


def _response(
    response_id: str,
    model: str,
    status: str,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": output or [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def _message(stream: _Stream, index: int, item: Text, response_id: str) -> dict[str, Any]:
    item_id = f"msg_{response_id}_{index}"
    where = {"item_id": item_id, "output_index": index}
    added = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant"}
    stream.add(
        "response.output_item.added", {"output_index": index, "item": {**added, "content": []}}
    )
    empty = {"type": "output_text", "text": "", "annotations": []}
    stream.add("response.content_part.added", {**where, "content_index": 0, "part": empty})
    for piece in pieces(item.text, item.chunk_chars):
        body = {**where, "content_index": 0, "delta": piece, "logprobs": []}
        stream.add("response.output_text.delta", body)
    stream.add(
        "response.output_text.done",
        {**where, "content_index": 0, "text": item.text, "logprobs": []},
    )
    part = {**empty, "text": item.text}
    stream.add("response.content_part.done", {**where, "content_index": 0, "part": part})
    done = {**added, "status": "completed", "content": [part]}
    stream.add("response.output_item.done", {"output_index": index, "item": done})
    return done


def _reasoning(stream: _Stream, index: int, item: Reasoning, response_id: str) -> dict[str, Any]:
    item_id = f"rs_{response_id}_{index}"
    stream.add(
        "response.output_item.added",
        {"output_index": index, "item": {"id": item_id, "type": "reasoning", "summary": []}},
    )
    summary = [{"type": "summary_text", "text": item.text}]
    done = {"id": item_id, "type": "reasoning", "summary": summary}
    stream.add("response.output_item.done", {"output_index": index, "item": done})
    return done


def _function_call(stream: _Stream, index: int, call: Call, *, finished: bool) -> dict[str, Any]:
    item_id = f"fc_{call.call_id}"
    if item_id in stream.item_ids:  # a script reusing a call id: items keep their own ids
        item_id = f"{item_id}_{index}"
    stream.item_ids.add(item_id)
    head = {"id": item_id, "type": "function_call", "call_id": call.call_id, "name": call.name}
    added = {**head, "status": "in_progress", "arguments": ""}
    stream.add("response.output_item.added", {"output_index": index, "item": added})
    where = {"item_id": item_id, "output_index": index}
    for piece in pieces(call.arguments, call.fragment_chars):
        stream.add("response.function_call_arguments.delta", {**where, "delta": piece}, True)
    done = {**head, "status": "completed", "arguments": call.arguments}
    if finished:
        body = {**where, "name": call.name, "arguments": call.arguments}
        stream.add("response.function_call_arguments.done", body)
        stream.add("response.output_item.done", {"output_index": index, "item": done})
    return done
