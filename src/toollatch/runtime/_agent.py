"""The agent loop: model request -> stream -> gate -> tools -> results -> next round
(internal; public names in :mod:`toollatch.runtime`).

Theory of operation. :meth:`Agent.run` returns an :class:`AgentRun`, an async iterator of
agent events. Its driver task plays rounds until the model stops calling tools or a budget
ends the run (``max_rounds``, ``max_tool_calls``, ``deadline_s``). Each round is one attempt:
a fresh :class:`toollatch.StreamParser` (new buffers) fed with the raw bytes of one
:class:`ModelClient` stream, and one :class:`DispatchRound`:

* while the stream runs, the parser's notices become events (``text``, ``call_opened``) and
  a ``CallReady`` (an eager tool the provider has moved on from: the core decides) starts at
  once, with a ``call_committed`` event marked ``early``;
* at the round's end the Round is authoritative: its committed calls run (batch) if it ended
  normally, else every started call is cancelled (``abort``); either way every call gets one
  result, in call order;
* the assistant entries and the results are appended to the history in the provider's
  format, so the history is valid to send again after every round, and after an
  interruption at any point (a model error, a timeout, ``cancel()``, the deadline).

A stream that stalls (``StreamTimeout``) or drops (``StreamInterrupted``) fails the round's
undecided calls with ``idle_timeout`` / ``stream_interrupted``; the next round sends their
error results to the model. A request that fails before its stream starts (HTTP error,
connection refused, no first byte) ends the run with ``run_ended.error`` set. A retried
request is always a new attempt with new buffers.

This module holds :class:`Agent` (the client, the tools and their dispatcher, the budgets:
what lasts across runs) and :class:`RunLimits`; one run, its rounds and its events are
:class:`AgentRun`'s, in :mod:`._agent_run`.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .._errors import ConfigError, ErrorCode, UsageError
from .._gate import Deny, Policy, PolicyDecision
from .._limits import Limits
from .._preview import PreviewPolicy, PreviewUpdated
from ..ledger import ArgumentAudit, History, Ledger
from ._agent_events import AgentEvent, ToolFinishedEvent, ToolStartedEvent
from ._agent_run import AgentRun
from ._clients import ModelClient
from ._dispatcher import Dispatcher
from ._observer import AgentObserver
from ._results import ResultLimits
from ._tools import Tool

__all__ = ["Agent", "AgentRun", "RunLimits", "ToolSource", "user_message"]


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


class Agent:
    """Runs conversations of one model client with one set of tools.

    ``tools``: :class:`Tool` objects (``@toollatch.runtime.tool``). ``eager``: more tool names
    that may start before their round ends (besides ``eager=True`` tools). The agent's
    dispatcher lives as long as the agent; a call id runs at most once per *conversation*
    (:attr:`AgentRun.conversation`): the same id in another conversation is another call.
    ``system`` and ``max_tokens`` go with every request; ``limits`` and ``previews`` are the
    core's (argument sizes, depth; preview notices are not agent events).
    ``eager_start=False`` is the master switch off: no call starts before its round ends.
    ``drop_failed``: error codes whose failed calls are dropped from the history with their
    results (``drop_with_protocol_repair``; events and ``rounds`` still show them).
    ``observers`` see the run (:class:`AgentObserver`: metrics, spans, logs). ``ledger``
    (:mod:`toollatch.ledger`) makes a call id run at most once across processes, scoped by
    the conversation: with a ``history_store`` that is ``session`` (one session is one stored
    run, which ``resume`` continues), so give each run its own session id;
    ``audit`` (opt-in) keeps a redacted record of each call that did not commit.
    ``on_preview`` gets each (redacted) :class:`PreviewUpdated` of ``previews``, called by the
    run's iterator in stream order with the events (the relay's hook; nothing else goes to it).
    ``result_limits``: the size budgets of tool results (:class:`ResultLimits`); every tool
    result also passes the ``redactor`` of ``previews`` (the same policy object) before it is
    stored, emitted or sent to the model.
    ``tool_source`` adds tools that may change between rounds: before each round the agent
    takes its :meth:`ToolSource.refresh` (a name may not repeat one of ``tools``), and its
    ``check`` runs in the gate before ``policy`` (the gate's hook, ``Gate(policy=...)``).
    """

    def __init__(
        self,
        client: ModelClient,
        tools: Sequence[Tool[Any, Any]],
        *,
        eager: Sequence[str] = (),
        system: str | None = None,
        max_tokens: int | None = None,
        run_limits: RunLimits | None = None,
        limits: Limits | None = None,
        session: str = "default",
        max_concurrency: int = 8,
        default_timeout_s: float | None = 30.0,
        previews: PreviewPolicy | None = None,
        eager_start: bool = True,
        drop_failed: Collection[ErrorCode] = (),
        observers: Sequence[AgentObserver] = (),
        ledger: Ledger | None = None,
        history_store: History | None = None,
        on_preview: Callable[[PreviewUpdated], None] | None = None,
        result_limits: ResultLimits | None = None,
        tool_source: ToolSource | None = None,
        policy: Policy | None = None,
        audit: ArgumentAudit | None = None,
    ) -> None:
        if not isinstance(client, ModelClient):
            raise UsageError(f"client must be a ModelClient (model_client()), got {client!r:.60}")
        self.client = client
        self.system = system
        self.max_tokens = max_tokens
        self.run_limits = run_limits or RunLimits()
        self.limits = limits or Limits()
        self.session = session
        self.ledger = ledger
        self.history_store = history_store
        self.audit = audit
        self.previews = previews
        self.drop_failed = frozenset(drop_failed)
        self.observers = tuple(observers)
        self._sink: asyncio.Queue[AgentEvent | PreviewUpdated | None] | None = None
        self.on_preview = on_preview
        self._attempts = 0
        self.tool_source = tool_source
        self.policy = _with_source(tool_source, policy)
        self._own_tools = tuple(tools)
        if tool_source is not None:
            tools = (*self._own_tools, *tool_source.snapshot())
        self._eager_start = eager_start
        self.dispatcher = Dispatcher(
            tools,
            eager=eager,
            max_concurrency=max_concurrency,
            default_timeout_s=default_timeout_s,
            on_event=self._tool_event,
            ledger=ledger,
            audit=audit,
            result_limits=result_limits,
            redaction=previews,
        )
        self._take_tools()

    def run(
        self,
        message: str | None = None,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        resume: bool = False,
        conversation: str | None = None,
    ) -> AgentRun:
        """A run from ``history`` (the provider's format) plus ``message`` as a user turn.

        With a ``history_store``, the run's history is stored after every round under the
        agent's ``session``; ``resume=True`` continues the session's stored run instead
        (``message``, if given, is a new user turn after it).

        ``conversation`` names the conversation the run belongs to: call ids are deduped
        within it (in this process and, with a ``ledger``, as the ledger's scope), never
        across conversations. Default: the agent's ``session`` when it has a
        ``history_store`` (the stored run), else a new id for each run, so two runs with
        their own histories never answer each other's calls (servers that number ids per
        response reuse ``call_0``); pass the same id to a run that continues another's
        history. Raises ``UsageError`` when there is no message, history or resume, for
        ``resume`` without a store, for an empty or non-str ``conversation``, or (when
        iterated) while another run of this agent is being iterated.
        """
        if conversation is not None and not (isinstance(conversation, str) and conversation):
            raise UsageError(f"conversation must be a non-empty str, got {conversation!r:.60}")
        entries = [dict(m) for m in history]
        if message is not None:
            entries.append(user_message(self.client.provider, message))
        if resume and self.history_store is None:
            raise UsageError("resume=True needs the agent's history_store")
        if not entries and not resume:
            raise UsageError("a run needs a message or a history")
        if conversation is None:
            conversation = self.session
            if self.history_store is None:
                conversation = f"{self.session}/{secrets.token_hex(8)}"
        return AgentRun(self, entries, resume=resume, conversation=conversation)

    def _next_attempt(self, after: int = 0) -> int:
        """A new attempt number for each request of this agent's life, above ``after`` (the
        highest one the conversation's history already holds in made-up ids): a call id
        made up for a provider that sends none (Gemini) embeds it, so such ids never repeat
        across runs nor in a conversation continued from its history (``resume``, a later
        process), where the counter starts again (the dispatcher dedupes by call id)."""
        self._attempts = max(self._attempts, after) + 1
        return self._attempts

    async def _refresh_tools(self) -> None:
        """Take the tool source's current tools (between rounds)."""
        if self.tool_source is None:
            return
        current = (*self._own_tools, *await self.tool_source.refresh())
        if current == tuple(self.dispatcher.tools.values()):
            return  # (Tool objects compare by identity: a changed tool is a new object)
        self.dispatcher.replace_tools(current)
        self._take_tools()

    def _take_tools(self) -> None:
        """The eager names and the specs of the dispatcher's current tools."""
        may = self.dispatcher.may_start_early
        self._eager = tuple(n for n in self.dispatcher.tools if self._eager_start and may(n))
        # The core reads ToolSpec.eager too: with the switch off no spec may say eager.
        specs = self.dispatcher.specs
        self._specs = specs if self._eager_start else tuple(replace(s, eager=False) for s in specs)

    def _tool_event(self, event: ToolStartedEvent | ToolFinishedEvent) -> None:
        if self._sink is not None:
            for observer in self.observers:
                observer.on_event(self.client.provider, event)
            self._sink.put_nowait(event)


def _with_source(source: ToolSource | None, policy: Policy | None) -> Policy | None:
    """The gate's policy: the source's check first (a denial stands), then ``policy``."""
    if source is None:
        return policy

    def check(name: str, arguments: Mapping[str, Any]) -> PolicyDecision | bool | None:
        decision = source.check(name, arguments)
        if isinstance(decision, Deny) or decision is False or policy is None:
            return decision
        return policy(name, arguments)

    return check


def user_message(provider: str, text: str) -> dict[str, Any]:
    """A user turn holding ``text``, in ``provider``'s history format."""
    if provider == "gemini":
        return {"role": "user", "parts": [{"text": text}]}
    if provider in ("openai_chat", "openai_responses", "anthropic"):
        return {"role": "user", "content": text}  # (a Responses input item reads the same)
    raise UsageError(f"no user message format for provider {provider!r}")
