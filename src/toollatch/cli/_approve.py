"""``toollatch run`` answering the calls that wait for a person (internal; imported only by
``_run_command``).

``--approve ask`` (the default) asks for each call: the tool's name and its full committed
arguments on standard error, then one line of standard input (a terminal, or a script's
pipe): ``y`` or ``yes`` approves, ``a`` or ``always`` approves and always allows the tool
in the run's session (kept in the ledger: ``--resume`` keeps it; ``--max-always``), anything
else (an empty line, end of input) denies with the reason "not approved" (past the cap of
always-allowed tools, ``a`` approves this call only). ``--approve all`` approves every call,
``--approve none`` denies every one. A client tool's call (a tool without a body) has no
client here: it gets an error result saying so. The question is told first (``--json``: its
``approval_requested`` line), so a script reading the events knows what it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from typing import Literal

from ..ledger import ApprovalError, TooManyAlways
from ..runtime import ApprovalRequestedEvent
from ..runtime._agent_events import AgentEvent
from ..runtime._agent_run import AgentRun
from ._output import visible

Mode = Literal["ask", "all", "none"]
MODES: tuple[Mode, ...] = ("ask", "all", "none")
NOT_APPROVED = "not approved"
NO_CLIENT = "toollatch run has no client for this tool: it was not run"
_CHECK_S = 0.2
"""How often a prompt checks that its call still waits (it expired, or the run was
cancelled: the prompt is abandoned)."""


class Answerer:
    """The events of a run, each waiting call answered as ``mode`` says, after its event is
    shown; ``pause()`` is held around a prompt (the live view stops drawing)."""

    def __init__(
        self, mode: Mode, pause: Callable[[], AbstractContextManager[object]] | None = None
    ) -> None:
        self.mode = mode
        self.pause = pause or contextlib.nullcontext
        self._reading: asyncio.Future[str] | None = None
        """The line being read: a prompt abandoned (its call expired) leaves its reader
        for the next prompt, so no typed line goes to a question that is gone."""

    async def events(self, run: AgentRun) -> AsyncIterator[AgentEvent]:
        """``run``'s events, answering each question once it was passed on."""
        async for event in run:
            yield event
            if isinstance(event, ApprovalRequestedEvent):
                try:
                    await self._answer(run, event)
                except ApprovalError as exc:  # answered meanwhile (expired): nothing to do
                    sys.stderr.write(f"toollatch: {visible(str(exc))}\n")

    async def _answer(self, run: AgentRun, event: ApprovalRequestedEvent) -> None:
        if event.kind == "client":
            await run.submit_result(event.id, {"error": NO_CLIENT})
            return
        answer = "yes" if self.mode == "all" else "no"
        if self.mode == "ask":
            answer = await self._asked(run, event)
        if answer == "no":
            await run.deny(event.id, NOT_APPROVED)
            return
        try:
            await run.approve(event.id, args_sha256=event.args_sha256, always=answer == "always")
        except TooManyAlways as exc:  # (the call is still approved, this once)
            sys.stderr.write(f"toollatch: {visible(str(exc))}; approved this call only\n")
            await run.approve(event.id, args_sha256=event.args_sha256)

    async def _asked(self, run: AgentRun, event: ApprovalRequestedEvent) -> str:
        """The person's answer: ``yes``, ``always`` or ``no`` (also on end of input, or when
        the call stopped waiting)."""
        arguments = json.dumps(dict(event.arguments), indent=2, ensure_ascii=False)
        prompt = (
            f"toollatch: {visible(event.name)} (call {visible(event.id)}) wants to run with:\n"
            f"{visible(arguments, lines=True)}\napprove? [y/N] (a: always, this session) "
        )
        with self.pause():
            sys.stderr.write(prompt)
            sys.stderr.flush()
            if self._reading is None:
                self._reading = _read_line()
            line = await _line_while(self._reading, lambda: event.id in run.pending)
            if self._reading.done():
                self._reading = None
        said = "" if line is None else line.strip().lower()
        return "yes" if said in ("y", "yes") else "always" if said in ("a", "always") else "no"


def _settle(got: asyncio.Future[str], line: str) -> None:
    if not got.done():
        got.set_result(line)


def _read_line() -> asyncio.Future[str]:
    """One line of standard input ("" at its end), read in a daemon thread (a process that
    ends meanwhile does not wait for it)."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[str] = loop.create_future()

    def read() -> None:
        try:
            line = sys.stdin.readline()
        except (OSError, ValueError):  # closed or not readable: end of input
            line = ""
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody asks
            loop.call_soon_threadsafe(_settle, got, line)

    threading.Thread(target=read, name="toollatch-approve", daemon=True).start()
    return got


async def _line_while(got: asyncio.Future[str], waiting: Callable[[], bool]) -> str | None:
    """The line ``got`` reads; None at end of input or when ``waiting()`` turns false."""
    while not got.done():
        await asyncio.wait([got], timeout=_CHECK_S)
        if not got.done() and not waiting():
            return None
    return got.result() or None
