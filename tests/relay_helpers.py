"""Shared pieces of the relay tests: scripts the relay's scripted server plays, an SSE
reader over httpx (real HTTP on loopback), and ``toollatch serve`` run in a subprocess."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from toollatch.scripted import Call, Script, Text, Turn


def slow_script(delay_ms: float = 25.0, city_chars: int = 40) -> Script:
    """Two parallel get_weather calls whose arguments stream one character an event, then a
    final text: a run that lasts about (text + 2 * args) * delay_ms."""
    long_city = ("Oslo " * city_chars)[:city_chars].strip()
    first = Turn(
        items=(
            Text(text="Checking two cities, slowly.", chunk_chars=4),
            Call(
                call_id="call_slow_a",
                name="get_weather",
                arguments=json.dumps({"city": long_city}),
                fragment_chars=1,
            ),
            Call(
                call_id="call_slow_b",
                name="get_weather",
                arguments=json.dumps({"city": "Zürich", "unit": "c"}),
                fragment_chars=1,
            ),
        ),
        delay_ms=delay_ms,
    )
    final = Turn(items=(Text(text="Both done.", chunk_chars=4),), delay_ms=delay_ms)
    return Script(turns=(first, final))


def chatty_script(chars: int, chunk_chars: int = 1) -> Script:
    """One turn of ``chars`` characters of text, ``chunk_chars`` an event, no pauses."""
    text = Text(text="x" * chars, chunk_chars=chunk_chars)
    return Script(turns=(Turn(items=(text,), delay_ms=0.0),))


@dataclass(frozen=True)
class Frame:
    id: int
    event: str
    data: dict[str, Any]


def parse_sse(text: str) -> tuple[list[Frame], list[str]]:
    """Frames (id, event, JSON data) and the comment lines of an SSE body."""
    frames: list[Frame] = []
    comments: list[str] = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line)
            elif ": " in line:
                key, value = line.split(": ", 1)
                fields[key] = value
        if "data" in fields:
            frames.append(Frame(int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return frames, comments


async def start_run(client: httpx.AsyncClient, message: str = "hi", **extra: Any) -> dict[str, Any]:
    """POST /runs; the answer's JSON (asserting 201), in a session the client names by
    header (a new one, kept on the client, unless it has one): the relay echoes it."""
    client.headers.setdefault("x-toollatch-session", secrets.token_urlsafe(32))
    response = await client.post("/runs", json={"message": message, **extra})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["session"] == client.headers["x-toollatch-session"]
    return body


async def cancel(client: httpx.AsyncClient, url: str) -> httpx.Response:
    """POST a run's cancel_url as the page does (a JSON body)."""
    return await client.post(url, json={})


async def read_events(
    client: httpx.AsyncClient, url: str, *, last_id: int | None = None, limit: int | None = None
) -> list[Frame]:
    """The frames of one GET (until the run ends, or ``limit`` frames, then disconnect)."""
    headers = {} if last_id is None else {"last-event-id": str(last_id)}
    frames: list[Frame] = []
    buffer = ""
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, response.status_code
        assert response.headers["content-type"].startswith("text/event-stream")
        async for text in response.aiter_text():
            buffer += text
            *blocks, buffer = buffer.split("\n\n")
            for block in blocks:
                frames += parse_sse(block + "\n\n")[0]
                if limit is not None and len(frames) >= limit:
                    return frames[:limit]
    return frames


CLI = [sys.executable, "-c", "import sys; from toollatch.cli import main; sys.exit(main())"]


def serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``toollatch serve --port 0 *args`` started: the process and the URL it printed."""
    return listening(launch(*args))


def launch(*args: str) -> subprocess.Popen[str]:
    """``toollatch serve --port 0 *args`` launched, not waited for (:func:`listening`): a
    test that needs several launches them all first, so that their start-ups (imports, DBOS's
    launch) overlap instead of queueing (about 1.3 s each)."""
    return subprocess.Popen(
        [*CLI, "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True
    )


def listening(proc: subprocess.Popen[str]) -> tuple[subprocess.Popen[str], str]:
    """A process from :func:`launch` once it listens, and the URL it printed (if it exits
    first: killed, and an AssertionError with what it wrote). Lines before the URL's are
    skipped (DBOS may log first, as lb_helpers.start_workers allows)."""
    assert proc.stderr is not None
    before: list[str] = []
    match = None
    while match is None and (line := proc.stderr.readline()):
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        before.append(line)
    if match is None:
        proc.kill()
        rest = proc.stderr.read()
        proc.stderr.close()
        proc.wait()
        raise AssertionError(f"serve did not start: {''.join(before)}{rest}")
    return proc, match.group(0)


_DRAINS: dict[int, tuple[threading.Thread, deque[str]]] = {}
"""The stderr readers of :func:`drain`, by process id."""

DRAIN_LINES = 400
"""Lines of a drained process's stderr kept (its end, for a failure's message)."""


def drain(proc: subprocess.Popen[str]) -> None:
    """Read what ``proc`` writes to stderr from now on, in a thread, keeping its last
    :data:`DRAIN_LINES` lines (:func:`written`; :func:`stop` shows them). A pipe nobody
    reads fills (64 KiB on Linux), and the process blocks at its next write: a ``serve
    --durable`` worker whose PostgreSQL is down logs DBOS's retries, tracebacks included,
    and one was seen stuck for good on Ctrl-C, DBOS's shut-down waiting for the logging
    lock that a thread blocked writing held (under load the outage lasts longer)."""
    assert proc.stderr is not None
    pipe, lines = proc.stderr, deque[str](maxlen=DRAIN_LINES)

    def read() -> None:
        with contextlib.suppress(ValueError, OSError):  # (the pipe closed under it: done)
            for line in pipe:
                lines.append(line)

    thread = threading.Thread(target=read, name=f"stderr of {proc.pid}", daemon=True)
    thread.start()
    _DRAINS[proc.pid] = (thread, lines)


def written(proc: subprocess.Popen[str], wait_s: float = 5.0) -> str:
    r"""What ``proc`` wrote to stderr that is left to read: for a :func:`drain`\ ed one, its
    kept lines once its pipe ended (after at most ``wait_s``: it exited); else the rest of
    its pipe (which ends when it exits)."""
    assert proc.stderr is not None
    if proc.pid not in _DRAINS:
        return proc.stderr.read()
    thread, lines = _DRAINS[proc.pid]
    thread.join(wait_s)
    return "".join(lines)


def close_stderr(proc: subprocess.Popen[str]) -> None:
    """Close ``proc``'s stderr pipe once it exited (a drain's reader done first)."""
    assert proc.stderr is not None
    drained = _DRAINS.pop(proc.pid, None)
    if drained is not None:
        drained[0].join(5.0)
    proc.stderr.close()


def stop(proc: subprocess.Popen[str], how: int = signal.SIGINT, wait_s: float = 15) -> None:
    """Ctrl-C (status 130) or ``how`` (SIGTERM: 143; SIGKILL: no clean-up at all), then
    close the pipe. A server still running ``wait_s`` later is killed and the test fails
    with the end of what it wrote (its pipe closed all the same: no leak into later tests),
    chained to the timeout, and so to a test body's error that a ``finally`` calling this
    was handling (shown, not hidden)."""
    proc.send_signal(how)
    assert proc.stderr is not None
    try:
        status = proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.wait()
        rest = written(proc)
        close_stderr(proc)
        raise AssertionError(
            f"serve still ran {wait_s:g} s after signal {how}: {rest[-2000:]}"
        ) from exc
    close_stderr(proc)
    assert status == (-how if how == signal.SIGKILL else 128 + how)


def stop_each(
    procs: Iterable[subprocess.Popen[str]], how: int = signal.SIGINT, wait_s: float = 15
) -> None:
    """:func:`stop` each of ``procs`` still running, every one of them even when one fails
    (that one killed): then the first failure is raised (a worker that overran its stop
    left the others running, orphaned, past the test)."""
    failures: list[AssertionError] = []
    for proc in procs:
        if proc.poll() is None:
            try:
                stop(proc, how, wait_s)
            except AssertionError as exc:
                failures.append(exc)
    if failures:
        raise failures[0]


@contextlib.contextmanager
def serving(*args: str, how: int = signal.SIGINT) -> Iterator[str]:
    """A :func:`serve` for the block (its URL), stopped with ``how`` when the block ends."""
    proc, url = serve(*args)
    try:
        yield url
    finally:
        stop(proc, how)


def served_run(url: str, message: str) -> tuple[dict[str, Any], list[Frame]]:
    """POST a run of ``message`` to the served relay at ``url``; its answer and every event
    frame to the end of the run."""
    with httpx.Client(base_url=url, timeout=60) as client:
        run = client.post("/runs", json={"message": message}).json()
        run["session"] = client.cookies["toollatch_session"]  # (HttpOnly: not in the body)
        frames, _ = parse_sse(client.get(run["events_url"]).text)
    return run, frames
