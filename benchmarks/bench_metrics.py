"""The cost of metrics on the assembly path: StreamParser alone vs StreamParser + Metrics.

Run it from the repository root::

    python benchmarks/bench_metrics.py            # 1 KiB, 16 KiB, 256 KiB per provider
    python benchmarks/bench_metrics.py --quick    # smoke run
    git show main:src/toollatch/runtime/_metrics.py > /tmp/before.py
    python benchmarks/bench_metrics.py --before /tmp/before.py   # before/after, side by side

The streams are bench_assembly's (one ``write_file`` call, 3-20 character fragments, one
event per read). Both contenders run the parser with ``observe=True`` (the agent loop's
setting) and loop over the notices of every read as the loop does; the second also hands
each notice to ``Metrics.on_notice``, the decided Round to ``Metrics.on_round`` and the
call's five agent events to ``Metrics.on_event``: everything the agent loop tells the
metrics for one round. The figures are the best of N samples, interleaved (the order
rotates every sample) so that machine noise hits every contender alike: ``on/off``, and,
the stable figure, the metrics' own time per round measured alone (``metrics us``, best of
15 samples of 2,000 rounds: short samples dodge preemption) against the parse time
(``cost``); the target is an overhead under 5 %. ``--before`` loads another version of
``_metrics.py`` (e.g. main's) as a third contender, measured the same way in the same
process. The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_assembly import (
    make_arguments,
    split_fragments,
    stream_anthropic,
    stream_gemini,
    stream_openai_chat,
    stream_openai_responses,
)

from toollatch import (
    CallCommittedEvent,
    CallOpenedEvent,
    Limits,
    RoundEndedEvent,
    StreamParser,
    ToolFinishedEvent,
    ToolStartedEvent,
)
from toollatch.runtime import Metrics

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


def one_round(provider: str, reads: Sequence[bytes], metrics: Any) -> None:
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


def run(provider: str, reads: Sequence[bytes], metrics: Any, times: int) -> None:
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


def metrics_cost(provider: str, reads: Sequence[bytes], repeat: int, make: type) -> float:
    """Seconds the metrics take for one round, alone: the same calls on a recorded round's
    notices and events (best of 15; this is the stable figure on a shared machine)."""
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
    metrics = make()

    def rounds() -> None:
        for _ in range(repeat):
            metrics.on_round_start(provider, 1)
            for notice in notices:
                metrics.on_notice(provider, notice)
            metrics.on_round(provider, round_)
            for event in events:
                metrics.on_event(provider, event)

    return min(timed(rounds) for _ in range(15)) / repeat


def load_before(path: str) -> type:
    """``Metrics`` from another version of ``_metrics.py``, as a sibling module (its relative
    imports resolve in ``toollatch.runtime``)."""
    spec = importlib.util.spec_from_file_location("toollatch.runtime._metrics_before", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Metrics  # type: ignore[no-any-return]


def best_per_round(
    provider: str, reads: Sequence[bytes], contenders: Sequence[Any], reps: int, inner: int
) -> list[float]:
    """Best sample of each contender (None: metrics off), the order rotating every sample."""
    samples: list[list[float]] = [[] for _ in contenders]
    order = list(range(len(contenders)))
    for _ in range(reps):
        for i in order:
            samples[i].append(timed(partial(run, provider, reads, contenders[i], inner)))
        order = order[1:] + order[:1]
    return [min(s) / inner for s in samples]


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--before", metavar="FILE", help="another _metrics.py to compare")
    parser.add_argument("--provider", action="append", help="only these (repeatable)")
    args = parser.parse_args(argv)
    sizes = (1024, 16384) if args.quick else (1024, 16384, 262144)
    reps = 5 if args.quick else 21
    makes: list[type] = [Metrics] + ([load_before(args.before)] if args.before else [])
    names = ["after", "before"][: len(makes)] if args.before else [""]
    print(load(), f"(best of {reps}, interleaved; cost: metrics alone / off)")
    heads = "".join(f" {n + ' on/off':>14} {n + ' us':>10} {n + ' cost':>11}" for n in names)
    print(f"{'provider':18} {'size':>8} {'off ms':>9}{heads}")
    for size in sizes:
        for provider, reads in streams(size).items():
            if args.provider and provider not in args.provider:
                continue
            inner = max(1, 200_000 // size)  # small rounds: several per sample
            contenders = [None, *(make() for make in makes)]
            off, *on = best_per_round(provider, reads, contenders, reps, inner)
            row = f"{provider:18} {size:>8} {off * 1e3:9.3f}"
            for b, make in zip(on, makes, strict=True):
                cost = metrics_cost(provider, reads, 500 if args.quick else 2000, make)
                row += f" {(b / off - 1):14.1%} {cost * 1e6:10.1f} {cost / off:11.1%}"
            print(row, flush=True)
    print(load())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
