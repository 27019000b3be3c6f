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
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .._errors import ConfigError, ErrorCode, UsageError
from .._events import CallKey, RoundEnd
from .._gate import CommittedCall, Deny, Policy, PolicyDecision, RunBudget
from .._limits import Limits
from .._messages import assistant_messages, tool_results_messages
from .._messages._repair import repaired_history
from .._pipeline import StreamParser
from .._preview import PreviewPolicy, PreviewUpdated
from .._round import Round, ToolResult
from ..assembly import CallAnnounced, CallReady, TextReceived
from ..ledger import ArgumentAudit, History, Ledger
from ._agent_events import (
    AgentEvent,
    CallCommittedEvent,
    CallFailedEvent,
    CallOpenedEvent,
    RoundEndedEvent,
    RunEndedEvent,
    TextEvent,
    ToolFinishedEvent,
    ToolStartedEvent,
)
from ._clients import ModelClient, ModelError, StreamInterrupted, StreamTimeout
from ._dispatcher import Dispatcher, DispatchRound
from ._observer import AgentObserver
from ._results import ResultLimits
from ._resume import StoredHistory
from ._tools import Tool


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits:
    """Budgets of one run; the run ends (with a valid history) when one is spent."""

    max_rounds: int = 8
    """Model requests at most."""
    max_tool_calls: int = 64
    """Committed calls at most over the run (more fail ``budget_exceeded``)."""
    deadline_s: float | None = None
    """Wall-clock limit of the whole run; the round in flight is cancelled at it."""
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


class _StallWatch:
    """When the open calls' argument bytes last grew (monotonic clock, read per chunk)."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s or 0.0
        self._seen: int | None = None
        self._since = 0.0

    def stalled(self, nbytes: int | None) -> bool:
        if not self.limit_s or nbytes is None:
            self._seen = None
            return False
        now = time.monotonic()
        if nbytes != self._seen:
            self._seen, self._since = nbytes, now
            return False
        return now - self._since > self.limit_s


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
    dispatcher lives as long as the agent: a call id runs at most once across its runs.
    ``system`` and ``max_tokens`` go with every request; ``limits`` and ``previews`` are the
    core's (argument sizes, depth; preview notices are not agent events).
    ``eager_start=False`` is the master switch off: no call starts before its round ends.
    ``drop_failed``: error codes whose failed calls are dropped from the history with their
    results (``drop_with_protocol_repair``; events and ``rounds`` still show them).
    ``observers`` see the run (:class:`AgentObserver`: metrics, spans, logs). ``ledger``
    (:mod:`toollatch.ledger`) makes a call id run at most once across processes, scoped by
    ``session``: give each run its own session id (providers reuse ids such as ``call_1``);
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
        may = self.dispatcher.may_start_early
        self._eager = tuple(n for n in self.dispatcher.tools if eager_start and may(n))
        # The core reads ToolSpec.eager too: with the switch off no spec may say eager.
        specs = self.dispatcher.specs
        self._specs = specs if eager_start else tuple(replace(s, eager=False) for s in specs)

    def run(
        self,
        message: str | None = None,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        resume: bool = False,
    ) -> AgentRun:
        """A run from ``history`` (the provider's format) plus ``message`` as a user turn.

        With a ``history_store``, the run's history is stored after every round under the
        agent's ``session``; ``resume=True`` continues the session's stored run instead
        (``message``, if given, is a new user turn after it). Raises ``UsageError`` when there
        is no message, history or resume, for ``resume`` without a store, or (when iterated)
        while another run of this agent is being iterated.
        """
        entries = [dict(m) for m in history]
        if message is not None:
            entries.append(user_message(self.client.provider, message))
        if resume and self.history_store is None:
            raise UsageError("resume=True needs the agent's history_store")
        if not entries and not resume:
            raise UsageError("a run needs a message or a history")
        return AgentRun(self, entries, resume=resume)

    def _next_attempt(self) -> int:
        """A new attempt number for each request of this agent's life: a call id made up for
        a provider that sends none (Gemini) embeds it, so such ids never repeat across runs
        (the dispatcher dedupes by call id)."""
        self._attempts += 1
        return self._attempts

    async def _refresh_tools(self) -> None:
        """Take the tool source's current tools (between rounds)."""
        if self.tool_source is None:
            return
        current = (*self._own_tools, *await self.tool_source.refresh())
        if current == tuple(self.dispatcher.tools.values()):
            return  # (Tool objects compare by identity: a changed tool is a new object)
        self.dispatcher.replace_tools(current)
        may = self.dispatcher.may_start_early
        self._eager = tuple(n for n in self.dispatcher.tools if self._eager_start and may(n))
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


class AgentRun:
    """One run of an :class:`Agent`: ``async for event in run`` (see the module docstring).

    ``history`` is the provider-format history, valid to send again after every round;
    ``rounds`` the rounds played; ``error`` why the run stopped early (a model error), if it
    did. :meth:`cancel` stops the run: the round in flight is cancelled, every call paired.
    """

    def __init__(
        self, agent: Agent, history: list[dict[str, Any]], *, resume: bool = False
    ) -> None:
        self.agent = agent
        self.history = history
        self._resume = resume
        store = agent.history_store
        self._stored = StoredHistory(store, agent.session) if store is not None else None
        self.rounds: list[Round] = []
        self.results: list[list[ToolResult]] = []
        self.error: str | None = None
        self._events: asyncio.Queue[AgentEvent | PreviewUpdated | None] = asyncio.Queue()
        self._driver: asyncio.Task[None] | None = None
        self._budget = RunBudget(agent.run_limits.max_tool_calls)
        self._opened: set[CallKey] = set()

    def cancel(self) -> None:
        """Stop the run; the events still end with ``round_ended`` and ``run_ended``."""
        if self._driver is not None:
            self._driver.cancel()

    async def __aiter__(self) -> AsyncIterator[AgentEvent]:
        if self._driver is not None:
            raise UsageError("an AgentRun can be iterated once")
        if self.agent._sink is not None:
            raise UsageError("this agent is already running; one run at a time")
        if self._stored is not None:  # (misuse raises here, before any event)
            self.history = await self._stored.begin(self.history, resume=self._resume)
        self.agent._sink = self._events
        self._driver = asyncio.get_running_loop().create_task(self._drive())
        try:
            while (event := await self._events.get()) is not None:
                if isinstance(event, PreviewUpdated):
                    if self.agent.on_preview is not None:
                        self.agent.on_preview(event)  # in order with the events around it
                else:
                    yield event
        finally:
            self.agent._sink = None
            if not self._driver.done():
                self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver

    # -- the driver ------------------------------------------------------------------------

    async def _drive(self) -> None:
        limits = self.agent.run_limits
        try:
            async with asyncio.timeout(limits.deadline_s):
                while len(self.rounds) < limits.max_rounds:
                    if not await self._round():
                        break
        except TimeoutError:
            self.error = None  # the deadline is a budget: the run ended
        except asyncio.CancelledError:
            pass  # cancel(): the round in flight was closed by _round
        finally:
            self._emit(self._run_ended())
            self._events.put_nowait(None)

    async def _round(self) -> bool:
        """Play one round; True when the model should be asked again."""
        agent = self.agent
        await agent._refresh_tools()
        for observer in agent.observers:
            observer.on_round_start(agent.client.provider, len(self.rounds) + 1)
        parser = StreamParser(
            agent.client.provider,
            tools=agent._specs,
            limits=agent.limits,
            budget=self._budget,
            attempt=agent._next_attempt(),
            eager=agent._eager,
            observe=True,
            previews=agent.previews,
            policy=agent.policy,
        )
        async with agent.dispatcher.round(agent.session) as dispatch:
            round_: Round | None = None
            try:
                round_ = await self._stream(parser, dispatch)
                if round_ is None:
                    return False  # the request failed before its stream began
                self._decided(round_)
                if round_.ended is RoundEnd.NORMAL:
                    results = await dispatch.finish(round_)
                else:
                    results = await dispatch.abort(round_)
            except BaseException:
                # cancel() or the deadline, while streaming or running: the round is
                # cancelled (a finished parser keeps its Round), every call paired
                if round_ is None:
                    round_ = parser.cancel()
                    self._decided(round_)
                self._close(round_, await dispatch.abort(round_))
                await self._persist()
                raise
            self._close(round_, results)
        await self._persist()
        # Ask again after tool calls, and after a stream that broke (a new attempt); a normal
        # or truncated answer without calls is the end.
        return bool(round_.calls) or round_.ended is RoundEnd.INTERRUPTED

    async def _persist(self) -> None:
        """Store the history's new entries (with a ``history_store``)."""
        if self._stored is not None:
            await self._stored.persist(self.history)

    async def _stream(self, parser: StreamParser, dispatch: DispatchRound) -> Round | None:
        """Feed the round's stream; None when no stream began (``error`` is set)."""
        agent = self.agent
        stream = agent.client.stream(
            self.history,
            tools=agent.dispatcher.specs,
            system=agent.system,
            max_tokens=agent.max_tokens,
        )
        try:
            async with stream as chunks:
                stall = _StallWatch(agent.run_limits.call_stall_s)
                try:
                    async for chunk in chunks:
                        self._notices(parser.feed(chunk), dispatch)
                        if stall.stalled(parser.open_argument_bytes()):
                            detail = f"a call's arguments did not grow for {stall.limit_s:g} s"
                            return parser.fail(ErrorCode.IDLE_TIMEOUT, detail)
                except StreamTimeout as exc:
                    return parser.fail(ErrorCode.IDLE_TIMEOUT, str(exc))
                except StreamInterrupted as exc:
                    return parser.fail(ErrorCode.STREAM_INTERRUPTED, str(exc))
        except ModelError as exc:
            self.error = str(exc)
            parser.cancel()
            return None
        round_ = parser.finish()
        self._notices(parser.finish_notices, dispatch)
        return round_

    def _notices(self, notices: Sequence[object], dispatch: DispatchRound) -> None:
        for notice in notices:
            for observer in self.agent.observers:
                observer.on_notice(self.agent.client.provider, notice)
            if isinstance(notice, TextReceived):
                if notice.choice == 0:
                    self._emit(TextEvent(text=notice.text))
            elif isinstance(notice, CallAnnounced):
                if notice.key.choice == 0 and notice.call_id and notice.name:
                    self._open(notice.key, notice.call_id, notice.name)
            elif isinstance(notice, CallReady):
                call = notice.call
                self._open(call.key, call.call_id, call.name)
                self._emit(
                    CallCommittedEvent(
                        id=call.call_id, name=call.name, arguments=call.arguments, early=True
                    )
                )
                self._start(dispatch, call)
            elif isinstance(notice, PreviewUpdated) and self.agent.on_preview is not None:
                self._events.put_nowait(notice)  # UIs (the relay), not the agent events

    def _start(self, dispatch: DispatchRound, call: object) -> None:
        """Start an eager call; a refusal for not being committed is told to observers
        (``tool_execute_rejected_not_committed_total``) before it propagates."""
        try:
            dispatch.start(call)  # type: ignore[arg-type]  # the dispatcher checks the type
        except UsageError as exc:
            if not isinstance(call, CommittedCall):
                for observer in self.agent.observers:
                    observer.on_not_committed(self.agent.client.provider, str(exc))
            raise

    def _open(self, key: CallKey, call_id: str, name: str) -> None:
        if key not in self._opened:
            self._opened.add(key)
            self._emit(CallOpenedEvent(id=call_id, name=name))

    def _decided(self, round_: Round) -> None:
        """``call_committed`` / ``call_failed`` for every call not told yet, in call order."""
        for observer in self.agent.observers:
            observer.on_round(self.agent.client.provider, round_)
        for call in round_.calls:
            if call.name is not None:
                self._open(call.key, call.call_id, call.name)
            if call.committed is not None:
                if not call.early:
                    self._emit(
                        CallCommittedEvent(
                            id=call.call_id,
                            name=call.committed.name,
                            arguments=call.committed.arguments,
                            early=False,
                        )
                    )
            else:
                self._emit(
                    CallFailedEvent(
                        id=call.call_id,
                        name=call.name,
                        error=str(call.error or ErrorCode.PROTOCOL_VIOLATION),
                        detail=call.detail,
                    )
                )

    def _close(self, round_: Round, results: list[ToolResult]) -> None:
        """Append the round and its results to the history; ``round_ended``."""
        self.rounds.append(round_)
        self.results.append(results)
        if self.agent.drop_failed:
            self.history += repaired_history(round_, results, self.agent.drop_failed)
        else:
            self.history += assistant_messages(round_)
            if any(c.name for c in round_.calls):
                self.history += tool_results_messages(round_, results)
        self._emit(
            RoundEndedEvent(
                round=len(self.rounds), ended=str(round_.ended), stop_reason=round_.stop_reason
            )
        )

    def _run_ended(self) -> RunEndedEvent:
        calls = []
        for round_, results in zip(self.rounds, self.results, strict=True):
            by_id = {r.tool_call_id: r for r in results}
            for call in round_.calls:
                result = by_id.get(call.call_id)
                calls.append(
                    {
                        "id": call.call_id,
                        "name": call.name,
                        "state": str(call.state),
                        "is_error": result.is_error if result else True,
                        "error": str(result.code) if result and result.code else None,
                    }
                )
        return RunEndedEvent(
            rounds=len(self.rounds), calls=calls, history=self.history, error=self.error
        )

    def _emit(self, event: AgentEvent) -> None:
        for observer in self.agent.observers:
            observer.on_event(self.agent.client.provider, event)
        self._events.put_nowait(event)
