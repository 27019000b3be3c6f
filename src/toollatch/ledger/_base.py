"""The :class:`Ledger` protocol and the in-memory backend (internal)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._round import ToolResult
from ._records import (
    Claim,
    LedgerKey,
    LedgerRecord,
    check_lease,
    decide_claim,
    decide_unknown,
    fenced,
    finished,
    released,
    renewed,
    started,
)


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
    ) -> Claim:
        """Claim ``key`` for ``worker``: :class:`Won` when there was no record or a stale
        ``claimed`` one (or a stale ``started`` one and ``rerun_started``), else
        :class:`Found` with the record unchanged (compare its ``digest``)."""
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


class MemoryLedger:
    """A :class:`Ledger` in a dict: one process, one event loop (for tests and single-shot
    runs). Every method runs to completion without awaiting, so each is atomic."""

    def __init__(self) -> None:
        self._records: dict[LedgerKey, LedgerRecord] = {}

    async def claim(
        self,
        key: LedgerKey,
        *,
        digest: str,
        worker: str,
        now: float,
        lease_s: float,
        rerun_started: bool = False,
    ) -> Claim:
        """See :meth:`Ledger.claim`."""
        check_lease(lease_s)
        outcome, new = decide_claim(
            self._records.get(key), key, digest=digest, worker=worker, now=now,
            lease_s=lease_s, rerun_started=rerun_started,
        )  # fmt: skip
        if new is not None:
            self._records[key] = new
        return outcome

    async def start(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """See :meth:`Ledger.start`."""
        check_lease(lease_s)
        record = fenced(self._records.get(key), key, token)
        self._records[key] = started(record, now=now, lease_s=lease_s)

    async def renew(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """See :meth:`Ledger.renew`."""
        check_lease(lease_s)
        record = fenced(self._records.get(key), key, token)
        self._records[key] = renewed(record, now=now, lease_s=lease_s)

    async def finish(self, key: LedgerKey, token: int, result: ToolResult, *, now: float) -> None:
        """See :meth:`Ledger.finish`."""
        record = fenced(self._records.get(key), key, token)
        self._records[key] = finished(record, result, now=now)

    async def release(self, key: LedgerKey, token: int) -> None:
        """See :meth:`Ledger.release`."""
        if (record := released(self._records.get(key), token)) is not None:
            self._records[key] = record

    async def settle_unknown(
        self, key: LedgerKey, token: int, result: ToolResult, *, now: float
    ) -> LedgerRecord:
        """See :meth:`Ledger.settle_unknown`."""
        record, changed = decide_unknown(self._records.get(key), key, token, result, now=now)
        if changed:
            self._records[key] = record
        return record

    async def get(self, key: LedgerKey) -> LedgerRecord | None:
        """See :meth:`Ledger.get`."""
        return self._records.get(key)

    async def aclose(self) -> None:
        """Nothing to release."""
