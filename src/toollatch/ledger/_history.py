"""Stored run histories, for resuming a run by id in another process (internal).

A run's history is the append-only list of its canonical messages (what the agent loop sends
the model: user, assistant and tool-result messages as JSON objects), never stream deltas or
half-assembled arguments. :meth:`History.append` takes the length the writer believes the
history has (``at``) and refuses with :class:`HistoryConflict` when another writer appended
first, so two processes resuming one run cannot interleave it. Resume: ``load`` the history,
rebuild the last round's calls from its last assistant message, and dispatch them again
with the same session and a ledger: completed calls return their stored results, and the
ledger's rules decide the others.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..core._errors import UsageError
from ._records import LedgerError
from ._sqlite import _connect


class HistoryConflict(LedgerError):
    """Another writer appended to the run's history first (its length is not ``at``)."""


@runtime_checkable
class History(Protocol):
    """Append-only canonical message lists by run id."""

    async def append(self, run: str, messages: Sequence[dict[str, Any]], *, at: int) -> int:
        """Append ``messages`` to ``run``'s history, which must have ``at`` messages
        (else :class:`HistoryConflict`); returns the new length."""
        ...

    async def load(self, run: str) -> list[dict[str, Any]]:
        """``run``'s messages in order (empty for an unknown run)."""
        ...

    async def aclose(self) -> None:
        """Release connections; the histories stay."""
        ...


def _encoded(run: str, messages: Sequence[dict[str, Any]], at: int) -> list[str]:
    if not isinstance(run, str) or not run:
        raise UsageError(f"run must be a non-empty str, got {run!r:.60}")
    if not isinstance(at, int) or isinstance(at, bool) or at < 0:
        raise UsageError(f"at must be a length (int >= 0), got {at!r}")
    if not all(isinstance(m, dict) for m in messages):
        raise UsageError("history messages must be JSON objects (dicts)")
    try:
        return [json.dumps(m, separators=(",", ":"), allow_nan=False) for m in messages]
    except (TypeError, ValueError) as exc:
        raise UsageError(f"a history message is not JSON: {exc}") from exc


class MemoryHistory:
    """A :class:`History` in a dict (one process)."""

    in_process: ClassVar[bool] = True
    """No other process reads it: a run keeps no record for a survivor here (see
    :mod:`toollatch.runtime._resume`)."""

    def __init__(self) -> None:
        self._runs: dict[str, list[str]] = {}

    async def append(self, run: str, messages: Sequence[dict[str, Any]], *, at: int) -> int:
        """See :meth:`History.append`."""
        encoded = _encoded(run, messages, at)
        stored = self._runs.setdefault(run, [])
        if len(stored) != at:
            raise HistoryConflict(f"run {run!r} has {len(stored)} messages, not {at}")
        stored.extend(encoded)
        return len(stored)

    async def load(self, run: str) -> list[dict[str, Any]]:
        """See :meth:`History.load`."""
        return [json.loads(m) for m in self._runs.get(run, [])]

    async def delete(self, run: str, *, at: int) -> None:
        """Forget ``run``'s history, which must have ``at`` messages (else
        :class:`HistoryConflict`: another writer appended meanwhile). Not part of the
        :class:`History` protocol: every built-in store has it."""
        held = len(self._runs.get(run, []))
        if held != at:
            raise HistoryConflict(f"run {run!r} has {held} messages, not {at}")
        self._runs.pop(run, None)

    async def aclose(self) -> None:
        """Nothing to release."""


_TABLE = (
    "CREATE TABLE IF NOT EXISTS toollatch_history (run TEXT NOT NULL, "
    "seq INTEGER NOT NULL, message TEXT NOT NULL, PRIMARY KEY (run, seq)) WITHOUT ROWID"
)


class SQLiteHistory:
    """A :class:`History` in a SQLite file (may be the ledger's own file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toollatch-hist")
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = _connect(self.path, 10_000, (_TABLE,))  # (WAL, as the ledger's)
        return self._conn

    def _at(self, run: str, at: int, change: Callable[[sqlite3.Connection], object]) -> None:
        """``change(conn)`` in one transaction, if ``run`` has ``at`` messages (else
        :class:`HistoryConflict` and nothing changes)."""
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            (length,) = conn.execute(
                "SELECT COUNT(*) FROM toollatch_history WHERE run = ?", (run,)
            ).fetchone()
            if length != at:
                raise HistoryConflict(f"run {run!r} has {length} messages, not {at}")
            change(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _append(self, run: str, encoded: list[str], at: int) -> int:
        self._at(
            run, at, lambda conn: conn.executemany(
                "INSERT INTO toollatch_history (run, seq, message) VALUES (?, ?, ?)",
                [(run, at + i, m) for i, m in enumerate(encoded)],
            ),
        )  # fmt: skip
        return at + len(encoded)

    def _delete(self, run: str, at: int) -> None:
        self._at(
            run,
            at,
            lambda conn: conn.execute("DELETE FROM toollatch_history WHERE run = ?", (run,)),
        )

    def _load(self, run: str) -> list[dict[str, Any]]:
        rows = self._db().execute(
            "SELECT message FROM toollatch_history WHERE run = ? ORDER BY seq", (run,)
        )
        return [json.loads(m) for (m,) in rows]

    async def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:
            raise LedgerError(f"SQLite history {self.path}: {exc}") from exc

    async def append(self, run: str, messages: Sequence[dict[str, Any]], *, at: int) -> int:
        """See :meth:`History.append`."""
        encoded = _encoded(run, messages, at)
        return int(await self._call(self._append, run, encoded, at))

    async def load(self, run: str) -> list[dict[str, Any]]:
        """See :meth:`History.load`."""
        loaded: list[dict[str, Any]] = await self._call(self._load, run)
        return loaded

    async def delete(self, run: str, *, at: int) -> None:
        """See :meth:`MemoryHistory.delete`."""
        await self._call(self._delete, run, at)

    async def aclose(self) -> None:
        """Close the connection and its thread."""
        if self._conn is not None:
            await self._call(self._conn.close)
            self._conn = None
        self._executor.shutdown(wait=False)
