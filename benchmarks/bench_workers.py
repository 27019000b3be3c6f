"""Several relay workers on one Redis: how soon a dead worker's run is ended, and what an
answer posted to another worker than the run's owner costs.

Run it from the repository root (needs redis-server on the PATH)::

    python benchmarks/bench_workers.py                 # 5 kills, 20 answers each way
    python benchmarks/bench_workers.py --kills 3 --lease 1 --answers 40

**Lease detection**: two ``toollatch serve`` processes (``--lease``), a slow scripted run
started on the first, which is SIGKILLed once the run's 8th event was read; the time from
the kill to ``run_ended`` parsed by a reader on the second. Bounded by about 4/3 of the
lease (the lease runs out between 2/3 of it and all of it after the kill; the survivors
look every third of it). **Answer latency**: two relays in this process, a run waiting on
an approval on the first; ``POST .../approve`` timed on the owner itself and on the other
worker (handed over by Redis pub/sub, applied by the owner, its reply by a Redis list).
Nothing here is a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from toollatch import tool
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

CLI = [sys.executable, "-c", "import sys; from toollatch.cli import main; sys.exit(main())"]

SLOW = Script(
    turns=(
        Turn(
            items=(
                Text(text="Checking, slowly.", chunk_chars=2),
                Call(call_id="c1", name="get_weather", arguments='{"city": "Oslo Oslo Oslo"}',
                     fragment_chars=1),
            ),
            delay_ms=150.0,
        ),
    )
)  # fmt: skip
ASK = Script(
    turns=(
        Turn(items=(Call(call_id="w", name="write_note", arguments='{"text": "hi"}'),)),
        Turn(items=(Text(text="Done."),)),
    )
)


@tool(needs_approval=True)
def write_note(text: str) -> str:
    """Write a note (waits for an approval)."""
    return f"noted {len(text)} chars"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    match = re.search(r"http://127\.0\.0\.1:\d+", proc.stderr.readline())
    assert match is not None, "serve did not start"
    return proc, match.group(0)


def events(client: httpx.Client, url: str, until: int | None) -> list[tuple[str, Any]]:
    """(event, data) of ``url`` until ``until`` frames, or the stream's end."""
    got: list[tuple[str, Any]] = []
    buffer = ""
    with client.stream("GET", url) as stream:
        for text in stream.iter_text():
            buffer += text
            *blocks, buffer = buffer.split("\n\n")
            for block in blocks:
                fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
                if "data" in fields:
                    got.append((fields["event"], json.loads(fields["data"])))
            if until is not None and len(got) >= until:
                break
    return got


def detection(redis_url: str, lease: float, kills: int) -> list[float]:
    """Seconds from SIGKILL of a run's owner to its ``run_ended`` read on another worker."""
    times = []
    with ScriptedServer(scripts={"slow": SLOW}) as model:
        args = ("--store", redis_url, "--ledger", "none", "--lease", f"{lease:g}")
        args += ("--model", "slow", "--base-url", model.base_url("openai_chat"))
        survivor, on_b = serve(*args)
        try:
            for _ in range(kills):
                owner, on_a = serve(*args)
                session = {"x-toollatch-session": "b" * 43}
                with httpx.Client(base_url=on_a, timeout=30, headers=session) as a:
                    run = a.post("/runs", json={"message": "m"}).json()
                    events(a, run["events_url"], 8)
                owner.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                owner.wait()
                with httpx.Client(base_url=on_b, timeout=30, headers=session) as b:
                    got = events(b, run["events_url"], None)
                times.append(time.monotonic() - killed)
                assert got[-1][0] == "run_ended"
                assert "lease" in got[-1][1]["error"]
        finally:
            survivor.send_signal(signal.SIGKILL)
            survivor.wait()
    return times


async def answers(redis_url: str, n: int) -> tuple[list[float], list[float]]:
    """Seconds of ``POST .../approve`` on the run's owner, and on another worker."""
    local: list[float] = []
    remote: list[float] = []
    options: dict[str, Any] = {"scripts": {"ask": ASK}, "delay_scale": 0, "store": redis_url}
    async with (
        RelayServer(tools=[write_note], **options) as a,
        RelayServer(tools=[write_note], **options) as b,
    ):
        headers = {"x-toollatch-session": "a" * 43}
        async with (
            httpx.AsyncClient(base_url=a.url, timeout=30, headers=headers) as on_a,
            httpx.AsyncClient(base_url=b.url, timeout=30, headers=headers) as on_b,
        ):
            for i in range(2 * n):
                run = (await on_a.post("/runs", json={"message": "m", "model": "ask"})).json()
                token = None
                async with on_a.stream("GET", run["events_url"]) as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("data: ") and '"approval_requested"' in line:
                            token = json.loads(line[6:])["token"]
                            break
                via, times = (on_a, local) if i % 2 else (on_b, remote)
                started = time.perf_counter()
                answer = await via.post(f"/runs/{run['id']}/calls/w/approve", json={"token": token})
                times.append(time.perf_counter() - started)
                assert answer.status_code == 202, answer.text
    return local, remote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--answers", type=int, default=20)
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("needs redis-server on the PATH")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        redis = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder],
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(0.3)
            url = f"redis://127.0.0.1:{port}/0"
            local, remote = asyncio.run(answers(url, args.answers))
            ms = [1000 * t for t in remote]
            print(
                f"approve on the owner: median {1000 * statistics.median(local):.2f} ms; "
                f"on another worker: median {statistics.median(ms):.2f} ms, max {max(ms):.2f} ms "
                f"({args.answers} each)"
            )
            found = detection(url, args.lease, args.kills)
            shown = ", ".join(f"{t:.2f}" for t in found)
            print(
                f"lease {args.lease:g} s: run_ended read {statistics.median(found):.2f} s "
                f"(median of {args.kills}) after SIGKILL of the owner [{shown}]"
            )
        finally:
            redis.terminate()
            redis.wait()


if __name__ == "__main__":
    main()
