"""The Redis audit store: keys of their own (internal; needs the ``redis`` package).

Per scope, a sorted set ``<prefix>audit:{<scope>}`` of records (JSON) scored by their expiry,
written by one Lua script that drops the expired members, adds the new ones, trims the set to
its newest ``max_per_scope`` and lets the key itself expire with its newest record (a
server-side backstop: a scope never written again still goes away). The ledger's keys are
``<prefix>call:...`` and the histories' ``<prefix>history:...``: nothing reads these but this
class. ``<prefix>audit-scopes`` lists the scopes (scored by their newest expiry) for
:meth:`RedisAudit.prune`.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from ._audit import AuditRecord
from ._records import LedgerError

_ADD = """
local key, now, keep, ttl_ms = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
for i = 4, #ARGV, 2 do redis.call('ZADD', key, ARGV[i], ARGV[i + 1]) end
local extra = redis.call('ZCARD', key) - keep
if extra > 0 then redis.call('ZREMRANGEBYRANK', key, 0, extra - 1) end
if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
return 'ok'
"""


class RedisAudit:
    """An :class:`AuditStore` on a Redis server. ``client``: a ``redis.asyncio.Redis``
    (closed by :meth:`aclose`); ``prefix``: the key prefix (the ledger's, by default)."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "toollatch:") -> None:
        self._r = client
        self._prefix = prefix
        self._add = client.register_script(_ADD)

    def _key(self, scope: str) -> str:
        return f"{self._prefix}audit:{{{scope}}}"

    async def add(self, records: Sequence[AuditRecord], *, max_per_scope: int) -> None:
        """See :meth:`AuditStore.add`."""
        now = max((r.recorded_at for r in records), default=0.0)
        try:
            for scope in sorted({r.scope for r in records}):
                mine = [r for r in records if r.scope == scope]
                newest = max(r.expires_at for r in mine)
                ttl_ms = max(1, math.ceil((newest - now) * 1000))
                args: list[Any] = [repr(now), max_per_scope, ttl_ms]
                for r in mine:  # a nonce keeps two equal records two members
                    args += [repr(r.expires_at), f"{secrets.token_hex(4)} {r.to_json()}"]
                await self._add(keys=[self._key(scope)], args=args)
                await self._r.zadd(f"{self._prefix}audit-scopes", {scope: newest})
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis audit store: {type(exc).__name__}: {exc}") from exc

    async def records(self, scope: str, *, now: float) -> list[AuditRecord]:
        """See :meth:`AuditStore.records`."""
        try:
            raw = await self._r.zrangebyscore(self._key(scope), f"({now!r}", "+inf")
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis audit store: {type(exc).__name__}: {exc}") from exc
        texts = [m.decode() if isinstance(m, bytes) else str(m) for m in raw]
        return [AuditRecord.from_json(text.partition(" ")[2]) for text in texts]

    async def prune(self, now: float) -> int:
        """See :meth:`AuditStore.prune` (visits every scope listed)."""
        index = f"{self._prefix}audit-scopes"
        deleted = 0
        try:
            for scope in await self._r.zrange(index, 0, -1):
                name = scope.decode() if isinstance(scope, bytes) else str(scope)
                deleted += int(await self._r.zremrangebyscore(self._key(name), "-inf", now))
            await self._r.zremrangebyscore(index, "-inf", now)
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis audit store: {type(exc).__name__}: {exc}") from exc
        return deleted

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._r.aclose()
