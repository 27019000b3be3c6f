"""A run's history kept in a :class:`toollatch.ledger.History` store, so that another process
can resume the run by its session id (internal; used by the agent loop).

Only canonical messages are stored (what the next request sends: user turns, the assistant
entries of finished rounds and their results), appended after every round; never deltas or
half-assembled arguments. A round cut off by a crash is not stored: the resumed run asks the
model again from the last stored round, and the ledger decides what becomes of the calls the
dead process had claimed (a completed one returns its stored result, a started one is
"started, outcome unknown" unless its tool is idempotent).
"""

from __future__ import annotations

from typing import Any

from ..core._errors import UsageError
from ..ledger import History


class StoredHistory:
    """One run's view of the store: what it loaded, and how much of its history is stored."""

    def __init__(self, store: History, session: str) -> None:
        self.store = store
        self.session = session
        self._stored = 0

    async def begin(self, history: list[dict[str, Any]], *, resume: bool) -> list[dict[str, Any]]:
        """The run's starting history: the stored one followed by ``history`` when resuming
        (UsageError when nothing is stored), else ``history``, which is stored (UsageError
        when the session already has a stored history: one session is one run)."""
        loaded = await self.store.load(self.session)
        if resume and not loaded:
            raise UsageError(f"nothing is stored for session {self.session!r}: nothing to resume")
        if not resume and loaded:
            raise UsageError(
                f"session {self.session!r} already has a stored history of {len(loaded)} "
                "messages: resume it, or start the run under a new session"
            )
        self._stored = len(loaded)
        started = [*loaded, *history] if resume else history
        await self.persist(started)
        return started

    async def persist(self, history: list[dict[str, Any]]) -> None:
        """Append what ``history`` has beyond the stored part (a ``HistoryConflict`` when
        another process appended to this run meanwhile)."""
        if len(history) > self._stored:
            self._stored = await self.store.append(
                self.session, history[self._stored :], at=self._stored
            )
