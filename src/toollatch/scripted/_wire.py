"""Wire encoders: a :class:`Turn` -> the SSE events one provider streams for it (pure).

Each encoder returns :class:`WireEvent` values, one per SSE event, in order; the server only
adds the delays and the faults. Shapes follow the recorded streams in ``shared/fixtures`` and
the providers' references:

* OpenAI Chat Completions: https://platform.openai.com/docs/api-reference/chat-streaming
  (``chat.completion.chunk``; ``stream_options.include_usage`` adds a last chunk with
  ``choices: []`` and ``usage``, and ``"usage": null`` on every other chunk; ``data: [DONE]``);
* Anthropic Messages: https://docs.anthropic.com/en/api/messages-streaming (``event:`` lines;
  a truncated last ``tool_use`` block gets no ``content_block_stop``, as in the recorded
  ``anthropic/max_tokens_truncated_tool_use.sse``);
* OpenAI Responses: see :mod:`._wire_responses`; Gemini: see :mod:`._wire_gemini`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ._script import Call, Item, Reasoning, Text, Turn

CREATED = 1767225600
"""A fixed ``created`` timestamp (2026-01-01): the encoders are pure, and a stream must not
depend on the clock."""


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One SSE event as the bytes sent for it."""

    data: bytes
    """The whole event, blank line included."""
    in_arguments: bool = False
    """True for an argument fragment (the default place of a stall)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cut:
    """A turn's items as streamed: the last call cut to half its text when truncated."""

    items: tuple[Item, ...]
    """The items, the cut call holding only the text that is sent."""
    truncated: bool
    """True when the turn stops at ``max_tokens``."""
    cut_call: Call | None
    """The cut call (its text already cut), when truncated."""


def cut(turn: Turn) -> Cut:
    """The items streamed for ``turn``: for ``stop="max_tokens"`` the last call keeps the
    first half of its argument text and nothing follows it."""
    if turn.stop != "max_tokens":
        return Cut(items=turn.items, truncated=False, cut_call=None)
    last = max(i for i, item in enumerate(turn.items) if isinstance(item, Call))
    call = turn.items[last]
    assert isinstance(call, Call)
    short = Call(
        call_id=call.call_id,
        name=call.name,
        arguments=call.arguments[: len(call.arguments) // 2],
        fragment_chars=call.fragment_chars,
    )
    return Cut(items=(*turn.items[:last], short), truncated=True, cut_call=short)


def pieces(text: str, size: int) -> list[str]:
    """``text`` in pieces of ``size`` characters (none for empty text)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def dumps(value: object) -> str:
    """Compact JSON, non-ASCII kept (as the providers send it)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse(data: object, *, event: str | None = None, eol: str = "\n") -> bytes:
    """One SSE event: an optional ``event:`` line, one ``data:`` line, a blank line."""
    head = f"event: {event}{eol}" if event else ""
    body = data if isinstance(data, str) else dumps(data)
    return f"{head}data: {body}{eol}{eol}".encode()


def usage_counts(turn_items: tuple[Item, ...]) -> tuple[int, int]:
    """Made-up (input, output) token counts: about four characters a token."""
    chars = 0
    for item in turn_items:
        chars += len(item.arguments if isinstance(item, Call) else item.text)
    return 12, max(1, chars // 4)


# --- OpenAI Chat Completions ------------------------------------------------------------------


def chat_events(
    turn: Turn, *, model: str, response_id: str, include_usage: bool
) -> list[WireEvent]:
    """The ``chat.completion.chunk`` stream for ``turn`` (see the module docstring)."""
    shown = cut(turn)

    chunk = _ChatChunk(model=model, response_id=response_id, include_usage=include_usage)
    out = [WireEvent(sse(chunk({"role": "assistant", "content": ""})))]
    index = 0
    for item in shown.items:
        if isinstance(item, Text):
            out += [
                WireEvent(sse(chunk({"content": p}))) for p in pieces(item.text, item.chunk_chars)
            ]
        elif isinstance(item, Reasoning):
            out.append(WireEvent(sse(chunk({"reasoning_content": item.text}))))
        else:
            out += _chat_call(item, index, chunk)
            index += 1
    finish = "length" if shown.truncated else ("tool_calls" if index else "stop")
    out.append(WireEvent(sse(chunk({}, finish))))
    if include_usage:
        prompt, completion = usage_counts(shown.items)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        out.append(WireEvent(sse({**chunk({}), "choices": [], "usage": usage})))
    out.append(WireEvent(sse("[DONE]")))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class _ChatChunk:
    """Makes the ``chat.completion.chunk`` objects of one response."""

    model: str
    response_id: str
    include_usage: bool

    def __call__(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": self.model,
            "system_fingerprint": "fp_scripted",
            "choices": [choice],
        }
        if self.include_usage:
            body["usage"] = None  # as OpenAI sends it on every chunk but the usage chunk
        return body


def _chat_call(call: Call, index: int, chunk: _ChatChunk) -> Iterator[WireEvent]:
    head = {"index": index, "id": call.call_id, "type": "function"}
    yield WireEvent(
        sse(chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}))
    )
    for piece in pieces(call.arguments, call.fragment_chars):
        entry = {"index": index, "function": {"arguments": piece}}
        yield WireEvent(sse(chunk({"tool_calls": [entry]})), in_arguments=True)


# --- Anthropic Messages -----------------------------------------------------------------------


def anthropic_events(turn: Turn, *, model: str, response_id: str) -> list[WireEvent]:
    """The Messages stream for ``turn`` (see the module docstring)."""
    shown = cut(turn)
    prompt, completion = usage_counts(shown.items)
    message: dict[str, Any] = {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 1},
    }
    out = [_anth("message_start", {"message": message}), _anth("ping", {})]
    has_calls = False
    for index, item in enumerate(shown.items):
        out += _anthropic_block(index, item, open_end=item is shown.cut_call)
        has_calls = has_calls or isinstance(item, Call)
    stop = "max_tokens" if shown.truncated else ("tool_use" if has_calls else "end_turn")
    delta = {
        "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": completion},
    }
    out += [_anth("message_delta", delta), _anth("message_stop", {})]
    return out


def _anth(kind: str, body: dict[str, Any], in_arguments: bool = False) -> WireEvent:
    return WireEvent(sse({"type": kind, **body}, event=kind), in_arguments=in_arguments)


def _anthropic_block(index: int, item: Item, *, open_end: bool) -> list[WireEvent]:
    """One content block: start, deltas, stop (no stop for the cut call: ``open_end``)."""

    def delta(body: dict[str, Any], in_arguments: bool = False) -> WireEvent:
        return _anth("content_block_delta", {"index": index, "delta": body}, in_arguments)

    if isinstance(item, Text):
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [
            delta({"type": "text_delta", "text": p}) for p in pieces(item.text, item.chunk_chars)
        ]
    elif isinstance(item, Reasoning):
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            delta({"type": "thinking_delta", "thinking": item.text}),
            delta({"type": "signature_delta", "signature": _signature(item.text)}),
        ]
    else:
        start = {"type": "tool_use", "id": item.call_id, "name": item.name, "input": {}}
        deltas = [
            delta({"type": "input_json_delta", "partial_json": p}, in_arguments=True)
            for p in pieces(item.arguments, item.fragment_chars)
        ]
    out = [_anth("content_block_start", {"index": index, "content_block": start}), *deltas]
    if not open_end:
        out.append(_anth("content_block_stop", {"index": index}))
    return out


def _signature(text: str) -> str:
    """A stand-in thinking signature: opaque, stable for a text (never checked here)."""
    return "scripted-signature-" + format(sum(map(ord, text)) % 65521, "04x")
