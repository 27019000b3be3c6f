"""The Redis run store: any worker serves any run (internal; the ``redis`` extra).

Theory of operation. Per run, two keys sharing the run id as their hash tag (one Redis
Cluster slot): ``toollatch:relay:{ID}:meta``, a hash (``session``: the SHA-256 of the
session token, never the token; ``owner``: the worker driving it; ``status``: ``running``
or ``done``), and ``toollatch:relay:{ID}:log``, a Stream holding the run's SSE frames.
Entry ``0-N`` is the frame with ``id: N``: the relay's own 1-based counter *is* the
stream entry id (XADD with an explicit id, https://redis.io/docs/latest/commands/xadd/), so
every worker sends the same ids and the same bytes, and ``Last-Event-ID: N`` resumes with
``XREAD ... 0-N`` anywhere.

The owner writes (:class:`_Writer`, one task for every run of the worker): it copies the
frames each run appended since its last write from the run's own log, all runs in one
pipeline, each XADD trimming with ``MINID`` to the local log's first kept id, so the stream
keeps exactly what :attr:`RelayLimits.max_kept_bytes` keeps locally (a frame the local log
forgot before it was written is never written: a reader then gets ``lagged``, as locally).
Only then are the frames *published* (:meth:`RelayRun.publish`): no reader, local or
remote, gets an id the shared log does not have. Both keys get their TTL
(``relay.store_ttl_s``) with the run's first write, renewed every third of it while the
run goes on, and once more at its end (``status: done``): they expire one TTL later.

Readers elsewhere (:class:`RemoteRun`) ``XREAD BLOCK`` (at most ``heartbeat_s``, then a
heartbeat); a gap between their cursor and the first entry returned is a ``lagged``; the
``run_ended`` frame, or ``status: done`` seen after a quiet wait, ends them.

Cancel and answers from another worker (request/response): ``PUBLISH`` on the owner's
channel (``toollatch:relay:worker:<id>``) of ``{"run", "session", "kind", ..., "reply"}``;
the owner's listener applies it to the run with the same checks as its own endpoint (the
session's digest must be the run's; an answer's token is checked by the answer itself) and
``LPUSH``es its HTTP status and body on the ``reply`` key (expiring), which the asking
worker waits on with ``BLPOP`` (at most :data:`ASK_S`). No subscriber: the owner is gone
(its lease will end the run); no reply in time: 503.

Leases: a worker that dies. Each worker holds ``toollatch:relay:worker:<id>:lease``
(``SET PX lease_s``, renewed every third of it) while it runs; its running runs are in the
set ``toollatch:relay:running``. Every third of ``lease_s`` each worker also looks at that
set: a run whose owner's lease is gone is ended by the first survivor that wins a
compare-and-set on its metadata (a Lua script: ``status`` ``running`` -> ``ending``, only if
the ``owner`` is still the dead worker; a survivor that died while ending it is replaced the
same way, by ``ender``). The survivor reads the run's log, pairs every call the log left open
(a committed call with ``tool_started`` and no result: ``tool_finished`` with
``outcome_unknown``, as the ledger calls a started call whose worker vanished; one that never
started: ``cancelled``; one still streaming: ``call_failed``), ends the open round
(``round_ended``, ``interrupted``) and writes ``run_ended`` with an error naming the dead
worker, then ``status: done``: readers on every worker see the end. With a ledger the
relay shares, a committed call the log shows as not started is looked up there (the log may
lag the ledger by one write), under the run's own scope (a chat's or an AG-UI thread's for
their runs: ``conversation`` in its metadata, from :attr:`RelayRun.kept`, written with its
first frames): a ``started`` record makes it ``outcome_unknown``. A run is
thus ended within about ``lease_s`` * 4/3 of its owner's death.
Before ending it, the survivor offers the run to the relay's ``adopter``
(:meth:`._app.Relay.adopt_orphan`): a run waiting for an answer with its record in the shared
history is resumed there instead (its question settled ``cancelled`` when it cannot be; a
run ended gets the round it cut off and an interrupted note stored after its history:
:func:`.runtime._resume.file_interrupted`; an AG-UI thread's run its stored rounds filed to
its thread), and
:meth:`adopt` (a restarting worker) takes a dead worker's run with the same compare-and-set,
so one worker only resumes or ends it.

Connection loss. A write that fails is retried (backoff to 1 s) for ``outage_s``
(``relay.store_outage_s``, 5 s); past it, the worker's runs stop mirroring: each is cancelled (its
``run_ended.error`` says the store is unreachable) and its local readers get every event;
readers on other workers get an error and their stream ends (a reconnect gets 503 while
Redis is down). Such a run's rest (its cancellation, its ``run_ended``) is written *late*,
once Redis answers again (:meth:`_Writer.retry_late`, every :data:`LATE_S`), so a reader
resuming on another worker gets it to its end (without it that reader would wait on a run
its live owner never ends there, until the store's TTL); the write is fenced as every write.
A run whose lease was lost (a paused worker) is written late the same way (a durable run
goes on while the store still says it is this worker's).

Fencing. Each run's metadata holds an ``epoch``, bumped when a worker records the run
(:meth:`RedisRunStore.created`) or takes it over (:meth:`RedisRunStore.take_over`). Every
write of a run's frames is one Lua script (:data:`_WRITE`) that appends them only while the
run is ``running`` under this worker at the epoch it holds. So a worker paused past its lease
(SIGSTOP, a long GC) writes nothing once a survivor claimed the run (``ending``) or took it
over: the refused write makes the run *lost* there (:meth:`RedisRunStore.lost`): nothing of
it is written or published any more, its readers there reconnect to the shared log, and its
driver stops (cancelled; a durable run's workflow stops at its next step, unrecorded).

Requests that need the store answer 503 ``store_unavailable``. The cancel listener
reconnects by itself. No operation waits longer than its socket timeout: 5 s, or
``heartbeat_s`` + 5 s for a blocking read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
import redis.exceptions

from ...core._errors import ConfigError
from ...ledger import Ledger, LedgerKey
from ...tools._tasks import cancel_lost
from .._requests import run_scope_of
from .._runs import Batch, RelayRun, RunRegistry
from ._base import Adopter, Handler, StoreUnavailable
from ._orphans import OpenCalls, closing_events, read_log

_log = logging.getLogger("toollatch.relay")

_LOST = (redis.exceptions.RedisError, OSError)
"""What a lost or refused Redis connection raises (redis-py wraps most socket errors in its
ConnectionError, not every one)."""

SOCKET_S = 5.0
"""Socket timeout of every command but a blocking read."""
ASK_S = 5.0
LATE_S = 0.5
"""How often a worker tries again to write the rest of the runs it gave up (a store outage
or a lost lease) while it kept them locally."""
"""How long a worker waits for the owner's reply to a forwarded cancel or answer."""
_PREFIX = "toollatch:relay:"
_RUN_ENDED = b"\nevent: run_ended\n"
_RUNNING = f"{_PREFIX}running"

_CLAIM_ORPHAN = """
local status = redis.call('HGET', KEYS[1], 'status')
local holder = false
if status == 'running' then holder = redis.call('HGET', KEYS[1], 'owner')
elseif status == 'ending' then holder = redis.call('HGET', KEYS[1], 'ender') end
if holder ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'ending', 'ender', ARGV[2])
return 1
"""
"""The compare-and-set that makes one survivor the ender of a dead worker's run."""
_WRITE = """
local held = redis.call('HMGET', KEYS[1], 'status', 'owner', 'epoch')
if held[1] ~= 'running' or held[2] ~= ARGV[1] or held[3] ~= ARGV[2] then return 0 end
local n, kept = tonumber(ARGV[3]), tonumber(ARGV[7])
for i = 8 + 2 * kept, #ARGV do
  n = n + 1
  local added = redis.pcall('XADD', KEYS[2], 'MINID', '=', ARGV[4], '0-' .. n, 'f', ARGV[i])
  if type(added) == 'table' and added.err
    and not string.find(added.err, 'equal or smaller', 1, true) then return added end
end
if kept > 0 then redis.call('HSET', KEYS[1], unpack(ARGV, 8, 7 + 2 * kept)) end
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'status', 'done') end
if ARGV[5] ~= '0' then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return 1
"""
"""One run's write (see :meth:`_Writer._args`): its frames, only while its metadata says
``running`` under this worker at the fencing epoch it holds, else nothing (0): its run was
ended by a survivor or taken over by another worker (this one was paused past its lease).
An XADD of an id the stream has is skipped (a try that seemed to fail had written it)."""
_TAKE = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or status == 'done' or redis.call('HEXISTS', KEYS[1], 'session') == 0 then
  return false
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'status', 'running')
redis.call('HDEL', KEYS[1], 'ender')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local newest = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local fields = redis.call('HMGET', KEYS[1], 'session', unpack(ARGV, 3))
return {epoch, newest[1] and newest[1][1] or '0-0', fields}
"""
""":meth:`RedisRunStore.take_over`'s move, at once: the run's owner this worker, its epoch
bumped (the previous owner's writes are refused from then on), its log's newest id read
after that (nothing is written past it but by this worker), and its kept fields."""
_TAKEN_AWAY = "this worker lost the run to another worker (it was paused past its lease)"
_UNREACHABLE = "the run store (Redis) is unreachable: the run was cancelled"
_LAST_ID = "0-18446744073709551615"
_LEASE_LOST = "this worker's lease expired (it was paused): the run was cancelled"
_KEPT = ("conversation", "history", "thread", "provider", "workflow")
"""The fields of :attr:`RelayRun.kept` a survivor reads back from a run's metadata."""
_TAKEN = ("conversation", "history", "history_at", "agent", "workflow", "agui_thread")
"""The fields of :attr:`RelayRun.kept` a worker taking a durable run over reads back (its
history key and length, where the run's end writes its new entries; the workflow's agent,
whose ledger its answers go to; a resumed run's workflow id; an AG-UI run's thread id)."""


def session_digest(session: str) -> str:
    """What the store keeps of a session token (its SHA-256, hex)."""
    return hashlib.sha256(session.encode()).hexdigest()


def _meta(run_id: str) -> str:
    return f"{_PREFIX}{{{run_id}}}:meta"


def _stream(run_id: str) -> str:
    return f"{_PREFIX}{{{run_id}}}:log"


def _channel(worker: str) -> str:
    return f"{_PREFIX}worker:{worker}"


def _lease(worker: str) -> str:
    return f"{_PREFIX}worker:{worker}:lease"


_OWN_CONNECTIONS = 8
"""Connections a worker's store uses beside its clients' (the writer, the lease, the cancel
listener, replies)."""


def _client(url: str, socket_s: float, connections: int) -> aioredis.Redis:
    """A client of ``url`` that opens at most ``connections`` connections, and whose command
    that finds them all busy waits for one (at most :data:`SOCKET_S`, then a connection
    error) rather than failing at once, as redis-py's default pool (100 connections since
    its version 6) does: each reader of another worker's run holds one connection for its
    blocking read, so a worker's readers (at most ``relay.max_connections``) need as many."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=connections,
        timeout=SOCKET_S,
        socket_timeout=socket_s,
        socket_connect_timeout=SOCKET_S,
    )
    return aioredis.Redis.from_pool(pool)


def _entry_id(raw: bytes) -> int:
    return int(raw.split(b"-", 1)[1])


async def _stopped(tasks: Sequence[asyncio.Task[None]], within_s: float) -> None:
    """Cancel ``tasks`` and wait for them, at most ``within_s`` seconds, cancelling again
    each tenth of a second the ones still going (a cancel swallowed at one await is
    delivered at the next); one still going then is left, named in a warning."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within_s
    pending = {task for task in tasks if not task.done()}
    while pending and (left := until - loop.time()) > 0:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=min(left, 0.1))
    for task in tasks:
        if task.done() and not task.cancelled() and (error := task.exception()) is not None:
            _log.error("run store: %s had failed", task.get_name(), exc_info=error)
    if pending:
        names = ", ".join(sorted(task.get_name() for task in pending))
        _log.warning("run store: %s still going %g s after the stop; left", names, within_s)


class RedisRunStore:
    """The runs of every worker in one Redis (see the module docstring). ``url``:
    ``redis://HOST:PORT/DB``; ``ttl_s``: how long an ended run is kept; ``outage_s``: how
    long a failed write is retried before the worker's runs are cancelled; ``lease_s``: how
    long this worker's lease lasts without a renewal (a dead worker's runs are ended by a
    survivor about that long after its death)."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        outage_s: float,
        lease_s: float = 10.0,
        ledger: Ledger | None = None,
        connections: int = 1000,
    ) -> None:
        self.url = url
        self.connections = connections + _OWN_CONNECTIONS
        """The most connections each of its two clients opens (:func:`_client`)."""
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.outage_s = outage_s
        self.lease_ms = max(1, int(lease_s * 1000))
        self.ledger = ledger
        """The ledger the relay's workers share, if any (it tells which calls started)."""
        self.worker = secrets.token_hex(8)
        """This worker's id (its runs' ``owner``)."""
        self.shown = url.rsplit("@", maxsplit=1)[-1]
        try:
            self.client = _client(url, SOCKET_S, self.connections)
        except ValueError as exc:
            raise ConfigError(f"run store {self.shown}: {exc}") from None
        self._blocking: aioredis.Redis | None = None
        self._runs: RunRegistry | None = None
        self._writer: _Writer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reads: set[asyncio.Task[Any]] = set()  # blocking reads in flight
        self._reading = True
        self._handler: Handler | None = None
        self._adopter: Adopter | None = None
        self._replies: set[asyncio.Task[None]] = set()
        self._epochs: dict[str, int] = {}  # run id -> the fencing epoch its writes carry
        self.on_lost: Callable[[RelayRun], bool] | None = None
        """Told each run this worker lost (:meth:`lost`): True when it stops the run's
        driver itself (a durable run's, :mod:`.._durable`); else the run is cancelled."""
        self.goes_on: Callable[[RelayRun], bool] | None = None
        """Whether a run goes on when this worker's lease was lost (a durable run: if a
        survivor took it, the fence stops it here; else it is cancelled, its end written
        late)."""

    async def open(
        self, runs: RunRegistry, handler: Handler | None = None, adopter: Adopter | None = None
    ) -> None:
        """Check the server (ConfigError), then start the writer, the lease and the
        listener of other workers' requests (``handler`` applies them); a dead worker's run
        this worker wins is offered to ``adopter`` before it is ended."""
        self._handler, self._adopter = handler, adopter
        try:
            await self.client.ping()
            await self.client.set(_lease(self.worker), b"1", px=self.lease_ms)
        except _LOST as exc:
            await self.client.aclose()
            raise ConfigError(f"run store {self.shown}: cannot reach Redis: {exc}") from None
        block_s = runs.limits.heartbeat_s + SOCKET_S
        self._blocking = _client(self.url, block_s, self.connections)
        self._runs = runs
        self._writer = _Writer(self, runs)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._writer.loop(), name="toollatch-store-writer"),
            loop.create_task(self._listen(), name="toollatch-store-control"),
            loop.create_task(self._heartbeat(), name="toollatch-store-lease"),
        ]

    async def aclose(self) -> None:
        """Write what is left (bounded by ``outage_s``), stop the tasks, disconnect."""
        if self._writer is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.outage_s + SOCKET_S):
                    await self._writer.drain()
        await _stopped(self._tasks, SOCKET_S)
        self._tasks = []
        with contextlib.suppress(*_LOST):  # (its runs still going are ended by a survivor now)
            await self.client.delete(_lease(self.worker))
        await self.client.aclose()
        if self._blocking is not None:
            await self._blocking.aclose()

    def end_reads(self) -> None:
        """End the blocking reads in flight, and refuse new ones (a stopping worker)."""
        self._reading = False
        for read in self._reads:
            read.cancel()

    async def created(self, run: RelayRun) -> None:
        """The run's metadata, before its id is given out; then its log is mirrored (a run
        resumed under its id starts a new log, as it does in memory)."""
        mapping: dict[Any, Any] = {
            "session": run.session_key,
            "owner": self.worker,
            "status": "running",
        }
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(_stream(run.id))  # (a resumed run: a new log under its old id)
                pipe.hset(_meta(run.id), mapping=mapping)
                pipe.hdel(_meta(run.id), "ender")  # (an adopted run: running again)
                pipe.hincrby(_meta(run.id), "epoch", 1)  # (its writes' fencing token)
                pipe.pexpire(_meta(run.id), self.ttl_ms)
                pipe.sadd(_RUNNING, run.id)
                *_done, epoch, _expire, _add = await pipe.execute()
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        self._epochs[run.id] = int(epoch)
        run.mirror = self._writer

    async def adopt(self, run_id: str) -> bool:
        """See :meth:`RunStore.adopt`: the run's owner (or ender) is alive while it listens
        on its cancel channel (``PUBSUB NUMSUB``); a dead one's run goes to the worker that
        wins the same compare-and-set as the sweep's (``_CLAIM_ORPHAN``), so a restarting
        worker and a survivor never both take it. A run a survivor ended (``done`` with an
        ``ender``) is never taken again; an expired one goes to the first ``SET NX``."""
        try:
            fields: Any = await self.client.hmget(_meta(run_id), "status", "owner", "ender")
            status, owner, ender = (bytes(f).decode() if f is not None else "" for f in fields)
            if status in ("running", "ending"):
                holder = ender if status == "ending" else owner
                if holder == self.worker:
                    return True  # (this worker won it in its sweep)
                listening = await self.client.pubsub_numsub(_channel(holder))
                if listening and listening[0][1] > 0:
                    return False  # (its worker is alive: it drives the run)
                won = await self.client.eval(_CLAIM_ORPHAN, 1, _meta(run_id), holder, self.worker)
                return bool(won)
            if status == "done" and ender:
                return False  # (a survivor ended it; its questions were settled)
            adoption = f"{_PREFIX}{{{run_id}}}:adopted:{owner}"
            won = await self.client.set(adoption, self.worker, nx=True, px=self.ttl_ms)
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        return bool(won)

    async def take_over(self, run_id: str) -> tuple[str, int, dict[str, str]] | None:
        """Make this worker the owner of a dead worker's run whose durable workflow it now
        drives (``--durable``): its session digest, the newest id of its log, which this
        worker's copy goes on after, and what its metadata keeps of :attr:`RelayRun.kept`
        (:data:`_TAKEN`) (None: the run expired or already ended). One script
        (:data:`_TAKE`): its fencing epoch is bumped, so the previous owner, if only paused,
        writes nothing more to its log (:meth:`lost` there)."""
        keys = (_meta(run_id), _stream(run_id))
        try:
            taken: Any = await self.client.eval(_TAKE, 2, *keys, self.worker, self.ttl_ms, *_TAKEN)
            if taken is None:
                return None
            await self.client.sadd(_RUNNING, run_id)
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        epoch, newest, (session, *more) = taken
        self._epochs[run_id] = int(epoch)
        kept = {k: bytes(v).decode() for k, v in zip(_TAKEN, more, strict=True) if v}
        return bytes(session).decode(), _entry_id(newest), kept

    async def holds(self, run_id: str) -> bool:
        """Whether this worker still drives run ``run_id`` in the store (``running``, its
        owner, at the epoch it holds); True when Redis cannot tell (unreachable: the outage
        path decides)."""
        epoch = self._epochs.get(run_id)
        if epoch is None:
            return False
        try:
            fields: Any = await self.client.hmget(_meta(run_id), "status", "owner", "epoch")
        except _LOST:
            return True
        return bool(fields == [b"running", self.worker.encode(), str(epoch).encode()])

    def lost(self, run: RelayRun) -> None:
        """This worker lost ``run``: the store refused its write (a survivor ended it, or
        another worker took it over, while this one was paused past its lease). Nothing
        more of it is written or published here; this worker's readers of it end their
        streams (StoreUnavailable: they reconnect and read the shared log, as do its new
        readers here); its driver stops (:attr:`on_lost`, else it is cancelled: no tool
        starts after that)."""
        self._epochs.pop(run.id, None)
        if self._writer is not None:
            self._writer.forget(run.id)
        run.mirror = _FENCED
        run.lost = StoreUnavailable(f"{_TAKEN_AWAY}: read it again")
        run.publish(run.published)  # (wakes its readers)
        if self._runs is not None and self._runs.get(run.id) is run:
            self._runs.forget(run.id)
        _log.warning("run %s…: %s", run.id[:6], _TAKEN_AWAY)
        if self.on_lost is None or not self.on_lost(run):
            run.cancel(_TAKEN_AWAY)

    def mirrored(self, run: RelayRun) -> None:
        """Copy ``run``'s log to the store from now on (a run :meth:`take_over` gave)."""
        run.mirror = self._writer

    async def logged(self, run_id: str) -> list[bytes]:
        """Every frame the store keeps of the run's log, in order."""
        entries: Any = await self._unblocked(self.client.xrange(_stream(run_id), "-", "+"))
        return [fields[b"f"] for _id, fields in entries]

    async def find(self, run_id: str, session: str) -> RemoteRun | None:
        """Another worker's run (or this one's that this process no longer holds)."""
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hgetall(_meta(run_id))
                pipe.xrevrange(_stream(run_id), count=1)
                meta, newest = await pipe.execute()
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        owner_of = meta.get(b"session", b"").decode()
        if not meta or not secrets.compare_digest(owner_of, session_digest(session)):
            return None
        assert self._blocking is not None
        last = _entry_id(newest[0][0]) if newest else 0
        done = meta.get(b"status") == b"done"
        return RemoteRun(self, run_id, session, meta[b"owner"].decode(), last, done)

    async def cancel(self, run: Any, reason: str | None = None) -> bool:
        """Ask the owner to cancel the run; True when it did (it was running there)."""
        if not isinstance(run, RemoteRun) or run.ended:
            return False
        replied = await self.ask(run, {"kind": "cancel", "reason": reason})
        return replied is not None and replied[1].get("cancelled") is True

    async def ask(self, run: Any, request: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """Publish ``request`` on the owner's channel, then wait for its reply (``BLPOP``,
        at most :data:`ASK_S`); None when nobody listens there (the owner is gone)."""
        if not isinstance(run, RemoteRun):
            return None
        reply = f"{_PREFIX}reply:{secrets.token_hex(12)}"
        sent = {**request, "run": run.id, "session": session_digest(run.session), "reply": reply}
        assert self._blocking is not None
        try:
            if not await self.client.publish(_channel(run.owner), orjson.dumps(sent)):
                return None
            got: Any = await self._blocking.blpop([reply], timeout=ASK_S)
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        if got is None:
            raise StoreUnavailable(f"the run's worker did not answer within {ASK_S:g} s")
        status, body = orjson.loads(got[1])
        return int(status), dict(body)

    async def point(self, kind: str, key: str, run_id: str) -> None:
        """``SET`` the pointer with the store's TTL."""
        try:
            await self.client.set(f"{_PREFIX}{kind}:{key}", run_id, px=self.ttl_ms)
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None

    async def pointed(self, kind: str, key: str) -> str | None:
        """The pointer's run id."""
        try:
            value: Any = await self.client.get(f"{_PREFIX}{kind}:{key}")
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        return bytes(value).decode() if value is not None else None

    async def _listen(self) -> None:
        """Cancel this worker's runs as other workers ask (reconnecting after a loss)."""
        assert self._runs is not None
        delay = 0.05
        while not cancel_lost():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(_channel(self.worker))
                delay = 0.05
                async for message in pubsub.listen():
                    self._control(message.get("data"))
            except _LOST as exc:
                _log.warning("run store: the cancel channel was lost (%s); reconnecting", exc)
            finally:
                with contextlib.suppress(*_LOST):
                    await pubsub.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _control(self, data: Any) -> None:
        """A request of another worker: answered in a task of its own (the listener goes on)."""
        try:
            asked = orjson.loads(data)
            reply = str(asked["reply"])
        except (orjson.JSONDecodeError, TypeError, KeyError):
            return
        task = asyncio.get_running_loop().create_task(self._reply(asked, reply))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _reply(self, asked: dict[str, Any], reply: str) -> None:
        assert self._runs is not None
        run = self._runs.get(str(asked.get("run")))
        session = str(asked.get("session"))
        # (the run's session_key: a run taken over or restored has no token until a
        # request of its session reaches this worker, but its digest all along)
        if run is None and str(asked.get("run")) in self._epochs:
            # (held here in the store, not yet in this process: a takeover under way, its
            # run kept here in a moment; the asking worker's client asks again on 409)
            answer: tuple[int, dict[str, Any]] = (
                409,
                {"error": {"code": "run_not_running", "message": "the run is being taken over"}},
            )
        elif run is None or not secrets.compare_digest(run.session_key, session):
            answer = (
                404,
                {"error": {"code": "not_found", "message": "no such run on its worker"}},
            )
        elif asked.get("kind") == "cancel":
            reason = asked.get("reason")
            cancelled = run.cancel(reason if isinstance(reason, str) else None)
            answer = (202, {"id": run.id, "cancelled": cancelled})
        elif self._handler is not None:
            answer = await self._handler(run, asked)
        else:
            answer = (404, {"error": {"code": "not_found", "message": "nothing answers it"}})
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.lpush(reply, orjson.dumps(answer))
                pipe.pexpire(reply, int(ASK_S * 1000) + 1000)
                await pipe.execute()
        except _LOST as exc:
            _log.warning("run store: a reply to another worker was lost (%s)", exc)

    async def _heartbeat(self) -> None:
        """Renew this worker's lease every third of it; then end the runs of dead workers."""
        every = self.lease_ms / 3000
        while not cancel_lost():
            await asyncio.sleep(every)
            try:
                lease = _lease(self.worker)
                if not await self.client.set(lease, b"1", px=self.lease_ms, xx=True):
                    await self._lease_lost()  # (paused past it: survivors may have its runs)
                    await self.client.set(lease, b"1", px=self.lease_ms)
                await self._reap()
            except _LOST as exc:
                _log.warning("run store: the lease could not be renewed (%s)", exc)
            except Exception:  # a bug in us: the lease goes on
                _log.exception("run store: ending a dead worker's runs failed")

    async def _lease_lost(self) -> None:
        """This worker's lease expired while it lived (a pause): its runs may have been
        ended by a survivor, so they stop mirroring (nothing is written after that end) and
        are cancelled; their local readers get every event. A run that goes on (durable,
        :attr:`goes_on`) does so while it is still this worker's in the store."""
        assert self._runs is not None
        assert self._writer is not None
        runs = [run for run in self._runs.live() if run.mirror is self._writer]
        going = [run for run in runs if self.goes_on is not None and self.goes_on(run)]
        for run in going:
            if not await self.holds(run.id):
                self.lost(run)
        if rest := [run for run in runs if run not in going]:
            self._writer.give_up(rest, _LEASE_LOST)

    async def _reap(self) -> None:
        """End every running run whose owner (or ender) holds no lease any more."""
        members: Any = await self.client.smembers(_RUNNING)
        run_ids = [bytes(r).decode() for r in members]
        if not run_ids:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(_meta(run_id), "status", "owner", "ender", "session", *_KEPT)
            metas = await pipe.execute()
        holders: dict[str, tuple[str, str, str, dict[str, str]]] = {}
        for run_id, (status, owner, ender, session, *more) in zip(run_ids, metas, strict=True):
            if status is None or status == b"done":  # (expired, or ended meanwhile)
                await self.client.srem(_RUNNING, run_id)
                continue
            holder = ender if status == b"ending" else owner
            if holder is not None and owner is not None and holder.decode() != self.worker:
                kept = {k: bytes(v).decode() for k, v in zip(_KEPT, more, strict=True) if v}
                holders[run_id] = (
                    holder.decode(), owner.decode(), (session or b"").decode(), kept
                )  # fmt: skip
        alive: dict[str, bool] = {}
        for holder, *_rest in holders.values():
            if holder not in alive:
                alive[holder] = bool(await self.client.exists(_lease(holder)))
        for run_id, (holder, owner, session, kept) in holders.items():
            if alive[holder]:
                continue
            won = await self.client.eval(_CLAIM_ORPHAN, 1, _meta(run_id), holder, self.worker)
            if not won:
                continue
            try:
                adopter = self._adopter
                if adopter is not None and await adopter(run_id, session, owner, kept):
                    continue  # (resumed here: a run waiting for an answer)
            except Exception:  # (a bug in us: the run is ended, never left hanging)
                _log.exception("run %s…: it could not be resumed here", run_id[:6])
            await self._end_orphan(run_id, owner, session, kept.get("conversation"))

    async def end_if_held(self, run_id: str, owner: str, session: str) -> bool:
        """End the dead worker ``owner``'s run as :meth:`_reap` does if this worker still
        holds it (``ending``, this worker its ender: nobody took it over since); whether it
        did (StoreUnavailable)."""
        try:
            fields: Any = await self.client.hmget(_meta(run_id), "status", "ender")
            if fields != [b"ending", self.worker.encode()]:
                return False
            await self._end_orphan(run_id, owner, session)
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        return True

    async def _end_orphan(
        self, run_id: str, owner: str, session: str, conversation: str | None = None
    ) -> None:
        """Write the end of the dead worker ``owner``'s run (this worker won it);
        ``conversation``: its calls' ledger scope (default: :meth:`known`'s)."""
        entries: Any = await self.client.xrange(_stream(run_id), "-", "+")
        last = _entry_id(entries[-1][0]) if entries else 0
        seen = read_log([fields[b"f"] for _id, fields in entries])
        error = (
            f"worker {owner} stopped (its lease of {self.lease_ms / 1000:g} s expired); "
            f"worker {self.worker} ended the run"
        )
        events = (
            []
            if seen.ended
            else closing_events(seen, error, await self.known(run_id, session, seen, conversation))
        )
        async with self.client.pipeline(transaction=False) as pipe:
            for n, data in enumerate(events, start=last + 1):
                frame = b"id: %d\nevent: %s\ndata: %s\n\n" % (
                    n,
                    data["type"].encode(),
                    orjson.dumps(data),
                )
                pipe.xadd(_stream(run_id), {"f": frame}, id=f"0-{n}")
            # the stream's last id at its maximum: a write of its owner (only paused, not
            # dead) after this end is refused by its id, never appended after run_ended
            pipe.execute_command("XSETID", _stream(run_id), _LAST_ID)
            pipe.hset(_meta(run_id), "status", "done")
            pipe.srem(_RUNNING, run_id)
            pipe.pexpire(_stream(run_id), self.ttl_ms)
            pipe.pexpire(_meta(run_id), self.ttl_ms)
            await pipe.execute()
        _log.warning("run %s…: %s", run_id[:6], error)

    async def known(
        self, run_id: str, session: str, seen: OpenCalls, conversation: str | None = None
    ) -> dict[str, tuple[bool, str | None] | str]:
        """What the shared ledger says of the calls the log leaves without a result (under
        ``conversation``, the run's ledger scope: a chat's or an AG-UI thread's for their
        runs; default: the one its metadata keeps, else a ``POST /runs`` run's own)."""
        known: dict[str, tuple[bool, str | None] | str] = {}
        if self.ledger is None or not seen.committed:
            return known
        if conversation is None:
            kept: Any = None
            with contextlib.suppress(*_LOST):  # (unreachable: a POST /runs run's own)
                kept = await self.client.hget(_meta(run_id), "conversation")
            conversation = bytes(kept).decode() if kept else None
        scope = conversation or run_scope_of(session, run_id)
        for call_id in seen.committed:
            try:
                record = await self.ledger.get(LedgerKey(scope=scope, call_id=call_id))
            except Exception as exc:  # (the ledger unreachable: the log decides)
                _log.warning("run %s…: the ledger could not be read (%s)", run_id[:6], exc)
                return known
            if record is None:
                continue
            if record.result is not None:
                code = record.result.code
                known[call_id] = (record.result.is_error, str(code) if code else None)
            elif record.state == "started":
                known[call_id] = "started"
        return known

    async def xread(self, run_id: str, cursor: int, limit: int, wait_s: float) -> Any:
        """``XREAD`` after entry ``0-cursor``, blocking at most ``wait_s`` (0: not at all)."""
        if not self._reading:
            raise StoreUnavailable("this worker is stopping: read the run from another")
        streams: dict[Any, Any] = {_stream(run_id): f"0-{cursor}"}
        if wait_s <= 0:
            return await self._unblocked(self.client.xread(streams, count=limit))
        assert self._blocking is not None
        block = max(1, int(wait_s * 1000))
        read = asyncio.ensure_future(self._blocking.xread(streams, count=limit, block=block))
        self._reads.add(read)  # (end_reads cancels it)
        try:
            return await self._unblocked(read)
        except asyncio.CancelledError:
            if self._reading or not read.cancelled():
                raise  # (the reader's own cancel: its client left)
            raise StoreUnavailable("this worker is stopping: read the run from another") from None
        finally:
            self._reads.discard(read)
            read.cancel()

    @staticmethod
    async def _unblocked(command: Any) -> Any:
        try:
            return await command
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None

    async def logged_end(self, run_id: str) -> bool:
        """Whether the newest entry of the run's log is its ``run_ended``."""
        newest: Any = await self._unblocked(self.client.xrevrange(_stream(run_id), count=1))
        return bool(newest) and _RUN_ENDED in newest[0][1][b"f"]

    async def status(self, run_id: str) -> bytes | None:
        """The run's ``status`` (None: the run expired)."""
        try:
            value: Any = await self.client.hget(_meta(run_id), "status")
        except _LOST as exc:
            raise StoreUnavailable(f"the run store is unreachable: {exc}") from None
        return bytes(value) if value is not None else None


class RemoteRun:
    """A run read from the shared store (:class:`~.._runs.RunSource`)."""

    def __init__(
        self, store: RedisRunStore, run_id: str, session: str, owner: str, last: int, done: bool
    ) -> None:
        self.id, self.session, self.owner = run_id, session, owner
        self.last_id = last
        """The newest id when it was looked up."""
        self.ended = done
        """Whether it had ended when looked up (every event is in the log by then), or
        since, as its reader saw."""
        self._store = store

    async def read(self, cursor: int, limit: int, wait_s: float) -> Batch:
        """See :meth:`RunSource.read`: ``XREAD`` (blocking at most ``wait_s``)."""
        if self.ended and cursor >= self.last_id:
            return 0, [], cursor, True
        answer = await self._store.xread(self.id, cursor, limit, wait_s)
        if not answer:
            if wait_s <= 0:
                return 0, [], cursor, False
            status = await self._store.status(self.id)  # a quiet run: ended meanwhile?
            if status == b"done" or status is None:  # (None: expired)
                again = await self._store.xread(self.id, cursor, limit, 0)
                if again:
                    return self._batch(cursor, again)
                self.ended = True
                return 0, [], cursor, True
            return 0, [], cursor, False
        return self._batch(cursor, answer)

    async def ending(self) -> bool:
        """See :meth:`RunSource.ending`: the newest entry of its log is its ``run_ended``."""
        return self.ended or await self._store.logged_end(self.id)

    def _batch(self, cursor: int, answer: Any) -> Batch:
        entries = answer[0][1]
        first = _entry_id(entries[0][0])
        frames = [fields[b"f"] for _id, fields in entries]
        last = _entry_id(entries[-1][0])
        ended = _RUN_ENDED in frames[-1]
        if ended:
            self.ended = True
            self.last_id = last
        return first - 1 - cursor, frames, last, ended


class _Fenced:
    """The mirror of a run this worker lost (:meth:`RedisRunStore.lost`): what it still
    appends is neither written nor published."""

    def push(self, run: RelayRun) -> None:
        """(:class:`~.._runs.Mirror`) Nothing: the run is another worker's now."""


_FENCED = _Fenced()


class _Writer:
    """The worker's runs' logs copied to the store, every run in one pipeline per write."""

    def __init__(self, store: RedisRunStore, runs: RunRegistry) -> None:
        self._store, self._runs = store, runs
        self._dirty: dict[str, RelayRun] = {}
        self._written: dict[str, int] = {}  # run id -> newest id in the stream
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._failing_since: float | None = None
        self._late: dict[str, tuple[RelayRun, float]] = {}  # given up: run, when
        self._late_at = 0.0

    def push(self, run: RelayRun) -> None:
        """(:class:`~.._runs.Mirror`) ``run`` has something to write."""
        self._dirty[run.id] = run
        self._idle.clear()
        self._wake.set()

    async def drain(self) -> None:
        """Wait until every pushed run is written (or given up)."""
        while self._dirty or not self._idle.is_set():
            await self._idle.wait()

    async def loop(self) -> None:
        loop = asyncio.get_running_loop()
        refresh_s = max(0.05, self._store.ttl_ms / 3000)
        renew_at = loop.time() + refresh_s
        while not cancel_lost():
            wake_at = min(renew_at, self._late_at) if self._late else renew_at
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wake_at - loop.time())):
                    await self._wake.wait()
            self._wake.clear()
            if self._late and loop.time() >= self._late_at:
                self._late_at = loop.time() + LATE_S
                await self.retry_late()
            renew = loop.time() >= renew_at
            if renew:  # every live run's TTL, busy or quiet
                renew_at = loop.time() + refresh_s
                for run in self._runs.live():
                    if run.mirror is self:
                        self._dirty[run.id] = run
            dirty, self._dirty = self._dirty, {}
            try:
                if dirty:
                    await self._flush(list(dirty.values()), renew)
            except Exception as exc:  # a bug in us: its runs go on locally, the writer lives
                _log.exception("run store: a write failed")
                self.give_up(list(dirty.values()), exc, late=False)
            if not self._dirty:
                self._idle.set()

    async def _flush(self, runs: list[RelayRun], renew: bool) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.05
        while True:
            try:
                await self._write(runs, renew)
                self._failing_since = None
                return
            except _LOST as exc:
                now = loop.time()
                if self._failing_since is None:
                    self._failing_since = now
                if now + delay - self._failing_since > self._store.outage_s:
                    self.give_up(runs + list(self._dirty.values()), exc)
                    self._dirty.clear()
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def forget(self, run_id: str) -> None:
        """Write nothing more of run ``run_id`` (this worker lost it)."""
        self._dirty.pop(run_id, None)
        self._written.pop(run_id, None)
        self._late.pop(run_id, None)

    def _args(self, run: RelayRun, renew: bool) -> tuple[list[Any], int, bool]:
        """The :data:`_WRITE` script's arguments for ``run``'s frames the stream lacks (its
        end too, once it ended; ``renew``: the keys' TTL as well); the newest id written
        then, and whether that is its end."""
        log = run.log
        written = self._written.get(run.id, log.start)
        missed, frames, upto = log.frames(written, log.last_id - written)
        ended = run.done and upto >= log.last_id
        kept = [] if written or not run.kept else list(run.kept.items())  # (for a survivor)
        expire = ended or renew or not written  # (its end, a renewal, a new stream)
        store = self._store
        head = [store.worker, store._epochs.get(run.id, 0), written + missed]
        head += [f"0-{log.kept_from}", store.ttl_ms if expire else 0, int(ended), len(kept)]
        return [*head, *(x for pair in kept for x in pair), *frames], upto, ended

    async def _write(self, runs: list[RelayRun], renew: bool) -> None:
        plans: list[tuple[RelayRun, int, bool, int]] = []
        async with self._store.client.pipeline(transaction=False) as pipe:
            for run in runs:
                args, upto, ended = self._args(run, renew)
                plans.append((run, upto, ended, len(pipe)))
                pipe.eval(_WRITE, 2, _meta(run.id), _stream(run.id), *args)
                if ended:
                    pipe.srem(_RUNNING, run.id)
            results = await pipe.execute(raise_on_error=False)
        _raise_lost(results)
        for run, upto, ended, at in plans:
            if results[at] == 0:  # (refused: another worker has the run now)
                self._store.lost(run)
                continue
            if ended:
                self._written.pop(run.id, None)
                self._store._epochs.pop(run.id, None)
            else:
                self._written[run.id] = upto
            if run.mirror is self:  # (given up meanwhile: its readers have every event)
                run.publish(upto)

    def give_up(self, runs: list[RelayRun], exc: Exception | str, *, late: bool = True) -> None:
        """The store stayed unreachable (``exc``), or this worker lost its lease (``exc``:
        the reason): the runs go on locally only, cancelled; with ``late``, their rest is
        written once the store answers again (:meth:`retry_late`)."""
        if isinstance(exc, str):
            _log.error("run store: %s (%d runs)", exc, len(runs))
        else:
            outage = self._store.outage_s
            _log.error("run store unreachable for %g s (%s): cancelling its runs", outage, exc)
        reason = exc if isinstance(exc, str) else _UNREACHABLE
        now = asyncio.get_running_loop().time()
        for run in {r.id: r for r in runs}.values():
            if late:
                self._late[run.id] = (run, now)
                self._late_at = now + LATE_S
            else:
                self._written.pop(run.id, None)
            run.mirror = None
            run.publish(run.log.last_id)
            run.cancel(reason)
        self._wake.set()  # (the loop's wait: until the first late try)

    async def retry_late(self) -> None:
        """Write what the store lacks of each given-up run; forget a run once its end is
        written, once it is no longer this worker's to write (see :meth:`_write_late`), or
        one TTL after it was given up (it would have expired there by then)."""
        now = asyncio.get_running_loop().time()
        for run_id, (run, since) in list(self._late.items()):
            try:
                finished = await self._write_late(run)
            except _LOST:
                finished = False
            if finished or now - since > self._store.ttl_ms / 1000:
                self._late.pop(run_id, None)
                self._written.pop(run_id, None)
                self._store._epochs.pop(run_id, None)

    async def _write_late(self, run: RelayRun) -> bool:
        """``run``'s frames the stream lacks (and its end, if it ended), fenced as every
        write (:data:`_WRITE`: nothing while a survivor ends it, once it ended it or took it
        over, or once it expired). True when nothing is left to write."""
        args, upto, ended = self._args(run, renew=True)
        async with self._store.client.pipeline(transaction=False) as pipe:
            pipe.eval(_WRITE, 2, _meta(run.id), _stream(run.id), *args)
            if ended:
                pipe.srem(_RUNNING, run.id)
            results = await pipe.execute(raise_on_error=False)
        _raise_lost(results)
        if results[0] == 0:
            return True  # (ended by a survivor, taken over, or expired)
        self._written[run.id] = upto
        return ended


def _raise_lost(results: list[Any]) -> None:
    """Raise a pipeline's first error (the write script skips an XADD's "equal or
    smaller": that frame was written by a try that seemed to fail)."""
    for result in results:
        if isinstance(result, redis.exceptions.ConnectionError | TimeoutError):
            raise result
        if isinstance(result, Exception) and "equal or smaller" not in str(result):
            raise result
