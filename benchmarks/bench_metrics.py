"""The cost of metrics on the assembly path: StreamParser alone vs StreamParser + Metrics.

Run it from the repository root::

    python benchmarks/bench_metrics.py            # 1 KiB, 16 KiB, 256 KiB per provider
    python benchmarks/bench_metrics.py --quick    # smoke run

The streams are bench_assembly's (one ``write_file`` call, 3-20 character fragments, one
event per read). Both contenders run the parser with ``observe=True`` (the agent loop's
setting) and loop over the notices of every read as the loop does; the second also hands
each notice to ``Metrics.on_notice``, the decided Round to ``Metrics.on_round`` and the
call's five agent events to ``Metrics.on_event``: everything the agent loop tells the
metrics for one round. The figure is the median over repetitions, interleaved so that
machine noise hits both alike (``on/off``), and, the stable figure, the metrics' own time
per round measured alone (``metrics us``) against the parse time (``cost``); the target is
an overhead under 5 %.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_assembly import (
    make_arguments,
    split_fragments,
    stream_anthropic,
    stream_gemini,
    stream_openai_chat,
    stream_openai_responses,
)

from toollatch import Limits, StreamParser
from toollatch.runtime._agent_events import (
    CallCommittedEvent,
    CallOpenedEvent,
    RoundEndedEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
)
from toollatch.runtime._metrics import Metrics

LIMITS = Limits(max_argument_bytes=4 * 1024 * 1024)


def streams(size: int, seed: int = 7) -> dict[str, list[bytes]]:
    rng = random.Random(seed)
    text, obj = make_arguments(size, rng)
    frags = split_fragments(text, rng)
    return {
        "openai_chat": stream_openai_chat(frags, rng),
        "openai_responses": stream_openai_responses(frags, rng),
        "anthropic": stream_anthropic(frags, rng),
        "gemini": stream_gemini(obj, rng),
    }


def one_round(provider: str, reads: Sequence[bytes], metrics: Metrics | None) -> None:
    parser = StreamParser(provider, limits=LIMITS, observe=True)
    if metrics is not None:
        metrics.on_round_start(provider, 1)
    for read in reads:
        for notice in parser.feed(read):
            if metrics is not None:
                metrics.on_notice(provider, notice)
    round_ = parser.finish()
    call = round_.calls[0]
    assert call.committed is not None, (call.error, call.detail)
    events = (  # the loop makes these whether metrics listen or not
        CallOpenedEvent(id=call.call_id, name=call.name),
        CallCommittedEvent(id=call.call_id, name="write_file", arguments={}, early=False),
        ToolStartedEvent(id=call.call_id, name="write_file"),
        ToolFinishedEvent(id=call.call_id, name="write_file", is_error=False, error=None),
        RoundEndedEvent(round=1, ended="normal", stop_reason=None),
    )
    if metrics is None:
        return
    for notice in parser.finish_notices:
        metrics.on_notice(provider, notice)
    metrics.on_round(provider, round_)
    for event in events:
        metrics.on_event(provider, event)


def run(provider: str, reads: Sequence[bytes], metrics: Metrics | None, times: int) -> None:
    for _ in range(times):
        one_round(provider, reads, metrics)


def timed(fn: Callable[[], None]) -> float:
    gc.collect()
    gc.disable()  # a collection landing in one contender's sample is noise, not its cost
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def metrics_cost(provider: str, reads: Sequence[bytes], repeat: int) -> float:
    """Seconds the metrics take for one round, alone: the same calls on a recorded round's
    notices and events (best of 5; this is the stable figure on a shared machine)."""
    parser = StreamParser(provider, limits=LIMITS, observe=True)
    notices = [n for read in reads for n in parser.feed(read)]
    round_ = parser.finish()
    notices += parser.finish_notices
    call = round_.calls[0]
    events = (
        CallOpenedEvent(id=call.call_id, name=call.name),
        ToolStartedEvent(id=call.call_id, name="write_file"),
        ToolFinishedEvent(id=call.call_id, name="write_file", is_error=False, error=None),
        RoundEndedEvent(round=1, ended="normal", stop_reason=None),
    )
    metrics = Metrics()

    def rounds() -> None:
        for _ in range(repeat):
            metrics.on_round_start(provider, 1)
            for notice in notices:
                metrics.on_notice(provider, notice)
            metrics.on_round(provider, round_)
            for event in events:
                metrics.on_event(provider, event)

    return min(timed(rounds) for _ in range(5)) / repeat


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    sizes = (1024, 16384) if args.quick else (1024, 16384, 262144)
    reps = 5 if args.quick else 21
    metrics = Metrics()
    print(
        f"{'provider':18} {'size':>8} {'off ms':>9} {'on ms':>9} {'on/off':>8}"
        f" {'metrics us':>11} {'cost':>7}"
    )
    for size in sizes:
        for provider, reads in streams(size).items():
            inner = max(1, 200_000 // size)  # small rounds: several per sample
            off: list[float] = []
            on: list[float] = []
            for rep in range(reps):
                pair = [(off, None), (on, metrics)]
                for samples, m in pair if rep % 2 else pair[::-1]:  # alternate who goes first
                    samples.append(timed(partial(run, provider, reads, m, inner)))
            a, b = statistics.median(off) / inner, statistics.median(on) / inner
            cost = metrics_cost(provider, reads, 2000 if args.quick else 10000)
            print(
                f"{provider:18} {size:>8} {a * 1e3:9.3f} {b * 1e3:9.3f} {(b / a - 1):8.1%}"
                f" {cost * 1e6:11.1f} {cost / a:7.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
