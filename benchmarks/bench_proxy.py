"""`toollatch proxy` beside LiteLLM's proxy, on the same upstream, in one run.

Run it from the repository root (LiteLLM lives in a venv of its own, never in toollatch's)::

    python benchmarks/bench_proxy.py --litellm /path/to/venv/bin/litellm
    TOOLLATCH_BENCH_LITELLM=/path/to/venv/bin/litellm python benchmarks/bench_proxy.py --quick

Without LiteLLM (no ``--litellm``, no ``TOOLLATCH_BENCH_LITELLM``, or the path missing) it
says so and measures the upstream directly and toollatch's proxy only.

``--baseline NAME=SRC`` (repeatable) adds toollatch's proxy from another source tree (e.g.
``git archive BASE src | tar -x -C /tmp/base``, then ``--baseline base=/tmp/base/src``) as a
target of its own, ``toollatch@NAME``, measured in the same run, in turn with the others at
each concurrency, with a ratio row: a change's effect, under the same load.
``--no-wire`` takes no packet capture (see "On the wire" below). ``--pin`` puts each proxy
on a core of its own (core 1) and this process, the upstream and the capture on core 0 (Linux
``sched_setaffinity``): a proxy's added latency without the other processes' turns on its
core (two cores shared by three busy processes preempt each of them for a few ms at a time
while 50 streams start).
``--calls-stream`` adds the proxy in ``--calls stream`` mode the same way
(``toollatch@stream``: every argument fragment forwarded, so more call deltas per stream).
``--paired`` runs each target at the same time as n direct streams of its own (the upstream
serves 2n, the client reads 2n) and compares it with those: on a shared machine whose load
moves between levels, the fairer comparison (the ``direct beside`` rows' CPU is the
upstream's for both). ``--unsettled`` adds the proxy without the heap settled at start
(``toollatch@unsettled``: full garbage collections walk every object its start made, as
before ``toollatch proxy`` called ``settle_heap``), and runs the baselines that way too.

Theory of operation
-------------------
Processes, as in a deployment: the scripted model server (``python -m toollatch.scripted``,
one script: text deltas and two tool calls, about 120 wire events per response, ``--delay-ms``
between events), toollatch's proxy (:class:`toollatch.relay._proxy.ProxyServer` started by
the small runner below, in a process of its own, stdlib asyncio), LiteLLM's proxy
(``litellm --config``, model ``openai/bench`` at the scripted server, no network: the local
cost map, telemetry off), and the clients (this process: ``httpx.AsyncClient``, raw SSE
split on blank lines and parsed with orjson, no SDK). For each concurrency (1, 50, 200
streams, all started at once) the same streaming request (``stream: true``, the two tools)
goes to each target in turn: (a) the upstream directly, (b) toollatch, (c) LiteLLM.

**CPU per event**: the target process tree's utime + stime (``/proc/<pid>/stat``, every
descendant included) over the streams, divided by the *upstream* events it relayed (the
same count for both proxies: toollatch sends a committed call as one delta, so counting the
events it delivers would flatter it).

Times are each stream's arrival offsets (``time.perf_counter`` when a read returned), taken
at each text delta's end, i.e. the moment the client holds the first k characters of the text
(by character count, so a proxy that re-cuts the deltas is still compared fairly), and each
compared with the *median over the direct streams at the same concurrency* of the same
offset; p50/p99 over every (stream, delta) pair. The upstream's own jitter is in there too:
the ``direct`` row (direct streams against their own median) is that noise floor.

- **First text added**: the first delta's offset since the stream's request was sent: what
  the proxy adds to the time to the first token (the request through the proxy, the
  proxy's own request and connection to the upstream; with 50 streams started at once,
  three processes doing 50 requests each on the same cores).
- **Text added per event**: each later delta's offset since the stream's own first delta:
  the delay the proxy adds to an event once the stream flows (what the issue's "added
  latency per event" means; a proxy that held every event, the first too, would show it
  in the first column).
- **Since request** (the benchmark's earlier measure): each delta's offset since the
  request, so the stream's start is charged to every event of it.

**Call delay** is the per-event difference (since the stream's first delta) for the moment
each tool call's arguments are complete at the client: direct, the call's last argument
fragment; toollatch holds a call until the gate commits it (the upstream moved on from it,
by design), then sends it whole; LiteLLM passes fragments through.

**On the wire** (where ``tcpdump`` can capture on ``lo``; ``--no-wire`` turns it off, and
the bench says why when it cannot): each target's level runs under a capture of the
upstream's port and the proxy's (``Capture``: nanosecond time stamps, written as packets
come), read by ``pcap_wire`` (our own reader: pcap records, Ethernet/SLL, IPv4/IPv6, TCP
reassembled by sequence number, HTTP/1.1, SSE). Each stream shows up twice: the proxy's
request to the upstream and the client's request to the proxy both carry the stream's tag
(``TAG``, in its user message: LiteLLM drops the request's ``user``), and on a connection
the n-th response answers the n-th request (HTTP/1.1, no pipelining), so each request's body
names its stream and its response is that stream's leg. An event is dated by the packet that
carried its last byte. **Wire text added** is, for each text delta's end (by characters, as
above), the time of the proxy's packet that carried it to the client minus the time of the
upstream's packet that carried it to the proxy: the latency the proxy adds, without the
client's own scheduling in it and without a reference to subtract (no ``direct`` row: no
proxy there). **Once all flow**: the same, for the text the upstream sent after the proxy
had sent every stream of the level its first text (no stream starting any more: what the
proxy adds to an event in a steady flow). **Wire calls' delay**: the same for each call's
last argument fragment. **Wire request relayed**: the proxy's request to the upstream minus
the client's request to the proxy (each by its last byte), the proxy's own share of the
first text's delay. Capturing costs CPU too (tcpdump's, on the same cores; not in any
target's CPU column).

**Correctness**: every stream through every target must assemble the script's text and its
two calls (merged by ``index``, ``id`` and ``name`` from the first delta, arguments joined),
with a finish reason; the table counts streams that did not, and the tool-call deltas per
stream. Nothing here is a test: timings depend on the machine and its load (printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pcap_wire

# Our proxy in a process of its own: the upstream base URL and ProxyServer's keyword arguments
# (JSON) in, its own base URL printed out, served until SIGTERM (uvicorn's own signal handling
# stops it). The heap is settled once started, as `toollatch proxy` does (a third argument
# "unsettled": not, as before it did).
RUNNER = """
import asyncio, json, sys
from toollatch.relay._proxy import ProxyServer
from toollatch.relay._server import settle_heap

async def main():
    async with ProxyServer(sys.argv[1], **json.loads(sys.argv[2])) as proxy:
        if sys.argv[3:] != ["unsettled"]:
            settle_heap()
        print(proxy.url, flush=True)
        await proxy.serve_forever()

asyncio.run(main())
"""

# The scripted server, noting when each event's bytes went to its socket (perf_counter: one
# clock for every process of the machine), by the stream's tag in the request (TAG: each bench
# stream's own, in its user message, which every proxy passes on; LiteLLM 1.108.7 drops the
# request's "user"). SIGUSR1 writes {tag: {"text": [[chars so far, time], ...],
# "calls": {index: time of its last argument fragment}}} to the file named by its first
# argument (then the rest is python -m toollatch.scripted's) and forgets them.
UPSTREAM_RUNNER = """
TAG = rb"bench stream ([0-9a-f]{16})"
import json, os, re, signal, sys, time
import orjson
from toollatch.scripted import _server
from toollatch.scripted.__main__ import main

OUT = sys.argv.pop(1)
SENT = {}
handle, play = _server.ScriptedServer._handle, _server._Playback.__call__

async def handled(self, provider, request):
    answer = await handle(self, provider, request)
    try:
        answer.bench_user = re.search(TAG, await request.body()).group(1).decode()
    except AttributeError:  # no tag: not a bench stream
        pass
    return answer

async def played(self, scope, receive, send):
    user = getattr(self, "bench_user", None)
    if user is None:
        return await play(self, scope, receive, send)
    sent = SENT[user] = []
    async def timed(message):
        await send(message)
        if message.get("body"):
            sent.append((time.perf_counter(), message["body"]))
    await play(self, scope, receive, timed)

def times(sent):
    chars, text, calls = 0, [], {}
    for at, data in sent:
        for line in data.split(b"\\n"):
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            for choice in orjson.loads(line[5:]).get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    chars += len(delta["content"])
                    text.append((chars, at))
                for call in delta.get("tool_calls") or ():
                    if (call.get("function") or {}).get("arguments"):
                        calls[call.get("index", 0)] = at
    return {"text": text, "calls": calls}

def dump(*_):
    done = {user: times(sent) for user, sent in list(SENT.items())}
    SENT.clear()
    with open(OUT + ".part", "wb") as f:
        f.write(orjson.dumps(done, option=orjson.OPT_NON_STR_KEYS))
    os.replace(OUT + ".part", OUT)

_server.ScriptedServer._handle, _server._Playback.__call__ = handled, played
signal.signal(signal.SIGUSR1, dump)
sys.exit(main())
"""

MODEL = "bench"
TAG = rb"bench stream ([0-9a-f]{16})"  # a stream's tag in its user message (as UPSTREAM_RUNNER)
QUESTION = "Weather in Oslo and Lima?"
TEXT = (
    "Let me look at both cities before I answer. The weather in Oslo is usually cold in "
    "winter and mild in summer, while Lima stays fairly even all year round; so I will ask "
    "the weather tool for each of them, in Celsius, and then compare the two forecasts for "
    "you, city by city, with the wind and the rain."
)
CALLS = (
    ("call_oslo", "get_weather", {"city": "Oslo", "unit": "c", "days": 3, "detail": "hourly"}),
    ("call_lima", "get_weather", {"city": "Lima", "unit": "c", "days": 3, "detail": "daily"}),
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"enum": ["c", "f"]},
                    "days": {"type": "integer"},
                    "detail": {"enum": ["hourly", "daily"]},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
CHUNK_CHARS = 4
FRAGMENT_CHARS = 4
TICK = os.sysconf("SC_CLK_TCK")


def script_json(delay_ms: float) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"text": TEXT, "chunk_chars": CHUNK_CHARS}]
    for call_id, name, args in CALLS:
        items.append(
            {
                "call_id": call_id,
                "name": name,
                "arguments": json.dumps(args),
                "fragment_chars": FRAGMENT_CHARS,
            }
        )
    return {"turns": [{"items": items, "delay_ms": delay_ms}]}


EXPECTED_CALLS = [(i, n, json.dumps(a)) for i, n, a in CALLS]
TEXT_ENDS = [*range(CHUNK_CHARS, len(TEXT), CHUNK_CHARS), len(TEXT)]


# --- processes ------------------------------------------------------------------------------


def tree_cpu(pid: int) -> float:
    """utime + stime (seconds) of ``pid`` and every descendant, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / TICK
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += times.get(p, 0.0)
        todo.extend(c for c, parent in parents.items() if parent == p)
    return total


def read_line(proc: subprocess.Popen[str], want: str, timeout: float) -> str:
    """The first stdout line containing ``want`` (raises after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process {proc.args!r} ended early")
        if want in line:
            return line.strip()
    raise RuntimeError(f"no {want!r} from {proc.args!r} in {timeout} s")


def scripted_process(
    tmp: Path, delay_ms: float, procs: list[subprocess.Popen[str]]
) -> tuple[subprocess.Popen[str], str]:
    """The scripted server playing the bench script (in ``tmp``) as model MODEL, in a process
    of its own (appended to ``procs``), and its root URL."""
    (tmp / "bench.json").write_text(json.dumps(script_json(delay_ms)))
    script = f"{MODEL}={tmp / 'bench.json'}"
    upstream = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM_RUNNER, str(tmp / "sent.json"), "--script", script],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(upstream)
    return upstream, read_line(upstream, "http://", 30).split()[-1]


def upstream_sent(upstream: subprocess.Popen[str], tmp: Path) -> dict[str, Any]:
    """When the upstream sent each stream's text and calls since the last call (by the
    stream's tag; see UPSTREAM_RUNNER)."""
    path = tmp / "sent.json"
    path.unlink(missing_ok=True)
    upstream.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the upstream wrote no send times in 30 s")
        time.sleep(0.01)
    sent: dict[str, Any] = orjson.loads(path.read_bytes())
    return sent


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"{url} not ready in {timeout} s")


# --- one stream -----------------------------------------------------------------------------


@dataclass
class Stream:
    user: str = field(default_factory=lambda: secrets.token_hex(8))  # its tag (TAG)
    start: float = 0.0  # perf_counter when the request was sent
    sent: dict[str, Any] | None = None  # when the upstream sent its text and calls
    text: str = ""
    text_at: list[tuple[int, float]] = field(default_factory=list)  # (chars so far, offset)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    call_deltas: int = 0
    finish: list[str] = field(default_factory=list)
    events: int = 0
    error: str | None = None
    wire: Wire | None = None  # both legs as captured (None: no capture, or not found in it)

    def assembled(self) -> list[tuple[str, str, str]]:
        return [(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]

    def ok(self) -> bool:
        return (
            self.error is None
            and self.text == TEXT
            and self.assembled() == EXPECTED_CALLS
            and len(self.finish) == 1
        )

    def text_offsets(self) -> list[float]:
        """The offset at which the client held each of TEXT_ENDS characters."""
        out, k = [], 0
        for end in TEXT_ENDS:
            while k < len(self.text_at) and self.text_at[k][0] < end:
                k += 1
            out.append(self.text_at[k][1] if k < len(self.text_at) else float("nan"))
        return out

    def call_offsets(self) -> list[float]:
        """The offset at which each call's arguments were complete (its last fragment)."""
        return [c["done"] for _, c in sorted(self.calls.items())]

    def text_relayed(self) -> list[float]:
        """For each of TEXT_ENDS, the time the client held it minus the time the upstream
        sent it (NaN where the upstream's times are missing)."""
        sent = (self.sent or {}).get("text") or []
        out, k = [], 0
        for end, got in zip(TEXT_ENDS, self.text_offsets(), strict=True):
            while k < len(sent) and sent[k][0] < end:
                k += 1
            out.append(self.start + got - sent[k][1] if k < len(sent) else float("nan"))
        return out

    def calls_relayed(self) -> list[float]:
        """For each call, the time the client held its arguments complete minus the time the
        upstream sent its last fragment."""
        sent = (self.sent or {}).get("calls") or {}
        return [
            self.start + c["done"] - sent.get(str(index), float("nan"))
            for index, c in sorted(self.calls.items())
        ]


REQUEST = {
    "model": MODEL,
    "messages": [{"role": "user", "content": QUESTION}],
    "tools": TOOLS,
    "stream": True,
}
KEY = f"sk-{secrets.token_hex(32)}"  # LiteLLM's master key (the others ignore it)
HEADERS = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}


async def one_stream(client: httpx.AsyncClient, base: str) -> Stream:
    s = Stream()
    question = {"role": "user", "content": f"{QUESTION} (bench stream {s.user})"}
    body = orjson.dumps({**REQUEST, "messages": [question], "user": s.user})
    start = s.start = time.perf_counter()
    buf = b""
    try:
        async with client.stream(
            "POST", f"{base}/chat/completions", content=body, headers=HEADERS
        ) as answer:
            if answer.status_code != 200:
                s.error = f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}"
                return s
            async for data in answer.aiter_raw():
                now = time.perf_counter() - start
                buf += data
                *frames, buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
                for frame in frames:
                    for line in frame.split(b"\n"):
                        if line.startswith(b"data:"):
                            payload = line[5:].strip()
                            if payload != b"[DONE]":
                                s.events += 1
                                take(s, orjson.loads(payload), now)
    except httpx.HTTPError as exc:
        s.error = f"{type(exc).__name__}: {exc}"
    return s


def take(s: Stream, chunk: dict[str, Any], now: float) -> None:
    if "error" in chunk:
        s.error = str(chunk["error"])[:200]
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content"):
            s.text += delta["content"]
            s.text_at.append((len(s.text), now))
        for tc in delta.get("tool_calls") or ():
            s.call_deltas += 1
            call = s.calls.setdefault(
                tc.get("index", 0), {"id": None, "name": None, "arguments": "", "done": now}
            )
            call["id"] = call["id"] or tc.get("id")
            fn = tc.get("function") or {}
            call["name"] = call["name"] or fn.get("name")
            if fn.get("arguments"):
                call["arguments"] += fn["arguments"]
                call["done"] = now
        if choice.get("finish_reason"):
            s.finish.append(choice["finish_reason"])


# --- on the wire ----------------------------------------------------------------------------


@dataclass
class Marks:
    """One leg of a stream as captured: when its text and calls crossed the wire (ns)."""

    text: list[tuple[int, int]] = field(default_factory=list)  # (chars so far, time)
    calls: dict[int, int] = field(default_factory=dict)  # index: time of its last fragment
    asked: float = float("nan")  # when the request's last byte went


@dataclass
class Wire:
    """A stream's two legs: the upstream's answer to the proxy, the proxy's to the client."""

    up: Marks
    down: Marks

    def text_added(self, after: float = -math.inf) -> list[float]:
        """For each of TEXT_ENDS the upstream sent after ``after`` (ns), the proxy's packet
        that carried it to the client minus the upstream's packet that carried it to the
        proxy (s; NaN where a leg lacks it)."""
        up, down = _held(self.up, TEXT_ENDS), _held(self.down, TEXT_ENDS)
        return [(d - u) / 1e9 for u, d in zip(up, down, strict=True) if not u <= after]

    def flowing(self) -> float:
        """When the proxy sent the client the stream's first text (ns; NaN: never)."""
        return self.down.text[0][1] if self.down.text else math.nan

    def request_relayed(self) -> float:
        """The proxy's request to the upstream (its last byte) minus the client's request to
        the proxy (s): the proxy's share of the stream's start."""
        return (self.up.asked - self.down.asked) / 1e9

    def calls_added(self) -> list[float]:
        """For each call, the proxy's packet with its arguments complete minus the upstream's
        packet with its last fragment (s)."""
        return [
            (at - self.up.calls[index]) / 1e9 if index in self.up.calls else float("nan")
            for index, at in sorted(self.down.calls.items())
        ]


def _held(marks: Marks, ends: list[int]) -> list[float]:
    """When the leg had carried ``ends[i]`` characters of text (NaN: it never did)."""
    out: list[float] = []
    k = 0
    for end in ends:
        while k < len(marks.text) and marks.text[k][0] < end:
            k += 1
        out.append(marks.text[k][1] if k < len(marks.text) else float("nan"))
    return out


def leg_marks(events: list[tuple[int, bytes]]) -> Marks:
    """Text and call times of one captured event stream (as UPSTREAM_RUNNER's ``times``)."""
    marks, chars = Marks(), 0
    for at, data in events:
        if data.strip() == b"[DONE]":
            continue
        for choice in orjson.loads(data).get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                chars += len(delta["content"])
                marks.text.append((chars, at))
            for call in delta.get("tool_calls") or ():
                if (call.get("function") or {}).get("arguments"):
                    marks.calls[call.get("index", 0)] = at
    return marks


@dataclass
class WireLevel:
    """What one capture held, by the requests' tags."""

    up: dict[str, Marks] = field(default_factory=dict)  # answers of the upstream's port
    down: dict[str, Marks] = field(default_factory=dict)  # answers of the proxy's port
    problems: list[str] = field(default_factory=list)


def wire_level(pcap: bytes, up_port: int, proxy_port: int | None) -> WireLevel:
    """Each event stream answered on the two ports, by the tag in its request (each bench
    stream's own, in its user message, so carried by both the client's request to the proxy
    and the proxy's to the upstream; LiteLLM does not pass the request's ``user`` on).
    HTTP/1.1 answers in the order of the requests on a connection, so the n-th response on
    a connection is the n-th request's."""
    level = WireLevel()
    linktype, packets = pcap_wire.read_pcap(pcap)
    segments = (pcap_wire.tcp_segment(linktype, frame, at) for at, frame in packets)
    directions = pcap_wire.reassemble(s for s in segments if s is not None)
    for client, server in pcap_wire.connections(directions):
        port = client.dst[1]
        legs = level.up if port == up_port else level.down if port == proxy_port else None
        if legs is None or server is None:
            continue
        if client.hole_at is not None or server.hole_at is not None:
            level.problems.append(f"a connection to port {port} has bytes missing")
        try:
            for ex in pcap_wire.exchanges(client, server):
                user = _tag(ex.request_body)
                if user is None or ex.status != 200 or ex.response_body is None:
                    continue
                legs[user] = marks = leg_marks(pcap_wire.sse_events(ex.response_body, server))
                last = ex.request_body.raw_offset(len(ex.request_body.data) - 1)
                marks.asked = client.time_at(last)
        except (pcap_wire.PcapError, ValueError) as exc:  # orjson's errors are ValueErrors
            level.problems.append(f"a connection to port {port}: {exc}")
    return level


def _tag(body: pcap_wire.Body) -> str | None:
    found = re.search(TAG, body.data) if body.complete else None
    return found.group(1).decode() if found else None


class Capture:
    """``tcpdump`` on the loopback interface, for some TCP ports, into a pcap file: started
    before a level, stopped after it. Nanosecond time stamps; ``-U`` writes each packet as
    it comes; ``-Z root`` keeps root's right to write the file (Debian's tcpdump otherwise
    drops to its own user first)."""

    def __init__(self, tcpdump: str, path: Path, ports: list[int]) -> None:
        self.path = path
        user = ["-Z", "root"] if os.geteuid() == 0 else []
        rule = " or ".join(f"tcp port {p}" for p in ports)
        self.proc = subprocess.Popen(
            [
                tcpdump,
                "-i",
                "lo",
                "-n",
                "-U",
                "-B",
                "16384",
                "--time-stamp-precision=nano",
                *user,
                "-w",
                str(path),
                rule,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.said = b""
        deadline = time.monotonic() + 30
        assert self.proc.stderr is not None
        while b"listening on" not in self.said:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stderr], [], [], max(left, 0))
            line = self.proc.stderr.readline() if ready else b""
            if not line:  # ended, or silent for 30 s
                stop(self.proc)
                said = (self.said + self.proc.stderr.read()).decode(errors="replace").strip()
                raise CaptureError(f"tcpdump did not start: {said or 'no output'}")
            self.said += line

    def finish(self) -> tuple[bytes, str]:
        """Stop the capture; the pcap and tcpdump's count of the packets the kernel dropped
        (drops mean holes). It waits 1.5 s first: libpcap on Linux reads the kernel's ring in
        blocks, and hands over a block not yet full only when its timeout (tcpdump's 1 s)
        expires; stopped sooner, the last packets would be lost without being counted as
        dropped. (``--immediate-mode`` would hand over each packet, at a wake-up each, on
        the cores being measured.)"""
        time.sleep(1.5)
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            stop(self.proc)
            raise CaptureError("tcpdump did not stop in 30 s") from None
        said = (self.said + err).decode(errors="replace")
        dropped = re.search(r"(\d+) packets? dropped by kernel", said)
        data = self.path.read_bytes()
        self.path.unlink()
        return data, dropped.group(1) if dropped else "?"


class CaptureError(RuntimeError):
    """tcpdump could not capture (not installed, not permitted, or it failed)."""


def port_of(url: str) -> int:
    port = urllib.parse.urlsplit(url).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port


# --- a level --------------------------------------------------------------------------------


@dataclass
class Result:
    target: str
    streams: list[Stream]
    cpu_s: float
    wall_s: float
    ref: list[Stream] | None = None  # the direct streams it is compared with (None: rows[0]'s)
    wire_note: str = ""  # what the capture lacked, if anything


async def run_level(
    base: str, pid: int | None, n: int, repeat: int
) -> tuple[list[Stream], float, float]:
    # idle connections dropped after 2 s, before the servers' own 5 s keep-alive (uvicorn's;
    # the proxy's idle_timeout_s): at httpx's default 5 s the client took a connection just as
    # the server closed it, and the stream failed ReadError (a reset: a few of 200 at load 7
    # on 2 cores, where a burst's streams start over more than 5 s; direct streams too)
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=n + 8, keepalive_expiry=2.0
    )
    timeout = httpx.Timeout(connect=30.0, read=300.0, write=30.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        await one_stream(client, base)  # warm (and a connection)
        cpu0 = tree_cpu(pid) if pid else 0.0
        t0 = time.perf_counter()
        streams: list[Stream] = []
        for _ in range(repeat):
            streams += await asyncio.gather(*(one_stream(client, base) for _ in range(n)))
        wall = time.perf_counter() - t0
        cpu = (tree_cpu(pid) - cpu0) if pid else 0.0
    return streams, cpu, wall


def pct(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def offsets(s: Stream, which: str) -> list[float]:
    """A stream's times for ``which``: ``first`` (its first text delta, since the request),
    ``text`` (each text delta, since the upstream sent it), ``calls`` (each call complete,
    since the upstream sent its last fragment), ``request`` (each text delta, since the
    request)."""
    if which == "first":
        return s.text_offsets()[:1]
    if which == "text":
        return s.text_relayed()
    if which == "calls":
        return s.calls_relayed()
    return s.text_offsets()


def added(streams: list[Stream], ref: list[float], which: str) -> list[float]:
    out: list[float] = []
    for s in streams:
        if s.error is not None:
            continue
        out += [g - r for g, r in zip(offsets(s, which), ref, strict=False)]
    return out


def reference(streams: list[Stream], which: str) -> list[float]:
    rows = [offsets(s, which) for s in streams if s.ok()]
    return [statistics.median(col) for col in zip(*rows, strict=False)]


# --- main -----------------------------------------------------------------------------------


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


async def bench(args: argparse.Namespace) -> None:
    litellm = args.litellm or os.environ.get("TOOLLATCH_BENCH_LITELLM")
    if litellm and not Path(litellm).exists():
        litellm = shutil.which(litellm)
    if not litellm:
        print(
            "LiteLLM not found: pass --litellm PATH/TO/litellm or set TOOLLATCH_BENCH_LITELLM "
            "(install it in a venv of its own: pip install 'litellm[proxy]'); "
            "measuring direct and toollatch only"
        )
    tmp = Path(tempfile.mkdtemp(prefix="bench_proxy_"))
    procs: list[subprocess.Popen[str]] = []
    if args.pin:  # this process, so the upstream and tcpdump, on core 0; each proxy on core 1
        os.sched_setaffinity(0, {0})
        print("# pinned: each proxy on core 1, the clients, the upstream and tcpdump on core 0")

    def pin_proxy(proc: subprocess.Popen[str]) -> None:
        """With ``--pin``, ``proc`` (and the threads and processes it makes) on core 1."""
        if args.pin:
            os.sched_setaffinity(proc.pid, {1})

    try:
        upstream, root = scripted_process(tmp, args.delay_ms, procs)
        up_url = f"{root}/v1"
        ours = subprocess.Popen(
            [sys.executable, "-c", RUNNER, up_url, '{"calls": "hold"}'],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(ours)
        pin_proxy(ours)
        ours_url = read_line(ours, "http://", 30)
        targets: list[tuple[str, str, int | None]] = [
            ("direct", up_url, upstream.pid),
            ("toollatch", ours_url, ours.pid),
        ]
        if args.unsettled:
            plain = subprocess.Popen(
                [sys.executable, "-c", RUNNER, up_url, '{"calls": "hold"}', "unsettled"],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(plain)
            pin_proxy(plain)
            targets.append(("toollatch@unsettled", read_line(plain, "http://", 30), plain.pid))
        if args.calls_stream:
            live = subprocess.Popen(
                [sys.executable, "-c", RUNNER, up_url, '{"calls": "stream"}'],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(live)
            pin_proxy(live)
            targets.append(("toollatch@stream", read_line(live, "http://", 30), live.pid))
        for name, src in args.baseline:
            env = {**os.environ, "PYTHONPATH": src}
            settled = ["unsettled"] if args.unsettled else []
            base_proc = subprocess.Popen(
                [sys.executable, "-c", RUNNER, up_url, '{"calls": "hold"}', *settled],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            procs.append(base_proc)
            pin_proxy(base_proc)
            base_url = read_line(base_proc, "http://", 30)
            targets.append((f"toollatch@{name}", base_url, base_proc.pid))
        if litellm:
            port = free_port()
            (tmp / "cfg.yaml").write_text(
                "model_list:\n"
                f"  - model_name: {MODEL}\n"
                "    litellm_params:\n"
                f"      model: openai/{MODEL}\n"
                f"      api_base: {up_url}\n"
                "      api_key: sk-bench\n"
                "litellm_settings:\n"
                "  telemetry: false\n"
                "general_settings:\n"
                f"  master_key: {KEY}\n"
            )
            env = {
                **os.environ,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
                "LITELLM_LOG": "ERROR",
            }
            log = (tmp / "litellm.log").open("w")
            lite = subprocess.Popen(
                [
                    litellm,
                    "--config",
                    str(tmp / "cfg.yaml"),
                    "--port",
                    str(port),
                    "--host",
                    "127.0.0.1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
            )
            procs.append(lite)
            pin_proxy(lite)
            await wait_ready(
                f"http://127.0.0.1:{port}/health/liveliness", 600
            )  # (imports are slow)
            targets.append(("litellm", f"http://127.0.0.1:{port}/v1", lite.pid))
        tcpdump = None if args.no_wire else capture_tool(tmp)
        up_port = port_of(up_url)
        print(f"# bench_proxy: {load()}; delay {args.delay_ms} ms between upstream events")
        header(wire=tcpdump is not None)
        for n in args.streams:
            repeat = args.single if n == 1 else 1
            rows = []
            for name, base, pid in targets if not args.paired else targets[1:]:
                proxy_port = None if base == up_url else port_of(base)
                ports = [up_port] if proxy_port is None else [up_port, proxy_port]
                cap = Capture(tcpdump, tmp / "level.pcap", ports) if tcpdump else None
                if args.paired:  # n direct streams beside the n through the target
                    (d, d_cpu, d_wall), (streams, cpu, wall) = await asyncio.gather(
                        run_level(up_url, upstream.pid, n, repeat), run_level(base, pid, n, repeat)
                    )
                    rows.append(Result(f"direct beside {name}", d, d_cpu, d_wall, ref=d))
                else:
                    streams, cpu, wall = await run_level(base, pid, n, repeat)
                sent = upstream_sent(upstream, tmp)
                for s in [*streams, *(rows[-1].streams if args.paired else ())]:
                    s.sent = sent.get(s.user)
                note = take_wire(cap, up_port, proxy_port, streams) if cap else ""
                rows.append(
                    Result(
                        name,
                        streams,
                        cpu,
                        wall,
                        ref=rows[-1].streams if args.paired else None,
                        wire_note=note,
                    )
                )
            report(n, rows, wire=tcpdump is not None)  # as each level ends
        print(f"# at the end: {load()}")
    finally:
        for proc in reversed(procs):
            stop(proc)


def capture_tool(tmp: Path) -> str | None:
    """tcpdump's path if it can capture on the loopback interface here, else None (said)."""
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        print(
            "# tcpdump not found (Debian: apt-get install tcpdump): "
            "no wire columns (the proxies' added latency as captured on the loopback interface)"
        )
        return None
    try:
        Capture(tcpdump, tmp / "probe.pcap", [free_port()]).finish()
    except CaptureError as exc:
        print(f"# capture not possible ({exc}): no wire columns")
        return None
    return tcpdump


def take_wire(cap: Capture, up_port: int, proxy_port: int | None, streams: list[Stream]) -> str:
    """Stop ``cap``, give each stream through a proxy its two legs, and say what is missing."""
    data, dropped = cap.finish()
    if proxy_port is None:
        return ""
    level = wire_level(data, up_port, proxy_port)
    found = whole = 0
    for s in streams:
        up, down = level.up.get(s.user), level.down.get(s.user)
        s.wire = Wire(up, down) if up is not None and down is not None else None
        found += s.wire is not None
        whole += s.wire is not None and all(leg_whole(leg) for leg in (up, down))
    problems = sorted(set(level.problems))
    if whole == len(streams) and dropped == "0" and not problems:
        return ""
    return (
        f"{found} of {len(streams)} streams on both legs, {whole} whole (all the text and "
        f"calls on both); {dropped} packets dropped; "
        + ("; ".join(problems[:3]) or "no other problem")
    )


def leg_whole(marks: Marks | None) -> bool:
    """The leg carried all of TEXT and a last fragment of each call."""
    return (
        marks is not None
        and bool(marks.text)
        and marks.text[-1][0] == len(TEXT)
        and sorted(marks.calls) == list(range(len(CALLS)))
    )


def header(*, wire: bool) -> None:
    extra = (
        " wire text added p50 / p99 ms | wire text added once all flow p50 / p99 ms "
        "| wire calls' delay p50 / p99 ms | wire request relayed p50 / p99 ms |"
    )
    print(
        "| streams | target | ok / streams | upstream events | call deltas/stream "
        "| CPU µs/event | first text added p50 / p99 ms | text added per event p50 / p99 ms "
        "| calls' delay p50 / p99 ms | since request p50 / p99 ms | wall s |" + extra * wire
    )
    print(
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (4 * wire), flush=True
    )


def once_all_flow(wired: list[Wire]) -> list[float]:
    """Text added (s) once every stream of ``wired`` (started together) has its first text
    from the proxy: no stream is starting any more."""
    if not wired:
        return []
    all_flow = max(w.flowing() for w in wired)
    return [t for w in wired for t in w.text_added(after=all_flow)]


def wire_cells(streams: list[Stream], n: int) -> tuple[str, tuple[float, float]]:
    """The wire columns of a row (and the p99s of its text, ms: all of it, once all flow), or
    "(no proxy)" where no stream had both legs captured (the direct rows: no proxy there)."""
    wired = [s.wire for s in streams if s.error is None and s.wire is not None]
    if not wired:
        return " (no proxy) |" * 4, (math.nan, math.nan)
    text = [t for w in wired for t in w.text_added()]
    flowing = [
        t
        for batch in range(0, len(streams), n)  # the streams started together (run_level)
        for t in once_all_flow([s.wire for s in streams[batch : batch + n] if s.wire])
    ]
    calls = [t for w in wired for t in w.calls_added()]
    asked = [w.request_relayed() for w in wired]
    cells = " | ".join(
        f"{pct(v, 0.5) * 1e3:.2f} / {pct(v, 0.99) * 1e3:.2f}"
        if any(x == x for x in v)
        else "(none)"  # e.g. once all flow: the first streams ended before the last started
        for v in (text, flowing, calls, asked)
    )
    return f" {cells} |", (pct(text, 0.99) * 1e3, pct(flowing, 0.99) * 1e3)


def report(n: int, rows: list[Result], *, wire: bool = False) -> None:
    direct = rows[0]
    up_events = statistics.median(s.events for s in direct.streams if s.ok())
    kinds = ("first", "text", "calls", "request")
    per_event: dict[str, float] = {}
    p99: dict[str, float] = {}
    wire_p99: dict[str, tuple[float, float]] = {}
    for r in rows:
        ok = sum(s.ok() for s in r.streams)
        events = up_events * len(r.streams)
        cpu_us = r.cpu_s / events * 1e6
        per_event[r.target] = cpu_us
        ref = r.ref if r.ref is not None else direct.streams
        late = {kind: added(r.streams, reference(ref, kind), kind) for kind in kinds}
        p99[r.target] = pct(late["text"], 0.99) * 1e3
        deltas = statistics.mean(s.call_deltas for s in r.streams)
        cells = " | ".join(
            f"{pct(late[kind], 0.5) * 1e3:.2f} / {pct(late[kind], 0.99) * 1e3:.2f}"
            for kind in kinds
        )
        extra, wire_p99[r.target] = wire_cells(r.streams, n) if wire else ("", (math.nan,) * 2)
        print(
            f"| {n} | {r.target} | {ok} / {len(r.streams)} | {up_events:.0f} | {deltas:.1f} "
            f"| {cpu_us:.0f} | {cells} | {r.wall_s:.1f} |{extra}"
        )
        if r.wire_note:
            print(f"#   {r.target} on the wire: {r.wire_note}")
        differs = Counter(
            f"error={s.error!r} text_ok={s.text == TEXT} calls={s.assembled()!r} finish={s.finish}"
            for s in r.streams
            if not s.ok()
        )
        for how, count in differs.most_common():  # (every way streams differed, counted)
            print(f"#   {r.target}: {count} stream(s) differ: {how}")
    others = [name for name in per_event if name.startswith("toollatch@")]
    others += ["litellm"] if per_event.get("litellm") else []
    for name in others:
        if not per_event[name]:
            continue
        label = "LiteLLM" if name == "litellm" else name
        ours, theirs = wire_p99["toollatch"], wire_p99[name]
        extra = (
            f" wire p99 {ours[0] / theirs[0]:.2f} | p99 {ours[1] / theirs[1]:.2f} | | |"
            if wire
            else ""
        )
        print(
            f"|  | toollatch / {label} | | | | {per_event['toollatch'] / per_event[name]:.2f} "
            f"| | p99 {p99['toollatch'] / p99[name]:.2f} | | | |{extra}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--litellm", help="the litellm executable (else $TOOLLATCH_BENCH_LITELLM)")
    parser.add_argument("--streams", default="1,50,200", help="concurrencies (default 1,50,200)")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="between upstream events")
    parser.add_argument("--single", type=int, default=10, help="sequential streams at 1")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="each proxy on a core of its own (core 1), everything else on core 0",
    )
    parser.add_argument("--quick", action="store_true", help="--single 3, --delay-ms 5")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="also toollatch's proxy from the source tree SRC, as toollatch@NAME (repeatable)",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="run each target beside n direct streams at the same time, compared with them",
    )
    parser.add_argument(
        "--unsettled",
        action="store_true",
        help="also toollatch's proxy without the heap settled at start, as toollatch@unsettled;"
        " the baselines without it too (as `toollatch proxy` ran before it settled its heap)",
    )
    parser.add_argument(
        "--no-wire",
        action="store_true",
        help="no packet capture (by default, where tcpdump can capture on lo, the wire columns:"
        " each proxy's added latency between the upstream's packets and its own)",
    )
    parser.add_argument(
        "--calls-stream",
        action="store_true",
        help="also toollatch's proxy with --calls stream, as toollatch@stream",
    )
    args = parser.parse_args()
    args.baseline = [tuple(b.split("=", 1)) for b in args.baseline]
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # rows as they come
    args.streams = [int(x) for x in args.streams.split(",")]
    if args.quick:
        args.single, args.delay_ms = 3, 5.0
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
