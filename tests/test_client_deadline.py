"""The model client's idle deadline with one timer per stream (runtime/_clients/_deadline):
it moves with every chunk, times only the reads, and never passes an outer cancellation off
as a timeout. Real HTTP on loopback (uvicorn, port 0), as in test_clients.py."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from loopback_http import loopback, stream_reply
from toollatch import ClientLimits, StreamTimeout, model_client
from toollatch.runtime._clients._deadline import IdleDeadline


@pytest.fixture
async def server():
    async with loopback() as state:
        yield state
        for client in state.clients:
            await client.aclose()


def client_for(server, idle_s: float):
    client = model_client(
        "openai_chat",
        model="m",
        base_url=server.url,
        limits=ClientLimits(idle_s=idle_s, first_byte_s=5),
        env={},
    )
    server.clients.append(client)
    return client


def pieces(count: int, gap_s: float) -> list:
    """``count`` SSE pieces with ``gap_s`` of silence before each one after the first."""
    out: list = [b"data: 0\n\n"]
    for n in range(1, count):
        out += [functools.partial(asyncio.sleep, gap_s), f"data: {n}\n\n".encode()]
    return out


async def test_a_steady_stream_longer_than_the_deadline_is_not_timed_out(server):
    # 8 chunks 0.1 s apart under a 0.3 s deadline: 0.7 s in all. A deadline armed once and
    # never moved by the chunks would fire at 0.3 s.
    server.replies.append(stream_reply(pieces(8, 0.1)))
    started = time.monotonic()
    async with client_for(server, 0.3).stream([]) as s:
        got = [chunk async for chunk in s]
    assert b"".join(got) == b"".join(f"data: {n}\n\n".encode() for n in range(8))
    assert time.monotonic() - started >= 0.7


async def test_a_stall_after_steady_chunks_times_out_about_idle_s_after_the_last(server):
    server.replies.append(stream_reply([*pieces(4, 0.1), server.release.wait]))
    got: list[bytes] = []
    times: list[float] = []

    async def drain(s) -> None:
        async for chunk in s:
            got.append(chunk)
            times.append(time.monotonic())

    async with client_for(server, 0.3).stream([]) as s:
        with pytest.raises(StreamTimeout) as caught:
            await drain(s)
        waited = time.monotonic() - times[-1]
    assert len(got) == 4
    assert caught.value.kind == "idle"
    assert 0.3 <= waited < 1.5  # not before the deadline, and not a timer left far behind


async def test_the_callers_own_time_between_reads_is_not_silence(server):
    # The server has every chunk ready; the caller takes 0.4 s per chunk, past the 0.2 s
    # deadline each time: only a read's own wait counts. (A read hands over what arrived
    # meanwhile: the chunks after the first may come as one.)
    server.replies.append(stream_reply(pieces(3, 0.0)))
    got = []
    async with client_for(server, 0.2).stream([]) as s:
        async for chunk in s:
            got.append(chunk)
            await asyncio.sleep(0.4)
    assert len(got) >= 2  # (the caller's own 0.4 s came between two reads)
    assert b"".join(got) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_an_outer_cancellation_mid_read_stays_a_cancellation(server):
    server.replies.append(stream_reply([b"data: 0\n\n", server.release.wait]))
    reading = asyncio.Event()

    async def read() -> None:
        async with client_for(server, 30).stream([]) as s:
            async for _ in s:
                reading.set()

    task = asyncio.create_task(read())
    await reading.wait()
    await asyncio.sleep(0.05)  # the task is in its second read now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancellation_together_with_the_deadline_is_not_swallowed():
    # The deadline's own cancel and an outer one reach the same read: the timeout must not
    # eat the outer request (the task's cancel count says there were two).
    outcome: list[str] = []

    async def read(deadline: IdleDeadline, started: asyncio.Event) -> None:
        deadline.reading()
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            outcome.append("timeout" if deadline.expired_for() else "cancelled")
            raise
        finally:
            deadline.done()
            deadline.close()

    for outer in (False, True):
        deadline, started = IdleDeadline(0.05), asyncio.Event()
        task = asyncio.create_task(read(deadline, started))
        await started.wait()
        if outer:  # due at the deadline's own instant: both run before the task resumes
            asyncio.get_running_loop().call_at(deadline._deadline, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task
    assert outcome == ["timeout", "cancelled"]


# -- the first byte, timed by the same deadline (one timer a request) -------------------------


@pytest.mark.parametrize("headers_first", [False, True])
async def test_an_outer_cancellation_before_the_first_byte_stays_a_cancellation(
    server, headers_first
):
    from loopback_http import stalling_reply

    server.replies.append(stalling_reply(server.release, headers_first=headers_first))
    client = model_client(
        "openai_chat",
        model="m",
        base_url=server.url,
        limits=ClientLimits(idle_s=0.05, first_byte_s=0.3),
        env={},
    )
    server.clients.append(client)

    async def read() -> None:
        async with client.stream([]) as s:
            async for _ in s:
                pass

    task = asyncio.create_task(read())
    await asyncio.sleep(0.1)  # waiting for the first byte (past idle_s, before first_byte_s)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # and no deadline's timer is left armed (the stream never opened: it closed its own)
    loop = asyncio.get_running_loop()
    left = [h for h in loop._scheduled if not h.cancelled() and _is_deadline_timer(h)]  # type: ignore[attr-defined]
    assert left == []


def _is_deadline_timer(handle: asyncio.TimerHandle) -> bool:
    return isinstance(getattr(handle._callback, "__self__", None), IdleDeadline)  # type: ignore[attr-defined]


async def test_a_first_byte_deadline_longer_than_the_idle_one_leaves_idle_s_to_the_reads():
    # One deadline object times the first byte (5 s) and then the reads (0.05 s): a read's
    # shorter deadline arms the timer again, earlier, or the stall would last 5 s.
    deadline = IdleDeadline(0.05)
    deadline.reading(5.0)
    deadline.done()
    started = time.monotonic()
    deadline.reading()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(10)
    assert deadline.expired_for()
    assert time.monotonic() - started < 1.0
    deadline.done()
    deadline.close()
