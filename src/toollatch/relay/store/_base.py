"""The run store seam and the in-memory store (internal; see :mod:`toollatch.relay.store`).

A run is driven by the worker that admitted it (its *owner*); the store makes it visible
to the others: :meth:`RunStore.created` records it (and gives it a mirror of its log, for a
shared store), :meth:`RunStore.find` gives another worker's run as a
:class:`~.._runs.RunSource` to read, :meth:`RunStore.cancel` asks its owner to cancel it,
and :meth:`RunStore.point` / :meth:`RunStore.pointed` keep the endpoints' pointers to runs
(a chat's latest run, an AG-UI ``runId``'s relay run).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from .._runs import RelayRun, RunRegistry, RunSource

POINTER_KINDS = ("chat", "agui")

Handler = Callable[[RelayRun, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]
"""How the owner of a run applies a request another worker forwarded (:meth:`RunStore.ask`):
its HTTP status and JSON body."""

Adopter = Callable[[str, str, str, Mapping[str, str]], Awaitable[bool]]
"""What a survivor does with a dead worker's run it won (run id, session digest, the dead
owner's worker id, what the run kept for it: :attr:`~.._runs.RelayRun.kept`): True when it
resumed the run (a pending question, a run record, a shared ledger; a durable workflow
recovered); False when it could not, its questions then settled ``cancelled`` so that no
restart resumes it (the store ends it)."""


class StoreUnavailable(Exception):
    """The shared store could not be reached (the endpoints answer 503 ``store_unavailable``;
    a reader's stream ends)."""


class RunStore(Protocol):
    """Where the runs live for every worker (see the module docstring)."""

    shared: bool
    """Whether other workers see the runs (False: this process only)."""

    async def open(
        self, runs: RunRegistry, handler: Handler | None = None, adopter: Adopter | None = None
    ) -> None:
        """Connect (a ``ConfigError`` naming the store when it cannot be reached) and start
        serving ``runs`` (this worker's): their mirrors, the cancels and the requests other
        workers send (``handler`` applies a request to a run of ``runs``; ``adopter`` is
        offered a dead worker's run before it is ended)."""

    async def aclose(self) -> None:
        """Stop; the runs' last events are written first (bounded)."""

    def end_reads(self) -> None:
        """End the reads of other workers' runs (this worker is stopping): each raises
        :class:`StoreUnavailable`, now or at its next read."""

    async def created(self, run: RelayRun) -> None:
        """Record a new run of this worker before anyone is told its id (StoreUnavailable)."""

    async def find(self, run_id: str, session: str) -> RunSource | None:
        """Another worker's run ``run_id`` of ``session`` (None: none, or not the session's;
        StoreUnavailable)."""

    async def cancel(self, run: RunSource, reason: str | None = None) -> bool:
        """Ask the owner of another worker's ``run`` to cancel it; False when no owner
        answered or the run had ended (StoreUnavailable)."""

    async def ask(
        self, run: RunSource, request: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """Hand ``request`` to the owner of another worker's ``run`` and wait (bounded) for
        its answer: the owner's :data:`Handler` reply; None when no owner heard it
        (StoreUnavailable, also when the owner did not answer in time)."""

    async def point(self, kind: str, key: str, run_id: str) -> None:
        """Keep ``key`` -> ``run_id`` (``kind``: one of :data:`POINTER_KINDS`)."""

    async def adopt(self, run_id: str) -> bool:
        """Whether this worker may resume the stored run ``run_id`` after a restart: no live
        worker owns it, and no other worker adopted it first (StoreUnavailable)."""

    async def pointed(self, kind: str, key: str) -> str | None:
        """The run ``key`` points to (None: none kept)."""


class MemoryRunStore:
    """The runs of this process only (the embedded default): nothing to find or cancel
    elsewhere; the pointers in memory, the newest ``keep`` of each kind."""

    shared = False

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._pointers: dict[str, OrderedDict[str, str]] = {k: OrderedDict() for k in POINTER_KINDS}

    async def open(
        self, runs: RunRegistry, handler: Handler | None = None, adopter: Adopter | None = None
    ) -> None:
        """Nothing to connect."""

    async def aclose(self) -> None:
        """Nothing to release."""

    def end_reads(self) -> None:
        """Nothing to end: every run read here is this process's."""

    async def created(self, run: RelayRun) -> None:
        """Nothing to record: the registry has it."""

    async def find(self, run_id: str, session: str) -> RunSource | None:
        """None: no other worker."""
        return None

    async def cancel(self, run: RunSource, reason: str | None = None) -> bool:
        """False: no other worker."""
        return False

    async def adopt(self, run_id: str) -> bool:
        """True: no other worker."""
        return True

    async def ask(
        self, run: RunSource, request: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """None: no other worker."""
        return None

    async def point(self, kind: str, key: str, run_id: str) -> None:
        """Keep it (the oldest of the kind forgotten past ``keep``)."""
        pointers = self._pointers[kind]
        pointers.pop(key, None)
        pointers[key] = run_id
        while len(pointers) > self._keep:
            pointers.popitem(last=False)

    async def pointed(self, kind: str, key: str) -> str | None:
        """The kept run id."""
        return self._pointers[kind].get(key)
