"""The SQLite audit store: a table of its own, in the ledger's file or another (internal).

The ledger reads only ``toollatch_calls`` and the history only ``toollatch_history``; audit
records live in ``toollatch_audit`` and nothing but this class reads it. Each write is one
``BEGIN IMMEDIATE`` transaction that inserts, deletes the expired records and trims the
scopes written, with the set-up and the retries of the ledger itself (:mod:`._sqlite`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .._errors import ConfigError
from ._audit import AuditRecord
from ._records import LedgerError
from ._sqlite import _connect, _immediate, _retrying

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS toollatch_audit (id INTEGER PRIMARY KEY, "
    "scope TEXT NOT NULL, expires_at REAL NOT NULL, record TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS toollatch_audit_scope ON toollatch_audit (scope, id)",
    "CREATE INDEX IF NOT EXISTS toollatch_audit_expiry ON toollatch_audit (expires_at)",
)
_TRIM = (
    "DELETE FROM toollatch_audit WHERE scope = ? AND id <= (SELECT id FROM toollatch_audit "
    "WHERE scope = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"
)


class SQLiteAudit:
    """An :class:`AuditStore` in the SQLite file at ``path`` (may be the ledger's file).
    ``busy_timeout_s`` and ``create_folder`` as for :class:`SQLiteLedger`."""

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 10.0, create_folder: bool = False
    ) -> None:
        if not isinstance(busy_timeout_s, int | float) or not 0 < busy_timeout_s <= 3600:
            raise ConfigError(f"busy_timeout_s must be in (0, 3600], got {busy_timeout_s!r}")
        self.path = Path(path)
        self._busy_ms = int(busy_timeout_s * 1000)
        self._create_folder = create_folder
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toollatch-audit")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def add(self, records: Sequence[AuditRecord], *, max_per_scope: int) -> None:
        """See :meth:`AuditStore.add`."""
        if not records:
            return
        now = max(r.recorded_at for r in records)
        rows = [(r.scope, r.expires_at, r.to_json()) for r in records]

        def run(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.executemany(
                    "INSERT INTO toollatch_audit (scope, expires_at, record) VALUES (?, ?, ?)",
                    rows,
                )
                conn.execute("DELETE FROM toollatch_audit WHERE expires_at <= ?", (now,))
                for scope in {r.scope for r in records}:
                    conn.execute(_TRIM, (scope, scope, max_per_scope))

        await self._call(run)

    async def records(self, scope: str, *, now: float) -> list[AuditRecord]:
        """See :meth:`AuditStore.records`."""

        def run(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT record FROM toollatch_audit WHERE scope = ? AND expires_at > ? ORDER BY id",
                (scope, now),
            )
            return [text for (text,) in rows]

        return [AuditRecord.from_json(text) for text in await self._call(run)]

    async def prune(self, now: float) -> int:
        """See :meth:`AuditStore.prune`."""

        def run(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                cursor = conn.execute("DELETE FROM toollatch_audit WHERE expires_at <= ?", (now,))
                return cursor.rowcount

        return await self._call(run)

    async def aclose(self) -> None:
        """Close the connection and its thread; the file stays."""
        if self._closed:
            return
        self._closed = True

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=False)

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise LedgerError(f"the SQLite audit store {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_connection, fn)

    def _with_connection(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if self._conn is None:
                if self._create_folder:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = _connect(self.path, self._busy_ms, _SCHEMA)
            return _retrying(self._conn, fn, time.monotonic() + self._busy_ms / 1000)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"SQLite audit store {self.path}: {exc}") from exc
