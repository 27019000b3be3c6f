"""The Redis backends (needs the ``redis`` extra): :class:`RedisLedger`, the per-session
:class:`RedisSessionLock` and :func:`redis_session_locks` for ``Dispatcher(session_locks=)``."""

from ._lock import RedisSessionLock, redis_session_locks
from ._redis import RedisLedger

__all__ = ["RedisLedger", "RedisSessionLock", "redis_session_locks"]
