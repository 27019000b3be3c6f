"""How long a tool held the event loop (internal).

A tool's timeout is ``asyncio.timeout``: it can only act when the tool's coroutine gives the
loop back (an ``await`` that suspends). An ``async def`` tool that blocks (``time.sleep``, a
blocking socket, a long computation) holds the loop for that whole step: the timeout cannot
fire during it, every other call and stream of the process stalls with it, and a tool that
returns without awaiting again keeps its result even though its deadline passed.

:class:`HeldLoop` wraps the tool's coroutine and measures each step (each ``send``/``throw``
the task makes into it, with ``time.perf_counter``), so the dispatcher can tell, naming the
tool, that one step held the loop longer than the tool's timeout. The cost is two clock
reads per step of the tool.

Each step runs in a copy of the context taken when the :class:`HeldLoop` is made, so what
the tool sets in a context variable stays its own, as in a task of its own, also when the
dispatcher awaits the call in the round's task (``DispatchRound._inline``).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class HeldLoop(Generic[T]):
    """``await HeldLoop(coro)`` is ``await coro``; :attr:`longest_s` is then the longest
    time one step of ``coro`` ran without giving the loop back."""

    __slots__ = ("_context", "_coro", "longest_s")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._context = contextvars.copy_context()
        self.longest_s = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        steps, run = self._coro.__await__(), self._context.run
        value: Any = None
        error: BaseException | None = None
        while True:
            began = time.perf_counter()
            try:
                yielded = run(steps.send, value) if error is None else run(steps.throw, error)
            except StopIteration as stop:
                self._held(began)
                return stop.value  # type: ignore[no-any-return]
            except BaseException:
                self._held(began)
                raise
            self._held(began)
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                self._coro.close()
                raise
            except BaseException as exc:  # (cancellation: passed on to the tool)
                value, error = None, exc

    def _held(self, began: float) -> None:
        held = time.perf_counter() - began
        self.longest_s = max(self.longest_s, held)
