"""The Redis ledger: many workers on many hosts (internal; needs the ``redis`` package).

Per call, a hash holds the record and a separate *lease key* holds the current fencing
token with a server-side expiry (``SET ... PX``, https://redis.io/docs/latest/commands/set/),
so liveness is judged by the Redis server's clock, never by a worker's. Every operation is Lua
scripts (``EVALSHA``), which Redis runs atomically
(https://redis.io/docs/latest/develop/interact/programmability/eval-intro/). A claim is
decided by :func:`._records.decide_claim`, the rule every backend shares, between two
scripts: one reads the hash and the lease key (live: it holds the record's token), one
writes the decision only if both are still as read (a compare-and-set; a race lost means
read and decide again). A write naming a token that is no longer the hash's is refused
with ``LEASE_LOST`` (the fencing rule of ``_records``). Final records
expire after ``retention_s``. Both keys of a call share a hash tag (the scope), so the scripts
also work on Redis Cluster.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions

from ..core._errors import ConfigError
from ..core._round import ToolResult
from ._always import check_room
from ._history import HistoryConflict, _encoded
from ._questions import Question, QuestionRules, QuestionStep, question_from_json, question_to_json
from ._records import (
    Claim,
    LeaseLost,
    LedgerError,
    LedgerKey,
    LedgerRecord,
    check_lease,
    decide_claim,
    result_from_json,
    result_to_json,
)

T = TypeVar("T")

_READ = """
local rec = redis.call('HGETALL', KEYS[1])
return {rec, redis.call('GET', KEYS[2]) or ''}
"""
# The record and its lease key as one atomic read: what a claim decides on.

_PUT = """
local h, lk = KEYS[1], KEYS[2]
local token, state, updated_at, lease, new_token, lease_ms, retention_ms = unpack(ARGV, 1, 7)
if (redis.call('HGET', h, 'token') or '') ~= token
    or (redis.call('HGET', h, 'state') or '') ~= state
    or (redis.call('HGET', h, 'updated_at') or '') ~= updated_at
    or (redis.call('GET', lk) or '') ~= lease then
  return 0
end
redis.call('HSET', h, unpack(ARGV, 8))
redis.call('HDEL', h, 'result')
if tonumber(retention_ms) > 0 then redis.call('PEXPIRE', h, retention_ms) end
redis.call('SET', lk, new_token, 'PX', lease_ms)
return 1
"""
# A claim's write, only if the record and lease key are still as read (else 0: read again).

_FENCED = """
local h, lk = KEYS[1], KEYS[2]
local token, op, now, lease_until, lease_ms, state_to, result, retention_ms = unpack(ARGV)
local held = redis.call('HGET', h, 'token')
local state = redis.call('HGET', h, 'state')
if held ~= token or state == 'completed' or state == 'failed' then
  return redis.error_reply('LEASE_LOST held ' .. tostring(held) .. ' ' .. tostring(state))
end
if op == 'start' and state ~= 'claimed' then
  return redis.error_reply('LEASE_LOST already ' .. state)
end
if op == 'finish' then
  redis.call('HSET', h, 'state', state_to, 'result', result, 'updated_at', now)
  redis.call('DEL', lk)
  if tonumber(retention_ms) > 0 then redis.call('PEXPIRE', h, retention_ms) end
  return 'ok'
end
if op == 'start' then redis.call('HSET', h, 'state', 'started') end
redis.call('HSET', h, 'lease_until', lease_until, 'updated_at', now)
redis.call('SET', lk, token, 'PX', lease_ms)
return 'ok'
"""

_QUESTION_CAS = """
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if tonumber(ARGV[4]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return 1
"""
# A question's write, only if it is still as read (else 0: read and decide again).

_ALWAYS = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -2 end
local held = redis.call('HLEN', KEYS[1])
if held >= tonumber(ARGV[3]) then return held end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if tonumber(ARGV[4]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return -1
"""
# An "always allow" decision added under the session's cap: -1 added, -2 there already, else
# the count held (too many).

_RELEASE = """
local h, lk = KEYS[1], KEYS[2]
local state = redis.call('HGET', h, 'state')
if redis.call('HGET', h, 'token') == ARGV[1] and state ~= 'completed' and state ~= 'failed' then
  redis.call('DEL', lk)
  redis.call('HSET', h, 'lease_until', '0.0')
end
return 'ok'
"""

_SETTLE = """
local h, lk = KEYS[1], KEYS[2]
local token, now, result, retention_ms = unpack(ARGV)
local state = redis.call('HGET', h, 'state')
if not state then return redis.error_reply('LEASE_LOST no record') end
local held = redis.call('HGET', h, 'token')
if held == token and state ~= 'completed' and state ~= 'failed'
    and redis.call('GET', lk) ~= held then
  redis.call('HSET', h, 'state', 'failed', 'result', result, 'updated_at', now)
  redis.call('DEL', lk)
  if tonumber(retention_ms) > 0 then redis.call('PEXPIRE', h, retention_ms) end
end
return redis.call('HGETALL', h)
"""


class RedisLedger(QuestionRules):
    """A :class:`Ledger` on a Redis server, for workers on several hosts.

    ``client``: a ``redis.asyncio.Redis`` (this ledger closes it in :meth:`aclose`).
    ``prefix``: the key prefix; ``retention_s``: how long a record is kept after its claim
    and after its result (0: forever); a replay of a call id older than that runs again.
    Connection failures and timeouts raise ``LedgerError``: nothing is assumed, so a call
    whose claim could not be made is not run.
    """

    def __init__(
        self, client: aioredis.Redis, *, prefix: str = "toollatch:", retention_s: float = 7 * 86400
    ) -> None:
        if not isinstance(retention_s, int | float) or retention_s < 0:
            raise ConfigError(f"retention_s must be >= 0 seconds, got {retention_s!r}")
        self._r = client
        self._prefix = prefix
        self._retention_ms = str(int(retention_s * 1000))
        self._read = client.register_script(_READ)
        self._put = client.register_script(_PUT)
        self._fenced = client.register_script(_FENCED)
        self._release = client.register_script(_RELEASE)
        self._settle = client.register_script(_SETTLE)
        self._question_cas = client.register_script(_QUESTION_CAS)
        self._allow = client.register_script(_ALWAYS)

    def _keys(self, key: LedgerKey) -> list[str]:
        # The scope's length first makes the key unambiguous whatever characters it holds.
        h = f"{self._prefix}call:{len(key.scope)}:{{{key.scope}}}:{key.call_id}"
        return [h, h + ":lease"]

    async def claim(
        self,
        key: LedgerKey,
        *,
        digest: str,
        worker: str,
        now: float,
        lease_s: float,
        rerun_started: bool = False,
        start: bool = False,
    ) -> Claim:
        """See :meth:`Ledger.claim` (liveness is the lease key's server-side expiry)."""
        check_lease(lease_s)
        for _ in range(_CLAIM_RACES):
            fields, lease = await self._run(self._read, key, [])
            data = _texts(fields)
            record = _record(key, data) if data else None
            live = record is not None and _text(lease) == str(record.token)
            outcome, new = decide_claim(
                record, key, live=live, digest=digest, worker=worker, now=now,
                lease_s=lease_s, rerun_started=rerun_started, start=start,
            )  # fmt: skip
            if new is None:
                return outcome
            held = [data.get(f, "") for f in ("token", "state", "updated_at")]
            args = [*held, _text(lease), str(new.token), _ms(lease_s), self._retention_ms]
            if await self._run(self._put, key, [*args, *_fields(new)]):
                return outcome
        raise LedgerError(f"Redis ledger: call {key.call_id!r} changed {_CLAIM_RACES} times")

    async def start(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """See :meth:`Ledger.start`."""
        await self._write(key, token, "start", now=now, lease_s=lease_s)

    async def renew(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        """See :meth:`Ledger.renew`."""
        await self._write(key, token, "renew", now=now, lease_s=lease_s)

    async def finish(self, key: LedgerKey, token: int, result: ToolResult, *, now: float) -> None:
        """See :meth:`Ledger.finish`."""
        state = "failed" if result.is_error else "completed"
        await self._write(key, token, "finish", now=now, state=state, result=result)

    async def release(self, key: LedgerKey, token: int) -> None:
        """See :meth:`Ledger.release`."""
        await self._run(self._release, key, [str(token)])

    async def settle_unknown(
        self, key: LedgerKey, token: int, result: ToolResult, *, now: float
    ) -> LedgerRecord:
        """See :meth:`Ledger.settle_unknown`."""
        args = [str(token), repr(now), result_to_json(result), self._retention_ms]
        return _record(key, await self._run(self._settle, key, args))

    async def get(self, key: LedgerKey) -> LedgerRecord | None:
        """See :meth:`Ledger.get`."""
        try:
            fields = await self._r.hgetall(self._keys(key)[0])
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis ledger: {type(exc).__name__}: {exc}") from exc
        return _record(key, fields) if fields else None

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._r.aclose()

    # -- questions (see ._questions): one hash per scope, a field per call id ----------------

    def _questions_key(self, scope: str) -> str:
        return f"{self._prefix}questions:{len(scope)}:{{{scope}}}"

    async def question(self, key: LedgerKey) -> Question | None:
        """See :meth:`QuestionStore.question`."""
        text = await self._redis(self._r.hget(self._questions_key(key.scope), key.call_id))
        return None if text is None else question_from_json(key, text)

    async def questions(self, scope: str) -> list[Question]:
        """See :meth:`QuestionStore.questions`."""
        found = await self._redis(self._r.hgetall(self._questions_key(scope)))
        asked = [
            question_from_json(LedgerKey(scope=scope, call_id=_text(c)), text)
            for c, text in found.items()
        ]
        return sorted(asked, key=lambda q: (q.asked_at, q.key.call_id))

    async def pending_questions(self, limit: int) -> list[Question]:
        """See :meth:`~._questions.PendingQuestions.pending_questions` (a ``SCAN`` of the
        questions' hashes: for a restart, not for a request's path)."""
        head = f"{self._prefix}questions:"
        found: list[Question] = []
        scopes: list[str] = []
        try:
            async for key in self._r.scan_iter(match=f"{head}*", count=500):
                size, _, braced = _text(key)[len(head) :].partition(":")
                if size.isdigit() and len(braced) == int(size) + 2:  # (else not ours)
                    scopes.append(braced[1:-1])
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis ledger: {type(exc).__name__}: {exc}") from exc
        for scope in scopes:
            found += [q for q in await self.questions(scope) if q.pending]
        found.sort(key=lambda q: (q.asked_at, q.key.scope, q.key.call_id))
        return found[:limit]

    async def _apply_question(self, key: LedgerKey, step: QuestionStep[T]) -> T:
        where = self._questions_key(key.scope)
        for _ in range(_CLAIM_RACES):
            text = await self._redis(self._r.hget(where, key.call_id))
            prior = None if text is None else question_from_json(key, text)
            outcome, new = step(prior)
            if new is None:
                return outcome
            args = [key.call_id, "" if text is None else _text(text), question_to_json(new)]
            cas = self._question_cas(keys=[where], args=[*args, self._retention_ms])
            if await self._redis(cas):
                return outcome
        raise LedgerError(f"Redis ledger: question {key.call_id!r} changed {_CLAIM_RACES} times")

    # -- "always allow" decisions (see ._always): one hash per session, name -> since --------

    def _always_key(self, scope: str) -> str:
        return f"{self._prefix}always:{len(scope)}:{{{scope}}}"

    async def allow_always(self, scope: str, name: str, *, now: float, limit: int) -> bool:
        """See :meth:`~._always.AlwaysStore.allow_always` (one script: the count and the
        write together; the session's hash lives ``retention_s`` after its last change)."""
        args = [name, repr(now), str(limit), self._retention_ms]
        held = int(await self._redis(self._allow(keys=[self._always_key(scope)], args=args)))
        if held >= 0:
            check_room(scope, held, limit)
        return held == -1

    async def always_allowed(self, scope: str, name: str) -> bool:
        """See :meth:`~._always.AlwaysStore.always_allowed`."""
        return bool(await self._redis(self._r.hexists(self._always_key(scope), name)))

    async def always(self, scope: str) -> list[str]:
        """See :meth:`~._always.AlwaysStore.always`."""
        found = _texts(await self._redis(self._r.hgetall(self._always_key(scope))))
        return sorted(found, key=lambda n: (float(found[n]), n))

    async def revoke_always(self, scope: str, name: str) -> bool:
        """See :meth:`~._always.AlwaysStore.revoke_always`."""
        return bool(await self._redis(self._r.hdel(self._always_key(scope), name)))

    async def _redis(self, pending: Any) -> Any:
        try:
            return await pending
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis ledger: {type(exc).__name__}: {exc}") from exc

    async def _write(
        self,
        key: LedgerKey,
        token: int,
        op: str,
        *,
        now: float,
        lease_s: float = 1.0,
        state: str = "",
        result: ToolResult | None = None,
    ) -> None:
        check_lease(lease_s)
        text = result_to_json(result) if result is not None else ""
        args = [str(token), op, repr(now), repr(now + lease_s), _ms(lease_s), state, text]
        await self._run(self._fenced, key, [*args, self._retention_ms])

    async def _run(self, script: Any, key: LedgerKey, args: list[str]) -> Any:
        try:
            return await script(keys=self._keys(key), args=args)
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith("LEASE_LOST"):
                raise LeaseLost(f"call {key.call_id!r} ({key.scope!r}): {exc}") from None
            raise LedgerError(f"Redis ledger: {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis ledger: {type(exc).__name__}: {exc}") from exc


_CLAIM_RACES = 100
"""Compare-and-set rounds a claim makes before giving up (each lost one means another
worker's write went through: the ledger makes progress)."""


def _fields(r: LedgerRecord) -> list[str]:
    """The hash fields of a claimed record (a claimed record holds no result)."""
    return [
        "digest", r.digest, "state", r.state, "worker", r.worker, "token", str(r.token),
        "claimed_at", repr(r.claimed_at), "lease_until", repr(r.lease_until),
        "updated_at", repr(r.updated_at),
    ]  # fmt: skip


def _ms(seconds: float) -> str:
    return str(max(1, int(seconds * 1000)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _texts(fields: Any) -> dict[str, str]:
    """HGETALL's reply (a flat list from a script, a dict from the client) as text."""
    if isinstance(fields, list):
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    return {_text(k): _text(v) for k, v in fields.items()}


def _record(key: LedgerKey, fields: Any) -> LedgerRecord:
    """A record from HGETALL's reply: a flat list from a script, a dict from the client."""
    data = _texts(fields)
    try:
        state = data["state"]
        if state not in ("claimed", "started", "completed", "failed"):
            raise ValueError(f"unknown state {state!r}")
        return LedgerRecord(
            key=key, digest=data["digest"], state=state,  # type: ignore[arg-type]
            worker=data["worker"], token=int(data["token"]),
            claimed_at=float(data["claimed_at"]), lease_until=float(data["lease_until"]),
            updated_at=float(data["updated_at"]),
            result=result_from_json(data["result"]) if "result" in data else None,
        )  # fmt: skip
    except (KeyError, ValueError) as exc:
        raise LedgerError(f"a Redis ledger record of {key.call_id!r} is corrupt: {exc}") from exc


_APPEND = """
local length = redis.call('LLEN', KEYS[1])
if length ~= tonumber(ARGV[1]) then return redis.error_reply('CONFLICT ' .. length) end
for i = 2, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
return length + #ARGV - 1
"""


_DELETE = """
local length = redis.call('LLEN', KEYS[1])
if length ~= tonumber(ARGV[1]) then return redis.error_reply('CONFLICT ' .. length) end
redis.call('DEL', KEYS[1])
return length
"""


class RedisHistory:
    """A :class:`History` in Redis lists (one per run), appended by a Lua script that
    checks the length first, so two writers never interleave one run."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "toollatch:") -> None:
        self._r = client
        self._prefix = prefix
        self._append = client.register_script(_APPEND)
        self._delete = client.register_script(_DELETE)

    async def append(self, run: str, messages: Sequence[dict[str, Any]], *, at: int) -> int:
        """See :meth:`History.append`."""
        encoded = _encoded(run, messages, at)
        return await self._checked(
            run, at, self._append(keys=[self._key(run)], args=[at, *encoded])
        )

    async def delete(self, run: str, *, at: int) -> None:
        """See :meth:`~._history.MemoryHistory.delete`."""
        await self._checked(run, at, self._delete(keys=[self._key(run)], args=[at]))

    async def _checked(self, run: str, at: int, script: Any) -> int:
        """A script's length, or :class:`HistoryConflict` when ``run`` had another one."""
        try:
            return int(await script)
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith("CONFLICT"):
                held = str(exc).split()[-1]
                raise HistoryConflict(f"run {run!r} has {held} messages, not {at}") from None
            raise LedgerError(f"Redis history: {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis history: {type(exc).__name__}: {exc}") from exc

    async def load(self, run: str) -> list[dict[str, Any]]:
        """See :meth:`History.load`."""
        try:
            raw = await self._r.lrange(self._key(run), 0, -1)
        except redis.exceptions.RedisError as exc:
            raise LedgerError(f"Redis history: {type(exc).__name__}: {exc}") from exc
        return [json.loads(m) for m in raw]

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._r.aclose()

    def _key(self, run: str) -> str:
        return f"{self._prefix}history:{{{run}}}"
