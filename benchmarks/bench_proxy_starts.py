"""`toollatch proxy`'s CPU per stream start: short streams through the proxy, process CPU
time over requests.

Run it from the repository root::

    python3 benchmarks/bench_proxy_starts.py --baseline main=/tmp/base/src

Theory of operation
-------------------
Three processes: a raw asyncio upstream (no framework: it reads each request and answers a
fixed chunked SSE stream of ``--events`` chunks and ``[DONE]``, so its own cost is small and
not counted), each proxy (``ProxyServer`` in a process of its own, heap settled as
``toollatch proxy`` does; ``--baseline NAME=SRC`` adds one from another source tree), and the
clients (this process: raw asyncio sockets, ``--concurrency`` keep-alive connections, or a
new connection per request with ``--fresh``). A round starts ``--concurrency`` streams at
once and waits for all of them; ``--rounds`` rounds make a repeat; the targets take turns
each repeat, so a change of load hits both.

**CPU per request** is the proxy process's utime + stime (``/proc/<pid>/stat``, 100 Hz
ticks) over a repeat, divided by its requests: the stream's start (request head and body,
the guard, routing, the gate's lookup, the upstream request built and sent, the answer's
head), its few events and its end. With ``--events 1`` a stream is one chunk: nearly all
start. The table gives the median per target and the median of the paired ratios (each
repeat's target over the first target of that repeat). ``--profile DIR`` writes a cProfile
of each proxy (``DIR/NAME.prof``) over the measured repeats (the profile slows the proxy
about threefold: read it for shares, not times).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

UPSTREAM = r"""
import asyncio, sys
EVENTS = int(sys.argv[1])
TEXT = [b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"bench",'
        b'"choices":[{"index":0,"delta":{"content":" word%d"},"finish_reason":null}]}' % n
        for n in range(EVENTS - 1)]
END = (b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"bench",'
       b'"choices":[{"index":0,"delta":{"content":"end"},"finish_reason":"stop"}]}')
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            size = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    size = int(line.split(b":")[1])
            await reader.readexactly(size)
            writer.write(HEAD)
            for event in [*TEXT, END]:
                writer.write(chunk(b"data: " + event + b"\n\n"))
                await writer.drain()
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print("http://127.0.0.1:%d/v1" % server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""

# The proxy: upstream URL in, its own base URL out; with a third argument, a cProfile written
# there at each SIGUSR1 (then profiling goes on).
RUNNER = r"""
import asyncio, cProfile, signal, sys
from toollatch.relay._proxy import ProxyServer
from toollatch.relay._server import settle_heap

async def main():
    async with ProxyServer(sys.argv[1]) as proxy:
        settle_heap()
        if sys.argv[2:]:
            profile = cProfile.Profile()

            def dump(*_):
                profile.disable()
                profile.dump_stats(sys.argv[2])
                profile.enable()

            signal.signal(signal.SIGUSR1, dump)
            profile.enable()
        print(proxy.url, flush=True)
        await proxy.serve_forever()

asyncio.run(main())
"""

from bench_proxy import TOOLS  # noqa: E402  (bench_proxy.py's tool set: the same schema)


def cpu(pid: int) -> float:
    """utime + stime of ``pid`` (seconds)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def request(port: int, n: int) -> bytes:
    """A streaming chat request with the bench's tool, as an SDK would send it."""
    body = json.dumps(
        {
            "model": "bench",
            "stream": True,
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": f"Weather in Oslo and Lima? (stream {n})"},
            ],
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        "content-type: application/json\r\naccept: text/event-stream\r\n"
        "authorization: Bearer sk-bench\r\nuser-agent: bench\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> None:
    """One stream on a connection, read to its end (checked)."""
    writer.write(data)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the proxy answered {head[:40]!r}")
    got = b""
    while not got.endswith(b"0\r\n\r\n"):
        got += await reader.read(65536)
    if b"data: [DONE]" not in got:
        raise RuntimeError("a stream ended without [DONE]")


async def drive(port: int, rounds: int, concurrency: int, fresh: bool) -> None:
    """``rounds`` rounds of ``concurrency`` streams started at once."""
    kept = []
    if not fresh:
        kept = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]

    async def stream(i: int, n: int) -> None:
        if fresh:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await one(reader, writer, request(port, n))
            writer.close()
        else:
            await one(*kept[i], request(port, n))

    for r in range(rounds):
        await asyncio.gather(*(stream(i, r * concurrency + i) for i in range(concurrency)))
    for _, writer in kept:
        writer.close()


def started(
    args: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """A process and the first line it prints (its URL)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--events", type=int, default=3, help="chunks per stream (>= 1)")
    parser.add_argument("--fresh", action="store_true", help="a new connection per stream")
    parser.add_argument("--profile", metavar="DIR", help="a cProfile of each proxy there")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    sources = {"toollatch": here} | dict(b.split("=", 1) for b in args.baseline)
    upstream, upstream_url = started([sys.executable, "-c", UPSTREAM, str(max(args.events, 1))])
    targets: dict[str, tuple[subprocess.Popen[str], int]] = {}
    per_request: dict[str, list[float]] = {name: [] for name in sources}
    ratios: dict[str, list[float]] = {name: [] for name in sources}
    load = Path("/proc/loadavg").read_text().split()[:3]
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    try:
        for name, src in sources.items():
            profile = [str(Path(args.profile) / f"{name}.prof")] if args.profile else []
            env = {**os.environ, "PYTHONPATH": src}
            proc, url = started([sys.executable, "-c", RUNNER, upstream_url, *profile], env)
            targets[name] = (proc, int(url.rsplit(":", 1)[1].split("/")[0]))
        for proc, port in targets.values():  # (warm: connections, gate cache, imports)
            asyncio.run(drive(port, 2, args.concurrency, args.fresh))
            if args.profile:
                proc.send_signal(signal.SIGUSR1)
        for _ in range(args.repeats):
            for name, (proc, port) in targets.items():
                before = cpu(proc.pid)
                asyncio.run(drive(port, args.rounds, args.concurrency, args.fresh))
                spent = cpu(proc.pid) - before
                per_request[name].append(spent / (args.rounds * args.concurrency) * 1e6)
            first = per_request["toollatch"][-1]
            for name in sources:
                ratios[name].append(per_request[name][-1] / first)
        if args.profile:
            for proc, _ in targets.values():
                proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
    finally:
        for proc, _ in targets.values():
            proc.send_signal(signal.SIGTERM)
        upstream.kill()
    end = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"# bench_proxy_starts: {args.repeats} repeats of {args.rounds} rounds of "
        f"{args.concurrency} streams, {args.events} chunk(s) each"
        f"{', a new connection each' if args.fresh else ''}; load average "
        f"{' '.join(load)} at the start, {' '.join(end)} at the end"
    )
    print("| target | CPU µs per request (median) | per repeat | ratio to toollatch (median) |")
    print("|---|---:|---|---:|")
    for name in sources:
        runs = ", ".join(f"{x:.0f}" for x in per_request[name])
        median = statistics.median(per_request[name])
        print(f"| {name} | {median:.0f} | {runs} | {statistics.median(ratios[name]):.2f} |")


if __name__ == "__main__":
    main()
