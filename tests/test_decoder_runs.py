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
from toollatch._errors import StreamDecodeError, UsageError
from toollatch._eventstream import RUN_EVENTS as ES_RUN
from toollatch._eventstream import EventStreamDecoder
from toollatch._limits import Limits
from toollatch._lines import RUN_EVENTS as LINES_RUN
from toollatch._lines import JSONLinesDecoder
from toollatch._sse import RUN_EVENTS as SSE_RUN
from toollatch._sse import SSEDecoder

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


def event_reads(framing: str, count: int) -> list[bytes]:
    """The stream cut at its event ends: one read per event, as a socket mostly delivers."""
    if framing == "eventstream":
        payloads = (json.dumps({"i": i}).encode() for i in range(count))
        return [es_event(f"kind{i // 300}", p) for i, p in enumerate(payloads)]
    data = CASES[framing][1](count)
    end = b"\n\n" if framing == "sse" else b"\n"
    return [part + end for part in data.split(end)[:-1]]


@pytest.mark.parametrize("framing", sorted(CASES))
def test_one_event_reads_give_the_runs_and_frames_of_the_walk(framing: str) -> None:
    """``one_event`` (StreamParser's per-read step) returns, for a read that is one event, the
    run ``feed_payloads`` hands over, and changes nothing: taking it instead of feeding the
    read gives the same events in order as ``feed``'s frames."""
    make = CASES[framing][0]
    reads = event_reads(framing, 1000)
    taken: list[tuple[str, bytes]] = []
    by_one, decoder = 0, make()

    def walked(name: str, payloads: list[bytes]) -> None:
        taken.extend((name, p) for p in payloads)

    for read in reads:
        one = decoder.one_event(read)
        if one is None:
            decoder.feed_payloads(read, walked)
        else:
            by_one += 1
            taken += [(decoder.one_event_type, x) for x in one]
    reference = make()
    frames = [f for read in reads for f in reference.feed(read)]
    assert [(n, p.decode()) for n, p in taken] == [(f.event, f.data) for f in frames]
    if framing == "eventstream":
        assert by_one == 0  # (its messages are always cut with their CRCs checked)
    else:  # most reads take the per-read step (JSON Lines: not the third needing a strip)
        assert by_one >= (900 if framing == "sse" else 600)


@pytest.mark.parametrize("framing", ["sse", "jsonl"])
@pytest.mark.parametrize("end", ["finish", "failure"])
def test_one_event_takes_nothing_after_the_end_or_a_failure(framing: str, end: str) -> None:
    """After ``finish()`` or a framing error, ``one_event`` returns None for a read it would
    have taken, so that ``feed_payloads`` raises as before."""
    reads = event_reads(framing, 5)
    limits = Limits(max_line_bytes=4096)
    decoder = SSEDecoder(limits=limits) if framing == "sse" else JSONLinesDecoder(limits=limits)
    for read in reads[:3]:
        decoder.feed_payloads(read, lambda name, p: None)
    assert decoder.one_event(reads[3]) is not None
    if end == "finish":
        decoder.finish()
    else:
        with pytest.raises(StreamDecodeError):
            decoder.feed_payloads(b"x" * 10_000 + b"\n", lambda name, p: None)
    assert decoder.one_event(reads[3]) is None
    with pytest.raises((UsageError, StreamDecodeError)):
        decoder.feed_payloads(reads[3], lambda name, p: None)
