"""Load check of the relay: N concurrent runs of the demo over loopback HTTP.

Run it from the repository root::

    python benchmarks/bench_relay.py                 # 200 runs at a model's pace (30 ms)
    python benchmarks/bench_relay.py --runs 50 --delay-scale 0
    python benchmarks/bench_relay.py --shape lockstep --delay-scale 1  # the worst case
    python benchmarks/bench_relay.py --matrix --repeat 3  # the README's table
    python benchmarks/bench_relay.py --protocols --runs 100 --repeat 5  # own vs UI vs AG-UI
    python benchmarks/bench_relay.py --vs-ai-sdk --repeat 3  # beside the AI SDK's node relay
    python benchmarks/bench_relay.py --stores --runs 50 --repeat 3  # memory: vs redis://
    python benchmarks/bench_relay.py --workers 3 --runs 600  # serve workers on one Redis
    python benchmarks/bench_relay.py --workers 3 --store redis://HOST:PORT/0  # that Redis

By default the runs start evenly over one run's length (users arriving independently) and
the model streams at 30 ms between wire events (``--delay-scale 10``: about a typical
model's rate); ``--matrix`` adds the demo's 3 ms pacing, in lockstep and staggered, and a
fast model (10 ms).

Theory of operation
-------------------
Three processes, as in a deployment: the scripted model server (``python -m
toollatch.scripted``, the demo, ``--delay-scale`` of its 3 ms pacing), the relay (this process,
with the example tools, talking to that model over loopback HTTP), and the clients (a child
process: each POSTs a run and reads its SSE stream to the end, on a connection of its own in
plain HTTP/1.1 over asyncio streams, as the load shape starts them). The relay records each
stored frame's append time and the clients each frame's parse time, both on
``time.monotonic`` (CLOCK_MONOTONIC, one clock for every process).
**Event latency** is the difference: what the relay adds between the agent's event and the
browser's parse, including the SSE write, the socket and the client's own parse, with the
three processes sharing this machine's two cores. It starts when the relay has read the
model's bytes, so a relay that reads its model streams late does not show there: the **run
length** (POST to ``run_ended`` parsed, against one run alone) does. Also reported: events/s
over the wall time, the relay's garbage collections during the load (each one a pause of the
loop), and that every call of every run is paired (each run ends with ``run_ended``, every
call has a result, no id skipped or repeated). Nothing here is a test: timings depend on the
machine.

Load shape. One run goes alone first (it warms the relay and measures one run's length L and
its events E). ``--shape lockstep`` then starts every run at once: with one script and one
pacing the runs move together, so each model event comes as a burst of one event per run.
``--shape staggered`` starts them evenly over L, as users arriving independently would. The
*offered* load is runs x E / L events/s while every run is in flight (lockstep: for all of L;
staggered: only at the peak, half of it on average); the relay's *capacity* is events per
second of its own CPU (one event loop: at most one core). ``--matrix`` prints both for each
case, with the achieved events/s and the latency percentiles.

Scale-out (``--workers N``). The relay runs as real ``toollatch serve`` processes (each on a
port of its own, started through this file, which stamps their events as above and writes
the stamps when they stop), over one Redis: ``--store redis://HOST:PORT/DB``, or a
redis-server of Debian's started here in a temporary folder (no persistence) when no URL (or
a bare ``redis://``) is given. The clients spread the runs round-robin over the workers, as a
load balancer without sticky sessions: run ``i`` is posted to worker ``i mod N`` and its events
are read from worker ``i + 1 mod N`` (so every read crosses Redis: the worst case; a real
balancer lands on the owner one time in N). In one invocation: one worker with the in-memory
store and N workers on Redis under the chosen shape (the one-run table), then every run at
once on 1..N workers (throughput: the events of all runs over the wall time until the last
``run_ended``), then the cost per run of durable runs (``serve --durable`` when this checkout
has it, else benchmarks/bench_durable.py's DurableRuns measure). Each load is checked: every
run's SSE ids are 1..N once each, N being the number of events its worker appended (counted
from the worker's stamps), it ends with ``run_ended`` and every call is paired; the bench
exits with the failing runs otherwise. Event latency is measured as above (the agent
event's creation in the worker, to the client's parse), with the store's hop in it: the
owner's write to the stream and the other worker's ``XREAD``. CPU per event is the workers'
and redis-server's (from /proc; Redis's only when started here), not the clients' nor the
model's, which are shown beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import gc
import json
import os
import pstats
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from toollatch.relay._config import RelayLimits  # noqa: E402
from toollatch.relay._runs import RelayRun  # noqa: E402
from toollatch.relay._server import RelayServer, settle_heap  # noqa: E402
from toollatch.relay.protocols._agui import AguiView, Shape  # noqa: E402
from toollatch.relay.protocols._ui_message import UIMessageEncoder, event_data  # noqa: E402
from toollatch.runtime import _agent  # noqa: E402

APPENDED: dict[tuple[str, int], tuple[float, float]] = {}
"""(run id, SSE id) -> (the agent event's creation, the relay's append), time.monotonic."""


_CREATED = [0.0]
"""When the agent last created an event: set on entering each of its creation points."""


class _StampedQueue(asyncio.Queue):  # type: ignore[type-arg]
    """An AgentRun's event queue that remembers when each item was put (the agent puts an
    event the moment it creates it): for a relay that appends what the queue hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: collections.deque[float] = collections.deque()

    def _put(self, item: Any) -> None:
        self.stamps.append(time.monotonic())
        super()._put(item)  # type: ignore[misc]

    def _get(self) -> Any:
        _CREATED[0] = self.stamps.popleft()
        return super()._get()  # type: ignore[misc]


def _record_times() -> None:
    """Stamp each event's creation and its append to the relay's log.

    This relay appends each event from inside the agent's creation points, synchronously
    (it is the agent's observer): ``AgentRun._emit`` (agent events), ``DispatchRound._emit``
    (tool events; ``Agent._tool_event`` before) and ``AgentRun._notices`` (previews, from
    the notices the core just returned), so the stamp taken on entering them is the
    event's own. A relay that appends what the AgentRun's queue hands it (before 86a1543,
    when ``RelayRun.preview`` existed) gets the stamp of its queue's put instead."""

    def stamped(original: Any) -> Any:
        def creating(*args: Any, **kwargs: Any) -> Any:
            _CREATED[0] = time.monotonic()
            return original(*args, **kwargs)

        return creating

    if hasattr(RelayRun, "preview"):  # the queue-fed relay
        init = _agent.AgentRun.__init__

        def stamped_init(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self._events = _StampedQueue()

        _agent.AgentRun.__init__ = stamped_init  # type: ignore[method-assign]
    else:
        _agent.AgentRun._emit = stamped(_agent.AgentRun._emit)  # type: ignore[method-assign]
        _agent.AgentRun._notices = stamped(_agent.AgentRun._notices)  # type: ignore[method-assign]
        if hasattr(_agent.Agent, "_tool_event"):  # (before the dispatch round had its own)
            _agent.Agent._tool_event = stamped(_agent.Agent._tool_event)  # type: ignore[method-assign]
        else:
            from toollatch.runtime import _dispatch_round  # noqa: PLC0415

            rounds = _dispatch_round.DispatchRound
            rounds._emit = stamped(rounds._emit)  # type: ignore[method-assign]
    append = RelayRun.append

    def stamped_append(self: Any, data: dict[str, Any]) -> None:
        append(self, data)
        log = getattr(self, "log", None)  # (its own id: last_id waits for a shared store)
        last = log.last_id if log is not None else len(self.frames)
        APPENDED[(self.id, last)] = (_CREATED[0], time.monotonic())

    RelayRun.append = stamped_append  # type: ignore[method-assign]


# -- the clients (child process) --------------------------------------------------------------
# Plain HTTP/1.1 over asyncio streams, not httpx: 200 browsers are 200 machines, and the
# clients share this one with the relay; httpx's per-chunk work in one process made the
# clients cost about as much CPU as the relay they measure (2.4 s at 200 runs).


async def _request(host: str, port: int, head: str, body: bytes = b"") -> tuple[Any, Any, int, int]:
    """Send one request on a new connection; (reader, writer, status, content length or -1)
    after the headers."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head.encode() + b"\r\n" + body)
    status = int((await reader.readline()).split()[1])
    length = -1
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return reader, writer, status, length


async def _chunks(reader: Any) -> Any:
    """The chunks of a chunked body, as they arrive."""
    while size := int((await reader.readline()).strip(), 16):
        yield await reader.readexactly(size)
        await reader.readexactly(2)


async def _one(
    host: str,
    port: int,
    seen: list[Any],
    start_s: float,
    chat: bool = False,
    read_at: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """One run over ``POST /runs`` + ``GET /runs/{id}/events``; ``chat``: in a chat of its
    own (``chat_id``, as the page sends: its history kept on the server); ``read_at``: the
    events read from another worker than the one the run was posted to."""
    await asyncio.sleep(start_s)  # a staggered start (0: all at once)
    posted = time.monotonic()
    length = 0.0
    asked: dict[str, Any] = {"message": "weather please"}
    if chat:
        asked["chat_id"] = secrets.token_urlsafe(12)
    body = json.dumps(asked).encode()
    session = secrets.token_urlsafe(32)  # a browser's would be its cookie
    head = "POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"X-Toollatch-Session: {session}\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    reader, writer, status, length = await _request(host, port, head, body)
    assert status == 201, status
    # by its length, as a browser reads it: not until the server closes the connection
    run = json.loads(await reader.readexactly(length))
    writer.close()
    head = f"GET {run['events_url']} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += f"X-Toollatch-Session: {session}\r\n"
    reader, writer, status, _ = await _request(*(read_at or (host, port)), head)
    if status != 200:
        raise SystemExit(f"GET {run['events_url']}: {status} {(await reader.read(500))!r}")
    ids: list[int] = []
    notes: list[str] = []
    ended: dict[str, Any] | None = None
    results: set[str] = set()
    buffer = b""
    async for chunk in _chunks(reader):
        now = time.monotonic()
        *blocks, buffer = (buffer + chunk).split(b"\n\n")
        for block in blocks:
            if block.startswith(b": ") and block != b": heartbeat":
                notes.append(block[2:].decode(errors="replace"))
            fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
            if b"id" not in fields:
                continue
            ids.append(int(fields[b"id"]))
            seen.append((run["id"], ids[-1], now))
            if fields[b"event"] in (b"tool_finished", b"call_failed"):
                results.add(json.loads(fields[b"data"])["id"])
            elif fields[b"event"] == b"run_ended":
                ended = json.loads(fields[b"data"])
                length = now - posted
    writer.close()
    paired = ended is not None and ended["error"] is None
    paired = paired and {c["id"] for c in ended["calls"]} == results
    return {
        "id": run["id"],
        "events": len(ids),
        "length": length,
        "calls": len(ended["calls"]) if ended else 0,
        "exact": ids == list(range(1, len(ids) + 1)),
        "paired": paired,
        "notes": notes,
    }


async def _one_ui(host: str, port: int, seen: list[Any], start_s: float) -> dict[str, Any]:
    """One run over ``POST /api/chat`` (the AI SDK's UI message stream), read to its end."""
    await asyncio.sleep(start_s)
    posted = time.monotonic()
    length = 0.0
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "weather please"}]}
    chat = {"id": secrets.token_urlsafe(12), "messages": [user], "trigger": "submit-message"}
    body = json.dumps(chat).encode()
    head = "POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"X-Toollatch-Session: {secrets.token_urlsafe(32)}\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    reader, writer, status, _ = await _request(host, port, head, body)
    assert status == 200, status
    chunks, done, finished = 0, False, False
    inputs: set[str] = set()
    outputs: set[str] = set()
    buffer = b""
    async for part in _chunks(reader):
        *blocks, buffer = (buffer + part).split(b"\n\n")
        for block in blocks:
            if not block.startswith(b"data: "):
                continue
            if block == b"data: [DONE]":
                done, length = True, time.monotonic() - posted
                continue
            chunk = json.loads(block[6:])
            chunks += 1
            if chunk["type"] == "tool-input-available":
                inputs.add(chunk["toolCallId"])
            elif chunk["type"] in ("tool-output-available", "tool-output-error"):
                outputs.add(chunk["toolCallId"])
            finished = finished or chunk["type"] == "finish"
    writer.close()
    return {
        "events": chunks,
        "length": length,
        "calls": len(inputs),
        "exact": done and finished,
        "paired": inputs == outputs,
    }


async def _one_agui(host: str, port: int, seen: list[Any], start_s: float) -> dict[str, Any]:
    """One run over ``POST /agui`` (AG-UI's event stream), read to its end."""
    await asyncio.sleep(start_s)
    posted = time.monotonic()
    length = 0.0
    thread = secrets.token_urlsafe(12)
    message = {"id": "u1", "role": "user", "content": "weather please"}
    given = {"threadId": thread, "runId": "r1", "messages": [message], "tools": [], "context": []}
    body = json.dumps(given).encode()
    head = "POST /agui HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "Accept: text/event-stream\r\n"
    head += f"X-Toollatch-Session: {secrets.token_urlsafe(32)}\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    reader, writer, status, _ = await _request(host, port, head, body)
    assert status == 200, status
    events, finished = 0, False
    ended: set[str] = set()
    results: set[str] = set()
    buffer = b""
    async for part in _chunks(reader):
        *blocks, buffer = (buffer + part).split(b"\n\n")
        for block in blocks:  # (``id: N`` then ``data: {...}``)
            data = next((x for x in block.split(b"\n") if x.startswith(b"data: ")), None)
            if data is None:
                continue
            event = json.loads(data[6:])
            events += 1
            if event["type"] == "TOOL_CALL_END":
                ended.add(event["toolCallId"])
            elif event["type"] == "TOOL_CALL_RESULT":
                results.add(event["toolCallId"])
            elif event["type"] == "RUN_FINISHED":
                finished, length = True, time.monotonic() - posted
    writer.close()
    return {
        "events": events,
        "length": length,
        "calls": len(ended),
        "exact": finished,
        "paired": ended == results,
    }


async def _clients(url: str, runs: int, stagger_s: float, protocol: str = "own") -> None:
    """``url``: one relay, or several workers' comma-separated (``--workers``): run ``i`` is
    posted to worker ``i mod N`` and read from worker ``i + 1 mod N``, as a round-robin load
    balancer without sticky sessions sends each request to the next worker."""
    seen: list[Any] = []
    where = [
        (h, int(p)) for h, p in (u.removeprefix("http://").rsplit(":", 1) for u in url.split(","))
    ]
    starts = [i * stagger_s / runs for i in range(runs)]  # evenly over the stagger
    started = time.monotonic()
    one = {"ui": _one_ui, "agui": _one_agui}.get(protocol, _one)
    extra = (True,) if protocol == "chat" else ()  # (our own format, in chats)
    if len(where) > 1:
        done = await asyncio.gather(
            *(
                _one(*where[i % len(where)], seen, s, read_at=where[(i + 1) % len(where)])
                for i, s in enumerate(starts)
            )
        )
    else:
        done = await asyncio.gather(*(one(*where[0], seen, s, *extra) for s in starts))
    wall = time.monotonic() - started
    cpu = time.process_time()
    json.dump({"wall": wall, "runs": done, "seen": seen, "client_cpu": cpu}, sys.stdout)


# -- the flood (another child process, with --flood) -----------------------------------------
# What a hostile client can hold open against the relay while the measured runs stream:
# slowloris connections (a request head sent a byte a second, never finished; reopened when
# the relay closes one) and idle event readers (readers of the flooder's own runs that never
# read, with a 4 KiB receive buffer; reopened every second; per session at most
# max_session_readers are served, the rest get 429).

_FLOOD_SESSIONS = 4


async def _slowloris(host: str, port: int, stats: collections.Counter[str], stop: Any) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            stats["connect_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        stats["slow_opened"] += 1
        stats["slow_open"] += 1
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            while not stop.is_set():
                writer.write(b"a")
                await writer.drain()
                try:
                    data = await asyncio.wait_for(reader.read(256), 1.0)
                except TimeoutError:
                    continue
                status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "none"
                stats[f"slow_closed_{status}"] += 1
                break
        except OSError:
            stats["slow_closed_reset"] += 1
        finally:
            stats["slow_open"] -= 1
            writer.close()
        await asyncio.sleep(0.1)


async def _post_run(host: str, port: int, session: str) -> str | None:
    body = json.dumps({"message": "flood"}).encode()
    head = "POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"X-Toollatch-Session: {session}\r\nContent-Length: {len(body)}\r\n"
    head += "Connection: close\r\n"
    reader, writer, status, length = await _request(host, port, head, body)
    answer = json.loads(await reader.readexactly(length))
    writer.close()
    return answer["events_url"] if status == 201 else None


async def _idle_readers(
    host: str, port: int, readers: int, stats: collections.Counter[str], stop: Any
) -> None:
    sessions = [secrets.token_urlsafe(32) for _ in range(_FLOOD_SESSIONS)]
    urls: dict[str, str] = {}
    held: list[tuple[float, socket.socket]] = []
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        for session in sessions:
            try:
                url = await _post_run(host, port, session)
            except (OSError, ValueError, IndexError) as exc:
                stats[f"flood_post_{type(exc).__name__}"] += 1
                continue
            stats["flood_runs_started" if url else "flood_runs_429"] += 1
            urls[session] = url or urls.get(session, "")
            if not urls[session]:
                continue
            for _ in range(readers // _FLOOD_SESSIONS):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                try:
                    await loop.sock_connect(sock, (host, port))
                    head = f"GET {urls[session]} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    head += f"X-Toollatch-Session: {session}\r\n\r\n"
                    await loop.sock_sendall(sock, head.encode())
                    line = await asyncio.wait_for(loop.sock_recv(sock, 12), 10)
                except (OSError, TimeoutError):
                    stats["readers_failed"] += 1
                    sock.close()
                    continue
                status = line[9:12].decode(errors="replace") or "none"
                stats[f"readers_{status}"] += 1
                if status == "200":
                    held.append((time.monotonic(), sock))  # and never read again
                else:
                    sock.close()
        cutoff = time.monotonic() - 20  # at most 20 s of readers held, so the fds are bounded
        while held and held[0][0] < cutoff:
            held.pop(0)[1].close()
        stats["readers_held"] = len(held)
        await asyncio.sleep(1.0)
    for _, sock in held:
        sock.close()


async def _flood(url: str, slow: int, readers: int, limit_s: float) -> None:
    """Hold the flood until standard input closes (or ``limit_s``); print its counts."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stats: collections.Counter[str] = collections.Counter()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_slowloris(host, int(port), stats, stop)) for _ in range(slow)]
    if readers:
        tasks.append(asyncio.create_task(_idle_readers(host, int(port), readers, stats, stop)))
    deadline = time.monotonic() + 15
    while stats["slow_open"] < slow * 0.9 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stats["slow_open_at_start"] = stats["slow_open"]
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader.read(), limit_s)
    stats["slow_open_at_end"] = stats["slow_open"]
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(dict(stats)), flush=True)


async def _flooding(url: str, args: argparse.Namespace) -> Any:
    """The flood's child process, started and holding its connections."""
    command = [sys.executable, __file__, "--flood-client", url, "--flood-slow", str(args.flood)]
    command += ["--flood-readers", str(args.flood_readers)]
    child = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=_child_env()
    )
    assert child.stdout is not None
    ready = await child.stdout.readline()
    assert ready.strip() == b"ready", ready
    return child


# -- the relay (this process) -----------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """This checkout's ``src`` first on the children's path, then what the caller had."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _start(command: list[str], pattern: str) -> tuple[subprocess.Popen[str], str]:
    env = _child_env()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    match = re.search(pattern, proc.stdout.readline())
    if match is None:
        proc.kill()
        raise SystemExit(f"{command[2]} did not start")
    return proc, match.group(0)


async def _load(
    url: str, runs: int, stagger_s: float, uvloop: bool, protocol: str = "own"
) -> dict[str, Any]:
    """Run the clients' child process: ``runs`` runs, started evenly over ``stagger_s``,
    read in the relay's own format (``GET /runs/{id}/events``) or, ``protocol="ui"``, as the
    AI SDK's UI message stream (``POST /api/chat``)."""
    command = [sys.executable, __file__, "--client", url, "--runs", str(runs)]
    command += ["--stagger", str(stagger_s)] + (["--uvloop"] if uvloop else [])
    command += ["--client-protocol", protocol]
    cpu = time.process_time()
    child = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, env=_child_env()
    )
    out, _ = await child.communicate()
    return {**json.loads(out), "relay_cpu": time.process_time() - cpu}


GC_PAUSES: list[float] = []
"""The relay process's garbage collections during the load, seconds each."""


_GC_STARTED = [0.0]


def _time_collections(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _GC_STARTED[0] = time.perf_counter()
    else:
        GC_PAUSES.append(time.perf_counter() - _GC_STARTED[0])


async def _serve_and_load(server: RelayServer, args: argparse.Namespace) -> dict[str, Any]:
    """One run alone first (it warms the relay and gives one run's length and events, for
    the stagger and the offered load), then the load itself. The heap is settled after the
    start, as ``toollatch serve`` does; each collection during the load is timed: a pause
    of the loop that every run in flight waits out."""
    async with server:
        settle_heap()
        solo = await _load(server.url, 1, 0.0, args.uvloop)
        solo_s = solo["wall"]
        stagger = solo_s if args.shape == "staggered" else 0.0
        flood = await _flooding(server.url, args) if args.flood else None
        cap = getattr(server, "cap", None)  # (None: a relay from before the cap, for --before)
        held = len(cap) if cap is not None else -1
        gc.callbacks.append(_time_collections)
        try:
            result = await _load(server.url, args.runs, stagger, args.uvloop)
        finally:
            gc.callbacks.remove(_time_collections)
        extra: dict[str, Any] = {"cap": cap.limit if cap else None, "open_at_load": held}
        if flood is not None:
            assert flood.stdin is not None
            assert flood.stdout is not None
            extra["open_at_end"] = len(cap) if cap else -1
            flood.stdin.close()
            extra["flood"] = json.loads((await flood.stdout.read()).splitlines()[-1])
            await flood.wait()
            extra["evicted"], extra["refused"] = (cap.evicted, cap.refused) if cap else (0, 0)
        return {**result, **extra, "solo_s": solo_s, "solo_events": solo["runs"][0]["events"]}


async def _relay(args: argparse.Namespace) -> dict[str, Any]:
    active = args.runs + (_FLOOD_SESSIONS if args.flood else 0)  # (the flood's runs, one each)
    limits = RelayLimits(max_active_runs=active, max_stored_runs=active * 2)
    if args.model_in_process:  # RelayServer's default: the scripted server on the same loop
        server = RelayServer(
            limits=limits, delay_scale=args.delay_scale, ledger=args.ledger, store=args.store
        )
        return await _serve_and_load(server, args)
    model, url = _start(
        [sys.executable, "-m", "toollatch.scripted", "--delay-scale", str(args.delay_scale)],
        r"http://127\.0\.0\.1:\d+",
    )
    try:
        server = RelayServer(
            base_url=url + "/v1",
            model="scripted",
            limits=limits,
            ledger=args.ledger,
            **({"store": args.store} if args.store else {}),
        )
        result = await _serve_and_load(server, args)
        result["model_cpu"] = _cpu_of(model.pid)
        return result
    finally:
        model.terminate()
        model.wait()


async def _protocols(args: argparse.Namespace) -> None:
    """The relay's CPU per event when its runs are read in its own format, as the AI SDK's
    UI message stream (``POST /api/chat``) and as AG-UI (``POST /agui``), the two encoders
    re-reading each run's log: the same demo runs on one relay (the model in its own
    process, the clients in another, each on raw asyncio streams), the three loads
    alternated ``--repeat`` times (the median of each), each over the relay's own events
    (the runs' log entries: the same producer either way). ``agui_models`` is ``POST /agui``
    with each AG-UI event built as the package's validated model and written by its
    ``EventEncoder`` (the same bytes: the view before its frames were cut once per event
    kind). Prints a Markdown table."""
    formats = ("own", "chat", "ui", "agui", "agui_models")
    loads = len(formats) * (args.repeat + 1)
    limits = RelayLimits(max_active_runs=args.runs, max_stored_runs=args.runs * loads)
    model, url = _start(
        [sys.executable, "-m", "toollatch.scripted", "--delay-scale", str(args.delay_scale)],
        r"http://127\.0\.0\.1:\d+",
    )
    cpu: dict[str, list[float]] = {f: [] for f in formats}
    wire: dict[str, int] = {}
    load_avg = os.getloadavg()[0]
    try:
        server = RelayServer(base_url=url + "/v1", model="scripted", limits=limits)
        async with server:
            settle_heap()
            assert server.relay is not None
            registry = server.relay.runs
            counted: set[str] = set()

            def new_events() -> int:
                runs = [r for r in registry._runs.values() if r.id not in counted]
                counted.update(r.id for r in runs)
                return sum(r.last_id for r in runs)

            solo = await _load(server.url, 1, 0.0, args.uvloop)
            for protocol in formats[1:]:
                with _agui_models(protocol == "agui_models"):
                    await _load(server.url, 1, 0.0, args.uvloop, protocol.removesuffix("_models"))
            new_events()
            for _ in range(args.repeat):
                for protocol in formats:
                    client = protocol.removesuffix("_models")
                    with _agui_models(protocol == "agui_models"):
                        result = await _load(
                            server.url, args.runs, solo["wall"], args.uvloop, client
                        )
                    assert all(r["paired"] and r["exact"] for r in result["runs"]), protocol
                    assert all(r["calls"] == 3 for r in result["runs"]), protocol
                    cpu[protocol].append(result["relay_cpu"] * 1000 / new_events())
                    wire[protocol] = sum(r["events"] for r in result["runs"]) // args.runs
            # the UI encoder alone, over every stored run's log (what each UI reader adds)
            logs = [r.log.frames(0, r.last_id)[1] for r in registry._runs.values()]
            started = time.process_time()
            for frames in logs:
                encoder = UIMessageEncoder("m")
                for frame in frames:
                    encoder.encode(event_data(frame))
            encoded = sum(len(f) for f in logs)
            encoder_us = (time.process_time() - started) * 1e6 / encoded
            agui_us = {}  # the AG-UI view alone, both ways, over the same logs
            for way in ("agui_models", "agui"):
                with _agui_models(way == "agui_models"):
                    started = time.process_time()
                    for frames in logs:
                        AguiView("t", "r", "p")(b"".join(frames))
                    agui_us[way] = (time.process_time() - started) * 1e6 / encoded
    finally:
        model.terminate()
        model.wait()
    load_avg = max(load_avg, os.getloadavg()[0])
    median = {f: sorted(v)[len(v) // 2] for f, v in cpu.items()}
    names = {
        "own": "toollatch (GET /runs/{id}/events), no history kept",
        "chat": "toollatch, in chats (POST /runs with chat_id, as the page)",
        "ui": "UI message stream (POST /api/chat)",
        "agui": "AG-UI (POST /agui)",
        "agui_models": "AG-UI, each event a validated model + EventEncoder (before)",
    }
    print(f"{args.runs} runs staggered, {3.0 * args.delay_scale:g} ms pacing, load {load_avg:.1f}")
    print(
        "| format | events on the wire per run | relay CPU per relay event | ratio to own "
        "| to chats |"
    )
    print("|---|---|---|---|---|")
    for f in formats:
        own, chat = median[f] / median["own"], median[f] / median["chat"]
        print(f"| {names[f]} | {wire[f]} | {median[f]:.3f} ms | {own:.2f}x | {chat:.2f}x |")
    print(f"(each of {args.repeat}: {cpu})")
    print(f"the UI encoder alone: {encoder_us:.1f} us per event ({encoded} events re-encoded)")
    print(
        f"the AG-UI view alone: {agui_us['agui']:.1f} us per event, "
        f"{agui_us['agui_models']:.1f} us with validated models + EventEncoder"
    )


@contextlib.contextmanager
def _agui_models(on: bool) -> Any:
    """While ``on``, the AG-UI view writes each event as the package's validated model through
    its ``EventEncoder`` (:meth:`Shape.encoded`: the same bytes, the cost before)."""
    if not on:
        yield
        return
    fast = Shape.frame
    Shape.frame = Shape.encoded  # type: ignore[method-assign]
    try:
        yield
    finally:
        Shape.frame = fast  # type: ignore[method-assign]


# -- toollatch beside the AI SDK's own node relay ---------------------------------------------
# The same chats (the demo: 3 rounds, 3 calls, over POST /api/chat, read to [DONE] by the same
# raw-asyncio clients in a child process) through two relays, each in its own process against
# the same scripted model server (its own process): ``toollatch serve`` (the example tools, no
# ledger, its default metrics) and benchmarks/ai_sdk_relay.mjs (node's http module,
# ``streamText(...).pipeUIMessageStreamToResponse`` with @ai-sdk/openai-compatible and the
# same tools). Each relay's CPU is read from /proc/<pid>/stat (every thread: node's GC and
# libuv's pool included) around each load, half a second after its last client is done.

_SERVE = [sys.executable, "-c", "import sys; from toollatch.cli import main; sys.exit(main())"]
_NODE_RELAY = Path(__file__).with_name("ai_sdk_relay.mjs")
_URL = r"http://127\.0\.0\.1:\d+"


def _started(command: list[str], env: dict[str, str], stderr: bool = False) -> tuple[Any, str]:
    """A server process and the URL it printed first (on stdout, or stderr)."""
    pipe = {"stderr": subprocess.PIPE} if stderr else {"stdout": subprocess.PIPE}
    proc = subprocess.Popen(command, text=True, env=env, **pipe)  # type: ignore[call-overload]
    stream = proc.stderr if stderr else proc.stdout
    match = re.search(_URL, stream.readline())
    if match is None:
        proc.kill()
        raise SystemExit(f"{command[:3]} did not start")
    return proc, match.group(0)


async def _chats_on(pid: int, url: str, runs: int, uvloop: bool) -> dict[str, Any]:
    """``runs`` chats at once through the relay at ``url`` (process ``pid``), again until at
    least 10 chats are done (/proc counts CPU in 10 ms ticks): its CPU seconds per chat and
    per wire event, the wall time of one load, and the chats, each checked whole."""
    before = _cpu_of(pid)
    done: list[dict[str, Any]] = []
    walls = []
    while len(done) < max(runs, 10):
        result = await _load(url, runs, 0.0, uvloop, "ui")
        done += result["runs"]
        walls.append(result["wall"])
    await asyncio.sleep(0.5)  # (what the relay does after its last byte counts too)
    cpu = _cpu_of(pid) - before
    for run in done:
        assert run["exact"], run
        assert run["paired"], run
        assert run["calls"] == 3, run
    wire = sum(r["events"] for r in done)
    return {"per_run": cpu / len(done), "per_event": cpu / wire, "wire": wire // len(done),
            "wall": sorted(walls)[len(walls) // 2]}  # fmt: skip


async def _vs_ai_sdk(args: argparse.Namespace) -> None:
    node = shutil.which("node")
    if node is None or not (SRC.parent / "node_modules" / "ai" / "package.json").is_file():
        raise SystemExit("needs node and the pinned packages (npm ci)")
    levels = [int(n) for n in args.concurrency.split(",")]
    env = _child_env()
    env["TOOLLATCH_RELAY__MAX_ACTIVE_RUNS"] = str(max(16, *levels))
    model, model_url = _started(
        [sys.executable, "-m", "toollatch.scripted", "--delay-scale", str(args.delay_scale)], env
    )
    procs = [model]
    try:
        ours, ours_url = _started(
            [
                *_SERVE,
                "serve",
                "--port",
                "0",
                "--base-url",
                f"{model_url}/v1",
                "--model",
                "scripted",
                "--ledger",
                "none",
            ],
            env,
            stderr=True,
        )
        procs.append(ours)
        theirs, theirs_url = _started([node, str(_NODE_RELAY), model_url + "/v1"], env)
        procs.append(theirs)
        relays = {"toollatch": (ours.pid, ours_url), "ai-sdk": (theirs.pid, theirs_url)}
        for pid, url in relays.values():  # warm both (imports, JITs, pools)
            await _chats_on(pid, url, 10, args.uvloop)
        load = [os.getloadavg()[0]]
        rows = []
        for n in levels:
            done: dict[str, list[dict[str, Any]]] = {name: [] for name in relays}
            for i in range(args.repeat):  # ABBA: each order as often
                order = list(relays) if i % 2 == 0 else list(reversed(relays))
                for name in order:
                    done[name].append(await _chats_on(*relays[name], n, args.uvloop))
                load.append(os.getloadavg()[0])
            row: dict[str, Any] = {"chats": n}
            for name, loads in done.items():
                per_run = sorted(d["per_run"] * 1000 for d in loads)
                per_event = sorted(d["per_event"] * 1e6 for d in loads)
                row[name] = {
                    "cpu_ms_per_run": per_run[len(per_run) // 2],
                    "cpu_us_per_event": per_event[len(per_event) // 2],
                    "events_per_run": loads[0]["wire"],
                    "wall_s": sorted(d["wall"] for d in loads)[len(loads) // 2],
                }
            rows.append(row)
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    pacing = 3.0 * args.delay_scale
    print(f"the demo (3 rounds, 3 calls) over POST /api/chat, {pacing:g} ms pacing, all chats at")
    print(f"once, median of {args.repeat}; load average {min(load):.1f}-{max(load):.1f}")
    print(
        "| concurrent chats | toollatch CPU per run | AI SDK CPU per run | ratio | "
        "toollatch per wire event | AI SDK per wire event | wire events per run (ours / AI SDK) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        a, b = row["toollatch"], row["ai-sdk"]
        print(
            f"| {row['chats']} | {a['cpu_ms_per_run']:.2f} ms | {b['cpu_ms_per_run']:.2f} ms | "
            f"{a['cpu_ms_per_run'] / b['cpu_ms_per_run']:.2f}x | {a['cpu_us_per_event']:.0f} us | "
            f"{b['cpu_us_per_event']:.0f} us | {a['events_per_run']} / {b['events_per_run']} |"
        )
    if args.json:
        print(json.dumps(rows))


def _cpu_of(pid: int) -> float:
    """User plus system CPU seconds of a live process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, max(0, int(len(values) * q + 0.5) - 1))] * 1000


def _report(args: argparse.Namespace, result: dict[str, Any], cpu: float) -> dict[str, Any]:
    runs = result["runs"]
    created = sorted(t - APPENDED[(r, n)][0] for r, n, t in result["seen"])
    lengths = sorted(r["length"] for r in runs)
    appended = sorted(t - APPENDED[(r, n)][1] for r, n, t in result["seen"])
    events = sum(r["events"] for r in runs)
    # What the load asks of the relay: all runs in flight at once stream runs x E events
    # in one run's length L (lockstep: for all of L; staggered evenly over L: only at the
    # peak, t = L, and half of it on average over the 2 L the load then lasts).
    peak = len(runs) * result["solo_events"] / result["solo_s"]
    mean = peak / 2 if args.shape == "staggered" else peak
    row = {
        "shape": args.shape,
        "pacing_ms": 3.0 * args.delay_scale,
        "runs": len(runs),
        "model": "in relay process" if args.model_in_process else "own process",
        "ledger": args.ledger,
        "store": args.store or "memory:",
        "calls": sum(r["calls"] for r in runs),
        "paired": all(r["paired"] and r["exact"] for r in runs),
        "events": events,
        "events_s": events / result["wall"],
        "relay_cpu_ms_per_event": cpu * 1000 / events,
        "relay_cpu_s": cpu,
        "client_cpu_s": result["client_cpu"],
        "model_cpu_s": result.get("model_cpu"),
        "p50": _pct(created, 0.5),
        "p99": _pct(created, 0.99),
        "max": created[-1] * 1000,
        "append_p50": _pct(appended, 0.5),
        "append_p99": _pct(appended, 0.99),
        "solo_s": result["solo_s"],
        "solo_events": result["solo_events"],
        "length_p50_s": _pct(lengths, 0.5) / 1000,
        "length_p99_s": _pct(lengths, 0.99) / 1000,
        "gc_count": len(GC_PAUSES),
        "gc_ms": sum(GC_PAUSES) * 1000,
        "gc_max_ms": max(GC_PAUSES, default=0.0) * 1000,
        "offered_peak_s": peak,
        "offered_mean_s": mean,
        "capacity_s": events / cpu,
    }
    print(
        f"runs: {row['runs']} {args.shape}, {row['pacing_ms']:g} ms pacing (model server: "
        f"{row['model']}), {row['calls']} calls, every call paired and every id once: "
        f"{row['paired']}"
    )
    print(
        f"offered: one run alone {result['solo_events']} events in {result['solo_s']:.2f} s, "
        f"so {peak:.0f} events/s at the peak, {mean:.0f} on average; the relay's one loop "
        f"carries {row['capacity_s']:.0f} events/s at this CPU per event"
    )
    print(
        f"events: {events} in {result['wall']:.2f} s = {row['events_s']:.0f} events/s; relay "
        f"process CPU {cpu:.2f} s = {row['relay_cpu_ms_per_event']:.3f} ms per event"
    )
    model_cpu = "" if row["model_cpu_s"] is None else f", model server {row['model_cpu_s']:.2f} s"
    print(f"other processes' CPU: clients {row['client_cpu_s']:.2f} s{model_cpu}")
    print(
        f"event latency (agent event created -> client parsed): p50 {row['p50']:.1f} ms, "
        f"p99 {row['p99']:.1f} ms, max {row['max']:.1f} ms"
    )
    print(
        f"  of which after the relay stored it (append -> client parsed): p50 "
        f"{row['append_p50']:.1f} ms, p99 {row['append_p99']:.1f} ms"
    )
    print(
        f"run length (POST -> run_ended parsed): alone {row['solo_s']:.2f} s, under load p50 "
        f"{row['length_p50_s']:.2f} s, p99 {row['length_p99_s']:.2f} s (a relay reading its "
        "model streams late stretches the runs, which the event latency does not show)"
    )
    print(
        f"garbage collections in the relay during the load: {row['gc_count']}, "
        f"{row['gc_ms']:.0f} ms in all, the longest {row['gc_max_ms']:.1f} ms"
    )
    row["cap"], row["open_at_load"] = result["cap"], result["open_at_load"]
    print(f"connections: cap {result['cap']}, open when the load started {result['open_at_load']}")
    if "flood" in result:
        f = result["flood"]
        row["flood"] = f
        row["evicted"], row["refused"] = result["evicted"], result["refused"]
        closed = {k.removeprefix("slow_closed_"): v for k, v in f.items() if "closed" in k}
        print(
            f"flood: {args.flood} slowloris connections ({f.get('slow_opened', 0)} opened in "
            f"all, {f.get('slow_open_at_start', 0)} open at the start, "
            f"{f.get('slow_open_at_end', 0)} at the end; closed by the relay: {closed}); "
            f"the relay closed {result['evicted']} idle ones for new clients, refused "
            f"{result['refused']}; idle readers: {f.get('readers_200', 0)} served, "
            f"{f.get('readers_429', 0)} refused 429, {f.get('readers_failed', 0)} failed; "
            f"flood runs {f.get('flood_runs_started', 0)} started, "
            f"{f.get('flood_runs_429', 0)} refused 429"
        )
    return row


CASES = {
    "lockstep": ("lockstep", 1.0),
    "staggered": ("staggered", 1.0),
    "fast-model": ("staggered", 10.0 / 3.0),
    "model-paced": ("staggered", 10.0),
}
"""The load shapes of ``--matrix``: every run started at once at the demo's 3 ms pacing (the
worst case: bursts of one event per run); started evenly over one run's length; that with
10 ms between the model's wire events (a fast model: 100 chunks a second per stream); and
with 30 ms (about a typical model's streaming rate)."""


def _matrix(repeat: int) -> None:
    """Each case at 20, 100 and 200 runs, each cell a fresh relay (its own process), the
    upper median of ``repeat`` per figure (of 2: the worse); prints a Markdown table."""
    head = "case, runs, offered peak/mean ev/s, events/s, CPU/event, capacity ev/s, p50, p99"
    head += ", run length p99 / alone, longest GC pause"
    print("| " + " | ".join(head.split(", ")) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case, (shape, scale) in CASES.items():
        for runs in (20, 100, 200):
            rows = []
            for _ in range(repeat):
                command = [sys.executable, __file__, "--json", "--runs", str(runs)]
                command += ["--shape", shape, "--delay-scale", str(scale)]
                out = subprocess.run(
                    command, capture_output=True, text=True, check=True, env=_child_env()
                )
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            m = {k: sorted(r[k] for r in rows)[len(rows) // 2] for k in rows[0] if k != "shape"}
            assert all(r["paired"] for r in rows), "a run lost an event or a result"
            print(
                f"| {case} | {runs} | {m['offered_peak_s']:.0f} / {m['offered_mean_s']:.0f} | "
                f"{m['events_s']:.0f} | {m['relay_cpu_ms_per_event']:.3f} ms | "
                f"{m['capacity_s']:.0f} | {m['p50']:.1f} ms | {m['p99']:.1f} ms | "
                f"{m['length_p99_s']:.2f} / {m['solo_s']:.2f} s | {m['gc_max_ms']:.1f} ms |",
                flush=True,
            )


# -- AG-UI beside our own format: the relay's CPU per event of each encoder ------------------
# The same runs (the demo, 3 rounds, 3 calls) read as ``GET /runs/{id}/events`` (the log's
# frames as stored) and as ``POST /agui`` (each frame re-encoded by relay/protocols/_agui.py
# with ag-ui-protocol's models and EventEncoder); the model in its own process, the clients in
# another, so the relay process's CPU is the relay's. Per event = CPU / the runs' relay events
# (the log's, the same count for both formats). Loads alternate (own, agui, own, agui...)
# after one warm-up pair; the figure is each format's median.


async def _format_client(url: str, fmt: str, runs: int) -> None:
    import httpx  # noqa: PLC0415 (the child only)

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(i: int) -> int:
            headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
            if fmt == "own":
                run = await client.post("/runs", json={"message": "weather"}, headers=headers)
                body = await client.get(run.json()["events_url"], headers=headers)
                assert "event: run_ended" in body.text
                return body.text.count("\ndata: ")
            message = {"id": "u", "role": "user", "content": "weather"}
            given = {"threadId": f"t{i}", "runId": f"r{i}", "messages": [message]}
            body = await client.post("/agui", json=given, headers=headers)
            assert '"RUN_FINISHED"' in body.text, body.text[-300:]
            return body.text.count("data: ")

        counts = await asyncio.gather(*(one(i) for i in range(runs)))
    json.dump({"wire_events": sum(counts)}, sys.stdout)


async def _format_loads(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    model, url = _start(
        [sys.executable, "-m", "toollatch.scripted", "--delay-scale", str(args.delay_scale)],
        r"http://127\.0\.0\.1:\d+",
    )
    limits = RelayLimits(max_active_runs=args.runs, max_stored_runs=args.runs * 4)
    loads: dict[str, list[dict[str, float]]] = {"own": [], "agui": []}
    try:
        async with RelayServer(base_url=url + "/v1", model="scripted", limits=limits) as server:
            assert server.relay is not None
            registry = server.relay.runs
            for n in range(2 * (args.repeat + 1)):
                fmt = ("own", "agui")[n % 2]
                before = set(registry._runs)
                cpu = time.process_time()
                command = [sys.executable, __file__, "--format-client", server.url]
                command += ["--format", fmt, "--runs", str(args.runs)]
                child = await asyncio.create_subprocess_exec(
                    *command, stdout=asyncio.subprocess.PIPE, env=_child_env()
                )
                out, _ = await child.communicate()
                cpu = time.process_time() - cpu
                new = [r for k, r in registry._runs.items() if k not in before]
                assert len(new) == args.runs, "runs were forgotten before they were counted"
                events = sum(r.last_id for r in new)
                if n >= 2:  # (the first pair warms the relay)
                    wire = json.loads(out)["wire_events"]
                    loads[fmt].append({"cpu": cpu, "events": events, "wire": wire})
    finally:
        model.terminate()
        model.wait()
    return loads


def agui_row(args: argparse.Namespace) -> dict[str, Any]:
    """The relay's CPU per event of ``POST /agui`` against ``GET /runs/{id}/events`` (goal:
    within 1.2x); prints two Markdown rows and returns the figures."""
    loads = asyncio.run(_format_loads(args))
    row: dict[str, Any] = {"runs": args.runs, "pacing_ms": 3.0 * args.delay_scale}
    for fmt, done in loads.items():
        per_event = sorted(d["cpu"] * 1000 / d["events"] for d in done)
        row[fmt] = {
            "relay_cpu_ms_per_event": per_event[len(per_event) // 2],
            "relay_events": done[0]["events"],
            "wire_events": done[0]["wire"],
        }
    row["ratio"] = row["agui"]["relay_cpu_ms_per_event"] / row["own"]["relay_cpu_ms_per_event"]
    print("| format | runs | relay events | events on the wire | relay CPU per event | ratio |")
    print("|---|---|---|---|---|---|")
    for fmt, name in (("own", "toollatch (GET /runs/{id}/events)"), ("agui", "AG-UI (POST /agui)")):
        f = row[fmt]
        ratio = row["ratio"] if fmt == "agui" else 1.0
        print(
            f"| {name} | {args.runs} | {f['relay_events']} | {f['wire_events']} | "
            f"{f['relay_cpu_ms_per_event']:.3f} ms | {ratio:.2f}x |"
        )
    return row


@contextlib.contextmanager
def _redis_server() -> Any:
    """A redis-server of Debian's on a free loopback port, no persistence, in a temporary
    folder: ``(its process, its URL)`` for the block."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ledger_helpers import free_port  # noqa: PLC0415 (tests' helper)

    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "no", "--dir", folder],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock,
                ):
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
                if time.monotonic() > deadline or redis.poll() is not None:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.05)
            yield redis, f"redis://127.0.0.1:{port}/0"
        finally:
            redis.terminate()
            redis.wait()


def _stores(args: argparse.Namespace) -> None:
    """The relay's CPU per event with its runs in memory and in Redis (a redis-server
    started here on loopback, no persistence), the loads alternated ``--repeat`` times,
    each in a relay process of its own (``--store``); with ``--against FILE`` (another
    checkout's bench_relay.py) its relay as a third column, in memory. Prints a Markdown
    table of the medians, and the redis-server's own CPU per event."""
    common = ["--runs", str(args.runs), "--delay-scale", str(args.delay_scale), "--json"]
    rows: dict[str, list[dict[str, Any]]] = {}
    redis_ms: list[float] = []
    with _redis_server() as (redis, url):
        cases = {"memory": [__file__, *common], "redis": [__file__, *common, "--store", url]}
        if args.against:
            cases["before"] = [args.against, *common]
        rows.update({k: [] for k in cases})
        for _ in range(args.repeat):
            for name, command in cases.items():
                before = _cpu_of(redis.pid)
                done = subprocess.run(
                    [sys.executable, *command], capture_output=True, text=True, check=True
                )
                row = json.loads(done.stdout.strip().splitlines()[-1])
                assert row["paired"], name
                rows[name].append(row)
                if name == "redis":
                    redis_ms.append((_cpu_of(redis.pid) - before) * 1000 / row["events"])

    def median(name: str, key: str) -> float:
        values = sorted(r[key] for r in rows[name])
        return float(values[len(values) // 2])

    print("| store | relay CPU/event | events/s | p50 | p99 | run length p99 |")
    print("|---|---|---|---|---|---|")
    for name in cases:
        print(
            f"| {name} | {median(name, 'relay_cpu_ms_per_event'):.3f} ms | "
            f"{median(name, 'events_s'):.0f} | {median(name, 'p50'):.1f} ms | "
            f"{median(name, 'p99'):.1f} ms | {median(name, 'length_p99_s'):.2f} s |"
        )
    print(f"redis-server CPU per event: {sorted(redis_ms)[len(redis_ms) // 2]:.3f} ms")
    for name in cases:
        print(f"({name}, each: {[round(r['relay_cpu_ms_per_event'], 4) for r in rows[name]]})")


# -- several `toollatch serve` workers on one Redis (--workers N) -----------------------------
# Real worker processes (``toollatch serve --store redis://...``, each on a port of its own,
# started through this file so each stamps its events as the in-process relay does), one
# scripted model process, the clients in another process spread round-robin over the workers
# (a run posted to one is read from the next: no sticky sessions). Each worker writes its
# stamps when it stops (SIGTERM); the figures come out of both sides' monotonic clocks.


def _stamped_serve(stamps: str, argv: list[str]) -> int:
    """``toollatch serve`` (``argv``) with its events stamped (:func:`_record_times`); the
    stamps written to ``stamps`` as JSON when it stops."""
    from toollatch.cli import main as cli_main  # noqa: PLC0415

    _record_times()
    try:
        return cli_main(argv)
    finally:
        rows = [[run, n, *times] for (run, n), times in APPENDED.items()]
        Path(stamps).write_text(json.dumps(rows), encoding="utf-8")


class _Worker:
    """One stamped ``toollatch serve`` process; its standard error drained by a thread (its
    last lines kept, for a failure's message)."""

    def __init__(self, folder: str, n: int, serve_args: list[str], env: dict[str, str]) -> None:
        self.stamps = str(Path(folder) / f"stamps-{n}.json")
        command = [sys.executable, __file__, "--stamped-serve", self.stamps, "serve"]
        command += ["--port", "0", *serve_args]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stderr is not None
        first = self.proc.stderr.readline()
        match = re.search(_URL, first)
        if match is None:
            self.proc.kill()
            raise SystemExit(f"a worker did not start: {first}{self.proc.stderr.read()[-2000:]}")
        self.url = match.group(0)
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line)
            if "warning" in line.lower() or "error" in line.lower():
                sys.stderr.write(f"[worker {self.url}] {line}")

    def stop(self) -> dict[tuple[str, int], list[float]]:
        """SIGTERM, wait; its stamps."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            rows = json.loads(Path(self.stamps).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise SystemExit(f"worker {self.url} left no stamps: {''.join(self.tail)}") from None
        return {(r[0], r[1]): r[2:] for r in rows}


def _workers_load(
    args: argparse.Namespace, model_url: str, store: str, n: int, shape: str, extra: list[str]
) -> dict[str, Any]:
    """``n`` workers on ``store``, two runs alone through them (the first warms them up, the
    second's length spreads the staggered starts), then ``args.runs`` runs (``shape``); the
    load's figures with the workers' (and Redis's) CPU and stamps."""
    env = _child_env()
    env["TOOLLATCH_RELAY__MAX_ACTIVE_RUNS"] = str(args.runs + 8)
    env["TOOLLATCH_RELAY__MAX_CONNECTIONS"] = str(max(1000, args.runs * 3))
    serve_args = ["--store", store, "--ledger", "none", "--base-url", model_url + "/v1"]
    serve_args += ["--model", "scripted", *extra]
    with tempfile.TemporaryDirectory() as folder:
        workers = [_Worker(folder, i, serve_args, env) for i in range(n)]
        try:
            urls = ",".join(w.url for w in workers)
            asyncio.run(_load(urls, 1, 0.0, args.uvloop))  # (warms the workers: DBOS's first)
            solo = asyncio.run(_load(urls, 1, 0.0, args.uvloop))
            stagger = solo["wall"] if shape == "staggered" else 0.0
            redis_pid = getattr(args, "redis_pid", None)
            pids = [w.proc.pid for w in workers] + [args.model_pid]
            pids += [redis_pid] if store != "memory:" and redis_pid else []
            before = [_cpu_of(p) for p in pids]
            load = os.getloadavg()[0]
            result = asyncio.run(_load(urls, args.runs, stagger, args.uvloop))
            cpu = [_cpu_of(p) - b for p, b in zip(pids, before, strict=True)]
        finally:
            stamps: dict[tuple[str, int], list[float]] = {}
            for worker in workers:
                stamps.update(worker.stop())
    result.update(
        workers=n, store="memory" if store == "memory:" else "redis", shape=shape,
        worker_cpu=sum(cpu[:n]), model_cpu=cpu[n], redis_cpu=sum(cpu[n + 1 :]), stamps=stamps,
        load=load,
        solo_s=solo["wall"], solo_events=solo["runs"][0]["events"],
    )  # fmt: skip
    return result


def _checked(label: str, result: dict[str, Any]) -> None:
    """Fail loudly unless every run got ids 1..N once each, N being the number of events its
    worker appended, ended with ``run_ended``, and had every call paired."""
    appended: dict[str, int] = collections.Counter(run for run, _n in result["stamps"])
    bad = [
        r
        for r in result["runs"]
        if not (r["exact"] and r["paired"] and r["events"] == appended.get(r["id"], -1))
    ]
    if bad:
        keys = ("id", "events", "exact", "paired", "notes")
        shown = [{k: r.get(k) for k in keys} for r in bad[:5]]
        for r in shown:
            r["appended"] = appended.get(r["id"], 0)
        raise SystemExit(f"{label}: {len(bad)} runs lost, repeated or unpaired events: {shown}")


def _worker_row(label: str, result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one :func:`_workers_load` (checked first: :func:`_checked`)."""
    _checked(label, result)
    stamps, runs = result["stamps"], result["runs"]
    created = sorted(t - stamps[(r, n)][0] for r, n, t in result["seen"])
    lengths = sorted(r["length"] for r in runs)
    events = sum(r["events"] for r in runs)
    return {
        "case": label, "workers": result["workers"], "store": result["store"],
        "shape": result["shape"], "runs": len(runs), "events": events,
        "events_s": events / result["wall"], "wall_s": result["wall"],
        "p50_ms": _pct(created, 0.5), "p99_ms": _pct(created, 0.99),
        "length_p50_s": _pct(lengths, 0.5) / 1000, "length_p99_s": _pct(lengths, 0.99) / 1000,
        "solo_s": result["solo_s"], "worker_cpu_s": result["worker_cpu"],
        "redis_cpu_s": result["redis_cpu"], "model_cpu_s": result["model_cpu"],
        "client_cpu_s": result["client_cpu"],
        "cores_busy": (
            result["worker_cpu"] + result["redis_cpu"] + result["model_cpu"]
            + result["client_cpu"]
        ) / result["wall"],
        "cpu_ms_per_event": (result["worker_cpu"] + result["redis_cpu"]) * 1000 / events,
        "load": result["load"],
    }  # fmt: skip


def _durable_cost(args: argparse.Namespace, model_url: str, store: str) -> str:
    """The cost per run of durable runs: ``toollatch serve --durable`` when this checkout's
    serve has it (a PostgreSQL of tests/durable_helpers.py, ``--workers`` workers, a tenth of
    the runs, against the same without it), else benchmarks/bench_durable.py's measure of the
    DurableRuns API (one process, runs one after another)."""
    helps = subprocess.run(
        [*_SERVE, "serve", "--help"], check=False, capture_output=True, text=True, env=_child_env()
    ).stdout
    if "--durable" not in helps:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("bench_durable.py")), "--runs", "20",
             "--blocks", "4"],
            check=False, capture_output=True, text=True, env=_child_env(),
        )  # fmt: skip
        if done.returncode != 0:
            return f"bench_durable.py failed: {done.stderr.strip()[-500:]}"
        return (
            "`toollatch serve --durable` is not in this checkout: the DurableRuns API's cost "
            "per run instead (benchmarks/bench_durable.py, one process, the demo's 3 rounds "
            "without model delays):\n" + done.stdout.strip()
        )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from durable_helpers import PostgresServer  # noqa: PLC0415 (tests' helper)

    small = argparse.Namespace(**{**vars(args), "runs": max(10, args.runs // 10)})
    postgres = PostgresServer()
    try:
        postgres.start()
        rows = {}
        with tempfile.TemporaryDirectory() as folder:  # (--durable needs a shared ledger)
            ledger = ["--ledger", f"sqlite:///{folder}/ledger.db"]
            for name, extra in (("plain", ledger), ("durable", [*ledger, "--durable",
                                                                  postgres.url()])):  # fmt: skip
                result = _workers_load(small, model_url, store, args.workers, "staggered", extra)
                rows[name] = _worker_row(f"{name} x{args.workers}", result)
    finally:
        postgres.close()
    per_run = {k: r["worker_cpu_s"] * 1000 / r["runs"] for k, r in rows.items()}
    return (
        f"`toollatch serve --durable` ({small.runs} runs over {args.workers} workers, one SQLite "
        f"ledger both ways): workers' CPU {per_run['plain']:.1f} ms per run plain, "
        f"{per_run['durable']:.1f} ms durable ({per_run['durable'] / per_run['plain']:.2f}x); "
        f"run length p50 {rows['plain']['length_p50_s']:.2f} s / "
        f"{rows['durable']['length_p50_s']:.2f} s, p99 {rows['plain']['length_p99_s']:.2f} s / "
        f"{rows['durable']['length_p99_s']:.2f} s; events/s {rows['plain']['events_s']:.0f} / "
        f"{rows['durable']['events_s']:.0f}"
    )


def _scale_out(args: argparse.Namespace) -> None:
    """``--workers N``: the one-run table (one worker in memory against N on Redis, the
    load's shape), throughput at 1..N workers (every run at once), the cost of --durable."""
    own = args.store in (None, "redis://", "redis:")
    model, model_url = _start(
        [sys.executable, "-m", "toollatch.scripted", "--delay-scale", str(args.delay_scale)],
        r"http://127\.0\.0\.1:\d+",
    )
    rows = []
    try:
        with _redis_server() if own else contextlib.nullcontext((None, args.store)) as found:
            redis, store = found
            args.redis_pid = redis.pid if redis is not None else None
            args.model_pid = model.pid
            print(f"uptime load before: {os.getloadavg()}", flush=True)
            cases = [("memory x1", "memory:", 1, args.shape)]
            cases.append((f"redis x{args.workers}", store, args.workers, args.shape))
            cases += [(f"redis x{n}, all at once", store, n, "lockstep")
                      for n in range(1, args.workers + 1)]  # fmt: skip
            cases.insert(2, ("memory x1, all at once", "memory:", 1, "lockstep"))
            for label, where, n, shape in cases:
                result = _workers_load(args, model_url, where, n, shape, [])
                rows.append(_worker_row(label, result))
                print(json.dumps(rows[-1]), flush=True)
            durable = _durable_cost(args, model_url, store)
    finally:
        model.terminate()
        model.wait()
    print(
        f"\n{args.runs} runs, {3.0 * args.delay_scale:g} ms between the model's wire events; "
        "every run's ids 1..N once each (N = the events its worker appended), every call "
        "paired: checked"
    )
    print(
        "| case | runs in | events/s | p50 / p99 event latency | run length p50 / p99 "
        "(alone) | CPU per event (workers + Redis) | CPU s: workers / Redis / model / clients "
        "(cores busy) | load |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        spread = "at once" if r["shape"] == "lockstep" else f"{r['solo_s']:.1f} s"
        print(
            f"| {r['case']} | {spread} | {r['events_s']:.0f} | {r['p50_ms']:.1f} / "
            f"{r['p99_ms']:.1f} ms | {r['length_p50_s']:.2f} / {r['length_p99_s']:.2f} s "
            f"({r['solo_s']:.2f} s) | {r['cpu_ms_per_event']:.3f} ms | {r['worker_cpu_s']:.1f} / "
            f"{r['redis_cpu_s']:.1f} / {r['model_cpu_s']:.1f} / {r['client_cpu_s']:.1f} "
            f"({r['cores_busy']:.2f}) | {r['load']:.1f} |"
        )
    print(f"\n{durable}")
    print(f"uptime load after: {os.getloadavg()}")


def main() -> None:
    if sys.argv[1:2] == ["--stamped-serve"]:  # (a worker of --workers)
        sys.exit(_stamped_serve(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--delay-scale",
        type=float,
        default=10.0,
        help="the scripted model's pacing (1: 3 ms between wire events; default 10: 30 ms)",
    )
    parser.add_argument(
        "--model-in-process",
        action="store_true",
        help="serve the scripted model on the relay's own event loop (RelayServer's default)",
    )
    parser.add_argument(
        "--uvloop",
        action="store_true",
        help="run the relay's (and the clients') event loop on uvloop (must be installed)",
    )
    parser.add_argument(
        "--shape",
        choices=("lockstep", "staggered"),
        default="staggered",
        help="start every run at once, or evenly over one run's length (measured alone first)",
    )
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="the table: lockstep, staggered, fast-model and model-paced, at 20, 100, 200 runs",
    )
    parser.add_argument("--repeat", type=int, default=1, help="with --matrix: runs per cell")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the relay process to FILE")
    parser.add_argument(
        "--ledger",
        metavar="URL",
        help="the runs' call ledger and histories, as `toollatch serve --ledger` (default: none; "
        "serve's own default is sqlite:///<data folder>/ledger.db)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="where the relay keeps its runs, as `toollatch serve --store` (default memory:)",
    )
    parser.add_argument(
        "--stores",
        action="store_true",
        help="relay CPU per event with the runs in memory and in Redis (a redis-server "
        "started here), alternated --repeat times",
    )
    parser.add_argument(
        "--against",
        metavar="FILE",
        help="with --stores: another checkout's bench_relay.py, in memory, as a third column",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="N `toollatch serve` workers on one Redis (--store, or one started here) against "
        "one worker in memory, then 1..N workers with every run at once, and --durable's cost",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    parser.add_argument(
        "--flood",
        type=int,
        default=0,
        metavar="N",
        help="during the load, N slowloris connections from another process (e.g. 1100)",
    )
    parser.add_argument(
        "--flood-readers",
        type=int,
        default=0,
        metavar="M",
        help="with --flood: M idle event readers tried each second (over 4 sessions)",
    )
    parser.add_argument(
        "--nofile",
        type=int,
        metavar="N",
        help="the relay process's open-file limit (e.g. 1024, as a default Linux shell's)",
    )
    parser.add_argument(
        "--agui",
        action="store_true",
        help="the AG-UI row: relay CPU per event of POST /agui against our own event stream",
    )
    parser.add_argument("--format-client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--format", default="own", help=argparse.SUPPRESS)
    parser.add_argument("--flood-client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--flood-slow", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--protocols",
        action="store_true",
        help="the relay's CPU per event: its own format vs the AI SDK's UI message stream",
    )
    parser.add_argument(
        "--vs-ai-sdk",
        action="store_true",
        help="relay CPU per chat beside the AI SDK's own node relay (benchmarks/ai_sdk_relay.mjs)",
    )
    parser.add_argument(
        "--concurrency",
        default="1,20,100",
        help="with --vs-ai-sdk: the numbers of chats at once (default 1,20,100)",
    )
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--client-protocol", default="own", help=argparse.SUPPRESS)
    parser.add_argument("--stagger", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.matrix:
        _matrix(args.repeat)
        return
    if args.format_client:
        asyncio.run(_format_client(args.format_client, args.format, args.runs))
        return
    if args.agui:
        row = agui_row(args)
        if args.json:
            print(json.dumps(row))
        return
    loop_factory = None
    if args.uvloop:
        import uvloop  # noqa: PLC0415 (optional)

        loop_factory = uvloop.new_event_loop
    if args.client:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_clients(args.client, args.runs, args.stagger, args.client_protocol))
        return
    if args.protocols:
        asyncio.run(_protocols(args))
        return
    if args.stores:
        _stores(args)
        return
    if args.workers:
        _scale_out(args)
        return
    if args.vs_ai_sdk:
        asyncio.run(_vs_ai_sdk(args))
        return
    if args.flood_client:
        asyncio.run(_flood(args.flood_client, args.flood_slow, args.flood_readers, 300.0))
        return
    if args.nofile:
        import resource  # noqa: PLC0415 (Unix)

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    _record_times()
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(_relay(args))
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
    row = _report(args, result, result["relay_cpu"])
    if args.json:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
