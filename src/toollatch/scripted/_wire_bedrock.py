"""Bedrock wire encoder: a :class:`Turn` -> the ConverseStream body (pure).

``POST /model/{modelId}/converse-stream`` answers ``application/vnd.amazon.eventstream``: a
sequence of binary messages (all integers big-endian), as the AWS event-stream encoding
defines them (https://docs.aws.amazon.com/lexv2/latest/dg/event-stream-encoding.html; the
framing :mod:`toollatch.core._eventstream` decodes)::

    total length (4) | headers length (4) | prelude CRC32 (4)
    headers | payload | message CRC32 (4)

The prelude CRC covers the first 8 bytes, the message CRC everything before it. Each header
here is a string (value type 7): ``name length (1) | name | 7 | value length (2) | value``.
Every event carries the three headers of the recorded
``shared/fixtures/bedrock/nova_text_then_tool_use.eventstream``, in its order:
``:event-type`` (the ConverseStream member: ``messageStart``, ``contentBlockStart``...),
``:content-type`` ``application/json``, ``:message-type`` ``event``; the payload is the
member's JSON without a wrapper key, with the ``p`` padding field Bedrock adds to every payload
(the recording has it; it hides the payload's length on the wire).

The events (https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStreamOutput.html):
``messageStart {role}``; per text block ``contentBlockDelta {delta: {text}}`` with no
``contentBlockStart`` (as the recording), then ``contentBlockStop``; per call
``contentBlockStart {start: {toolUse: {toolUseId, name}}}``, ``contentBlockDelta {delta:
{toolUse: {input}}}`` string fragments, ``contentBlockStop`` (none for a call cut by
``max_tokens``); reasoning as ``reasoningContent`` ``text`` then ``signature`` deltas;
``messageStop {stopReason}`` (``end_turn``, ``tool_use``, ``max_tokens``); ``metadata
{usage, metrics}`` last.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from ._script import Call, Item, Reasoning, Text, Turn
from ._wire import WireEvent, cut, dumps, pieces, usage_counts

CONTENT_TYPE = "application/vnd.amazon.eventstream"
"""The media type of a ConverseStream body."""

_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")
_PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _header(name: str, value: str) -> bytes:
    """One string-valued header (type 7)."""
    raw_name, raw_value = name.encode(), value.encode()
    return (
        bytes([len(raw_name)]) + raw_name + b"\x07" + len(raw_value).to_bytes(2, "big") + raw_value
    )


def encode_message(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message: prelude and its CRC, string headers, payload, message CRC."""
    block = b"".join(_header(name, value) for name, value in headers)
    total = 12 + len(block) + len(payload) + 4
    prelude = _PRELUDE.pack(total, len(block))
    head = prelude + _CRC.pack(zlib.crc32(prelude)) + block + payload
    return head + _CRC.pack(zlib.crc32(head))


def event_message(event: str, payload: dict[str, Any]) -> bytes:
    """A ConverseStream event as Bedrock frames it (the module docstring's headers)."""
    headers = [
        (":event-type", event),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ]
    return encode_message(headers, dumps(payload).encode())


class _Events:
    """Collects one stream's events, each padded with a ``p`` of a length that varies."""

    def __init__(self) -> None:
        self.out: list[WireEvent] = []

    def add(self, event: str, payload: dict[str, Any], in_arguments: bool = False) -> None:
        padding = _PADDING[: 1 + (len(self.out) * 7) % len(_PADDING)]
        message = event_message(event, {**payload, "p": padding})
        self.out.append(WireEvent(message, in_arguments=in_arguments))


def bedrock_events(turn: Turn, *, model: str, response_id: str) -> list[WireEvent]:
    """The ConverseStream body for ``turn``, one :class:`WireEvent` per message (see the
    module docstring; ``model`` and ``response_id`` are not part of Bedrock's stream)."""
    shown = cut(turn)
    events = _Events()
    events.add("messageStart", {"role": "assistant"})
    has_calls = False
    for index, item in enumerate(shown.items):
        _block(events, index, item, open_end=item is shown.cut_call)
        has_calls = has_calls or isinstance(item, Call)
    stop = "max_tokens" if shown.truncated else ("tool_use" if has_calls else "end_turn")
    events.add("messageStop", {"stopReason": stop})
    prompt, completion = usage_counts(shown.items)
    usage = {"inputTokens": prompt, "outputTokens": completion, "totalTokens": prompt + completion}
    events.add("metadata", {"usage": usage, "metrics": {"latencyMs": 0}})
    return events.out


def _block(events: _Events, index: int, item: Item, *, open_end: bool) -> None:
    """One content block's events (no stop for the cut call: ``open_end``)."""

    def delta(body: dict[str, Any], in_arguments: bool = False) -> None:
        payload = {"contentBlockIndex": index, "delta": body}
        events.add("contentBlockDelta", payload, in_arguments)

    if isinstance(item, Text):
        for piece in pieces(item.text, item.chunk_chars):
            delta({"text": piece})
    elif isinstance(item, Reasoning):
        delta({"reasoningContent": {"text": item.text}})
        delta({"reasoningContent": {"signature": f"scripted-signature-{len(item.text)}"}})
    else:
        start = {"toolUse": {"toolUseId": item.call_id, "name": item.name}}
        events.add("contentBlockStart", {"contentBlockIndex": index, "start": start})
        for piece in pieces(item.arguments, item.fragment_chars):
            delta({"toolUse": {"input": piece}}, in_arguments=True)
    if not open_end:
        events.add("contentBlockStop", {"contentBlockIndex": index})
