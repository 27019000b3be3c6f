"""Preview cost: toollatch's incremental PartialJSON against re-parsing the buffer per delta.

Run: ``nice python benchmarks/bench_preview.py [--quick] [--budget SECONDS] [--out PATH]``.

Arguments are realistic tool-call arguments (``{"path": ..., "content": <long text with
quotes, backslashes, tabs, newlines, accented letters, CJK and emoji>, "items": [...]}``) of
16 KiB, 256 KiB and 1 MiB (UTF-8), streamed in fragments of 1, 8 and 64 characters. For each
case it measures:

* floor: append every fragment to a list, then one ``json.loads("".join(parts))``;
* ours: ``PartialJSON.feed`` per fragment (deltas produced and dropped) and ``finish()``;
* re-parse per delta, as the libraries that motivate issue 4 do: ``partial_json_parser.loads``
  on the growing str, ``jiter.from_json(..., partial_mode="trailing-strings")`` on the growing
  bytes, and the anthropic SDK's ``accumulate_event`` fed ``input_json_delta`` events (only the
  accumulate calls are timed, not building the event objects);
* peak memory of ours (tracemalloc, a separate run) as a multiple of the argument size.

``--tracker`` instead times the preview path alone (``PreviewTracker`` as the assembler drives
it, sizes computed beforehand) per mode (``none``, ``full``, ``fields`` showing ``/path``) on
these arguments at 256 KiB and 1 MiB in fragments of 3-20 characters (the cut of
``bench_assembly.py``), against the floor, with the growth exponent.

``--masked`` instead times the whole preview path (``PreviewTracker``: parser, redaction
filter, throttle, coalescing) on arguments with N and 4N members masked in ``fields`` mode
(only ``/path`` allowed) against ``full`` mode, with and without a redactor, and reports the
growth ratio t(4N)/t(N): linear work is about 4x (issue 11 measured 19 s for 16k masked keys
in ``fields`` mode against 0.06 s in ``full``). It prints which ``toollatch`` it imported, so
that a committed version can be timed from a copy: ``git archive <commit> src/toollatch | tar
-x -C /tmp/old`` then ``PYTHONPATH=/tmp/old/src python benchmarks/bench_preview.py --masked``.

Times are CPU time of the process (``time.process_time``; the CPU is shared). Floor and ours
take the best of five interleaved runs. A re-parse method
that exceeds the time budget is stopped; its time is reported as "> budget" together with the
fraction done and the quadratic extrapolation (processing the first fraction f of an O(n^2)
stream costs about f^2 of the whole). Garbage collection stays on, as in a real process.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import inspect
import json
import math
import os
import platform
import random
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import toollatch
from toollatch import PreviewPolicy, ToolPreview
from toollatch.core._preview import PreviewTracker
from toollatch.stages import CallKey, PartialJSON

KIB = 1024
# CPU time of this process: the machine is shared, and wall time also counts other work.
_clock = time.process_time
# Prose and code words; about one escape (quote, backslash, tab, newline) per 13 bytes of JSON.
WORDS = [
    *[
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "café",
        "naïve",
        "日本語の文章",
        "😀",
    ],
    *["return", "x;", "if", "(y)", "{", "z", "=", "}", "def", "f():", "pass"],
    *['"quoted"', '"s";', "C:\\path\\to\\file", "a\tb"],
]


# --------------------------------------------------------------------------- inputs


def make_arguments(size_bytes: int, seed: int = 7) -> str:
    """A tool-argument JSON text of about ``size_bytes`` UTF-8 bytes (content ~85%)."""
    rnd = random.Random(seed)
    items = []
    while len(json.dumps(items, ensure_ascii=False).encode()) < size_bytes * 0.15:
        i = len(items)
        items.append(
            {
                "id": i,
                "title": " ".join(rnd.choice(WORDS) for _ in range(4)),
                "done": i % 3 == 0,
                "weight": round(rnd.random() * 100, 3),
                "tags": [rnd.choice(["a", "b", "ü", "x/y"]) for _ in range(2)],
                "parent": None,
            }
        )
    lines = []
    while sum(len(line) for line in lines) < size_bytes:
        lines.append(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 12))))
    doc = {"path": "src/notes/日本/notes.md", "content": "\n".join(lines), "items": items}
    text = json.dumps(doc, ensure_ascii=False)
    excess = len(text.encode()) - size_bytes
    while excess > 0:  # trim content to the target size (characters may be multi-byte)
        doc["content"] = doc["content"][: -max(1, excess // 4)]
        text = json.dumps(doc, ensure_ascii=False)
        excess = len(text.encode()) - size_bytes
    return text


def fragments_of(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# --------------------------------------------------------------------------- methods


def run_floor(fragments: list[str]) -> object:
    parts = []
    for fragment in fragments:
        parts.append(fragment)
    return json.loads("".join(parts))


def run_ours(fragments: list[str]) -> object:
    parser = PartialJSON()
    feed = parser.feed
    for fragment in fragments:
        feed(fragment)
    parser.finish()
    return parser.snapshot()


@dataclass
class Reparse:
    """A re-parse-per-delta method: an initial state and a step per fragment (timed)."""

    name: str
    available: bool
    run: Callable[[list[str], float], tuple[float, int]]
    """(fragments, budget seconds) -> (seconds spent, fragments processed)."""


def _timed_loop(
    fragments: list[str], budget: float, step: Callable[[str], object]
) -> tuple[float, int]:
    start = _clock()
    for index, fragment in enumerate(fragments):
        step(fragment)
        if index & 63 == 0 and _clock() - start > budget:
            return _clock() - start, index + 1
    return _clock() - start, len(fragments)


def reparse_partial_json_parser(fragments: list[str], budget: float) -> tuple[float, int]:
    from partial_json_parser import loads  # noqa: PLC0415 - optional dependency

    buffer = ""

    def step(fragment: str) -> object:
        nonlocal buffer
        buffer += fragment
        return loads(buffer)

    return _timed_loop(fragments, budget, step)


def reparse_jiter(fragments: list[str], budget: float) -> tuple[float, int]:
    from jiter import from_json  # noqa: PLC0415 - optional dependency

    buffer = bytearray()

    def step(fragment: str) -> object:
        buffer.extend(fragment.encode())
        return from_json(bytes(buffer), partial_mode="trailing-strings")

    return _timed_loop(fragments, budget, step)


def reparse_anthropic(fragments: list[str], budget: float) -> tuple[float, int]:
    """The anthropic SDK's stream accumulator, fed synthetic input_json_delta events."""
    from anthropic.lib.streaming._messages import accumulate_event  # noqa: PLC0415
    from anthropic.types import (  # noqa: PLC0415
        InputJSONDelta,
        Message,
        RawContentBlockDeltaEvent,
        RawContentBlockStartEvent,
        RawMessageStartEvent,
        ToolUseBlock,
        Usage,
    )

    keywords = {}
    if "json_bufs" in inspect.signature(accumulate_event).parameters:
        keywords["json_bufs"] = {}  # newer SDKs keep the raw buffer beside the snapshot
    message = Message.model_construct(
        id="msg_bench",
        type="message",
        role="assistant",
        content=[],
        model="claude-bench",
        stop_reason=None,
        stop_sequence=None,
        usage=Usage.model_construct(input_tokens=1, output_tokens=1),
    )
    snapshot = accumulate_event(
        event=RawMessageStartEvent.model_construct(type="message_start", message=message),
        current_snapshot=None,
        **keywords,
    )
    block = ToolUseBlock.model_construct(type="tool_use", id="toolu_b", name="write", input={})
    start_event = RawContentBlockStartEvent.model_construct(
        type="content_block_start", index=0, content_block=block
    )
    snapshot = accumulate_event(event=start_event, current_snapshot=snapshot, **keywords)
    spent = 0.0
    for index, fragment in enumerate(fragments):
        event = RawContentBlockDeltaEvent.model_construct(
            type="content_block_delta",
            index=0,
            delta=InputJSONDelta.model_construct(type="input_json_delta", partial_json=fragment),
        )
        start = _clock()
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, **keywords)
        spent += _clock() - start
        if spent > budget:
            return spent, index + 1
    return spent, len(fragments)


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


REPARSERS = [
    Reparse("partial-json-parser", _installed("partial_json_parser"), reparse_partial_json_parser),
    Reparse("jiter", _installed("jiter"), reparse_jiter),
    Reparse("anthropic", _installed("anthropic"), reparse_anthropic),
]


# --------------------------------------------------------------------------- measuring


def best_of(runs: int, fn: Callable[[list[str]], object], fragments: list[str]) -> float:
    best = math.inf
    for _ in range(runs):
        start = _clock()
        fn(fragments)
        best = min(best, _clock() - start)
    return best


def peak_memory(fn: Callable[[list[str]], object], fragments: list[str]) -> int:
    gc.collect()
    tracemalloc.start()
    result = fn(fragments)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del result
    return peak


@dataclass
class Cut:
    seconds: float
    done: float  # fraction of the fragments processed

    @property
    def finished(self) -> bool:
        return self.done >= 1.0

    @property
    def estimate(self) -> float:
        """Whole-run seconds: measured, or extrapolated as O(n^2) from the part done."""
        return self.seconds if self.finished else self.seconds / (self.done**2)

    def show(self) -> str:
        if self.finished:
            return fmt(self.seconds)
        return f"> {fmt(self.seconds)} ({self.done:.0%} done; ~{fmt(self.estimate)})"


@dataclass
class Case:
    size_bytes: int
    fragment: int
    count: int
    floor: float
    ours: float
    memory: float
    reparse: dict[str, Cut]


def fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e3:.1f} ms"


def measure(size_bytes: int, fragment: int, budget: float, runs: int) -> Case:
    text = make_arguments(size_bytes)
    fragments = fragments_of(text, fragment)
    assert run_ours(fragments) == json.loads(text)
    floor = ours = math.inf
    for _ in range(runs):  # interleaved, best of each
        floor = min(floor, best_of(1, run_floor, fragments))
        ours = min(ours, best_of(1, run_ours, fragments))
    memory = peak_memory(run_ours, fragments) / len(text.encode())
    reparse = {}
    for method in REPARSERS:
        if method.available:
            seconds, done = method.run(fragments, budget)
            reparse[method.name] = Cut(seconds, done / len(fragments))
    case = Case(len(text.encode()), fragment, len(fragments), floor, ours, memory, reparse)
    print(row(case), flush=True)
    return case


# --------------------------------------------------------------------------- masked members


def make_masked(members: int) -> str:
    """Arguments with one allowed field (``/path``) and ``members`` other members of mixed
    kinds (strings, numbers, small objects and arrays), all masked in ``fields`` mode."""
    kinds: list[object] = ["some text, é and \\n", 12345, {"a": 1, "b": "x"}, [1, "y", None]]
    doc: dict[str, object] = {"path": "src/notes.md"}
    for i in range(members):
        doc[f"key{i:06d}"] = kinds[i % len(kinds)]
    return json.dumps(doc, ensure_ascii=False)


def _redactor(pointer: str, text: str) -> str:
    return text.replace("sk-", "sk-***")


MASKED_POLICIES: dict[str, PreviewPolicy] = {
    "full": PreviewPolicy(default=ToolPreview(mode="full")),
    "fields": PreviewPolicy(default=ToolPreview(mode="fields", fields=("/path",))),
    "full + redactor": PreviewPolicy(default=ToolPreview(mode="full"), redactor=_redactor),
    "fields + redactor": PreviewPolicy(
        default=ToolPreview(mode="fields", fields=("/path",)), redactor=_redactor
    ),
}


def run_tracker(policy: PreviewPolicy, fragments: list[str]) -> int:
    """Feed one call's fragments through a preview tracker as the assembler does; the number
    of updates released."""
    key = CallKey(0, 0, 0)
    tracker = PreviewTracker(policy, "write_file", max_depth=64)
    updates = nbytes = 0
    for fragment in fragments:
        nbytes += len(fragment.encode())
        if tracker.feed(fragment, nbytes):
            tracker.release(key, "call_1", "write_file")
            updates += 1
    tracker.release(key, "call_1", "write_file", final=True)
    return updates + 1


def masked_report(members: int, fragment: int, runs: int) -> str:
    texts = {n: make_masked(n) for n in (members, 4 * members)}
    lines = [
        f"# Preview cost by masked members (toollatch from {Path(toollatch.__file__).parent})",
        "",
        f"Python {platform.python_version()}; {fragment}-character fragments; CPU time, best of"
        f" {runs} interleaved runs; N = {members:,} members (plus `/path`),"
        f" {len(texts[members].encode()) / KIB:,.0f} KiB; 4N: "
        f"{len(texts[4 * members].encode()) / KIB:,.0f} KiB.",
        "",
        "| mode | N | 4N | growth t(4N)/t(N) | 4N vs full (same redactor) |",
        "|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    frags = {n: fragments_of(text, fragment) for n, text in texts.items()}
    best: dict[tuple[str, int], float] = {}
    for _ in range(runs):  # interleaved, so that a slow moment of the machine hits every mode
        for name, policy in MASKED_POLICIES.items():
            for n, pieces in frags.items():
                start = _clock()
                run_tracker(policy, pieces)
                spent = _clock() - start
                best[name, n] = min(best.get((name, n), math.inf), spent)
    for name in MASKED_POLICIES:
        small, large = best[name, members], best[name, 4 * members]
        base = best["full + redactor" if "redactor" in name else "full", 4 * members]
        cells = [name, fmt(small), fmt(large), f"{large / small:.2f}x", f"{large / base:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return "\n".join([*lines, ""])


# --------------------------------------------------------------------------- the tracker


TRACKER_POLICIES: dict[str, PreviewPolicy] = {
    "none": PreviewPolicy(),
    "full": PreviewPolicy(default=ToolPreview(mode="full")),
    "fields": PreviewPolicy(default=ToolPreview(mode="fields", fields=("/path",))),
}


def split_3_20(text: str, seed: int = 1) -> list[str]:
    """``text`` in fragments of 3-20 characters, as ``bench_assembly.py`` cuts its streams."""
    rnd, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rnd.randint(3, 20)
        out.append(text[i : i + n])
        i += n
    return out


def run_floor_sized(pairs: list[tuple[str, int]]) -> object:
    """The floor with the tracker's input: the fragment and its UTF-8 size per step."""
    parts = []
    for fragment, _size in pairs:
        parts.append(fragment)
    return json.loads("".join(parts))


def run_tracker_sized(policy: PreviewPolicy, pairs: list[tuple[str, int]]) -> int:
    """:func:`run_tracker` with the sizes computed beforehand (the assembler has them)."""
    key = CallKey(0, 0, 0)
    tracker = PreviewTracker(policy, "write_file", max_depth=64)
    feed, release, updates, nbytes = tracker.feed, tracker.release, 0, 0
    for fragment, size in pairs:
        nbytes += size
        if feed(fragment, nbytes):
            release(key, "call_1", "write_file")
            updates += 1
    release(key, "call_1", "write_file", final=True)
    return updates + 1


def tracker_report(runs: int) -> str:
    """The preview path alone (``PreviewTracker``: parser, filter, throttle, coalescing; no
    decoder, adapter or assembler) per mode at the default ``every_bytes``, in 3-20 character
    fragments, against the floor; with the growth exponent 256 KiB -> 1 MiB."""
    sizes = (256 * KIB, 1024 * KIB)
    pairs = {}
    for size in sizes:
        frags = split_3_20(make_arguments(size))
        pairs[size] = [(f, len(f.encode("utf-8", "surrogatepass"))) for f in frags]
    lines = [
        f"# The preview tracker alone (toollatch from {Path(toollatch.__file__).parent})",
        "",
        f"Python {platform.python_version()}; 3-20 character fragments"
        f" ({len(pairs[sizes[1]]):,} at 1 MiB); CPU time, best of {runs} interleaved runs;"
        " every_bytes 256, on_structure on.",
        "",
        "| mode | 256 KiB | 1 MiB | updates (1 MiB) | tracker / floor (1 MiB) | exponent |",
        "|---|---|---|---|---|---|",
    ]
    contenders: dict[str, Callable[[list[tuple[str, int]]], object]] = {
        "floor": run_floor_sized,
        **{
            name: (lambda p, policy=policy: run_tracker_sized(policy, p))
            for name, policy in TRACKER_POLICIES.items()
        },
    }
    best: dict[tuple[str, int], float] = {}
    for _ in range(runs):
        for name, fn in contenders.items():
            for size in sizes:
                gc.collect()
                start = _clock()
                fn(pairs[size])
                spent = _clock() - start
                best[name, size] = min(best.get((name, size), math.inf), spent)
    for name, fn in contenders.items():
        small, large = best[name, sizes[0]], best[name, sizes[1]]
        updates = "-" if name == "floor" else f"{fn(pairs[sizes[1]]):,}"
        cells = [name, fmt(small), fmt(large), updates, f"{large / best['floor', sizes[1]]:.2f}x"]
        cells.append(f"{math.log(large / small) / math.log(4):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return "\n".join([*lines, ""])


# --------------------------------------------------------------------------- report


def size_label(size_bytes: int) -> str:
    return (
        f"{size_bytes / KIB / KIB:.0f} MiB"
        if size_bytes >= KIB * KIB
        else f"{size_bytes // KIB} KiB"
    )


def ratio(cut: Cut, ours: float) -> str:
    if cut.finished:
        return f"{cut.seconds / ours:,.0f}x"
    return f"> {cut.seconds / ours:,.0f}x (~{cut.estimate / ours:,.0f}x)"


def row(case: Case) -> str:
    cells = [
        size_label(case.size_bytes),
        str(case.fragment),
        f"{case.count:,}",
        fmt(case.floor),
        fmt(case.ours),
        f"{case.ours / case.floor:.1f}x",
        f"{case.memory:.1f}x",
    ]
    for method in REPARSERS:
        cut = case.reparse.get(method.name)
        cells += ["n/a", "n/a"] if cut is None else [cut.show(), ratio(cut, case.ours)]
    return "| " + " | ".join(cells) + " |"


def header() -> list[str]:
    names = ["args", "frag (chars)", "fragments", "floor", "ours", "ours/floor", "ours peak mem"]
    for method in REPARSERS:
        names += [method.name, f"{method.name}/ours"]
    return ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]


def exponents(cases: list[Case]) -> Iterator[str]:
    """Growth exponent between the two largest sizes, per fragment size: t ~ n^k."""
    sizes = sorted({case.size_bytes for case in cases})
    if len(sizes) < 2:
        return
    small, large = sizes[-2], sizes[-1]
    yield f"| frag (chars) | floor | ours | {' | '.join(m.name for m in REPARSERS)} |"
    yield "|---|---|---|" + "---|" * len(REPARSERS)
    for fragment in sorted({case.fragment for case in cases}):
        a = next(c for c in cases if c.size_bytes == small and c.fragment == fragment)
        b = next(c for c in cases if c.size_bytes == large and c.fragment == fragment)
        scale = math.log(b.size_bytes / a.size_bytes)
        cells = [str(fragment), f"{math.log(b.floor / a.floor) / scale:.2f}"]
        cells.append(f"{math.log(b.ours / a.ours) / scale:.2f}")
        for method in REPARSERS:
            ca, cb = a.reparse.get(method.name), b.reparse.get(method.name)
            if ca is None or cb is None or not (ca.finished and cb.finished):
                cells.append("cut" if ca and cb else "n/a")
            else:
                cells.append(f"{math.log(cb.seconds / ca.seconds) / scale:.2f}")
        yield "| " + " | ".join(cells) + " |"


def versions() -> str:
    found = []
    for name in ("jiter", "partial-json-parser", "anthropic"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def report(cases: list[Case], args: argparse.Namespace, load: tuple[str, str]) -> str:
    lines = [
        "# Preview benchmark: incremental PartialJSON vs re-parsing per delta",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `python benchmarks/bench_preview.py"
        f"{' --quick' if args.quick else ''}` (budget {args.budget:g} s per re-parse case).",
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cores "
        f"(shared; load average {load[0]} at start, {load[1]} at the end); {versions()}.",
        "",
        "Times: CPU seconds; floor and ours are the best of 5 interleaved runs; re-parse ran once.",
        "`> t (p% done; ~T)`: stopped at the budget after p% of the fragments; T extrapolates",
        "quadratically. Ratios `re-parse/ours` with `>` are lower bounds (measured part only).",
        "",
        *header(),
        *(row(case) for case in cases),
        "",
        "Growth exponent k (time ~ size^k) between the two largest sizes:",
        "",
        *exponents(cases),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 and 256 KiB only, 5 s budget")
    parser.add_argument("--budget", type=float, help="seconds per re-parse case (default 60)")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument(
        "--masked", action="store_true", help="only the fields-vs-full masked-members growth"
    )
    parser.add_argument(
        "--members", type=int, default=4096, help="N for --masked (also timed at 4N)"
    )
    parser.add_argument("--fragment", type=int, default=8, help="characters per fragment")
    parser.add_argument("--runs", type=int, default=3, help="runs per --masked case (best)")
    parser.add_argument(
        "--tracker", action="store_true", help="only the preview tracker alone, per mode"
    )
    args = parser.parse_args()
    if args.tracker:
        text = tracker_report(max(args.runs, 5))
        print(text)
        if args.out:
            args.out.write_text(text, encoding="utf-8")
        return
    if args.masked:
        text = masked_report(args.members, args.fragment, args.runs)
        if args.out:
            args.out.write_text(text, encoding="utf-8")
        return
    if args.budget is None:
        args.budget = 5.0 if args.quick else 60.0
    sizes = [16 * KIB, 256 * KIB] if args.quick else [16 * KIB, 256 * KIB, 1024 * KIB]
    load_start = f"{os.getloadavg()[0]:.1f}"
    print("\n".join(header()), flush=True)
    cases = [
        measure(size, fragment, args.budget, runs=5) for size in sizes for fragment in (1, 8, 64)
    ]
    text = report(cases, args, (load_start, f"{os.getloadavg()[0]:.1f}"))
    print()
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
