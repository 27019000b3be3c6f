"""The worker threads sync tools run in (internal).

A worker thread cannot be stopped: a sync tool past its timeout, or cancelled, keeps running
until its function returns, with its result discarded. In asyncio's default executor such a
thread would also hold the process: ``asyncio.run`` waits for the default executor at its end
(``loop.shutdown_default_executor``, with no limit on Python 3.11), and the interpreter joins
every ``ThreadPoolExecutor`` thread at exit (``concurrent.futures.thread._python_exit``), so a
hung tool kept ``toollatch run`` (and any program using the runtime) from exiting, forever.

Sync tools therefore run in :data:`TOOL_THREADS`, a small pool of *daemon* threads that
nothing waits for: when the program ends, a thread still running a tool is abandoned (the
interpreter stops it wherever it is, as it stops every daemon thread). A tool that must not be
cut off mid-write finishes its work within its timeout, or makes its effect atomic.

The pool starts threads on demand, reuses an idle one first, and keeps at most
``max_workers`` (asyncio's default executor's size, ``min(32, cpus + 4)``); a thread that a
hung tool holds counts until the tool returns, so calls beyond that wait for a free thread
(under their own timeout).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple["concurrent.futures.Future[Any]", Callable[[], Any]]


class DaemonThreads(concurrent.futures.Executor):
    """An executor of at most ``max_workers`` daemon threads, never joined (see the module
    docstring). ``submit`` works from any thread; ``shutdown`` only stops accepting work."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads started so far (each lives until the process ends)."""
        return self._threads

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` in a worker thread; its future."""
        if self._closed:
            raise RuntimeError("cannot schedule new work after shutdown")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._work.put((future, functools.partial(fn, *args, **kwargs)))
        if not self._idle.acquire(blocking=False):  # no idle thread will take it: start one
            with self._lock:
                if self._threads < self._max_workers:
                    self._threads += 1
                    number = self._threads
                    thread = threading.Thread(
                        target=self._serve, name=f"{self._name}_{number}", daemon=True
                    )
                    thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Accept no new work (``wait`` is ignored: these threads are never joined)."""
        self._closed = True

    def _serve(self) -> None:
        while True:
            future, work = self._work.get()
            if future.set_running_or_notify_cancel():
                try:
                    result = work()
                except BaseException as exc:  # the caller's future carries it
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, work  # (no reference kept to a result while idle)
            self._idle.release()


TOOL_THREADS = DaemonThreads(min(32, (os.cpu_count() or 1) + 4), "toollatch-tool")
"""The pool every sync tool runs in."""


async def in_tool_thread(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """``fn(**kwargs)`` in :data:`TOOL_THREADS`, with the caller's context variables (as
    ``asyncio.to_thread`` copies them: ``current_call()`` works in the tool)."""
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(TOOL_THREADS, call)
