"""The decoders hand events over in runs (``feed_payloads``): consecutive events of one type,
at most ``RUN_EVENTS`` a run, in stream order, the same events ``feed`` returns as frames.

StreamParser pays its per-call cost once per run, so these are the properties it relies on:
a run never mixes types (the adapter translates a run under one event name), a read holding
a whole stream is handed over in bounded pieces, and nothing is lost or reordered.
"""

from __future__ import annotations

import itertools
import json

import pytest

from test_eventstream import event as es_event
from toollatch.core._eventstream import RUN_EVENTS as ES_RUN
from toollatch.core._lines import RUN_EVENTS as LINES_RUN
from toollatch.core._sse import RUN_EVENTS as SSE_RUN
from toollatch.stages import EventStreamDecoder, JSONLinesDecoder, SSEDecoder

Decoder = SSEDecoder | JSONLinesDecoder | EventStreamDecoder


def sse_stream(count: int) -> bytes:
    """Named one-line events, a type change every 300, a two-line event among them."""
    parts = []
    for i in range(count):
        name = f"kind{i // 300}"
        parts.append(f"event: {name}\ndata: {json.dumps({'i': i})}\n\n".encode())
        if i == 700:
            parts.append(b"data: a\ndata: b\n\n")  # the general path, between runs
    return b"".join(parts)


def lines_stream(count: int) -> bytes:
    ends = (b"\n", b"\n", b"  \r\n")  # (every third line needs stripping: the general rule)
    return b"".join(json.dumps({"i": i}).encode() + ends[i % 3] for i in range(count))


def es_stream(count: int) -> bytes:
    payloads = (json.dumps({"i": i}).encode() for i in range(count))
    return b"".join(es_event(f"kind{i // 300}", p) for i, p in enumerate(payloads))


CASES = {
    "sse": (SSEDecoder, sse_stream, SSE_RUN),
    "jsonl": (JSONLinesDecoder, lines_stream, LINES_RUN),
    "eventstream": (EventStreamDecoder, es_stream, ES_RUN),
}


def runs_of(decoder: Decoder, reads: list[bytes]) -> list[tuple[str, list[bytes]]]:
    runs: list[tuple[str, list[bytes]]] = []
    for read in reads:
        decoder.feed_payloads(read, lambda name, payloads: runs.append((name, list(payloads))))
    return runs


@pytest.mark.parametrize("framing", sorted(CASES))
@pytest.mark.parametrize("read_size", [None, 16384, 97, 1])
def test_runs_are_bounded_typed_and_give_the_frames(framing: str, read_size: int | None) -> None:
    make, stream, limit = CASES[framing]
    data = stream(2000)
    step = read_size or len(data)
    reads = [data[i : i + step] for i in range(0, len(data), step)]
    runs = runs_of(make(), reads)
    decoder, frames = make(), []
    for read in reads:
        frames += decoder.feed(read)
    assert all(0 < len(payloads) <= limit for _, payloads in runs)
    flat = [(name, payload.decode()) for name, payloads in runs for payload in payloads]
    assert flat == [(f.event, f.data) for f in frames]
    assert len(flat) == 2000 + (framing == "sse")
    if read_size is None:  # one read: a run ends at a type change or at the bound only
        assert max(len(p) for _, p in runs) == limit
        for (name, payloads), (following, _) in itertools.pairwise(runs):
            assert name != following or len(payloads) == limit
