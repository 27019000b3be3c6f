"""The cost the dispatcher adds per tool result: the size budget and the redaction.

Run it from the repository root::

    python benchmarks/bench_results.py            # 1 KiB and 1 MiB results
    python benchmarks/bench_results.py --quick    # smoke run (fewer repetitions)

Each case times ``ResultShaper.tool_result`` (what ``Dispatcher`` calls on every result a
tool returns) on one result, median of repetitions with the collector off. Results: ASCII
log lines, text with some multi-byte characters and JSON (an array of small objects, the
shape a search or list tool returns, about 30 bytes per string), at 1 KiB and 1 MiB. Cases:
``budget`` alone (no redactor: the default), with the result within the budget or cut to
64 KiB; an identity redactor (the walk's own cost: parsing, pointers, one call per string and
key); the relay's ``redact_secrets`` (a key regex and a needle search per string: a realistic
redactor, whose own time dominates); for comparison, plain ``json.loads`` of the same text.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from toollatch import PreviewPolicy, ResultLimits, ToolResult
from toollatch.relay import redact_secrets
from toollatch.tools._results import ResultShaper

KIB = 1024


def plain_text(size: int) -> str:
    line = "2026-12-02T01:02:03Z worker-7 fetched page 12 of the report (durée 0.4 s) ✓\n"
    text = line * (size // len(line.encode()) + 1)
    return text.encode()[:size].decode(errors="ignore")  # size bytes (a whole character less)


def ascii_text(size: int) -> str:
    line = "2026-12-02T01:02:03Z worker-7 fetched page 12 of the report in 0.4 s\n"
    return (line * (size // len(line) + 1))[:size]


def json_text(size: int) -> str:
    rows, total = [], 0
    while total < size:
        row = {"id": len(rows), "title": f"Result number {len(rows)} — café", "ok": True}
        rows.append(row)
        total += len(json.dumps(row, ensure_ascii=False).encode()) + 1
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"))


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``fn()``."""
    gc.collect()
    gc.disable()
    try:
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return statistics.median(samples)


def cases(
    shapers: dict[str, ResultShaper], kind: str, text: str
) -> list[tuple[str, Callable[[], object]]]:
    """The timed cases for one result."""
    result = ToolResult(tool_call_id="c1", name="t", content=text)
    cut = "cut to 64 KiB" if len(text.encode()) > 65536 else "within budget"
    found: list[tuple[str, Callable[[], object]]] = [
        (f"{name} ({cut})", partial(shaper.tool_result, result, 65536))
        for name, shaper in shapers.items()
    ]
    if kind == "json":
        found.append(("json.loads alone (reference)", partial(json.loads, text)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    shapers = {
        "budget only": ResultShaper(ResultLimits(), None),
        "identity redactor + budget": ResultShaper(
            ResultLimits(), PreviewPolicy(redactor=lambda pointer, text: text)
        ),
        "redact_secrets + budget": ResultShaper(
            ResultLimits(), PreviewPolicy(redactor=redact_secrets)
        ),
    }
    print("| result | size | case | us per result |")
    print("|---|---|---|---|")
    for kind, make in (("ascii", ascii_text), ("text", plain_text), ("json", json_text)):
        for size in (KIB, KIB * KIB):
            text = make(size)
            actual = len(text.encode())
            label = f"{actual / KIB:.0f} KiB" if size == KIB else f"{actual / KIB**2:.2f} MiB"
            repeat = 5 if args.quick else (2000 if size == KIB else 15)
            for case, fn in cases(shapers, kind, text):
                print(f"| {kind} | {label} | {case} | {timed(fn, repeat) * 1e6:,.1f} |")


if __name__ == "__main__":
    main()
