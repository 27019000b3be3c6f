"""Frame decoders: time against the bytes of one long line or event, whatever the reads.

Run it from the repository root::

    python benchmarks/bench_decoders.py                       # this checkout
    python benchmarks/bench_decoders.py --quick               # smoke run: sizes / 16
    python benchmarks/bench_decoders.py --before /tmp/old/src --before-scale 8

Theory of operation
-------------------
A decoder that copies what is pending on every read costs O(n^2 / read size) for one long
line, which no single-size timing shows clearly. So every case is timed at two sizes, N and
4N, and the ratio t(4N)/t(N) is reported: about 4 for a decoder linear in the bytes, about 16
for one that copies the pending bytes per read. Ratios, not absolute times, are the claim (the
machine's speed drifts); each time is the best of ``--repeats`` runs with the collector off.

Cases, for the SSE, JSON Lines and AWS event-stream decoders alike (one event whose data is a
JSON object ``{"t": "xx..."}`` of the stated size; limits raised so that 4N is allowed):

* **line, 1 KiB reads** - N = 8 MiB (``Limits().max_line_bytes``), fed 1024 bytes per
  ``feed()``;
* **event, 1-byte reads** - N = 512 KiB, fed one byte per ``feed()`` (the per-call cost
  dominates: this is the worst read pattern, not a realistic one).

A **floor** row per case keeps the bytes in one growing buffer and decodes them once: the
least any decoder does. Its ratio is the machine's for the same memory (above ~4x at 32 MiB,
where the buffers leave the caches), so a decoder is linear when its ratio is near the floor's.

Every run checks that exactly one frame with the whole data came out; a mismatch aborts.

``--before SRC`` also times another checkout of the decoders (e.g. the committed version,
``git archive HEAD src/toollatch | tar -x -C /tmp/old``) in a child process with
``PYTHONPATH=SRC``. A quadratic version at N = 8 MiB takes minutes, so ``--before-scale K``
divides its sizes by K, and ``--timeout-s`` caps one run (the loop checks the clock; a capped
run is reported as ``> cap`` with the share of the bytes it got through).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import toollatch
from toollatch import Limits
from toollatch.stages import EventStreamDecoder, Frame, JSONLinesDecoder, SSEDecoder

KIB = 1024
MIB = 1024 * KIB
ROOT = Path(__file__).resolve().parents[1]

CASES = [  # (name, N in bytes, read size)
    ("line, 1 KiB reads", 8 * MIB, 1024),
    ("event, 1-byte reads", 512 * KIB, 1),
]
DECODERS = ("floor", "sse", "jsonl", "eventstream")


class _Floor:
    """The least any decoder does with these reads: keep the bytes (one buffer extended in
    place), decode them once at the end. Its ratio is the machine's own for touching N and 4N
    bytes (at 32 MiB the buffers no longer fit in the caches), the baseline for the others."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self.buf += data
        return []

    def finish(self) -> list[Frame]:
        return [Frame("message", self.buf.decode())]


def _payload(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes (``size`` >= 8)."""
    return b'{"t":"' + b"x" * (size - 8) + b'"}'


def _eventstream_message(payload: bytes) -> bytes:
    """One AWS event-stream event message (layout: src/toollatch/core/_eventstream.py docstring)."""
    name, value = b":event-type", b"contentBlockDelta"
    headers = bytes([len(name)]) + name + b"\x07" + struct.pack(">H", len(value)) + value
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def _make(
    kind: str, limit: int
) -> tuple[Callable[[bytes], list[Frame]], Callable[[], list[Frame]]]:
    """A fresh decoder of ``kind`` whose limits allow ``limit`` bytes; its feed and finish."""
    decoder: _Floor | SSEDecoder | JSONLinesDecoder | EventStreamDecoder
    if kind == "floor":
        decoder = _Floor()
    elif kind == "sse":
        decoder = SSEDecoder(max_line_bytes=limit, max_event_bytes=limit)
    elif kind == "jsonl":
        decoder = JSONLinesDecoder(limits=Limits(max_line_bytes=limit))
    else:
        decoder = EventStreamDecoder(max_message_bytes=limit)
    return decoder.feed, decoder.finish


def _stream(kind: str, payload: bytes) -> bytes:
    if kind == "floor":
        return payload
    if kind == "sse":
        return b"data: " + payload + b"\n\n"
    if kind == "jsonl":
        return payload + b"\n"
    return _eventstream_message(payload)


def _run(kind: str, size: int, read: int, limit: int, cap_s: float) -> tuple[float, float]:
    """One run: (seconds, share of the bytes fed); the share is < 1 when capped."""
    payload = _payload(size)
    data = _stream(kind, payload)
    reads = [data[i : i + read] for i in range(0, len(data), read)]
    feed, finish = _make(kind, limit)
    frames: list[Frame] = []
    gc.disable()
    try:
        start = time.perf_counter()
        deadline = start + cap_s
        for i, chunk in enumerate(reads):
            frames += feed(chunk)
            if i & 1023 == 0 and time.perf_counter() > deadline:
                return time.perf_counter() - start, i / len(reads)
        frames += finish()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    if len(frames) != 1 or frames[0].data.encode() != payload:
        raise SystemExit(f"{kind} {size}: wrong frames ({len(frames)})")
    return elapsed, 1.0


def measure(scale: int, repeats: int, cap_s: float) -> list[dict[str, object]]:
    """Every decoder and case at N and 4N; the best of ``repeats`` runs each."""
    rows: list[dict[str, object]] = []
    for name, full, read in CASES:
        n = full // scale
        for kind in DECODERS:
            row: dict[str, object] = {"case": name, "decoder": kind, "n": n}
            for label, size in (("t_n", n), ("t_4n", 4 * n)):
                best, share = min(_run(kind, size, read, 4 * n + 64, cap_s) for _ in range(repeats))
                row[label] = best if share == 1.0 else None
                row[label + "_share"] = share
                if share < 1.0:
                    break  # the larger size would only take longer
            rows.append(row)
    return rows


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n // KIB} KiB"


def _secs(row: dict[str, object], label: str, cap_s: float) -> str:
    value = row.get(label)
    if isinstance(value, float):
        return f"{value:.3f}"
    share = row.get(label + "_share")
    return f"> {cap_s:.0f} ({share:.0%} fed)" if isinstance(share, float) else "-"


def table(rows: list[dict[str, object]], cap_s: float) -> str:
    lines = [
        "| case | decoder | N | t(N) s | t(4N) s | t(4N)/t(N) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        t_n, t_4n = row.get("t_n"), row.get("t_4n")
        ratio = f"{t_4n / t_n:.2f}x" if isinstance(t_n, float) and isinstance(t_4n, float) else "-"
        lines.append(
            f"| {row['case']} | {row['decoder']} | {_size(int(row['n']))} "  # type: ignore[call-overload]
            f"| {_secs(row, 't_n', cap_s)} | {_secs(row, 't_4n', cap_s)} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes / 16, one run each")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="cap of one run")
    parser.add_argument("--before", type=Path, help="another src/ to time the same way")
    parser.add_argument("--before-scale", type=int, default=8, help="its sizes divided by")
    parser.add_argument("--scale", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    scale, repeats = (16, 1) if args.quick else (args.scale, args.repeats)
    if args.json:  # the child process of --before
        print(json.dumps(measure(scale, repeats, args.timeout_s)))
        return
    print(f"toollatch from {Path(toollatch.__file__).parent}, Python {sys.version.split()[0]}")
    print(table(measure(scale, repeats, args.timeout_s), args.timeout_s))
    if args.before is not None:
        child_scale = scale * args.before_scale
        env = {**os.environ, "PYTHONPATH": str(args.before)}
        command = [sys.executable, __file__, "--json", f"--scale={child_scale}"]
        command += [f"--repeats={repeats}", f"--timeout-s={args.timeout_s}"]
        done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        print(f"\nbefore: {args.before} (sizes / {child_scale})")
        print(table(json.loads(done.stdout), args.timeout_s))


if __name__ == "__main__":
    main()
