"""Durable call ledgers: exactly-once tool calls across processes and hosts.

A :class:`Ledger` records, per call id and scope (run or session), who claimed a call, whether
its tool started, and its final result; the dispatcher claims a call before it runs it (see
``Dispatcher(ledger=...)``). Backends: :class:`MemoryLedger` (one process),
:class:`SQLiteLedger` (one host, several processes) and ``RedisLedger`` (several hosts;
``toollatch.ledger.redis``, needs the ``redis`` extra). :func:`open_ledger` opens one by URL.

Apart from the calls, an opt-in :class:`ArgumentAudit` keeps a bounded, redacted, expiring
record of each call that did not commit (:class:`MemoryAudit`, :class:`SQLiteAudit`,
``RedisAudit``; :func:`open_audit` by URL); neither the ledger nor resume ever reads it.
"""

from ._audit import ArgumentAudit, AuditPolicy, AuditRecord, AuditStore, MemoryAudit, audit_record
from ._audit_sqlite import SQLiteAudit
from ._base import Ledger, MemoryLedger
from ._context import CallContext, current_call
from ._history import History, HistoryConflict, MemoryHistory, SQLiteHistory
from ._open import default_ledger_url, open_audit, open_history, open_ledger, sqlite_file
from ._records import (
    Claim,
    Found,
    LeaseLost,
    LedgerError,
    LedgerKey,
    LedgerRecord,
    LedgerState,
    LockBusy,
    LockLost,
    SessionLocks,
    Won,
    digest_of,
)
from ._sqlite import SQLiteLedger

__all__ = [
    "ArgumentAudit",
    "AuditPolicy",
    "AuditRecord",
    "AuditStore",
    "CallContext",
    "Claim",
    "Found",
    "History",
    "HistoryConflict",
    "LeaseLost",
    "Ledger",
    "LedgerError",
    "LedgerKey",
    "LedgerRecord",
    "LedgerState",
    "LockBusy",
    "LockLost",
    "MemoryAudit",
    "MemoryHistory",
    "MemoryLedger",
    "SQLiteAudit",
    "SQLiteHistory",
    "SQLiteLedger",
    "SessionLocks",
    "Won",
    "audit_record",
    "current_call",
    "default_ledger_url",
    "digest_of",
    "open_audit",
    "open_history",
    "open_ledger",
    "sqlite_file",
]
