"""The idle deadline of a stream's reads, with one timer per stream instead of one per read.

``asyncio.timeout`` around each read makes a Timeout, schedules a TimerHandle and cancels it
again for every body chunk: measured at 200 concurrent relay runs, that bookkeeping was about
a fifth of the model client's CPU per chunk. Here a read only moves a float: the one timer
armed fires at the deadline it was armed for and, when a read moved the deadline since, arms
itself again for the new one, so a stream pays about one timer per ``idle_s`` of reading,
not one per chunk. When the deadline passes during a read, the reading task is cancelled
(as ``asyncio.timeout`` does) and :meth:`IdleDeadline.expired_for` turns that cancellation
into a timeout, but only when no other cancellation is pending for the task.

A read may name its own ``seconds`` (:meth:`IdleDeadline.reading`): the model client times
the request's first byte with the same object, and so with the same timer, as the reads
after it (a timer armed for a later instant than a read's deadline is armed again for it).
"""

from __future__ import annotations

import asyncio
import time

_RESOLUTION = time.get_clock_info("monotonic").resolution
"""How early the event loop may run a timer (its ``loop.time()`` is ``time.monotonic``)."""


class IdleDeadline:
    """At most ``seconds`` from :meth:`reading` to :meth:`done` of each read, enforced by
    cancelling the task that called :meth:`reading`; :meth:`close` when the stream ends."""

    __slots__ = (
        "_armed",
        "_cancelling",
        "_deadline",
        "_loop",
        "_reading",
        "_seconds",
        "_task",
        "_timer",
        "expired",
    )

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed = 0.0  # when the timer fires
        self._deadline = 0.0
        self._reading = False
        self._cancelling = 0
        self.expired = False
        """True once a read outlasted the deadline (its task was cancelled for it)."""

    def reading(self, seconds: float | None = None) -> None:
        """A read starts now, in the current task: its deadline is ``seconds`` (default:
        the deadline's own) from now."""
        task = asyncio.current_task(self._loop)
        if task is None:  # pragma: no cover - reads are awaited, so there is a task
            raise RuntimeError("a stream is read from a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._deadline = deadline = self._loop.time() + (seconds or self._seconds)
        self._reading = True
        if self._timer is None:
            self._arm()
        elif deadline < self._armed:  # (a read with seconds of its own, shorter)
            self._timer.cancel()
            self._arm()

    def done(self) -> None:
        """The read started by :meth:`reading` ended (with a chunk or an error)."""
        self._reading = False

    def expired_for(self) -> bool:
        """Called on a CancelledError out of a read: True when it is this deadline's own
        cancellation (it is then consumed, so the caller raises its timeout), False when
        somebody else cancelled the task too (the caller re-raises)."""
        if not self.expired or self._task is None:
            return False
        return self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        """No more reads: drop the timer."""
        self._reading = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if not self._reading or self.expired:
            return  # between reads nothing is timed; the next read arms a timer again
        # the loop runs a timer up to its clock resolution early: only re-arm when the
        # deadline is really later (a read moved it), or the timer would spin on one instant
        if self._deadline - self._loop.time() > _RESOLUTION:
            self._arm()
            return
        self.expired = True
        assert self._task is not None  # set by reading()
        self._task.cancel()

    def _arm(self) -> None:
        self._armed = self._deadline
        self._timer = self._loop.call_at(self._deadline, self._fire)
