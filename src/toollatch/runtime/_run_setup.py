"""What one run of an agent needs, taken from the :class:`~._agent.Agent` when the run is made
(internal; the theory is in :mod:`._agent`).

An ``Agent`` is a configuration: it never holds the state of a run, so any number of runs
may share it, at once. :meth:`Agent.run` gives each :class:`~._agent_run.AgentRun` a
:class:`RunSetup`: a frozen snapshot of the client, the request settings, the budgets, the
core's limits and policies, the observers, the history store and the shared pieces every run
of the agent uses (the :class:`~._dispatcher.Dispatcher` with its dedupe memory, locks and
ledger; the :class:`Toolbox`; the attempt numbers). Changing an agent's attribute later
changes the runs made later, never one already made. What a run changes as it goes (its
history, rounds, events, budget, cancellation, the calls it has told) is the run's own.

Imports point one way: ``_agent`` -> ``_agent_run`` -> this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..core._errors import ConfigError, ErrorCode
from ..core._gate import Policy, PolicyDecision
from ..core._limits import Limits
from ..core._preview import PreviewPolicy, PreviewUpdated
from ..core._specs import ToolSpec
from ..ledger import History
from ..tools._tools import Tool
from ._clients import ModelClient
from ._dispatcher import Dispatcher
from ._observer import AgentObserver

DEFAULT_DEADLINE_S = 900.0
"""15 minutes: well above a normal run (``max_rounds`` 8 rounds of a minute or two of
generation plus tools that time out at 30 s by default), and a bound on a run that no other
limit stops: a stream that keeps sending without ending, a tool that ignores cancellation
between rounds. Long reasoning runs raise it (``RunLimits``, ``relay.deadline_s``,
``--deadline``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits:
    """Budgets of one run; the run ends (with a valid history) when one is spent."""

    max_rounds: int = 8
    """Model requests at most."""
    max_tool_calls: int = 64
    """Committed calls at most over the run (more fail ``budget_exceeded``)."""
    deadline_s: float | None = DEFAULT_DEADLINE_S
    """Wall-clock limit of the whole run (None: none); the round in flight is cancelled at
    it, every call paired (``cancelled``), and the run ends without an error."""
    call_stall_s: float | None = 60.0
    """Longest time a call may stay open without new argument bytes while the stream keeps
    sending (pings, other text): then its round fails ``idle_timeout``. A silent stream is
    the client's ``ClientLimits.idle_s``."""

    def __post_init__(self) -> None:
        for name in ("max_rounds", "max_tool_calls"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"RunLimits.{name} must be a positive integer, got {value!r}")
        for name in ("deadline_s", "call_stall_s"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ConfigError(f"RunLimits.{name} must be positive or None, got {value!r}")


class ToolSource(Protocol):
    """Tools that come from elsewhere and may change between rounds (an MCP tool source)."""

    def snapshot(self) -> Sequence[Tool[Any, Any]]:
        """The current tools, without I/O."""
        ...

    async def refresh(self) -> Sequence[Tool[Any, Any]]:
        """The current tools, after taking in the changes announced since the last call."""
        ...

    def check(self, name: str, arguments: Mapping[str, Any]) -> PolicyDecision | bool | None:
        """The gate's policy for the source's own tools (None: not the source's call)."""
        ...


@dataclass(frozen=True, slots=True)
class RoundTools:
    """The tools of one round, as its parser and its request see them."""

    specs: tuple[ToolSpec, ...]
    """For the parser: with the eager master switch off, no spec says ``eager``."""
    eager: tuple[str, ...]
    """The names that may start before the round ends."""
    requested: tuple[ToolSpec, ...]
    """For the model request: the dispatcher's specs as they are."""


class Toolbox:
    """An agent's tools as its rounds see them: its own, plus a tool source's current ones,
    run by the agent's dispatcher. Shared by the agent's runs (the source's changes are the
    agent's, not a run's); :meth:`refresh` is the only thing that replaces the dispatcher's
    tools, so a round that makes its dispatch round right after it (no ``await`` between)
    runs exactly the tools its parser's specs came from."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        own: Sequence[Tool[Any, Any]],
        source: ToolSource | None,
        *,
        eager_start: bool,
    ) -> None:
        self._dispatcher = dispatcher
        self._own = tuple(own)
        self._source = source
        self._eager_start = eager_start
        self._current = self._view()

    @property
    def current(self) -> RoundTools:
        """The tools as of the last refresh (or the agent's construction)."""
        return self._current

    async def refresh(self) -> RoundTools:
        """The tool source's current tools (without one: :attr:`current`)."""
        if self._source is None:
            return self._current
        tools = (*self._own, *await self._source.refresh())
        if tools != tuple(self._dispatcher.tools.values()):
            # (Tool objects compare by identity: a changed tool is a new object)
            self._dispatcher.replace_tools(tools)
            self._current = self._view()
        return self._current

    def _view(self) -> RoundTools:
        d = self._dispatcher
        on = self._eager_start
        eager = tuple(n for n in d.tools if on and d.may_start_early(n))
        # The core reads ToolSpec.eager too: with the switch off no spec may say eager.
        specs = d.specs
        parsed = specs if on else tuple(replace(s, eager=False) if s.eager else s for s in specs)
        return RoundTools(specs=parsed, eager=eager, requested=specs)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSetup:
    """What one run needs from its agent (see the module docstring); the fields mean what
    the :class:`~._agent.Agent` arguments of the same names mean."""

    client: ModelClient
    system: str | None
    max_tokens: int | None
    run_limits: RunLimits
    limits: Limits
    previews: PreviewPolicy | None
    policy: Policy | None
    drop_failed: frozenset[ErrorCode]
    observers: tuple[AgentObserver, ...]
    on_preview: Callable[[PreviewUpdated], None] | None
    history_store: History | None
    session: str
    """The stored run's id (with a ``history_store``)."""
    dispatcher: Dispatcher
    """Shared by the agent's runs: call ids are deduped per conversation, not per run."""
    tools: Toolbox
    """Shared by the agent's runs."""
    next_attempt: Callable[[int], int]
    """A new attempt number for each request of any run of the agent: a call id made up for
    a provider that sends none (Gemini: ``gemini:<attempt>:<position>``) embeds it, so such
    ids never repeat across the agent's runs, also when runs share a conversation (the
    dispatcher dedupes by call id there)."""
