"""Request starts take turns with the flowing streams (relay/_proxy_turns.py): at most one
start step per iteration of the event loop, a later step of a start before an earlier one,
a stream's read served between two starts. Counted in loop iterations, never timed: a
callback that schedules itself again each iteration numbers them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest

from toollatch.relay import ProxyServer, _proxy
from toollatch.relay._proxy import Proxy
from toollatch.relay._proxy_turns import StartTurns
from toollatch.scripted import Script, ScriptedServer, Text, Turn

HOUR = 3600.0  # (a pace no iteration of these tests lasts: one turn per iteration)


class Iterations:
    """The running loop's iterations, numbered: :attr:`now` is the current one's."""

    def __init__(self) -> None:
        self.now = 0
        self._loop = asyncio.get_running_loop()
        self._on = True
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.now += 1
        if self._on:
            self._loop.call_soon(self._tick)  # (runs once in the next iteration)

    def stop(self) -> None:
        self._on = False


@contextlib.contextmanager
def iterations() -> Iterator[Iterations]:
    counted = Iterations()
    try:
        yield counted
    finally:
        counted.stop()


async def started(
    turns: StartTurns, step: int, name: str, seen: list[tuple[int, str]], clock: Iterations
) -> None:
    await turns.turn(step)
    seen.append((clock.now, name))


def starting(
    turns: StartTurns, step: int, names: list[str], seen: list[tuple[int, str]], clock: Iterations
) -> list[asyncio.Task[None]]:
    """A start per name, each waiting for its turn at ``step``."""
    return [asyncio.create_task(started(turns, step, name, seen, clock)) for name in names]


async def test_starts_that_arrive_together_go_one_per_iteration_in_order():
    turns = StartTurns(1, HOUR)
    seen: list[tuple[int, str]] = []
    with iterations() as clock:
        await asyncio.gather(*(started(turns, 0, f"s{n}", seen, clock) for n in range(8)))
    assert [name for _, name in seen] == [f"s{n}" for n in range(8)]
    ticks = [tick for tick, _ in seen]
    assert len(set(ticks)) == 8  # (asyncio.sleep(0) for a turn: all eight in one iteration)
    assert turns.waiting == 0


async def test_a_long_iteration_gives_one_turn_per_pace_of_it(monkeypatch):
    loop = asyncio.get_running_loop()
    now = [0.0]
    monkeypatch.setattr(loop, "time", lambda: now[0])  # (the loop's clock, moved by hand)
    turns = StartTurns(1, 1.0)
    seen: list[tuple[int, str]] = []
    with iterations() as clock:
        starts = starting(turns, 0, [f"s{n}" for n in range(6)], seen, clock)
        await asyncio.sleep(0)  # (all six wait; the first hand-out is due next iteration)
        now[0] = 3.5  # the iteration took three paces and a half
        await asyncio.gather(*starts)
    assert [name for _, name in seen] == [f"s{n}" for n in range(6)]
    ticks = [tick for tick, _ in seen]
    assert ticks[0] == ticks[1] == ticks[2] < ticks[3] < ticks[4] < ticks[5]
    # an idle loop's time since the last hand-out is no long iteration: starts that come
    # after it go one per iteration again
    now[0] = 100.0
    seen.clear()
    with iterations() as clock:
        await asyncio.gather(*(started(turns, 0, f"s{n}", seen, clock) for n in range(3)))
    assert len({tick for tick, _ in seen}) == 3


async def test_a_later_step_goes_before_earlier_ones_waiting():
    turns = StartTurns(3, HOUR)
    seen: list[tuple[int, str]] = []
    with iterations() as clock:
        first = starting(turns, 0, [f"route{n}" for n in range(3)], seen, clock)
        await asyncio.sleep(0)  # (the three wait for their turn)
        answer = asyncio.create_task(started(turns, 2, "answer", seen, clock))
        send = asyncio.create_task(started(turns, 1, "send", seen, clock))
        await asyncio.gather(*first, answer, send)
    # route0's turn was already handed out when the later steps came
    assert [name for _, name in seen] == ["route0", "answer", "send", "route1", "route2"]
    assert len({tick for tick, _ in seen}) == 5


async def test_a_streams_read_is_served_between_two_starts():
    turns = StartTurns(1, HOUR)
    seen: list[tuple[int, str]] = []
    with iterations() as clock:
        starts = starting(turns, 0, [f"s{n}" for n in range(10)], seen, clock)
        read: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def reader() -> None:
            await read
            seen.append((clock.now, "read"))

        reading = asyncio.create_task(reader())
        while not seen:  # the first start went through: the bytes come in now
            await asyncio.sleep(0)
        read.set_result(None)
        await asyncio.gather(*starts, reading)
    names = [name for _, name in seen]
    assert 0 < names.index("read") < 4  # (not after every start)


async def test_a_cancelled_waiter_gives_its_turn_to_the_next_and_turns_start_again():
    turns = StartTurns(1, HOUR)
    seen: list[tuple[int, str]] = []
    with iterations() as clock:
        tasks = starting(turns, 0, [f"s{n}" for n in range(3)], seen, clock)
        await asyncio.sleep(0)
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert [name for _, name in seen] == ["s0", "s2"]
        assert turns.waiting == 0
        await started(turns, 0, "later", seen, clock)  # (the hand-out stopped, and restarts)
    assert seen[-1][1] == "later"


class Answer:
    """An upstream answer that notes its closing."""

    closed = False

    async def aclose(self) -> None:
        self.closed = True


async def test_a_request_cancelled_waiting_to_set_up_its_answer_closes_the_upstreams():
    async with httpx.AsyncClient() as http:
        proxy = Proxy("http://127.0.0.1:9/v1", http)
        answer = Answer()
        waiting = asyncio.create_task(proxy._answer_turn(answer, None))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # (waiting for its turn)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    assert answer.closed


STREAMS = 24
SLOW = Script(turns=(Turn(items=(Text(text="one two three four", chunk_chars=4),), delay_ms=40),))
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_a_burst_of_requests_through_the_proxy_takes_turns_step_by_step(monkeypatch):
    """Real HTTP on loopback: each chat request of a burst takes its three turns (routing,
    sending, answering) in that order, and no two turns of the burst go through in the same
    iteration of the loop (the pace set beyond any iteration, so the count is the loop's)."""
    taken: list[tuple[int, int, int]] = []
    real = StartTurns.turn

    async def turn(self: StartTurns, step: int) -> None:
        await real(self, step)
        taken.append((clock.now, id(asyncio.current_task()), step))

    monkeypatch.setattr(StartTurns, "turn", turn)
    monkeypatch.setattr(_proxy, "_TURN_PACE_S", HOUR)
    async with (
        ScriptedServer({"m": SLOW}) as upstream,
        ProxyServer(upstream.base_url("openai_chat")) as proxy,
        httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=60) as client,
        contextlib.AsyncExitStack() as stack,
    ):
        with iterations() as clock:
            answers = await asyncio.gather(
                *(
                    stack.enter_async_context(
                        client.stream("POST", f"{proxy.url}/chat/completions", json=BODY)
                    )
                    for _ in range(STREAMS)
                )
            )
            bodies = await asyncio.gather(*(a.aread() for a in answers))
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    steps: dict[int, list[int]] = {}
    for _, task, step in taken:
        steps.setdefault(task, []).append(step)
    assert list(steps.values()) == [[0, 1, 2]] * STREAMS
    assert len({at for at, _, _ in taken}) == 3 * STREAMS
