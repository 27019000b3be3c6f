"""The :class:`Ledger` protocol, the backends' shared rules and the in-memory backend
(internal).

:class:`RecordLedger` is every Ledger method written once over one storage primitive,
``_apply``: read a call's record, apply a pure rule of :mod:`._records` to it, write what
the rule returns, all in one atomic step. A backend that can do that (a dict under one event
loop, a SQLite transaction) only stores; the rules (what a claim returns for each prior
state, the fencing of every write) are nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

from ..core._round import ToolResult
from ._always import MemoryAlways
from ._questions import Question, QuestionRules, QuestionStep
from ._records import (
    Claim,
    LedgerKey,
    LedgerRecord,
    check_lease,
    decide_claim,
    decide_unknown,
    fenced,
    finished,
    lease_live,
    released,
    renewed,
    started,
)

T = TypeVar("T")
Step = Callable[["LedgerRecord | None"], "tuple[T, LedgerRecord | None]"]
"""A rule applied in one atomic step: the record read (None: none) to the step's outcome and
the record to write (None: write nothing)."""


@runtime_checkable
class Ledger(Protocol):
    """A durable record of calls by :class:`LedgerKey`, shared by every worker that opens it.

    Times are wall-clock seconds (Unix time) passed in by the caller, so tests can drive
    them; every method is atomic with respect to every other worker of the same ledger.
    Backend failures raise :class:`LedgerError`; a write whose token is no longer the
    call's raises :class:`LeaseLost` and changes nothing.
    """

    async def claim(
        self,
        key: LedgerKey,
        *,
        digest: str,
        worker: str,
        now: float,
        lease_s: float,
        rerun_started: bool = False,
        start: bool = False,
    ) -> Claim:
        """Claim ``key`` for ``worker``: :class:`Won` when there was no record or a stale
        ``claimed`` one (or a stale ``started`` one and ``rerun_started``), else
        :class:`Found` with the record unchanged (compare its ``digest``). ``start``: a won
        claim is recorded ``started`` at once, as :meth:`start` would (one write for both,
        for a caller that runs the tool right away)."""
        ...

    async def start(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """Mark the claimed call ``started`` (the tool is about to run); renews the lease."""
        ...

    async def renew(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """Extend the lease of a claimed or started call to ``now + lease_s``."""
        ...

    async def finish(self, key: LedgerKey, token: int, result: ToolResult, *, now: float) -> None:
        """Store the final result: ``failed`` when ``result.is_error``, else ``completed``."""
        ...

    async def release(self, key: LedgerKey, token: int) -> None:
        """Give back a call this worker holds: its lease ends now, so the next claim takes
        it over (a ``started`` one only with ``rerun_started``); no-op when not ours."""
        ...

    async def settle_unknown(
        self, key: LedgerKey, token: int, result: ToolResult, *, now: float
    ) -> LedgerRecord:
        """Finish a *stale* record holding ``token`` as ``failed`` with ``result`` (the
        "outcome unknown" verdict) and return it; when the record changed meanwhile (it
        holds another token, finished, or its lease was renewed) return it unchanged."""
        ...

    async def get(self, key: LedgerKey) -> LedgerRecord | None:
        """The record of ``key``, or None."""
        ...

    async def aclose(self) -> None:
        """Release connections; the stored records stay."""
        ...


class RecordLedger:
    """The :class:`Ledger` methods over ``_apply`` (see the module docstring): a subclass
    provides ``_apply(key, step)``, which runs ``step`` on ``key``'s record atomically and
    writes the record it returns, and ``get`` / ``aclose``."""

    async def _apply(self, key: LedgerKey, step: Step[T]) -> T:
        raise NotImplementedError  # pragma: no cover - every backend has its own

    async def claim(
        self,
        key: LedgerKey,
        *,
        digest: str,
        worker: str,
        now: float,
        lease_s: float,
        rerun_started: bool = False,
        start: bool = False,
    ) -> Claim:
        """See :meth:`Ledger.claim`."""
        check_lease(lease_s)

        def step(record: LedgerRecord | None) -> tuple[Claim, LedgerRecord | None]:
            live = record is not None and lease_live(record, now)
            return decide_claim(
                record, key, live=live, digest=digest, worker=worker, now=now,
                lease_s=lease_s, rerun_started=rerun_started, start=start,
            )  # fmt: skip

        return await self._apply(key, step)

    async def start(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """See :meth:`Ledger.start`."""
        check_lease(lease_s)
        await self._apply(
            key, lambda r: (None, started(fenced(r, key, token), now=now, lease_s=lease_s))
        )

    async def renew(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """See :meth:`Ledger.renew`."""
        check_lease(lease_s)
        await self._apply(
            key, lambda r: (None, renewed(fenced(r, key, token), now=now, lease_s=lease_s))
        )

    async def finish(self, key: LedgerKey, token: int, result: ToolResult, *, now: float) -> None:
        """See :meth:`Ledger.finish`."""
        await self._apply(key, lambda r: (None, finished(fenced(r, key, token), result, now=now)))

    async def release(self, key: LedgerKey, token: int) -> None:
        """See :meth:`Ledger.release`."""
        await self._apply(key, lambda r: (None, released(r, token)))

    async def settle_unknown(
        self, key: LedgerKey, token: int, result: ToolResult, *, now: float
    ) -> LedgerRecord:
        """See :meth:`Ledger.settle_unknown`."""

        def step(record: LedgerRecord | None) -> tuple[LedgerRecord, LedgerRecord | None]:
            after, changed = decide_unknown(record, key, token, result, now=now)
            return after, after if changed else None

        return await self._apply(key, step)


class MemoryLedger(RecordLedger, QuestionRules, MemoryAlways):
    """A :class:`Ledger` (and a :class:`~._questions.QuestionStore` and an
    :class:`~._always.AlwaysStore`) in dicts: one process, one event loop (for tests and
    single-shot runs). Every method runs to completion without awaiting, so each is atomic."""

    def __init__(self) -> None:
        MemoryAlways.__init__(self)
        self._records: dict[LedgerKey, LedgerRecord] = {}
        self._questions: dict[LedgerKey, Question] = {}

    async def _apply_question(self, key: LedgerKey, step: QuestionStep[T]) -> T:
        return _stepped(self._questions, key, step)

    async def question(self, key: LedgerKey) -> Question | None:
        """See :meth:`QuestionStore.question`."""
        return self._questions.get(key)

    async def questions(self, scope: str) -> list[Question]:
        """See :meth:`QuestionStore.questions`."""
        found = [q for k, q in self._questions.items() if k.scope == scope]
        return sorted(found, key=lambda q: q.asked_at)

    async def pending_questions(self, limit: int) -> list[Question]:
        """See :meth:`~._questions.PendingQuestions.pending_questions`."""
        found = [q for q in self._questions.values() if q.pending]
        return sorted(found, key=lambda q: (q.asked_at, q.key.scope, q.key.call_id))[:limit]

    async def _apply(self, key: LedgerKey, step: Step[T]) -> T:
        return _stepped(self._records, key, step)

    async def get(self, key: LedgerKey) -> LedgerRecord | None:
        """See :meth:`Ledger.get`."""
        return self._records.get(key)

    async def aclose(self) -> None:
        """Nothing to release."""


V = TypeVar("V")


def _stepped(
    table: dict[LedgerKey, V], key: LedgerKey, step: Callable[[V | None], tuple[T, V | None]]
) -> T:
    """Apply ``step`` to ``key``'s entry of ``table`` and write what it returns (no await
    in between: atomic under one event loop)."""
    outcome, new = step(table.get(key))
    if new is not None:
        table[key] = new
    return outcome
