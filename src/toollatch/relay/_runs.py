"""Runs and their event logs (internal; public names in :mod:`toollatch.relay`).

Theory of operation. Each run's driver task iterates its :class:`~toollatch.runtime.AgentRun`
and appends every event, already encoded as one SSE frame, to the run's log: entry ``n``
(1-based) is the frame with ``id: n``. Readers never get a buffer of their own: each keeps a
cursor into the shared log and is woken when it grows, so a reader that stalls (its socket's
send buffer full) blocks only its own response, never the run, and costs no memory beyond the
log, which is bounded by :attr:`RelayLimits.max_run_events` (a run reaching it is cancelled).
Resuming with ``Last-Event-ID: n`` restarts the cursor at ``n``: nothing lost, nothing repeated.

Previews come from the agent's ``on_preview`` hook, which its run's iterator calls in
stream order with the events, so the log is the stream's order; the page still never lets a
preview move a call back from a later state.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from .._preview import PreviewPolicy, PreviewUpdated
from ..runtime._agent import AgentRun
from ._config import RelayLimits, shown_arguments

_DROPPABLE = frozenset({"text", "call_preview", "call_opened"})
"""What a run past its event limit leaves out (still queued when the cancel was asked)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One stored event: its SSE id and the whole encoded frame."""

    id: int
    """1-based, increasing per run."""
    data: bytes
    """``id: ..\\nevent: ..\\ndata: ..\\n\\n``."""


def preview_json(preview: PreviewUpdated) -> dict[str, Any]:
    """A ``call_preview`` event's JSON: ``{"type", "id", "name", "bytes", "deltas":
    [[pointer, op, value]...], "provisional", "final", "error"}`` (deltas already redacted)."""
    return {
        "type": "call_preview",
        "id": preview.call_id,
        "name": preview.name,
        "bytes": preview.bytes_so_far,
        "deltas": [[d.path, d.op, d.value] for d in preview.deltas],
        "provisional": sorted(preview.provisional),
        "final": preview.final,
        "error": preview.error,
    }


class RelayRun:
    """One run of one session: its log, its driver task, its cancel."""

    def __init__(self, session: str, policy: PreviewPolicy, limits: RelayLimits) -> None:
        self.id = secrets.token_urlsafe(18)
        self.session = session
        self.frames: list[Frame] = []
        self.done = False
        self._policy = policy
        self._limits = limits
        self._grew = asyncio.Event()
        self._agent_run: AgentRun | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, agent_run: AgentRun, closing: Callable[[], Any]) -> None:
        """Drive ``agent_run`` in a task; ``closing()`` (awaitable) runs when it ends."""
        self._agent_run = agent_run
        self._task = asyncio.get_running_loop().create_task(self._drive(closing))

    def preview(self, notice: PreviewUpdated) -> None:
        """The agent's ``on_preview`` hook."""
        self.append(preview_json(notice))

    def append(self, data: dict[str, Any]) -> None:
        """Store one event (``data["type"]`` is its SSE name) and wake the readers."""
        n = len(self.frames) + 1
        if n > self._limits.max_run_events and data["type"] in _DROPPABLE:
            return  # past the limit only the events that pair calls and end the run are kept
        body = orjson.dumps(data)
        self.frames.append(
            Frame(n, b"id: %d\nevent: %s\ndata: %s\n\n" % (n, data["type"].encode(), body))
        )
        if n == self._limits.max_run_events:
            self.cancel()  # bounded: the cancel adds only the round's closing events
        self._grew.set()
        self._grew = asyncio.Event()

    async def wait(self, seen: int, timeout: float) -> bool:
        """Wait until the log has more than ``seen`` frames or the run is done; False on
        ``timeout`` (the caller sends a heartbeat)."""
        grew = self._grew
        if len(self.frames) > seen or self.done:
            return True
        try:
            async with asyncio.timeout(timeout):
                await grew.wait()
        except TimeoutError:
            return False
        return True

    def cancel(self) -> bool:
        """Stop the run (every open call gets its ``cancelled`` result); False when done."""
        if self.done or self._agent_run is None:
            return False
        self._agent_run.cancel()
        return True

    async def stop(self) -> None:
        """Cancel and wait for the driver (server shutdown)."""
        self.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _drive(self, closing: Callable[[], Any]) -> None:
        assert self._agent_run is not None
        ended = False
        try:
            async for event in self._agent_run:
                data = self._shown(event.to_json())
                ended = ended or data["type"] == "run_ended"
                self.append(data)
        except Exception as exc:  # a broken client or tool file: the page must still end
            if not ended:
                error = f"{type(exc).__name__}: {exc}"
                self.append(
                    {
                        "type": "run_ended",
                        "rounds": 0,
                        "calls": [],
                        "history": [],
                        "error": error,
                        "history_omitted": 0,
                    }
                )
        finally:
            self.done = True
            self._grew.set()
            await closing()

    def _shown(self, data: dict[str, Any]) -> dict[str, Any]:
        """The event as the browser may see it (see :mod:`._config`)."""
        if data["type"] == "call_committed":
            data["arguments"] = shown_arguments(self._policy, data["name"], data["arguments"])
        elif data["type"] == "run_ended":
            data["history_omitted"] = len(data["history"])
            data["history"] = []
        return data


class RunRegistry:
    """The runs of every session: bounded active runs, bounded stored runs."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self._runs: OrderedDict[str, RelayRun] = OrderedDict()

    def active(self) -> int:
        """Runs not done yet."""
        return sum(1 for r in self._runs.values() if not r.done)

    def admit(self, run: RelayRun) -> bool:
        """Store ``run``; False (not stored) when ``max_active_runs`` are in flight."""
        if self.active() >= self.limits.max_active_runs:
            return False
        while len(self._runs) >= self.limits.max_stored_runs:
            oldest = next((k for k, r in self._runs.items() if r.done), None)
            if oldest is None:
                return False
            del self._runs[oldest]
        self._runs[run.id] = run
        return True

    def owned(self, run_id: str, session: str | None) -> RelayRun | None:
        """The run, if it exists and belongs to ``session`` (constant-time compare)."""
        run = self._runs.get(run_id)
        if run is None or session is None:
            return None
        return run if secrets.compare_digest(run.session, session) else None

    async def close(self) -> None:
        """Cancel every run and wait for their drivers."""
        await asyncio.gather(*(r.stop() for r in list(self._runs.values())))
