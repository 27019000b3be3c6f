"""Sticky "always allow" decisions: the tools a person let run unasked in a session
(internal).

Theory of operation. ``approve(..., always=True)`` records the call's tool name under the
*approval session* (a browser session, a ``toollatch run`` session): every later call of
that tool in that session, in any run and any process sharing the store, runs without a
question until the decision is revoked. A decision names a tool in one session and nothing
else: never another session, never other tools. Each session holds at most ``limit``
decisions (:class:`TooManyAlways` past it; the caller's cap, ``ApprovalPolicy.max_always``);
adding a name already there changes nothing. Every built-in ledger is an
:class:`AlwaysStore` (memory, SQLite, Redis), in one atomic step per change, so two workers
never together pass the cap.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ._questions import ApprovalError


class TooManyAlways(ApprovalError):
    """The session already holds its cap of "always allow" decisions (revoke one first);
    nothing was changed."""


@runtime_checkable
class AlwaysStore(Protocol):
    """Where the "always allow" decisions of sessions live (every built-in ledger is one)."""

    async def allow_always(self, scope: str, name: str, *, now: float, limit: int) -> bool:
        """Let calls of tool ``name`` in session ``scope`` run unasked (``now``: Unix time,
        kept as when); whether it was added now (False: it was there). ``TooManyAlways``
        when ``scope`` holds ``limit`` other names."""
        ...

    async def always_allowed(self, scope: str, name: str) -> bool:
        """Whether calls of ``name`` in ``scope`` run unasked."""
        ...

    async def always(self, scope: str) -> list[str]:
        """The tool names ``scope`` always allows, oldest decision first."""
        ...

    async def revoke_always(self, scope: str, name: str) -> bool:
        """Forget ``name``'s decision in ``scope`` (its calls ask again); whether it had one."""
        ...


def check_room(scope: str, held: int, limit: int) -> None:
    """The cap rule: ``TooManyAlways`` when ``scope`` holds ``held`` >= ``limit`` names (and
    the name to add is not among them)."""
    if held >= limit:
        raise TooManyAlways(
            f"session {scope[:40]!r} always allows {held} tools already (the cap is {limit}): "
            "revoke one first"
        )


class MemoryAlways:
    """An :class:`AlwaysStore` in a dict (one process); at most ``max_scopes`` sessions, the
    oldest forgotten past it (its tools then ask again: the safe side)."""

    def __init__(self, max_scopes: int = 10_000) -> None:
        self._always: dict[str, dict[str, float]] = {}
        self._max_scopes = max_scopes

    async def allow_always(self, scope: str, name: str, *, now: float, limit: int) -> bool:
        """See :meth:`AlwaysStore.allow_always`."""
        names = self._always.get(scope, {})
        if name in names:
            return False
        check_room(scope, len(names), limit)
        self._always[scope] = self._always.pop(scope, names)  # (now the newest session)
        names[name] = now
        while len(self._always) > self._max_scopes:
            del self._always[next(iter(self._always))]
        return True

    async def always_allowed(self, scope: str, name: str) -> bool:
        """See :meth:`AlwaysStore.always_allowed`."""
        return name in self._always.get(scope, ())

    async def always(self, scope: str) -> list[str]:
        """See :meth:`AlwaysStore.always`."""
        names = self._always.get(scope, {})
        return sorted(names, key=lambda n: (names[n], n))

    async def revoke_always(self, scope: str, name: str) -> bool:
        """See :meth:`AlwaysStore.revoke_always`."""
        names = self._always.get(scope)
        if names is None or name not in names:
            return False
        del names[name]
        if not names:
            del self._always[scope]
        return True
