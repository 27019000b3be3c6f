"""Durable call ledgers: exactly-once tool calls across processes and hosts.

A :class:`Ledger` records, per call id and scope (run or session), who claimed a call, whether
its tool started, and its final result; the dispatcher claims a call before it runs it (see
``Dispatcher(ledger=...)``). A :class:`History` keeps a session's conversation for resume.
Apart from the calls, an opt-in :class:`ArgumentAudit` (an :class:`AuditStore` and an
:class:`AuditPolicy`) keeps a bounded, redacted, expiring record of each call that did not
commit; neither the ledger nor resume ever reads it.

Stores are built by URL only, with the openers in :mod:`toollatch`: ``open_ledger(url)``,
``open_history(url)`` and ``open_audit(url)`` for ``memory:``, ``sqlite:///PATH`` and
``redis://`` (the ``redis`` extra). Their classes (in-memory, SQLite, Redis) are internal;
this package holds the protocols they implement, the records they return, their errors, the
running call's :func:`current_call`, the :class:`Question` a call waiting for a person or a
client is (every built-in ledger is a :class:`QuestionStore`), the sessions' "always
allow" decisions (every built-in ledger is an :class:`AlwaysStore`), the errors of a refused
answer (:class:`ApprovalError` and its kinds, :class:`TooManyAlways`), the signed approval tokens
(:func:`approval_token`), and the URL helpers
(:func:`default_ledger_url`, :func:`sqlite_file`). :mod:`toollatch.ledger.redis` has the
Redis session locks.
"""

from ._always import AlwaysStore, TooManyAlways
from ._audit import ArgumentAudit, AuditPolicy, AuditRecord, AuditStore, audit_record
from ._base import Ledger
from ._context import CallContext, current_call
from ._history import History, HistoryConflict
from ._open import default_ledger_url, sqlite_file
from ._questions import (
    AlreadyAnswered,
    ApprovalError,
    Decision,
    EditRejected,
    NotAsked,
    OtherSession,
    Question,
    QuestionKind,
    QuestionStore,
    StaleArguments,
    WrongKind,
    approval_token,
    verify_approval_token,
)
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

__all__ = [
    "AlreadyAnswered",
    "AlwaysStore",
    "ApprovalError",
    "ArgumentAudit",
    "AuditPolicy",
    "AuditRecord",
    "AuditStore",
    "CallContext",
    "Claim",
    "Decision",
    "EditRejected",
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
    "NotAsked",
    "OtherSession",
    "Question",
    "QuestionKind",
    "QuestionStore",
    "SessionLocks",
    "StaleArguments",
    "TooManyAlways",
    "Won",
    "WrongKind",
    "approval_token",
    "audit_record",
    "current_call",
    "default_ledger_url",
    "digest_of",
    "sqlite_file",
    "verify_approval_token",
]
