"""What an :class:`Agent` tells its observers (internal; metrics, spans and logs use it).

An observer sees the run as the loop sees it, synchronously, in order: the core's notices
as the stream is fed, each decided :class:`Round`, every agent event, and any attempt to
run a call that was not committed (the dispatcher refused it). Observers must be quick and
must not raise: they run inside the loop. They get argument values (in events and Rounds);
what they export is theirs to redact (:mod:`toollatch.runtime._metrics` and
:mod:`toollatch.runtime._telemetry` export none).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..core._round import Round
from ._agent_events import AgentEvent


@runtime_checkable
class AgentObserver(Protocol):
    """Receives a run's notices, rounds and events (every method returns at once)."""

    def on_round_start(self, provider: str, round_no: int) -> None:
        """Round ``round_no`` (1-based within its run) is about to send its request."""

    def on_notice(self, provider: str, notice: object) -> None:
        """A core notice (``CallAnnounced``, ``CallComplete``, ``CallReady``...)."""

    def on_round(self, provider: str, round_: Round) -> None:
        """The round is decided (before its batch calls run)."""

    def on_event(self, provider: str, event: AgentEvent) -> None:
        """An agent event, as it is emitted (tool events included)."""

    def on_not_committed(self, provider: str, detail: str) -> None:
        """Something tried to run a call that is not committed; the dispatcher refused."""
