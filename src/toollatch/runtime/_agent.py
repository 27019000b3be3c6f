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

Agents are configurations; runs hold run state. This module holds :class:`Agent` (the
client, the tools and their dispatcher, the budgets: what lasts across runs). Each
:meth:`Agent.run` takes a frozen :class:`~._run_setup.RunSetup` of it (with
:class:`RunLimits`, in :mod:`._run_setup`), so any number of runs may share one agent, at
once, each with its own conversation; one run, its rounds and its events are
:class:`AgentRun`'s, in :mod:`._agent_run`. Imports point one way: this module ->
``_agent_run`` -> ``_run_setup``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..core._errors import ErrorCode, UsageError
from ..core._gate import Deny, Policy, PolicyDecision
from ..core._limits import Limits
from ..core._preview import PreviewPolicy, PreviewUpdated
from ..ledger import AlwaysStore, ArgumentAudit, History, Ledger
from ..tools._results import ResultLimits
from ..tools._tools import Tool
from ._agent_run import AgentRun
from ._approvals import ApprovalPolicy
from ._clients import ModelClient
from ._dispatcher import Dispatcher
from ._observer import AgentObserver
from ._run_setup import RunLimits, RunSetup, Toolbox, ToolSource

__all__ = ["Agent", "AgentRun", "RunLimits", "ToolSource", "user_message"]


class Agent:
    """Runs conversations of one model client with one set of tools.

    An agent is a configuration: it holds no run's state, so any number of its runs may go
    on at once (each :meth:`run` takes a snapshot of the agent's settings; changing an
    attribute later changes later runs only).
    ``tools``: :class:`Tool` objects (``@toollatch.runtime.tool``). ``eager``: more tool names
    that may start before their round ends (besides ``eager=True`` tools). The agent's
    dispatcher lives as long as the agent and serves all its runs (``max_concurrency`` is
    over all of them); a call id runs at most once per *conversation*
    (:attr:`AgentRun.conversation`): the same id in another conversation is another call,
    and runs sharing a conversation share its dedupe and its session lock (their tools never
    run at once; a call id one of them ran gets its result in the other).
    ``system`` and ``max_tokens`` go with every request; ``limits`` and ``previews`` are the
    core's (argument sizes, depth; preview notices are not agent events).
    ``eager_start=False`` is the master switch off: no call starts before its round ends.
    ``drop_failed``: error codes whose failed calls are dropped from the history with their
    results (``drop_with_protocol_repair``; events and ``rounds`` still show them).
    ``observers`` see the run (:class:`AgentObserver`: metrics, spans, logs). ``ledger``
    (:mod:`toollatch.ledger`) makes a call id run at most once across processes, scoped by
    the conversation: with a ``history_store`` that is the run's session (``session``, or
    ``run(session=...)``: one session is one stored run, which ``resume`` continues), so
    give each run its own session id; ``lease_s`` is how long a ledger claim lives unrenewed
    (renewed every third of it while the call runs): a dead process's call is taken over after
    it;
    ``audit`` (opt-in) keeps a redacted record of each call that did not commit.
    ``approvals``: which calls wait for a person besides those of ``needs_approval`` tools,
    and for how long (:class:`ApprovalPolicy`); a waiting call is answered with
    :meth:`AgentRun.approve` / ``deny`` / ``submit_result``, and its question lives in the
    ``ledger`` (a resumed run finds it); ``always_store``: where "always allow" decisions
    live (default: the ledger, else this agent's memory; see :meth:`run`).
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
        lease_s: float = 30.0,
        approvals: ApprovalPolicy | None = None,
        always_store: AlwaysStore | None = None,
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
        self.on_preview = on_preview
        self.tool_source = tool_source
        self.policy = _with_source(tool_source, policy)
        own = tuple(tools)
        if tool_source is not None:
            tools = (*own, *tool_source.snapshot())
        self.dispatcher = Dispatcher(
            tools,
            eager=eager,
            max_concurrency=max_concurrency,
            default_timeout_s=default_timeout_s,
            ledger=ledger,
            lease_s=lease_s,
            audit=audit,
            result_limits=result_limits,
            redaction=previews,
            approvals=approvals,
            always_store=always_store,
        )
        self._tools = Toolbox(self.dispatcher, own, tool_source, eager_start=eager_start)
        self._attempts = 0  # the last attempt number given (see _next_attempt)

    def run(
        self,
        message: str | None = None,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        resume: bool = False,
        conversation: str | None = None,
        session: str | None = None,
        approval_session: str | None = None,
    ) -> AgentRun:
        """A run from ``history`` (the provider's format) plus ``message`` as a user turn.

        With a ``history_store``, the run's history is stored after every round under
        ``session`` (default: the agent's ``session``; one session is one stored run, so
        runs of one agent that go on at once each need their own); ``resume=True``
        continues the session's stored run instead (``message``, if given, is a new user
        turn after it).

        ``conversation`` names the conversation the run belongs to: call ids are deduped
        within it (in this process and, with a ``ledger``, as the ledger's scope), never
        across conversations. Default: the run's ``session`` when the agent has a
        ``history_store`` (the stored run), else a new id for each run, so two runs with
        their own histories never answer each other's calls (servers that number ids per
        response reuse ``call_0``); pass the same id to a run that continues another's
        history. Runs of one agent may go on at once, each with its own history, events and
        budgets.

        ``approval_session`` is where "always allow" decisions (``approve(...,
        always=True)``) are kept and read, shared by every run that names it: default the
        run's ``session`` (``toollatch run --resume`` keeps it); the relay gives every run of
        a browser session the same one. Raises ``UsageError`` when there is no message,
        history or resume, for ``resume`` without a store, or for an empty or non-str
        ``conversation``, ``session`` or ``approval_session``.
        """
        for what, value in (
            ("conversation", conversation), ("session", session),
            ("approval_session", approval_session),
        ):  # fmt: skip
            if value is not None and not (isinstance(value, str) and value):
                raise UsageError(f"{what} must be a non-empty str, got {value!r:.60}")
        session = session or self.session
        entries = [dict(m) for m in history]
        if message is not None:
            entries.append(user_message(self.client.provider, message))
        if resume and self.history_store is None:
            raise UsageError("resume=True needs the agent's history_store")
        if not entries and not resume:
            raise UsageError("a run needs a message or a history")
        if conversation is None:
            conversation = session
            if self.history_store is None:
                conversation = f"{session}/{secrets.token_hex(8)}"
        setup = self._setup(session)
        return AgentRun(
            setup, entries, resume=resume, conversation=conversation,
            approval_session=approval_session,
        )  # fmt: skip

    def _setup(self, session: str) -> RunSetup:
        """The snapshot a new run (of ``session``) takes of this agent."""
        return RunSetup(
            client=self.client,
            system=self.system,
            max_tokens=self.max_tokens,
            run_limits=self.run_limits,
            limits=self.limits,
            previews=self.previews,
            policy=self.policy,
            drop_failed=frozenset(self.drop_failed),
            observers=tuple(self.observers),
            on_preview=self.on_preview,
            history_store=self.history_store,
            session=session,
            dispatcher=self.dispatcher,
            tools=self._tools,
            next_attempt=self._next_attempt,
        )

    def _next_attempt(self, after: int = 0) -> int:
        """A new attempt number for each request of this agent's life, above ``after`` (the
        highest one the conversation's history already holds in made-up ids): a call id
        made up for a provider that sends none (Gemini) embeds it, so such ids never repeat
        across runs nor in a conversation continued from its history (``resume``, a later
        process), where the counter starts again (the dispatcher dedupes by call id)."""
        self._attempts = max(self._attempts, after) + 1
        return self._attempts


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
    if provider == "bedrock":  # Converse content is always a list of blocks
        return {"role": "user", "content": [{"text": text}]}
    if provider in ("openai_chat", "openai_responses", "anthropic"):
        return {"role": "user", "content": text}  # (a Responses input item reads the same)
    raise UsageError(f"no user message format for provider {provider!r}")
