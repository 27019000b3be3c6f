"""Load check of the relay: N concurrent runs of the demo over loopback HTTP.

Run it from the repository root::

    python benchmarks/bench_relay.py                 # 200 concurrent runs
    python benchmarks/bench_relay.py --runs 50 --delay-scale 0

Theory of operation
-------------------
Three processes, as in a deployment: the scripted model server (``python -m
toollatch.scripted``, the demo, ``--delay-scale`` of its 3 ms pacing), the relay (this process,
with the example tools, talking to that model over loopback HTTP), and the clients (a child
process: each POSTs a run and reads its SSE stream to the end, all ``--runs`` at once over one
httpx pool). The relay records each stored frame's append time and the clients each frame's
parse time, both on ``time.monotonic`` (CLOCK_MONOTONIC, one clock for every process).
**Event latency** is the difference: what the relay adds between the agent's event and the
browser's parse, including the SSE write, the socket and the client's own parse, with the
three processes sharing this machine's two cores. Also reported: events/s over the wall time,
and that every call of every run is paired (each run ends with ``run_ended``, every call has
a result, no id skipped or repeated). Nothing here is a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from toollatch.relay._config import RelayLimits  # noqa: E402
from toollatch.relay._runs import RelayRun  # noqa: E402
from toollatch.relay._server import RelayServer  # noqa: E402

APPENDED: dict[tuple[str, int], float] = {}


def _record_appends() -> None:
    original = RelayRun.append

    def append(self: RelayRun, data: dict[str, Any]) -> None:
        original(self, data)
        APPENDED[(self.id, len(self.frames))] = time.monotonic()

    RelayRun.append = append  # type: ignore[method-assign]


# -- the clients (child process) --------------------------------------------------------------


async def _one(client: httpx.AsyncClient, seen: list[Any]) -> dict[str, Any]:
    response = await client.post("/runs", json={"message": "weather please"})
    response.raise_for_status()
    run = response.json()
    headers = {"x-toollatch-session": run["session"]}
    ids: list[int] = []
    ended: dict[str, Any] | None = None
    results: set[str] = set()
    buffer = ""
    async with client.stream("GET", run["events_url"], headers=headers) as stream:
        async for text in stream.aiter_text():
            buffer += text
            *blocks, buffer = buffer.split("\n\n")
            now = time.monotonic()
            for block in blocks:
                fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
                if "id" not in fields:
                    continue
                ids.append(int(fields["id"]))
                seen.append((run["id"], ids[-1], now))
                data = json.loads(fields["data"])
                if data["type"] in ("tool_finished", "call_failed"):
                    results.add(data["id"])
                elif data["type"] == "run_ended":
                    ended = data
    paired = ended is not None and ended["error"] is None
    paired = paired and {c["id"] for c in ended["calls"]} == results
    return {
        "events": len(ids),
        "calls": len(ended["calls"]) if ended else 0,
        "exact": ids == list(range(1, len(ids) + 1)),
        "paired": paired,
    }


async def _clients(url: str, runs: int) -> None:
    seen: list[Any] = []
    # pools of 16 (httpcore scans a whole pool per request: one pool of 400 is quadratic)
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with contextlib.AsyncExitStack() as stack:
        pools = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=120, limits=limits)
            )
            for _ in range(-(-runs // 16))
        ]
        started = time.monotonic()
        done = await asyncio.gather(*(_one(pools[i % len(pools)], seen) for i in range(runs)))
        wall = time.monotonic() - started
    json.dump({"wall": wall, "runs": done, "seen": seen}, sys.stdout)


# -- the relay (this process) -----------------------------------------------------------------


def _start(command: list[str], pattern: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    match = re.search(pattern, proc.stdout.readline())
    if match is None:
        proc.kill()
        raise SystemExit(f"{command[2]} did not start")
    return proc, match.group(0)


async def _relay(args: argparse.Namespace) -> dict[str, Any]:
    model, url = _start(
        [sys.executable, "-m", "toollatch.scripted", "--delay-scale", str(args.delay_scale)],
        r"http://127\.0\.0\.1:\d+",
    )
    try:
        limits = RelayLimits(max_active_runs=args.runs, max_stored_runs=args.runs * 2)
        server = RelayServer(base_url=url + "/v1", model="scripted", limits=limits)
        async with server:
            command = [sys.executable, __file__, "--client", server.url, "--runs", str(args.runs)]
            env = {**os.environ, "PYTHONPATH": str(SRC)}
            child = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, env=env
            )
            out, _ = await child.communicate()
            return dict(json.loads(out))
    finally:
        model.terminate()
        model.wait()


def _report(result: dict[str, Any]) -> None:
    runs = result["runs"]
    latencies = sorted(t - APPENDED[(r, n)] for r, n, t in result["seen"])
    events = sum(r["events"] for r in runs)
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000
    paired = all(r["paired"] and r["exact"] for r in runs)
    print(
        f"runs: {len(runs)}, {sum(r['calls'] for r in runs)} calls, every call paired and "
        f"every id once: {paired}"
    )
    print(f"events: {events} in {result['wall']:.2f} s = {events / result['wall']:.0f} events/s")
    print(
        f"event latency (append -> client parse): p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--delay-scale",
        type=float,
        default=1.0,
        help="the scripted model's pacing (1: 3 ms between wire events)",
    )
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(_clients(args.client, args.runs))
        return
    _record_appends()
    _report(asyncio.run(_relay(args)))


if __name__ == "__main__":
    main()
