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
from collections.abc import Iterator
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
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if match is None:
        proc.kill()
        rest = proc.stderr.read()
        proc.stderr.close()
        proc.wait()
        raise AssertionError(f"serve did not start: {line}{rest}")
    return proc, match.group(0)


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
        rest = proc.stderr.read()
        proc.stderr.close()
        raise AssertionError(
            f"serve still ran {wait_s:g} s after signal {how}: {rest[-2000:]}"
        ) from exc
    proc.stderr.close()
    assert status == (-how if how == signal.SIGKILL else 128 + how)


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
