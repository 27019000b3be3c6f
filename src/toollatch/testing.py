"""Helpers for testing toollatch and adapters built on it (public; no test-framework imports).

* :func:`sse` / :func:`jsonl` build wire bytes from native events;
* :func:`split_at`, :func:`byte_chunks` and :func:`chunkings` cut bytes the way networks do;
* :func:`replay` plays bytes through a :class:`StreamParser` in given pieces;
* :func:`summary` reduces a Round to plain data, so two replays can be compared with ``==``;
* :func:`check_adapter` runs the adapter conformance suite on a transcript.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, get_args

import orjson

from .core._adapters._base import Adapter
from .core._errors import UsageError
from .core._events import (
    Frame,
    RoundEnd,
    RoundEnded,
    StreamEvent,
)
from .core._limits import Limits
from .core._pipeline import StreamParser
from .core._registry import Framing
from .core._round import Round
from .core._specs import ToolSpec

__all__ = [
    "ConformanceError",
    "byte_chunks",
    "check_adapter",
    "chunkings",
    "jsonl",
    "replay",
    "split_at",
    "sse",
    "summary",
]


def sse(*events: Mapping[str, Any] | str, named: bool = False, done: bool = False) -> bytes:
    """SSE bytes: one ``data:`` event per native event (``str`` items are sent verbatim).

    ``named=True`` adds an ``event:`` line from each event's ``type`` (Anthropic style);
    ``done=True`` appends ``data: [DONE]``.
    """
    out = bytearray()
    for event in events:
        if isinstance(event, str):
            out += f"data: {event}\n\n".encode()
            continue
        if named and isinstance(event.get("type"), str):
            out += f"event: {event['type']}\n".encode()
        out += b"data: " + orjson.dumps(dict(event)) + b"\n\n"
    if done:
        out += b"data: [DONE]\n\n"
    return bytes(out)


def jsonl(*events: Mapping[str, Any]) -> bytes:
    """JSON Lines bytes, one native event per line."""
    return b"".join(orjson.dumps(dict(e)) + b"\n" for e in events)


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (sorted, deduplicated, clamped; empty pieces kept
    out except when ``data`` is empty)."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)] or [data]


def byte_chunks(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [data]


def chunkings(data: bytes, *, seed: int = 0, random_splits: int = 3) -> Iterator[list[bytes]]:
    """Whole, byte by byte, 7-byte pieces, and ``random_splits`` random cuttings (with empty
    pieces between) — the standard set every transcript is replayed at."""
    yield [data]
    yield byte_chunks(data, 1)
    yield byte_chunks(data, 7)
    rng = random.Random(seed)
    for _ in range(random_splits):
        cuts = [rng.randrange(len(data) + 1) for _ in range(rng.randint(1, 12))]
        pieces = split_at(data, cuts)
        pieces.insert(rng.randrange(len(pieces) + 1), b"")
        yield pieces


def replay(
    chunks: Sequence[bytes] | bytes,
    provider: str,
    *,
    framing: Framing = "sse",
    tools: Iterable[Mapping[str, Any] | ToolSpec] | None = None,
    limits: Limits | None = None,
) -> Round:
    """Play ``chunks`` (or one bytes value) through a fresh parser; return the Round."""
    parser = StreamParser(provider, framing=framing, tools=tools, limits=limits)
    for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
        parser.feed(chunk)
    return parser.finish()


def summary(round_: Round) -> dict[str, Any]:
    """Plain-data view of a Round (states, codes, arguments, text, anomalies) for ``==``."""
    return {
        "ended": round_.ended.value,
        "stop_reason": round_.stop_reason,
        "error": round_.error,
        "choices": [
            {
                "text": choice.text,
                "ended": choice.ended.value,
                "calls": [
                    {
                        "id": c.call_id,
                        "id_made_up": c.id_made_up,
                        "name": c.name,
                        "state": c.state.value,
                        "error": c.error.value if c.error else None,
                        "detail": c.detail,
                        "text": c.arguments_text,
                        "arguments": c.arguments,
                        "extras": dict(c.extras),
                    }
                    for c in choice.calls
                ],
                "blocks": [dict(b.data) for b in choice.blocks],
            }
            for choice in round_.choices
        ],
        "anomalies": [(a.kind.value, a.detail) for a in round_.anomalies],
    }


class ConformanceError(AssertionError):
    """An adapter broke the adapter contract; the message says which rule and where."""


def check_adapter(
    factory: Callable[[], Adapter],
    transcript: Sequence[Mapping[str, Any]],
    *,
    expected_calls: Sequence[Mapping[str, Any]] | None = None,
    end_index: int | None = None,
    tools: Iterable[Mapping[str, Any] | ToolSpec] | None = None,
) -> Round:
    """Run the adapter conformance suite on one complete, normally ending transcript.

    ``factory()`` must build a fresh adapter; ``transcript`` is the list of native events (dicts)
    of one response that ends normally. Checked, raising :class:`ConformanceError`:

    1. feeding the events as dicts and as SSE frames (JSON-encoded) gives equal events, twice
       (deterministic, no hidden state across instances);
    2. every event the adapter emits is a stream event, and every call key carries the
       adapter's attempt;
    3. **no early commit**: cut before the event that carries the round's normal end
       (``end_index``: the position in ``transcript`` of the provider's terminal event, e.g.
       the ``finish_reason`` chunk; pass it — when omitted it is taken from the adapter itself,
       which cannot catch an adapter that ends too early), the stream never commits a call;
    4. the whole transcript commits exactly ``expected_calls`` (``{id?, name, arguments}``
       each, in order) when given;
    5. feeding after ``finish()`` raises ``UsageError``; junk input (non-dicts, empty dicts,
       wrong types in known fields) never raises anything else.

    Returns the Round of the whole transcript.
    """
    whole = _events_of(factory, transcript, as_frames=False)
    for label, other in (
        ("as SSE frames", _events_of(factory, transcript, as_frames=True)),
        ("on a second run", _events_of(factory, transcript, as_frames=False)),
    ):
        if other != whole:
            raise ConformanceError(f"events differ when fed {label}")
    attempt = factory().attempt
    for event in whole:
        if not isinstance(event, _STREAM_EVENT_TYPES):
            raise ConformanceError(f"not a stream event: {event!r:.120}")
        key = getattr(event, "key", None)
        if key is not None and key.attempt != attempt:
            raise ConformanceError(f"call key {key} does not carry attempt {attempt}")
    end = _end_index(factory, transcript)
    if end_index is not None and end != end_index:
        raise ConformanceError(
            f"the round ended normally at event {end}, not at the terminal event {end_index}"
        )
    for cut in range(end):
        round_ = _round_of(factory, transcript[:cut], tools)
        if round_.committed():
            raise ConformanceError(
                f"a call committed from the first {cut} of {len(transcript)} events: "
                "the stream had not ended"
            )
    round_ = _round_of(factory, transcript, tools)
    if expected_calls is not None:
        got = [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in round_.calls]
        want = [
            {
                "id": e.get("id", got[i]["id"] if i < len(got) else None),
                "name": e["name"],
                "arguments": e["arguments"],
            }
            for i, e in enumerate(expected_calls)
        ]
        if got != want:
            raise ConformanceError(f"calls differ:\n  got  {got}\n  want {want}")
    _check_misuse_and_junk(factory)
    return round_


_STREAM_EVENT_TYPES: tuple[type, ...] = get_args(StreamEvent)
"""Every stream-event type (the members of the union, so that none is left out)."""

_JUNK: tuple[object, ...] = (
    None,
    3,
    "text",
    [],
    {},
    {"type": None},
    {"type": 7},
    {"choices": "x"},
    {"choices": [None]},
    {"candidates": [{"content": {"parts": [{"functionCall": None}]}}]},
    {"type": "content_block_delta", "index": "x", "delta": None},
    {"type": "response.function_call_arguments.delta", "delta": 5},
    {"contentBlockDelta": None},
    {"messageStop": []},
)


def _end_index(factory: Callable[[], Adapter], transcript: Sequence[Mapping[str, Any]]) -> int:
    """Index of the native event whose translation ends the round normally (or the length)."""
    adapter = factory()
    for index, native in enumerate(transcript):
        for event in adapter.feed(native):
            if isinstance(event, RoundEnded) and event.ending is RoundEnd.NORMAL:
                return index
    return len(transcript)


def _events_of(
    factory: Callable[[], Adapter], transcript: Sequence[Mapping[str, Any]], *, as_frames: bool
) -> list[StreamEvent]:
    adapter = factory()
    events: list[StreamEvent] = []
    for native in transcript:
        if as_frames:
            frame = Frame(
                event=str(native.get("type", "message")), data=orjson.dumps(native).decode()
            )
            events += adapter.feed_frame(frame)
        else:
            events += adapter.feed(native)
    return events + adapter.finish()


def _round_of(
    factory: Callable[[], Adapter],
    transcript: Sequence[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any] | ToolSpec] | None,
) -> Round:
    adapter = factory()
    parser = StreamParser(adapter, framing="jsonl", tools=tools)
    for native in transcript:
        parser.feed_event(native)
    return parser.finish()


def _check_misuse_and_junk(factory: Callable[[], Adapter]) -> None:
    adapter = factory()
    for junk in _JUNK:
        try:
            adapter.feed(junk)
        except Exception as exc:
            raise ConformanceError(f"feed({junk!r}) raised {type(exc).__name__}: {exc}") from exc
    adapter.finish()
    try:
        adapter.feed({})
    except UsageError:
        return
    raise ConformanceError("feed() after finish() did not raise UsageError")
