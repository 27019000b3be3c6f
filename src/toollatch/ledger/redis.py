"""The Redis backends (needs the ``redis`` extra): :class:`RedisLedger`,
:class:`RedisHistory`, the per-session :class:`RedisSessionLock` and
:func:`redis_session_locks` for ``Dispatcher(session_locks=...)``, and :class:`RedisAudit`
(the opt-in audit of uncommitted calls)."""

from ._audit_redis import RedisAudit
from ._lock import RedisSessionLock, redis_session_locks
from ._redis import RedisHistory, RedisLedger

__all__ = ["RedisAudit", "RedisHistory", "RedisLedger", "RedisSessionLock", "redis_session_locks"]
