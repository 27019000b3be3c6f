"""A reader that falls behind the relay's bounded log is told so (``event: lagged``, with the
first id still kept) and then gets every event from that id on: never a silent gap."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx

from relay_helpers import Frame, chatty_script, parse_sse, read_events, start_run
from toollatch import RelayLimits
from toollatch.relay import RelayServer
from toollatch.relay._runs import EventLog

TEXT = 8 << 20
"""A run's text: far more than the log keeps, and than the loopback socket buffers hold
(Linux's tcp_wmem maximum is 4 MiB; the stalled reader's receive buffer is 4 KiB)."""
KEPT = 64 * 1024


def _frame(n: int, size: int = 100) -> bytes:
    """A frame of the same length for every ``n`` below 10**6."""
    return b"id: %d\nevent: text\ndata: %s\n\n" % (n, b"x" * (size - len(str(n))))


def _ids(log: EventLog, cursor: int) -> tuple[list[Frame], int]:
    chunk, cursor = log.after(cursor, 10**9)
    return parse_sse_bytes(chunk), cursor


def parse_sse_bytes(chunk: bytes) -> list[Frame]:
    frames: list[Frame] = []
    for block in chunk.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if fields:
            data = {"size": len(fields["data"])} if fields["event"] == "text" else fields["data"]
            frames.append(Frame(int(fields["id"]), fields["event"], data))  # type: ignore[arg-type]
    return frames


def test_the_log_keeps_the_newest_bytes_and_tells_a_reader_what_it_lost() -> None:
    log = EventLog(max_bytes=10 * len(_frame(1)))
    for n in range(1, 5001):  # past the compaction threshold several times
        log.append(_frame(n))
        assert log.last_id == n and log.first_id == max(1, n - 9)
    for cursor in (0, 100, 4989, 4990, 4995, 5000):
        frames, after = _ids(log, cursor)
        assert after == 5000
        if cursor < 4990:  # its next event (cursor + 1) was forgotten
            assert frames[0].event == "lagged" and frames[0].id == 4990
            assert frames[0].data == f'{{"type":"lagged","first_id":4991,"missed":{4990 - cursor}}}'
            frames = frames[1:]
        assert [f.id for f in frames] == list(range(max(cursor, 4990) + 1, 5001))


def test_the_newest_frame_is_kept_even_when_larger_than_the_bound() -> None:
    log = EventLog(max_bytes=10)
    log.append(_frame(1, 500))
    log.append(_frame(2, 500))
    assert log.first_id == 2 and log.last_id == 2
    chunk, cursor = log.after(1, 64)
    assert chunk == _frame(2, 500) and cursor == 2
    chunk, cursor = log.after(2, 64)
    assert chunk == b"" and cursor == 2


def test_a_batch_limit_still_moves_the_cursor_over_the_gap() -> None:
    log = EventLog(max_bytes=3 * len(_frame(1)))
    for n in range(1, 11):
        log.append(_frame(n))
    chunk, cursor = log.after(0, 2)  # lagged to 7, then 8 and 9
    frames = parse_sse_bytes(chunk)
    assert [(f.event, f.id) for f in frames] == [("lagged", 7), ("text", 8), ("text", 9)]
    assert cursor == 9


def _check_told(frames: list[Frame], total: int) -> None:
    """Every id from 1 to ``total`` once, in order, except runs of ids announced as gone
    just before the gap by a ``lagged`` event (id first_id-1, missed = the gap's length)."""
    expected, told = 1, 0
    for frame in frames:
        if frame.event == "lagged":
            first = frame.data["first_id"]
            assert first > expected and frame.data["missed"] == first - expected
            assert frame.id == first - 1
            expected, told = first, told + 1
        else:
            assert frame.id == expected, "an event skipped without a lagged event before it"
            expected += 1
    assert expected == total + 1 and frames[-1].event == "run_ended"
    assert told >= 1, "a reader behind the kept log must be told"


async def test_a_stalled_reader_is_told_it_lagged_then_gets_the_rest() -> None:
    limits = RelayLimits(max_kept_bytes=KEPT)
    scripts = {"big": chatty_script(TEXT, chunk_chars=4096)}
    async with RelayServer(scripts=scripts, delay_scale=0, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=60) as client:
            run = await start_run(client, model="big")
            session = client.headers["x-toollatch-session"]
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", int(relay.url.rsplit(":", 1)[1])))
            head = (
                f"GET {run['events_url']} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"X-Toollatch-Session: {session}"
            )
            sock.sendall(f"{head}\r\n\r\n".encode())  # then read nothing until the run ends
            try:
                stored = relay.relay.runs.owned(run["id"], session)  # type: ignore[union-attr]
                started = time.monotonic()
                while not stored.done:
                    assert time.monotonic() - started < 60
                    await asyncio.sleep(0.05)
                body = await _read_to_end(sock)
            finally:
                sock.close()
            frames, _ = parse_sse(_dechunk(body).decode())
            _check_told(frames, stored.last_id)
            # a reconnect from an id already forgotten is told too (a browser's Last-Event-ID)
            again = await read_events(client, run["events_url"], last_id=3)
            assert again[0].event == "lagged" and again[0].data["missed"] == again[0].id - 3
            assert [f.id for f in again[1:]] == list(range(again[0].id + 1, stored.last_id + 1))
            # and one from a kept id is exact, with no lagged event
            tail = await read_events(client, run["events_url"], last_id=stored.last_id - 5)
            assert [f.id for f in tail] == list(range(stored.last_id - 4, stored.last_id + 1))


async def _read_to_end(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    received = bytearray()
    deadline = time.monotonic() + 60
    loop = asyncio.get_running_loop()
    while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end
        assert time.monotonic() < deadline
        part = await loop.sock_recv(sock, 1 << 20)
        assert part, "the relay closed the stream early"
        received += part
    return bytes(received)


def _dechunk(response: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response."""
    rest = response.split(b"\r\n\r\n", 1)[1]
    body = bytearray()
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return bytes(body)
        body += rest[:size]
        rest = rest[size + 2 :]
