"""Session locks on Redis (needs the ``redis`` extra): :func:`redis_session_locks` for
``Dispatcher(session_locks=...)``, so that one session's tools never run at once across
hosts. The Redis ledger, history and audit are opened by URL (``toollatch.open_ledger
("redis://...")``, ``open_history``, ``open_audit``)."""

from ._lock import redis_session_locks

__all__ = ["redis_session_locks"]
