"""What a running tool may know about its call: :func:`current_call` (internal)."""

from __future__ import annotations

import contextvars
import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class CallContext:
    """The call a tool is running for, read with :func:`current_call` inside the tool."""

    session: str
    """The dispatcher session (the ledger scope) of the call."""
    call_id: str
    """The provider's call id."""
    idempotency_key: str
    """Stable for this call across re-runs, workers and hosts (SHA-256 of scope, id and
    arguments digest): pass it to a downstream API (``Idempotency-Key``) to dedupe there."""
    token: int | None = None
    """The ledger's fencing token of this run (None without a ledger)."""
    rerun: bool = False
    """True when this run took over a stale claim whose tool had started: the earlier run
    may have had its effect, so the tool should dedupe by ``idempotency_key``."""


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "toollatch_call", default=None
)


def current_call() -> CallContext | None:
    """The :class:`CallContext` of the tool call running in this task or thread (sync tools
    run in a thread that inherits it), or None outside a dispatcher run."""
    return _current.get()


def canonical_call(name: str, arguments: Any) -> str:
    """``name``, a NUL and the canonical JSON (sorted keys, compact) of ``arguments``: what
    :func:`digest_of_canonical` hashes, and the dispatcher's fingerprint of a call (so a
    call's arguments are serialised once for both)."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return f"{name}\x00{text}"


def digest_of_canonical(canonical: str) -> str:
    """SHA-256 (hex) of :func:`canonical_call`'s text: the ledger's arguments digest."""
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotency_key(session: str, call_id: str, digest: str) -> str:
    """The :attr:`CallContext.idempotency_key` of a call."""
    raw = f"{len(session)}:{session}\x00{call_id}\x00{digest}".encode()
    return hashlib.sha256(raw).hexdigest()


def set_current(context: CallContext) -> contextvars.Token[CallContext | None]:
    """Make ``context`` current (the dispatcher, around one tool run)."""
    return _current.set(context)


def reset_current(token: contextvars.Token[CallContext | None]) -> None:
    """Undo :func:`set_current`."""
    _current.reset(token)
