"""Ledger records and the rules every backend applies to them (internal).

Theory of operation. One record per call id per scope (a run or session). Its life::

    (none) --claim--> claimed --start--> started --finish--> completed | failed
                        |                   |
                        +-- release --------+--> lease ended   the worker gave it back
    claimed, lease expired or released --claim--> claimed (new token)   nothing ran: safe
    started, lease expired --claim(rerun_started)--> claimed  idempotent tools only
    started, lease expired --settle_unknown--> failed         "started, outcome unknown"

Every claim that wins gets a *fencing token* larger than any before it for that call; every
write after the claim names its token and is refused (:class:`LeaseLost`) when the record
holds another one, so a worker whose claim expired and was taken over can never store a stale
result. The in-memory and SQLite backends apply the pure functions below inside one atomic
step (a dict under one event loop; a ``BEGIN IMMEDIATE`` transaction: see
:class:`._base.RecordLedger`); the Redis backend's claim applies :func:`decide_claim` too,
between an atomic read and a compare-and-set write, and its fenced writes apply the same
token rules in Lua scripts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from ..core._errors import ErrorCode, ToolLatchError, UsageError
from ..core._round import ToolResult
from ._context import canonical_call, digest_of_canonical

LedgerState: TypeAlias = Literal["claimed", "started", "completed", "failed"]
"""Where a call is in the ledger; ``completed`` and ``failed`` are final."""

FINAL: frozenset[str] = frozenset({"completed", "failed"})


class LedgerError(ToolLatchError):
    """The ledger could not be read or written (backend down, corrupt record)."""


class LeaseLost(LedgerError):
    """A write named a fencing token that is no longer the call's: another worker took the
    call over (this worker's lease had expired), or the record is gone."""


class LockLost(LedgerError):
    """A distributed session lock expired or was taken while held."""


class LockBusy(LedgerError):
    """A distributed session lock stayed held by another worker for longer than the wait
    allowed (the ledger was reachable: the session is busy, not the ledger down)."""


SessionLocks: TypeAlias = Callable[[str, Callable[[str], None]], AbstractAsyncContextManager[Any]]
"""Makes the distributed lock of a session (an async context manager), given the callback to
call with the reason if it is lost: ``Dispatcher(session_locks=redis_session_locks(...))``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerKey:
    """Identifies one call in a ledger: the call id within its scope (run or session id)."""

    scope: str
    """The run or session the call belongs to; ids of different scopes never meet."""
    call_id: str
    """The provider's call id."""

    def __post_init__(self) -> None:
        for what in ("scope", "call_id"):
            value = getattr(self, what)
            if not isinstance(value, str) or not value:
                raise UsageError(f"LedgerKey.{what} must be a non-empty str, got {value!r:.60}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerRecord:
    """What a ledger holds for one call."""

    key: LedgerKey
    digest: str
    """SHA-256 of the tool name and canonical arguments the call committed with."""
    state: LedgerState
    worker: str
    """The worker that holds (or last held) the claim."""
    token: int
    """The fencing token of the current claim (grows with every take-over)."""
    claimed_at: float
    """Wall-clock seconds (Unix time) of the current claim."""
    lease_until: float
    """Wall-clock seconds after which the claim is stale unless renewed (informational on
    Redis, where the lease is a key with a server-side expiry)."""
    updated_at: float
    result: ToolResult | None = None
    """Set in the final states."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Won:
    """The claim succeeded: this worker owns the call under ``token``."""

    token: int
    previous: LedgerRecord | None = None
    """The stale record taken over (None for a first claim)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """The claim did not succeed; ``record`` is what the ledger holds."""

    record: LedgerRecord
    live: bool
    """True while the holder's lease runs (it is presumed alive)."""


Claim: TypeAlias = Won | Found
"""The outcome of ``Ledger.claim``: :class:`Won` (this worker runs the call) or
:class:`Found` (the ledger already holds a record of it)."""


def digest_of(name: str, arguments: Any) -> str:
    """SHA-256 (hex) of ``name`` and the canonical JSON (sorted keys, compact) of
    ``arguments``: equal for the same call, different for other arguments."""
    return digest_of_canonical(canonical_call(name, arguments))


def check_lease(lease_s: float) -> None:
    """``UsageError`` unless ``lease_s`` is a positive finite number."""
    if not isinstance(lease_s, int | float) or isinstance(lease_s, bool) or not 0 < lease_s < 1e9:
        raise UsageError(f"lease_s must be a positive number of seconds, got {lease_s!r}")


def lease_live(record: LedgerRecord, now: float) -> bool:
    """Whether ``record``'s lease still runs at ``now`` (the in-memory and SQLite backends'
    liveness; Redis judges it by its lease key's server-side expiry instead)."""
    return record.lease_until > now


def decide_claim(
    record: LedgerRecord | None,
    key: LedgerKey,
    *,
    live: bool,
    digest: str,
    worker: str,
    now: float,
    lease_s: float,
    rerun_started: bool,
    start: bool = False,
) -> tuple[Claim, LedgerRecord | None]:
    """What a claim returns for the prior ``record`` (None: there is none) and the record to
    write (None: write nothing); every backend's claim is this decision. ``live``: whether
    the holder's lease runs (the backend's own judgement, see :func:`lease_live`).

    * no record: won with token 1;
    * other arguments (``digest``), a final record, a live lease, or a ``started`` record
      without ``rerun_started``: found, unchanged (``live`` only for an unfinished one);
    * else (a stale ``claimed`` one, or a stale ``started`` one with ``rerun_started``):
      won with the next token, the old record as ``previous``.

    ``start``: a won claim is written ``started`` at once (claim and :func:`started` in one
    write: the caller runs the tool now, with nothing to wait for in between)."""
    state: LedgerState = "started" if start else "claimed"
    if record is None:
        new = LedgerRecord(
            key=key, digest=digest, state=state, worker=worker, token=1,
            claimed_at=now, lease_until=now + lease_s, updated_at=now,
        )  # fmt: skip
        return Won(token=1), new
    takeable = record.state == "claimed" or (record.state == "started" and rerun_started)
    if record.digest != digest or record.state in FINAL or live or not takeable:
        return Found(record=record, live=live and record.state not in FINAL), None
    token = record.token + 1
    new = replace(
        record, state=state, worker=worker, token=token, claimed_at=now,
        lease_until=now + lease_s, updated_at=now, result=None,
    )  # fmt: skip
    return Won(token=token, previous=record), new


def fenced(record: LedgerRecord | None, key: LedgerKey, token: int) -> LedgerRecord:
    """``record`` when it holds ``token`` and is not final; else ``LeaseLost``."""
    if record is None or record.token != token or record.state in FINAL:
        held = "no record" if record is None else f"token {record.token}, {record.state}"
        raise LeaseLost(f"call {key.call_id!r} ({key.scope!r}) is no longer ours: {held}")
    return record


def started(record: LedgerRecord, *, now: float, lease_s: float) -> LedgerRecord:
    """``record`` moved to ``started`` with a fresh lease (``claimed`` only)."""
    if record.state != "claimed":
        raise LeaseLost(f"call {record.key.call_id!r} was already started")
    return replace(record, state="started", lease_until=now + lease_s, updated_at=now)


def finished(record: LedgerRecord, result: ToolResult, *, now: float) -> LedgerRecord:
    """``record`` in its final state: ``failed`` for an error result, else ``completed``."""
    state: LedgerState = "failed" if result.is_error else "completed"
    return replace(record, state=state, result=result, updated_at=now)


def result_to_json(result: ToolResult) -> str:
    """A stored result as JSON text."""
    data = result.as_dict()
    data["code"] = str(result.code) if result.code is not None else None
    data["truncated_from"] = result.truncated_from
    return json.dumps(data, separators=(",", ":"))


def result_from_json(text: str) -> ToolResult:
    """The inverse of :func:`result_to_json`; ``LedgerError`` for a corrupt record."""
    try:
        data = json.loads(text)
        code = data.get("code")
        return ToolResult(
            tool_call_id=str(data["tool_call_id"]),
            name=str(data["name"]),
            content=str(data["content"]),
            is_error=bool(data["is_error"]),
            code=ErrorCode(code) if code is not None else None,
            truncated_from=_size(data.get("truncated_from")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerError(f"a stored result is corrupt: {exc}") from exc


def _size(value: object) -> int | None:
    """A stored ``truncated_from``: absent (older records) or a byte count."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"truncated_from must be a byte count, got {value!r:.40}")
    return value


def renewed(record: LedgerRecord, *, now: float, lease_s: float) -> LedgerRecord:
    """``record`` with its lease extended to ``now + lease_s``."""
    return replace(record, lease_until=now + lease_s, updated_at=now)


def released(record: LedgerRecord | None, token: int) -> LedgerRecord | None:
    """``record`` with its lease ended, when it is an unfinished claim holding ``token``
    (else None: nothing to write). The record is kept, not deleted, so that the next claim
    takes it over with a *larger* token: a deleted record would restart the tokens at 1 and
    let a worker still holding an old token 1 write again."""
    if record is None or record.token != token or record.state in FINAL:
        return None
    return replace(record, lease_until=0.0)


def decide_unknown(
    record: LedgerRecord | None, key: LedgerKey, token: int, result: ToolResult, *, now: float
) -> tuple[LedgerRecord, bool]:
    """The record after settling a stale claim as ``result``, and whether it changed: only
    an unfinished record still holding ``token`` whose lease has run out is settled."""
    if record is None:
        raise LeaseLost(f"call {key.call_id!r} ({key.scope!r}) has no record")
    if record.token == token and record.state not in FINAL and not lease_live(record, now):
        return finished(record, result, now=now), True
    return record, False
