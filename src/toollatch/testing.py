"""Helpers for testing toollatch and adapters built on it (public; no test-framework imports).

* :func:`sse` / :func:`jsonl` build wire bytes from native events;
* :func:`split_at`, :func:`byte_chunks` and :func:`chunkings` cut bytes the way networks do;
* :func:`replay` plays bytes through a :class:`StreamParser` in given pieces;
* :func:`summary` reduces a Round to plain data, so two replays can be compared with ``==``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from ._limits import Limits
from ._pipeline import StreamParser
from ._registry import Framing
from ._round import Round
from ._specs import ToolSpec


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
                        "name": c.name,
                        "state": c.state.value,
                        "error": c.error.value if c.error else None,
                        "detail": c.detail,
                        "text": c.arguments_text,
                        "arguments": c.arguments,
                    }
                    for c in choice.calls
                ],
                "blocks": [dict(b.data) for b in choice.blocks],
            }
            for choice in round_.choices
        ],
        "anomalies": [(a.kind.value, a.detail) for a in round_.anomalies],
    }
