"""The SQLite ledger: one file, safe for several processes on one host (internal).

Each operation is one ``BEGIN IMMEDIATE`` transaction: it takes the database's write lock
before reading, so two processes claiming one call serialize and the second sees the first's
record (https://www.sqlite.org/lang_transaction.html). WAL mode lets readers run beside the
writer (https://www.sqlite.org/wal.html); WAL needs every process on the same host (shared
memory), which is why Redis is the backend for several hosts. ``synchronous=FULL`` makes each
commit durable across power loss, not only across a process crash. The blocking ``sqlite3``
calls run in one worker thread per ledger, which owns the connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..core._errors import ConfigError
from ._always import check_room
from ._base import RecordLedger, Step
from ._questions import Question, QuestionRules, QuestionStep, question_from_json, question_to_json
from ._records import LedgerError, LedgerKey, LedgerRecord, result_from_json, result_to_json

T = TypeVar("T")
_log = logging.getLogger("toollatch.ledger")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS toollatch_calls (
    scope TEXT NOT NULL, call_id TEXT NOT NULL, digest TEXT NOT NULL, state TEXT NOT NULL,
    worker TEXT NOT NULL, token INTEGER NOT NULL, claimed_at REAL NOT NULL,
    lease_until REAL NOT NULL, updated_at REAL NOT NULL, result TEXT,
    PRIMARY KEY (scope, call_id)
) WITHOUT ROWID
"""
_QUESTIONS = """
CREATE TABLE IF NOT EXISTS toollatch_questions (
    scope TEXT NOT NULL, call_id TEXT NOT NULL, asked_at REAL NOT NULL, answered_at REAL,
    data TEXT NOT NULL, PRIMARY KEY (scope, call_id)
) WITHOUT ROWID
"""
_ALWAYS = """
CREATE TABLE IF NOT EXISTS toollatch_always (
    scope TEXT NOT NULL, name TEXT NOT NULL, since REAL NOT NULL, PRIMARY KEY (scope, name)
) WITHOUT ROWID
"""
_COLUMNS = "digest, state, worker, token, claimed_at, lease_until, updated_at, result"
_UPSERT = f"INSERT OR REPLACE INTO toollatch_calls (scope, call_id, {_COLUMNS}) VALUES ({', '.join('?' * 10)})"  # noqa: E501


class SQLiteLedger(RecordLedger, QuestionRules):  # and an AlwaysStore
    """A :class:`Ledger` in the SQLite file at ``path`` (created with its table if absent).

    ``busy_timeout_s``: how long an operation waits for another process's write lock
    before it fails with ``LedgerError``. ``create_folder``: make missing parent folders
    when the file is first opened. Open it inside the event loop that uses it.
    """

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 10.0, create_folder: bool = False
    ) -> None:
        self.path = Path(path)
        self._file = SQLiteFile(
            self.path,
            busy_timeout_s,
            create_folder,
            (_SCHEMA, _QUESTIONS, _ALWAYS),
            label="SQLite ledger",
            thread="toollatch-ledger",
        )

    # -- the Ledger methods: RecordLedger's, over _apply ------------------------------------

    async def get(self, key: LedgerKey) -> LedgerRecord | None:
        """See :meth:`Ledger.get`."""
        return await self._file.call(lambda conn: _select(conn, key))

    async def purge(self, *, finished_before: float) -> int:
        """Delete final records last written before ``finished_before`` (Unix time), the
        questions answered before it and the "always allow" decisions made before it; the
        number of call records deleted. Retention is the caller's policy (a cron, a
        ``serve`` sweep)."""

        def run(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                cursor = conn.execute(
                    "DELETE FROM toollatch_calls WHERE state IN ('completed', 'failed') "
                    "AND updated_at < ?",
                    (finished_before,),
                )
                conn.execute(
                    "DELETE FROM toollatch_questions WHERE answered_at < ?", (finished_before,)
                )
                conn.execute("DELETE FROM toollatch_always WHERE since < ?", (finished_before,))
                return cursor.rowcount

        return await self._file.call(run)

    async def aclose(self) -> None:
        """Close the connection and its thread; the file stays."""
        await self._file.aclose()

    # -- questions (see ._questions) ---------------------------------------------------------

    async def question(self, key: LedgerKey) -> Question | None:
        """See :meth:`QuestionStore.question`."""
        return await self._file.call(lambda conn: _question(conn, key))

    async def questions(self, scope: str) -> list[Question]:
        """See :meth:`QuestionStore.questions`."""

        def run(conn: sqlite3.Connection) -> list[Question]:
            rows = conn.execute(
                "SELECT call_id, data FROM toollatch_questions WHERE scope = ? "
                "ORDER BY asked_at, call_id",
                (scope,),
            ).fetchall()
            return [question_from_json(LedgerKey(scope=scope, call_id=c), d) for c, d in rows]

        return await self._file.call(run)

    async def pending_questions(self, limit: int) -> list[Question]:
        """See :meth:`~._questions.PendingQuestions.pending_questions`."""

        def run(conn: sqlite3.Connection) -> list[Question]:
            rows = conn.execute(
                "SELECT scope, call_id, data FROM toollatch_questions WHERE answered_at IS NULL "
                "ORDER BY asked_at, scope, call_id LIMIT ?",
                (limit,),
            ).fetchall()
            return [question_from_json(LedgerKey(scope=s, call_id=c), d) for s, c, d in rows]

        return await self._file.call(run)

    async def _apply_question(self, key: LedgerKey, step: QuestionStep[T]) -> T:
        def run(conn: sqlite3.Connection) -> T:
            with _immediate(conn):
                outcome, new = step(_question(conn, key))
                if new is not None:
                    row = (key.scope, key.call_id, new.asked_at, new.answered_at)
                    conn.execute(
                        "INSERT OR REPLACE INTO toollatch_questions VALUES (?, ?, ?, ?, ?)",
                        (*row, question_to_json(new)),
                    )
                return outcome

        return await self._file.call(run)

    # -- "always allow" decisions (see ._always) ---------------------------------------------

    async def allow_always(self, scope: str, name: str, *, now: float, limit: int) -> bool:
        """See :meth:`~._always.AlwaysStore.allow_always` (one transaction: the count and
        the insert under the write lock)."""

        def run(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                where = (scope, name)
                held = "SELECT 1 FROM toollatch_always WHERE scope = ? AND name = ?"
                if conn.execute(held, where).fetchone() is not None:
                    return False
                count = "SELECT COUNT(*) FROM toollatch_always WHERE scope = ?"
                check_room(scope, conn.execute(count, (scope,)).fetchone()[0], limit)
                conn.execute("INSERT INTO toollatch_always VALUES (?, ?, ?)", (*where, now))
                return True

        return bool(await self._file.call(run))

    async def always_allowed(self, scope: str, name: str) -> bool:
        """See :meth:`~._always.AlwaysStore.always_allowed`."""
        held = "SELECT 1 FROM toollatch_always WHERE scope = ? AND name = ?"
        return await self._file.call(
            lambda conn: conn.execute(held, (scope, name)).fetchone() is not None
        )

    async def always(self, scope: str) -> list[str]:
        """See :meth:`~._always.AlwaysStore.always`."""
        names = "SELECT name FROM toollatch_always WHERE scope = ? ORDER BY since, name"
        rows = await self._file.call(lambda conn: conn.execute(names, (scope,)).fetchall())
        return [str(name) for (name,) in rows]

    async def revoke_always(self, scope: str, name: str) -> bool:
        """See :meth:`~._always.AlwaysStore.revoke_always`."""

        def run(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                gone = "DELETE FROM toollatch_always WHERE scope = ? AND name = ?"
                return conn.execute(gone, (scope, name)).rowcount > 0

        return bool(await self._file.call(run))

    # -- plumbing ----------------------------------------------------------------------------

    async def _apply(self, key: LedgerKey, step: Step[T]) -> T:
        """Read ``key``'s record, apply ``step``, write its new record: one transaction, in
        one hop to the worker thread."""

        def run(conn: sqlite3.Connection) -> T:
            with _immediate(conn):
                outcome, new = step(_select(conn, key))
                if new is not None:
                    conn.execute(_UPSERT, _row(new))
                return outcome

        return await self._file.call(run)


def _retrying(
    conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], deadline: float
) -> T:
    """``fn(conn)`` (one transaction), again after a "database is locked" that SQLite answered
    without waiting (in WAL mode it may, e.g. while another process recovers or checkpoints the
    file; seen with racing workers) until ``deadline``. Safe: the failed transaction was rolled
    back, so nothing of it was written."""
    pause = 0.005
    while True:
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
            if conn.in_transaction:  # (a COMMIT that answered busy: it wrote nothing)
                conn.execute("ROLLBACK")
        time.sleep(pause * (0.5 + random.random()))  # (jitter: see setup_statement)
        pause = min(pause * 2, 0.2)


def _connect(path: Path, busy_ms: int, schema: tuple[str, ...] = (_SCHEMA,)) -> sqlite3.Connection:
    """A connection to ``path`` in WAL mode with ``schema`` (its tables) created; a new file
    is created private first (:func:`create_private`)."""
    create_private(path)
    # isolation_level=None: transactions are the explicit BEGIN IMMEDIATE of _immediate.
    conn = sqlite3.connect(path, timeout=busy_ms / 1000, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
    deadline = time.monotonic() + busy_ms / 1000
    for statement in ("PRAGMA journal_mode = WAL", "PRAGMA synchronous = FULL", *schema):
        setup_statement(conn, statement, deadline)
    return conn


PRIVATE_MODE = 0o600
"""The mode of a SQLite file toollatch creates: it holds tool arguments (the run history)
and results, which are the user's data and may hold secrets."""
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 when nothing is there, before SQLite opens it.

    Why this way: SQLite creates a missing file with 0644 minus the umask (usually
    world-readable), and gives its ``-wal`` and ``-shm`` files the mode of the database
    file (os_unix.c ``findCreateFileMode``, and ``unixOpenSharedMemory`` for ``-shm``), so
    a database created private keeps all three private. ``O_CREAT | O_EXCL`` creates it or
    fails when anything (a file, a link, a device) is there, which is then left as it is:
    no check-then-create window, and no other file's mode is changed. The ``fchmod`` makes
    the mode independent of the umask (0600 minus a umask of 0o200 would be 0400, a file
    SQLite could not write), and is never broader than 0600 in between. A file that exists
    keeps its mode (the user's choice), with a warning when others may read it. A path that
    cannot be created here (a missing folder) is left to SQLite to report."""
    if str(path) == ":memory:" or str(path).startswith("file:"):
        return
    try:
        fd = os.open(path, _CREATE, PRIVATE_MODE)
    except FileExistsError:
        _warn_if_shared(path)
        return
    except OSError:
        return  # (SQLite's open reports it, as it would have)
    try:
        os.fchmod(fd, PRIVATE_MODE)
    finally:
        os.close(fd)


def _warn_if_shared(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) and mode & 0o077:
        _log.warning(
            "SQLite file %s is readable by others (mode %o): it holds tool arguments and "
            "results; chmod 600 it (and its -wal and -shm files)",
            path, stat.S_IMODE(mode),
        )  # fmt: skip


def setup_statement(conn: sqlite3.Connection, statement: str, deadline: float) -> None:
    """Run a set-up statement, retrying a "database is locked" until ``deadline``.

    Why: on a file not yet in WAL mode (a brand-new one), ``PRAGMA journal_mode = WAL``
    writes the header's version bytes in ``sqlite3BtreeSetVersion``, which opens a *read*
    transaction and then upgrades it to an exclusive write. SQLite never calls the busy
    handler for such an upgrade (it could deadlock: two readers each waiting for the other
    to let go, https://www.sqlite.org/c3ref/busy_handler.html; the btree retries only with
    no transaction open), so while another process opens the same new file the switch
    answers SQLITE_BUSY at once, ``busy_timeout`` or not: 6 of 40 races of 4 processes,
    measured. Retrying is the remedy SQLite leaves: each collision has a winner (the one
    holding RESERVED waits for EXCLUSIVE with the busy handler), and once the header says
    WAL the statement writes nothing, so the losers' retry succeeds. The pause is jittered
    so that processes started together do not retry in step."""
    pause = 0.002
    while True:
        try:
            conn.execute(statement)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause * (0.5 + random.random()))  # (jitter: see setup_statement)
        pause = min(pause * 2, 0.1)


class _immediate:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` when the body raises."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _question(conn: sqlite3.Connection, key: LedgerKey) -> Question | None:
    row = conn.execute(
        "SELECT data FROM toollatch_questions WHERE scope = ? AND call_id = ?",
        (key.scope, key.call_id),
    ).fetchone()
    return None if row is None else question_from_json(key, row[0])


def _select(conn: sqlite3.Connection, key: LedgerKey) -> LedgerRecord | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM toollatch_calls WHERE scope = ? AND call_id = ?",
        (key.scope, key.call_id),
    ).fetchone()
    if row is None:
        return None
    digest, state, worker, token, claimed_at, lease_until, updated_at, result = row
    if state not in ("claimed", "started", "completed", "failed"):
        raise LedgerError(f"call {key.call_id!r} has an unknown state {state!r}")
    return LedgerRecord(
        key=key, digest=digest, state=state, worker=worker, token=int(token),
        claimed_at=claimed_at, lease_until=lease_until, updated_at=updated_at,
        result=result_from_json(result) if result is not None else None,
    )  # fmt: skip


def _row(r: LedgerRecord) -> tuple[Any, ...]:
    result = result_to_json(r.result) if r.result is not None else None
    return (
        r.key.scope, r.key.call_id, r.digest, r.state, r.worker, r.token,
        r.claimed_at, r.lease_until, r.updated_at, result,
    )  # fmt: skip


class SQLiteFile:
    """One SQLite connection to ``path`` owned by one worker thread: opened on first use in
    WAL mode with ``schema`` created (and the missing folders when ``create_folder``), each
    :meth:`call` retried as :func:`_retrying` says; sqlite3 and OS errors are raised as
    ``LedgerError`` naming ``label`` (what the file holds, e.g. "SQLite ledger"); ``thread``
    names the worker thread."""

    def __init__(
        self,
        path: Path,
        busy_timeout_s: float,
        create_folder: bool,
        schema: tuple[str, ...],
        *,
        label: str,
        thread: str,
    ) -> None:
        if not isinstance(busy_timeout_s, int | float) or not 0 < busy_timeout_s <= 3600:
            raise ConfigError(f"busy_timeout_s must be in (0, 3600], got {busy_timeout_s!r}")
        self.path = path
        self._busy_ms = int(busy_timeout_s * 1000)
        self._create_folder = create_folder
        self._schema = schema
        self._label = label
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread)
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` in the worker thread (``LedgerError`` once closed)."""
        if self._closed:
            raise LedgerError(f"the {self._label} {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_connection, fn)

    async def aclose(self) -> None:
        """Close the connection and its thread (again: nothing); the file stays."""
        if self._closed:
            return
        self._closed = True

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=False)

    def _with_connection(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if self._conn is None:
                if self._create_folder:
                    # (the last folder private: it holds the ledger and its history)
                    self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._conn = _connect(self.path, self._busy_ms, self._schema)
            return _retrying(self._conn, fn, time.monotonic() + self._busy_ms / 1000)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"{self._label} {self.path}: {exc}") from exc
