"""Waiting for a task we stopped, without losing a cancel of our own (internal).

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
