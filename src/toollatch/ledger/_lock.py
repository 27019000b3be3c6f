"""A distributed per-session lock on Redis, with lease renewal (internal; needs ``redis``).

The lock is a key holding the holder's unique value with a server-side expiry
(``SET key value NX PX``, https://redis.io/docs/latest/commands/set/); renewal and release
are Lua scripts that act only while the key still holds that value, so a holder never extends
or deletes a lock another worker took after its lease ran out. Each acquisition also takes a
*fencing token* (``INCR``), larger than any earlier holder's, for writes a holder wants to
fence downstream. When renewal finds the lock gone (expired during a pause, deleted, taken)
or cannot reach Redis until the lease has run out, the body of ``async with`` is cancelled
and :class:`LockLost` is raised from it: the holder learns it no longer excludes anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from ..core._errors import ConfigError, UsageError
from ._records import LedgerError, LockBusy, LockLost, SessionLocks

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisSessionLock:
    """``async with RedisSessionLock(client, "s1"):`` — two holders never overlap.

    ``lease_s``: the lock's expiry, renewed every third of it while held; ``wait_s``: how
    long ``__aenter__`` waits for another holder before :class:`LockBusy` (``LedgerError``
    when Redis cannot be reached); ``poll_s``: the retry interval while waiting.
    ``on_lost``: called with the reason when the lock is lost, instead of cancelling the
    task that entered it (the dispatcher cancels its running calls); either way
    ``__aexit__`` raises :class:`LockLost`. One instance is entered once at a time.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        session: str,
        *,
        lease_s: float = 10.0,
        wait_s: float = 30.0,
        poll_s: float = 0.05,
        prefix: str = "toollatch:",
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        for what, value in (("lease_s", lease_s), ("wait_s", wait_s), ("poll_s", poll_s)):
            if not isinstance(value, int | float) or not 0 < value < 1e6:
                raise ConfigError(f"{what} must be a positive number of seconds, got {value!r}")
        if not isinstance(session, str) or not session:
            raise UsageError(f"session must be a non-empty str, got {session!r:.60}")
        self._r = client
        self._key = f"{prefix}lock:{{{session}}}"
        self._lease_ms = max(1, int(lease_s * 1000))
        self.lease_s, self.wait_s, self.poll_s = lease_s, wait_s, poll_s
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._value: str | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._lost: str | None = None
        self._on_lost = on_lost
        self.token: int | None = None
        """The fencing token of the current hold (None when not held)."""

    async def __aenter__(self) -> RedisSessionLock:
        if self._value is not None:
            raise UsageError("this RedisSessionLock is already held")
        value = secrets.token_hex(16)
        deadline = time.monotonic() + self.wait_s
        try:
            while not await self._r.set(self._key, value, nx=True, px=self._lease_ms):
                if time.monotonic() >= deadline:
                    raise LockBusy(f"session lock {self._key!r} busy for {self.wait_s:g} s")
                await asyncio.sleep(self.poll_s)
            self.token = int(await self._r.incr(self._key + ":fence"))
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"session lock: {type(exc).__name__}: {exc}") from exc
        self._value, self._lost = value, None
        owner = asyncio.current_task()
        assert owner is not None  # __aenter__ always runs in a task
        self._renewer = asyncio.create_task(self._keep(owner, value), name="toollatch:lock")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        value, self._value, self.token = self._value, None, None
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        if self._lost is not None:
            task = asyncio.current_task()
            if self._on_lost is None and exc_type is asyncio.CancelledError and task:
                task.uncancel()  # our own cancel (see _keep), turned into LockLost
            raise LockLost(self._lost) from exc
        # A failed release is harmless: the key expires by itself within lease_s.
        with contextlib.suppress(redis.exceptions.RedisError):
            await self._release(keys=[self._key], args=[value or ""])

    async def _keep(self, owner: asyncio.Task[object], value: str) -> None:
        """Renew every third of the lease; on loss, cancel the holder's task. A hold over
        (released) ends it too, its cancel lost or not: a renewal whose cancel was swallowed
        (redis-py's commands under Python 3.11's ``asyncio.wait_for``, python/cpython#86296)
        then finds the key gone, which is no loss to tell its former holder of."""
        expires = time.monotonic() + self.lease_s
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self._value != value:
                return
            try:
                renewed = await self._renew(keys=[self._key], args=[value, self._lease_ms])
            except redis.exceptions.RedisError as exc:
                if time.monotonic() < expires:
                    continue  # the lease still runs: try again at the next beat
                reason = f"could not renew it before its lease ran out ({exc})"
            else:
                if renewed:
                    expires = time.monotonic() + self.lease_s
                    continue
                reason = "it expired or another worker took it"
            if self._value != value:
                return  # (released meanwhile)
            self._lost = f"lost the session lock {self._key!r}: {reason}"
            if self._on_lost is not None:
                self._on_lost(self._lost)
            else:
                owner.cancel()
            return


def redis_session_locks(client: aioredis.Redis, **options: Any) -> SessionLocks:
    """A :data:`SessionLocks` of :class:`RedisSessionLock` on ``client`` with ``options``
    (``lease_s``, ``wait_s``, ``poll_s``, ``prefix``), for ``Dispatcher(session_locks=...)``."""
    RedisSessionLock(client, "check", **options)  # bad options fail here, not at a call

    def make(session: str, on_lost: Callable[[str], None]) -> RedisSessionLock:
        return RedisSessionLock(client, session, on_lost=on_lost, **options)

    return make
