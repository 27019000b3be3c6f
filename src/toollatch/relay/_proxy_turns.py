"""Request starts take turns with the streams already flowing (internal; :mod:`._proxy`).

Theory of operation. asyncio's loop, in each iteration, polls its sockets once, then runs
every callback that was ready when the iteration began (task steps included), and only then
polls again. Requests that arrive together (50 clients starting at once) make as many start
steps ready in the same iteration: the routing and the body, the gate's set-up, the
upstream request, the answer's set-up, each 0.1-0.3 ms. The upstream bytes of the streams already
flowing, seen by the next poll, wait behind all of them: 50 starts added 3-10 ms to the first
deltas of the flowing streams (benchmarks/README.md, "On a quiet machine").

A start awaits :meth:`StartTurns.turn` before each of its heavy steps (the proxy's own: its
routing and body; the gate's set-up and the upstream request; the answer's set-up once the
upstream answered). Turns are handed out once per iteration: :meth:`StartTurns._hand_out`
gives one waiter its turn and schedules itself again with ``call_soon``, so it runs once in
the next iteration, after that iteration's poll; the step it let through runs in the
iteration after its hand-out. So while the loop turns quickly, one of these steps runs per
iteration, and a flowing stream's read waits behind one start step, not behind every start.
A later step goes before an earlier one (FIFO within a step): a start under way finishes
before the next one begins, so the first streams flow after a few iterations, not after
every start's first step. Steps inside the upstream client (the connection, the request's bytes)
take no turn: they follow the turns' pace.

When the loop's iterations are long (a loop busy with many streams, or a process that did not
get the CPU), one step per iteration would starve the starts (at 200 streams the last stream
started seconds late, and the streams, no longer read in bursts, cost more CPU per event).
So a hand-out gives one turn per ``pace_s`` of the loop's time since the last one, at least
one: the starts go on at one step per ``pace_s`` at least, and a flowing read waits behind
about one step per ``pace_s`` of the iteration before it. A start's own latency grows by
two iterations per turn (short ones for a lone request); the starts' total work is the same,
spread over more iterations.
"""

from __future__ import annotations

import asyncio
from collections import deque


class StartTurns:
    """Start steps let through one per iteration of the running loop, or one per ``pace_s``
    of the loop's time when its iterations are longer; a later step of a start before an
    earlier one (see the module's theory of operation). ``steps``: how many kinds of step
    take turns (numbered from 0, in the order a start takes them). One instance per proxy,
    on one loop."""

    def __init__(self, steps: int, pace_s: float) -> None:
        self.pace_s = pace_s
        self._waiting: tuple[deque[asyncio.Future[None]], ...] = tuple(
            deque() for _ in range(steps)
        )
        self._handing = False  # a _hand_out is scheduled (at most one at a time)
        self._last = 0.0  # the loop's time at the last hand-out (or when it was scheduled)

    @property
    def waiting(self) -> int:
        """Steps waiting for their turn (cancelled waiters included until passed over)."""
        return sum(len(queue) for queue in self._waiting)

    async def turn(self, step: int) -> None:
        """Return once this start step has its turn (at the earliest two iterations of the
        loop from now); the first waiter of the latest ``step`` goes first. Cancellable: a
        cancelled waiter leaves the queue (its turn, if already given, is lost)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiting[step].append(waiter)
        if not self._handing:
            self._handing = True
            self._last = loop.time()
            loop.call_soon(self._hand_out, loop)
        await waiter

    def _hand_out(self, loop: asyncio.AbstractEventLoop) -> None:
        """Give turns to the first waiters of the latest steps: one, or one per ``pace_s``
        since the last hand-out; scheduled again while any waits (so once an iteration,
        after its poll)."""
        now = loop.time()
        turns = max(1, int((now - self._last) / self.pace_s))
        self._last = now
        for _ in range(turns):
            waiter = self._first()
            if waiter is None:
                break
            waiter.set_result(None)
        if any(self._waiting):
            loop.call_soon(self._hand_out, loop)
        else:
            self._handing = False

    def _first(self) -> asyncio.Future[None] | None:
        """The first waiter still waiting of the latest step, off its queue (a cancelled
        waiter gives way to the next)."""
        for queue in reversed(self._waiting):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    return waiter
        return None
