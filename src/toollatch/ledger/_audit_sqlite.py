"""The SQLite audit store: a table of its own, in the ledger's file or another (internal).

The ledger reads only ``toollatch_calls`` and the history only ``toollatch_history``; audit
records live in ``toollatch_audit`` and nothing but this class reads it. Each write is one
``BEGIN IMMEDIATE`` transaction that inserts, deletes the expired records and trims the
scopes written, with the set-up and the retries of the ledger itself (:mod:`._sqlite`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from ._audit import AuditRecord
from ._sqlite import SQLiteFile, _immediate

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
        self.path = Path(path)
        self._file = SQLiteFile(
            self.path,
            busy_timeout_s,
            create_folder,
            _SCHEMA,
            label="SQLite audit store",
            thread="toollatch-audit",
        )

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

        await self._file.call(run)

    async def records(self, scope: str, *, now: float) -> list[AuditRecord]:
        """See :meth:`AuditStore.records`."""

        def run(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT record FROM toollatch_audit WHERE scope = ? AND expires_at > ? ORDER BY id",
                (scope, now),
            )
            return [text for (text,) in rows]

        return [AuditRecord.from_json(text) for text in await self._file.call(run)]

    async def prune(self, now: float) -> int:
        """See :meth:`AuditStore.prune`."""

        def run(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                cursor = conn.execute("DELETE FROM toollatch_audit WHERE expires_at <= ?", (now,))
                return cursor.rowcount

        return await self._file.call(run)

    async def aclose(self) -> None:
        """Close the connection and its thread; the file stays."""
        await self._file.aclose()
