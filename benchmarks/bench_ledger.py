"""Ledger overhead: claim+start+finish per call per backend, and calls/s with 4 workers.

    python3 benchmarks/bench_ledger.py            # memory, SQLite, Redis (if redis-server)
    python3 benchmarks/bench_ledger.py --quick    # fewer calls

*Overhead*: one process, one call at a time, the three writes a dispatcher makes for a call
that runs (claim, start, finish), timed over N calls. *4 workers*: four processes race over
the same N call ids (each claims every id; the winner starts and finishes it), the wall time
from a common start until all four are done; calls/s = N / wall. *Audit*: the opt-in record
of one call that did not commit (its redaction under a ``fields`` rule and one store write).
The SQLite file is on the local disk with ``synchronous=FULL`` (one fsync per commit); Redis
is a local redis-server with ``appendfsync always``, the durable setting a ledger needs.

*Hops* (SQLite): the same transactions through the ledger's worker thread and inline on the
event loop's thread (the ledger with its thread hop removed), claim+start as two writes and
as one (``claim(start=True)``), then the finish; the ratio thread / inline is the cost of the
hops.

*Dispatch* (``--dispatch``, SQLite): a ``Dispatcher(ledger=...)`` running rounds of one call
of a tool that returns at once, one round at a time: trips to the ledger's thread per call
and CPU (``time.process_time``) per call, with the dispatcher as it is (a call with nothing
to wait for is claimed and started in one write) and with every ``claim(start=True)`` split
back into a claim and a start (the two writes it made before), alternating in one process.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toollatch import (
    PreviewPolicy,
    Round,
    StreamParser,
    ToolPreview,
    ToolResult,
    ToolSpec,
    open_audit,
    open_ledger,
    tool,
)
from toollatch.ledger import ArgumentAudit, AuditPolicy, LedgerKey, Won
from toollatch.ledger._sqlite import SQLiteFile, SQLiteLedger
from toollatch.runtime import Dispatcher


class InlineFile(SQLiteFile):
    """The ledger's SQLite file with the thread hop removed: each transaction runs inline."""

    async def call(self, fn):  # type: ignore[no-untyped-def]
        return self._with_connection(fn)

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._executor.shutdown(wait=False)


async def hops(path: str, n: int, *, inline: bool, merged: bool) -> tuple[float, float]:
    """Seconds per call of claim+start (two writes, or one when ``merged``) and of the
    finish after it, through the worker thread or inline."""
    ledger = SQLiteLedger(path)
    if inline:
        old = ledger._file
        ledger._file = InlineFile(
            old.path,
            old._busy_ms / 1000,
            False,
            old._schema,
            label="SQLite ledger",
            thread="inline",
        )
    result = ToolResult(tool_call_id="x", name="t", content="ok")
    scope = f"hops-{inline}-{merged}-{time.time()}"
    to_start = to_finish = 0.0
    for i in range(n):
        key = LedgerKey(scope=scope, call_id=f"c{i}")
        t0 = time.perf_counter()
        claim = await ledger.claim(
            key, digest="d", worker="w", now=time.time(), lease_s=30, start=merged
        )
        assert isinstance(claim, Won)
        if not merged:
            await ledger.start(key, claim.token, now=time.time(), lease_s=30)
        t1 = time.perf_counter()
        await ledger.finish(key, claim.token, result, now=time.time())
        to_start += t1 - t0
        to_finish += time.perf_counter() - t1
    await ledger.aclose()
    return to_start / n, to_finish / n


async def hops_table(path: str, n: int, repeats: int = 3) -> None:
    print("\n| SQLite, per call | claim+start | then finish | claim+start: thread / inline |")
    print("|---|---|---|---|")
    for merged in (False, True):
        best: dict[bool, tuple[float, float]] = {}
        for _ in range(repeats):  # alternate, keep the best of each
            for inline in (False, True):
                got = await hops(path, n, inline=inline, merged=merged)
                if inline not in best or got[0] < best[inline][0]:
                    best[inline] = got
        name = "claim(start=True), one write" if merged else "claim, start: two writes"
        for inline in (False, True):
            where = "inline" if inline else "thread"
            ratio = f"{best[False][0] / best[True][0]:.2f}x" if not inline else ""
            print(
                f"| {name}, {where} | {best[inline][0] * 1e3:.3f} ms "
                f"| {best[inline][1] * 1e3:.3f} ms | {ratio} |"
            )


class CountingFile(SQLiteFile):
    """The ledger's SQLite file, counting the trips to its worker thread."""

    trips = 0

    async def call(self, fn):  # type: ignore[no-untyped-def]
        CountingFile.trips += 1
        return await super().call(fn)


class TwoWrites:
    """A ledger whose ``claim(start=True)`` is a claim then a start: the writes (and trips)
    the dispatcher made per call before it claimed and started in one."""

    def __init__(self, inner: SQLiteLedger) -> None:
        self.inner = inner

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    async def claim(self, key: LedgerKey, *, start: bool = False, **kw):  # type: ignore[no-untyped-def]
        claim = await self.inner.claim(key, **kw)
        if start and isinstance(claim, Won):
            await self.inner.start(key, claim.token, now=kw["now"], lease_s=kw["lease_s"])
        return claim


async def lookup(q: str) -> str:
    """Returns at once."""
    return q


def one_call_round(specs: list[ToolSpec], call_id: str) -> Round:
    """An OpenAI chat round with one committed ``lookup`` call."""
    parser = StreamParser("openai_chat", tools=specs)
    delta = {"index": 0, "id": call_id, "function": {"name": "lookup", "arguments": '{"q":"x"}'}}
    parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return parser.finish()


def counting_ledger(path: str) -> SQLiteLedger:
    ledger = SQLiteLedger(path)
    old = ledger._file
    ledger._file = CountingFile(
        old.path, old._busy_ms / 1000, False, old._schema, label="SQLite ledger", thread="ledger"
    )
    return ledger


async def dispatch_table(path: str, n: int, repeats: int = 3) -> None:
    quick = tool(name="lookup")(lookup)
    ledgers = {"claim(start=True), one write": counting_ledger(path)}
    ledgers["claim, then start: two writes"] = TwoWrites(counting_ledger(path))  # type: ignore[assignment]
    cpu = dict.fromkeys(ledgers, 0.0)
    wall = dict.fromkeys(ledgers, 0.0)
    trips = dict.fromkeys(ledgers, 0)
    done = 0
    for r in range(repeats):
        for k, (name, ledger) in enumerate(ledgers.items()):
            d = Dispatcher([quick], ledger=ledger, worker="w")
            rounds = [one_call_round(d.specs, f"{k}-{r}-{i}") for i in range(n)]
            before, started, t0 = CountingFile.trips, time.process_time(), time.perf_counter()
            for i, round_ in enumerate(rounds):
                [result] = await d.run(round_, session=f"s{i % 8}")
                assert result.content == "x", result
            cpu[name] += time.process_time() - started
            wall[name] += time.perf_counter() - t0
            trips[name] += CountingFile.trips - before
        done += n
    print("\n| SQLite ledger, dispatcher, per call | trips to its thread | CPU | wall |")
    print("|---|---:|---:|---:|")
    for name in ledgers:
        print(
            f"| {name} | {trips[name] / done:.2f} | {cpu[name] / done * 1e3:.3f} ms "
            f"| {wall[name] / done * 1e3:.3f} ms |"
        )
    for ledger in ledgers.values():
        await ledger.aclose()


async def one_by_one(url: str, n: int, scope: str) -> float:
    """Seconds per call for claim+start+finish, one call at a time."""
    ledger = open_ledger(url)
    result = ToolResult(tool_call_id="x", name="t", content="ok")
    started = time.perf_counter()
    for i in range(n):
        key = LedgerKey(scope=scope, call_id=f"c{i}")
        claim = await ledger.claim(key, digest="d", worker="w", now=time.time(), lease_s=30)
        assert isinstance(claim, Won)
        await ledger.start(key, claim.token, now=time.time(), lease_s=30)
        await ledger.finish(key, claim.token, result, now=time.time())
    elapsed = time.perf_counter() - started
    await ledger.aclose()
    return elapsed / n


async def racer(url: str, n: int, scope: str, start_at: float) -> int:
    """Claim every id; run (start+finish) those won. Returns how many this worker ran."""
    ledger = open_ledger(url)
    result = ToolResult(tool_call_id="x", name="t", content="ok")
    await asyncio.sleep(max(0.0, start_at - time.time()))
    ran = 0
    for i in range(n):
        key = LedgerKey(scope=scope, call_id=f"c{i}")
        claim = await ledger.claim(key, digest="d", worker="w", now=time.time(), lease_s=30)
        if isinstance(claim, Won):
            await ledger.start(key, claim.token, now=time.time(), lease_s=30)
            await ledger.finish(key, claim.token, result, now=time.time())
            ran += 1
    await ledger.aclose()
    return ran


def failed_round() -> Round:
    """One OpenAI chat round with one call whose arguments break off mid-string."""
    parser = StreamParser("openai_chat", tools=[ToolSpec(name="write_file")])
    text = '{"path": "notes/a.md", "content": "' + "x" * 300 + '", "mode": 0o'
    delta = {"index": 0, "id": "c1", "function": {"name": "write_file", "arguments": text}}
    parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return parser.finish()


async def audit_per_call(url: str, n: int) -> float:
    """Seconds per audit record (redaction with a fields rule + one store write)."""
    previews = PreviewPolicy(tools={"write_file": ToolPreview(mode="fields", fields=("/path",))})
    audit = ArgumentAudit(open_audit(url), AuditPolicy(previews=previews))
    round_ = failed_round()
    started = time.perf_counter()
    for i in range(n):
        assert await audit.record(f"scope-{i % 50}", round_) == 1
    elapsed = time.perf_counter() - started
    await audit.store.aclose()
    return elapsed / n


def four_workers(url: str, n: int, scope: str) -> tuple[float, list[int]]:
    start_at = time.time() + 1.5
    code = (
        "import asyncio, sys; sys.path.insert(0, sys.argv[1]); import bench_ledger as b;"
        "a = sys.argv; print(asyncio.run(b.racer(a[2], int(a[3]), a[4], float(a[5]))))"
    )
    here = str(Path(__file__).parent)
    args = [sys.executable, "-c", code, here, url, str(n), scope, repr(start_at)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    ran = [int(p.communicate()[0]) for p in procs]
    return time.time() - start_at, ran


def start_redis(folder: str) -> tuple[subprocess.Popen[bytes], str] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder, "--save", "",
         "--appendonly", "yes", "--appendfsync", "always"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hops", action="store_true", help="only the SQLite hops table")
    parser.add_argument(
        "--dispatch", action="store_true", help="only the dispatcher's trips and CPU per call"
    )
    args = parser.parse_args()
    n = 200 if args.quick else 2000
    only = dispatch_table if args.dispatch else hops_table if args.hops else None
    if only is not None:  # one SQLite table, in a file of its own
        folder = tempfile.mkdtemp(prefix="toollatch-bench-")
        try:
            asyncio.run(only(f"{folder}/table.db", n // 4))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    folder = tempfile.mkdtemp(prefix="toollatch-bench-")
    redis = start_redis(folder)
    urls = {"memory": "memory:", "sqlite": f"sqlite:///{folder}/ledger.db"}
    if redis is not None:
        urls["redis"] = redis[1]
    print(f"| backend | claim+start+finish per call | calls/s, 4 workers racing on {n} ids "
          "| audit record of an uncommitted call (opt-in) |")  # fmt: skip
    print("|---|---|---|---|")
    try:
        for name, url in urls.items():
            per_call = asyncio.run(one_by_one(url, n, "solo"))
            audit = asyncio.run(audit_per_call(url, n // 4))
            if name == "memory":  # in one process only: nothing to race
                print(f"| {name} | {per_call * 1e6:.0f} us | - | {audit * 1e6:.0f} us |")
                continue
            wall, ran = four_workers(url, n, "race")
            assert sum(ran) == n, ran  # exactly one worker ran each call
            print(
                f"| {name} | {per_call * 1e3:.2f} ms | {n / wall:.0f} (runs per worker {ran}) "
                f"| {audit * 1e3:.2f} ms |"
            )
    finally:
        if redis is not None:
            redis[0].terminate()
            redis[0].wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
