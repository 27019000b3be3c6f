"""The opt-in audit of calls that did not commit (internal).

Half-assembled arguments are never persisted as calls: resume works from committed calls and
stored results only. This module is the one exception, off unless asked for: an *audit
record* of a call that failed the gate or was cut off (invalid JSON, a schema violation, a
truncated or interrupted stream, a cancelled round), for people looking into why. It is

- **redacted**: it never shows more of the arguments than a preview of the same call under the
  same :class:`~toollatch.PreviewPolicy` would (its tool rule, ``none`` / ``fields`` / ``full``,
  and its ``redactor``, which sees only complete strings): the final preview's view of the text
  is what is kept, as compact JSON. Text past a syntax error is never kept (only its byte
  count and where the parse stopped); with the default policy (``none``) no text at all;
- **bounded**: the kept view is cut at ``max_bytes`` UTF-8 bytes, and a scope keeps its newest
  ``max_per_scope`` records;
- **short-lived**: a record expires ``retention_s`` after it was written; every write deletes the
  expired records and :meth:`AuditStore.prune` does so on demand;
- **apart**: a store of its own (its own SQLite table, its own Redis keys), which the ledger's
  ``get``/``claim`` and the history's ``load`` never read, so a record can never be taken for a
  committed call, its result or its history.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from ..core._errors import ConfigError, ErrorCode
from ..core._preview import PreviewPolicy, PreviewTracker
from ..core._round import CallRecord, Round
from ._records import LedgerError

_log = logging.getLogger("toollatch.ledger")

_WRITE_TIMEOUT_S = 5.0
"""Longest wait for an audit write (shielded: it ends even when its round is torn down)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditPolicy:
    """What an audit record keeps and for how long; see the module docstring."""

    previews: PreviewPolicy = field(default_factory=PreviewPolicy)
    """The redaction: pass the policy the previews use (default: ``none``, so no text)."""
    max_bytes: int = 512
    """Most UTF-8 bytes of the redacted view kept per record (0: none)."""
    retention_s: float = 86400.0
    """Seconds a record is kept after it was written."""
    max_per_scope: int = 1000
    """Newest records a scope (run or session) keeps; older ones are deleted on write."""
    max_depth: int = 64
    """Nesting the redacting parse follows (deeper text is not shown)."""

    def __post_init__(self) -> None:
        if not isinstance(self.previews, PreviewPolicy):
            raise ConfigError(f"previews must be a PreviewPolicy, got {self.previews!r:.60}")
        for what, limit in (("max_bytes", 1 << 20), ("max_per_scope", 1 << 24)):
            value = getattr(self, what)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
                raise ConfigError(f"{what} must be an int in [0, {limit}], got {value!r}")
        if self.max_per_scope < 1:
            raise ConfigError("max_per_scope must be at least 1")
        if not isinstance(self.max_depth, int) or not 1 <= self.max_depth <= 1000:
            raise ConfigError(f"max_depth must be an int in [1, 1000], got {self.max_depth!r}")
        r = self.retention_s
        if not isinstance(r, int | float) or isinstance(r, bool) or not 0 < r <= 3.2e8:
            raise ConfigError(f"retention_s must be in (0, 10 years], got {r!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    """One call that did not commit, as the audit keeps it (never executable)."""

    scope: str
    """The run or session (the ledger scope) of the call."""
    call_id: str
    name: str | None
    code: str
    """The call's :class:`~toollatch.ErrorCode` value."""
    detail: str
    """The core's short reason (never quotes the argument text)."""
    argument_bytes: int
    """UTF-8 bytes of argument text received."""
    shown: str
    """The redacted view as compact JSON, cut at the policy's ``max_bytes`` (may be empty)."""
    truncated: bool
    """True when ``shown`` was cut."""
    parse_error: str | None
    """Where the redacting parse stopped (``"expected ',' ... at byte 57"``), if it did."""
    recorded_at: float
    """Unix time of the write."""
    expires_at: float
    """Unix time after which the record is deleted."""

    def to_json(self) -> str:
        """The record as one JSON object (how the stores keep it)."""
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> AuditRecord:
        """The inverse of :meth:`to_json`; ``LedgerError`` for a corrupt record."""
        try:
            data = json.loads(text)
            return cls(**{f.name: data[f.name] for f in fields(cls)})
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"an audit record is corrupt: {exc}") from exc


@runtime_checkable
class AuditStore(Protocol):
    """Where audit records live: apart from the ledger's calls and the histories."""

    async def add(self, records: Sequence[AuditRecord], *, max_per_scope: int) -> None:
        """Store ``records``, then delete the expired records (as of the newest
        ``recorded_at``; on Redis those of the scopes written, the other scopes' keys expiring
        on the server) and, per scope written, all but the newest ``max_per_scope``."""
        ...

    async def records(self, scope: str, *, now: float) -> list[AuditRecord]:
        """The unexpired records of ``scope``, oldest first."""
        ...

    async def prune(self, now: float) -> int:
        """Delete every record expired at ``now``; the number deleted."""
        ...

    async def aclose(self) -> None:
        """Release connections; the records stay until they expire."""
        ...


class MemoryAudit:
    """An :class:`AuditStore` in a dict (one process; for tests)."""

    def __init__(self) -> None:
        self._scopes: dict[str, list[AuditRecord]] = {}

    async def add(self, records: Sequence[AuditRecord], *, max_per_scope: int) -> None:
        """See :meth:`AuditStore.add`."""
        for record in records:
            self._scopes.setdefault(record.scope, []).append(record)
        if records:
            await self.prune(max(r.recorded_at for r in records))
        for scope in {r.scope for r in records}:
            kept = self._scopes.get(scope)
            if kept is not None and len(kept) > max_per_scope:
                del kept[: len(kept) - max_per_scope]

    async def records(self, scope: str, *, now: float) -> list[AuditRecord]:
        """See :meth:`AuditStore.records`."""
        return [r for r in self._scopes.get(scope, []) if r.expires_at > now]

    async def prune(self, now: float) -> int:
        """See :meth:`AuditStore.prune`."""
        deleted = 0
        for scope, kept in list(self._scopes.items()):
            alive = [r for r in kept if r.expires_at > now]
            deleted += len(kept) - len(alive)
            if alive:
                self._scopes[scope] = alive
            else:
                del self._scopes[scope]
        return deleted

    async def aclose(self) -> None:
        """Nothing to release."""


def audit_record(call: CallRecord, *, scope: str, policy: AuditPolicy, now: float) -> AuditRecord:
    """The audit record of a call that did not commit (see the module docstring)."""
    shown, parse_error = _redacted_view(call, policy)
    cut = _cut(shown, policy.max_bytes)
    return AuditRecord(
        scope=scope,
        call_id=call.call_id,
        name=call.name,
        code=str(call.error or ErrorCode.PROTOCOL_VIOLATION),
        detail=call.detail,
        argument_bytes=call.argument_bytes,
        shown=cut,
        truncated=len(cut) < len(shown),
        parse_error=parse_error,
        recorded_at=now,
        expires_at=now + policy.retention_s,
    )


def _redacted_view(call: CallRecord, policy: AuditPolicy) -> tuple[str, str | None]:
    """What the final preview of the call's text shows, as compact JSON, and where the
    parse stopped. The preview machinery itself does the redaction, so the audit can never
    show what a preview would not."""
    if policy.max_bytes == 0 or not call.arguments_text:
        return "", None
    tracker = PreviewTracker(policy.previews, call.name, max_depth=policy.max_depth)
    text = call.arguments_text
    tracker.feed(text, len(text.encode()))
    update = tracker.release(call.key, call.call_id, call.name, final=True)
    root: list[Any] = []
    for delta in update.deltas:
        _fold(root, delta.path, delta.op, delta.value)
    shown = json.dumps(root[0], ensure_ascii=False, separators=(",", ":")) if root else ""
    return shown, update.error


def _fold(root: list[Any], path: str, op: str, value: object) -> None:
    """Apply one preview delta to the document ``root[0]`` (RFC 6901 pointers)."""
    if op == "end":
        return
    if path == "":
        if op == "set":
            root[:] = [value]
        else:
            root[0] += str(value)
        return
    parent: Any = root[0]
    *ancestors, last = (t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/"))
    for token in ancestors:
        parent = parent[int(token)] if isinstance(parent, list) else parent[token]
    key: Any = int(last) if isinstance(parent, list) else last
    if op == "append":
        parent[key] += str(value)
    elif isinstance(parent, list) and key == len(parent):
        parent.append(value)
    else:
        parent[key] = value


def _cut(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, on a character boundary."""
    raw = text.encode()
    return text if len(raw) <= max_bytes else raw[:max_bytes].decode(errors="ignore")


class ArgumentAudit:
    """Writes the audit records of a round's uncommitted calls to ``store`` under
    ``policy``: ``Dispatcher(audit=ArgumentAudit(open_audit(url), AuditPolicy(...)))``.
    ``clock`` gives Unix time (tests pass their own)."""

    def __init__(
        self,
        store: AuditStore,
        policy: AuditPolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(store, AuditStore):
            raise ConfigError(f"store must be an AuditStore, got {store!r:.60}")
        self.store = store
        self.policy = policy if policy is not None else AuditPolicy()
        if not isinstance(self.policy, AuditPolicy):
            raise ConfigError(f"policy must be an AuditPolicy, got {policy!r:.60}")
        self.clock = clock
        self._writing: set[asyncio.Future[int]] = set()

    async def record(self, scope: str, round_: Round) -> int:
        """Record every call of ``round_`` that did not commit; the number recorded. Never
        raises for the store (a failed or slow write is logged after at most 5 s: the audit
        must not change what the tools do)."""
        now = self.clock()
        try:
            records = [
                audit_record(call, scope=scope, policy=self.policy, now=now)
                for call in round_.calls
                if call.committed is None
            ]
        except Exception:  # (a redactor that raises, say: an observer must not break a run)
            _log.exception("could not make the audit records of a round of %r", scope)
            return 0
        if not records:
            return 0
        # Shielded: a caller cancelled meanwhile (a round torn down) still gets its records
        # written; the write is bounded, and referenced here until it ends.
        task = asyncio.ensure_future(self._write(records))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)
        return await asyncio.shield(task)

    async def _write(self, records: list[AuditRecord]) -> int:
        write = self.store.add(records, max_per_scope=self.policy.max_per_scope)
        try:
            await asyncio.wait_for(write, _WRITE_TIMEOUT_S)
        except (LedgerError, TimeoutError) as exc:
            _log.warning("could not write %d audit record(s): %s", len(records), exc)
            return 0
        except Exception:  # a store's bug must not fail the round's task group (its tools)
            _log.exception("the audit store failed writing %d record(s)", len(records))
            return 0
        return len(records)
