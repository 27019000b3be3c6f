"""Waiting for a task we stopped, without losing a cancel of our own; a cancel lost on the
way (internal).

The runtime, the relay and MCP stop a task (``task.cancel()``, or a flag it obeys) and then
wait for it to end. ``with suppress(CancelledError): await task`` has a hole: a cancel of
the *waiting* task, arriving while it waits, is handed to ``task`` (``Task.cancel`` cancels
the future its task awaits) and comes back out of ``await task`` as ``task``'s own
``CancelledError``, which the ``suppress`` swallows; a ``task`` that catches its cancels and
returns swallows it without a trace. Either way the waiter goes on as if never cancelled: a
stop that never stops, an ``asyncio.timeout`` that never fires. :func:`join` tells the two
apart by the waiter's ``cancelling()`` count (Python 3.11).

It lives in ``tools/`` because that is the lowest room that may use asyncio (the core may
not) and that the runtime, MCP and the relay all import.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def join(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` has ended; its own cancellation is not an error.

    ``task``'s other exceptions propagate, as from ``await task``. When the caller is itself
    cancelled meanwhile, the cancel reaches ``task`` too (as it does through ``await task``),
    ``task`` is still awaited to its end (nothing is left running), and then
    ``CancelledError`` is raised to the caller, even when ``task`` ended without one."""
    waiter = asyncio.current_task()
    before = 0 if waiter is None else waiter.cancelling()
    try:
        await task
    except asyncio.CancelledError:
        if waiter is not None and waiter.cancelling() > before:
            raise
        return
    if waiter is not None and waiter.cancelling() > before:
        raise asyncio.CancelledError


def cancel_lost() -> bool:
    """Whether the running task was cancelled and goes on all the same: a cancel swallowed on
    the way, which the task still counts (:meth:`asyncio.Task.cancelling`). redis-py sends
    each command under ``asyncio.wait_for``, which on Python 3.11 returns the inner result
    when the cancel lands in the same loop turn as the command's end (python/cpython#86296,
    fixed in 3.12): a loop that renews a lease or a heartbeat until cancelled checks this at
    each turn, or it would go on for ever and hold its owner's stop."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
