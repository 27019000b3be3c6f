"""The dispatcher: runs committed calls (internal; public names in :mod:`toollatch.runtime`).

Theory of operation. A :class:`Dispatcher` owns the tools and what must hold across rounds:
the memory of call ids already run (dedupe), one lock per session, one lock per tool group and
the concurrency semaphore. Each model round is a :class:`DispatchRound`, an async context
manager around an ``asyncio.TaskGroup`` that owns every task the round starts::

    d = Dispatcher(tools, on_event=print)
    parser = StreamParser("anthropic", tools=d.specs)
    round_ = None
    async with d.round(session="s1") as r:
        try:
            ...                       # feed the stream; r.start(call) for eager calls
            round_ = parser.finish()
            results = await r.finish(round_)
        except asyncio.CancelledError:
            round_ = round_ or parser.cancel()
            results = await r.abort(round_)   # record them, then
            raise
    history += assistant_messages(round_)
    history += tool_results_messages(round_, results)   # always pairs: one result per call

A call's task waits for its session's lock (held from the round's first tool start until the
round closes, so two rounds of one session never run tools at once), then its group's lock,
then a semaphore slot; only then it *starts* (``ToolStartedEvent``) and runs under its
deadline. Every task records its result on its slot before it ends, cancelled or not, so that
``finish``/``abort`` always return one result per call of the round, in call order. A round's
only call to start at ``finish`` (a tool's run alone: no approval, no ledger, no distributed
lock, no eager task of the round still running) is awaited by ``finish`` itself instead of a
task: the same steps, cancelled with the task that called ``finish``
(``DispatchRound._inline``).

Dedupe: a call id runs at most once per session (the conversation: an :class:`Agent` gives
each of its conversations a session of its own, since servers that number ids per response
reuse ``call_0`` in every conversation). A later call of the session with the same id and the
same name and arguments gets the first run's result, whatever it is (waiting for it if it
still runs in another round); with other arguments it gets ``duplicate_call_id``. The same id
in another session is another call. Every committed call's result is told by one
``ToolFinishedEvent``, also when the tool did not run here (a stored result, a ledger's
"outcome unknown", a cancel before it started). Two cases are
forgotten so the id may run later: a call that never started here (cancelled before it
started, ``ledger_unavailable``, a session lock busy past its wait), and a call of an
``idempotent`` tool whose outcome is unknown (cancelled while running, timed out). The memory
keeps the newest ``max_remembered_calls`` ids.

Durable, cross-process dedupe is the ledger's job: with ``ledger=...`` every call that would
run is first claimed in the ledger under its session (the scope: use a run id that survives a
restart), and what happens next (the stored result, waiting for a live worker, "started,
outcome unknown" for a dead one, a re-run of an idempotent tool) is :mod:`._ledger_run`'s
policy. A running tool reads its call, idempotency key and fencing token with
``toollatch.ledger.current_call()``.

Results: a tool's outcome becomes its ``ToolResult`` through :mod:`._results` (redacted with
the ``redactor``, then cut to the call's size budget) before anything stores
or emits it, so the memo, the ledger, the events and the history only ever hold the shaped
result. Error results the dispatcher makes itself are cut to the budget, never redacted.

Limits of the design: a dispatcher belongs to one event loop (its locks do). A worker thread
cannot be stopped, so a sync tool that timed out or was cancelled finishes in the background
(with its result discarded) and holds one of the default executor's threads until then. A
round of a session opened inside another open round of the same session waits for it forever
(the session rule), so close a round before the next one starts.

This module holds :class:`Dispatcher` (the options, checked once); what lasts across rounds
is one :class:`~._dispatch_state.DispatchState` (:mod:`._dispatch_state`), which each round
gets; one round is :class:`DispatchRound`'s, in :mod:`._dispatch_round`, and a call's slot,
memo and the error results the dispatcher makes are in :mod:`._dispatch_calls`. Imports point
one way: this module -> round -> state -> calls.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..core._errors import ConfigError, UsageError
from ..core._gate import Gate
from ..core._preview import PreviewPolicy, Redactor
from ..core._round import Round, ToolResult
from ..core._specs import ToolSpec
from ..ledger import AlwaysStore, ArgumentAudit, Ledger, Question, SessionLocks
from ..tools._results import ResultLimits, ResultShaper
from ..tools._tools import MAX_DETAIL_CHARS, Tool
from ._approvals import ApprovalPolicy, Approvals
from ._dispatch_round import DispatchRound, result_text
from ._dispatch_state import DispatchState, OnEvent, ToolEvent
from ._ledger_run import Clock, LedgerGuard, default_clock

__all__ = ["DispatchRound", "Dispatcher", "OnEvent", "ToolEvent"]


class Dispatcher:
    """Runs committed calls of the given tools; see the module docstring.

    ``max_concurrency``: calls running at once across every round and session.
    ``default_timeout_s``: the run-time limit of a call whose tool sets none (None: no limit).
    ``eager``: names of tools that may start early besides those declared ``eager=True``.
    ``on_event``: told every :data:`ToolEvent` of every round (a round may have its own too:
    :meth:`round`).
    ``ledger``: claim every call there before running it (see the module docstring), as
    ``worker`` (default: host, pid and a random suffix), with claims that live ``lease_s``
    unless renewed (a heartbeat renews them while a call waits or runs), checking a call
    another worker runs every ``poll_s``; ``clock`` gives Unix time (tests pass their own).
    ``session_locks``: a distributed lock per session (``redis_session_locks``), held like
    the in-process one from a round's first tool start until its ``async with`` exits; when
    it is lost the round's running calls are cancelled and leaving the block raises
    ``LockLost``. ``audit`` (off by default): a redacted, bounded, expiring record of every
    call of a round that did not commit, written beside the tools once the round's
    ``finish`` or ``abort`` is called (a task of the round: the block waits for it).
    ``result_limits``: the size budgets of results (:class:`ResultLimits`; default 64 KiB
    each); ``redactor``: ``redactor(pointer, text) -> text``, which every tool's result
    passes (see :func:`redact_result`; None: no redaction; results over 64 Ki characters are
    redacted in a worker thread, so it must be thread-safe); ``redaction``: a
    ``PreviewPolicy`` whose ``redactor`` is taken (its preview settings do not apply to
    results), for one redactor shared with the previews; not with ``redactor``.
    ``approvals``: which calls wait for a person besides those of ``needs_approval``
    tools, and for how long (:class:`ApprovalPolicy`); their questions live in ``ledger``
    when it keeps them (every built-in one does), so a restarted process finds them, and
    ``clock`` times them. Answer them with :meth:`approve`, :meth:`deny` and
    :meth:`submit_result` (``AgentRun`` has the same, for its own session). ``always_store``:
    where sessions' "always allow" decisions live (default: ``ledger``, else memory; see
    :meth:`approve`).
    Raises ``ConfigError`` for duplicate tool names, unknown eager names or bad limits.
    """

    def __init__(
        self,
        tools: Sequence[Tool[Any, Any]],
        *,
        max_concurrency: int = 8,
        default_timeout_s: float | None = 30.0,
        eager: Iterable[str] = (),
        on_event: OnEvent | None = None,
        max_remembered_calls: int = 100_000,
        ledger: Ledger | None = None,
        worker: str | None = None,
        lease_s: float = 30.0,
        poll_s: float = 0.1,
        clock: Clock = default_clock,
        session_locks: SessionLocks | None = None,
        audit: ArgumentAudit | None = None,
        result_limits: ResultLimits | None = None,
        redaction: PreviewPolicy | None = None,
        approvals: ApprovalPolicy | None = None,
        redactor: Redactor | None = None,
        always_store: AlwaysStore | None = None,
    ) -> None:
        by_name = _by_name(tools)
        eager = frozenset(eager)
        if unknown := sorted(eager - by_name.keys()):
            raise ConfigError(f"eager names no tool: {unknown}")
        _check_positive_int("max_concurrency", max_concurrency)
        _check_positive_int("max_remembered_calls", max_remembered_calls)
        if default_timeout_s is not None and not (
            isinstance(default_timeout_s, int | float)
            and math.isfinite(default_timeout_s)
            and default_timeout_s > 0
        ):
            raise ConfigError("default_timeout_s must be a positive number of seconds or None")
        guard = _guard(ledger, worker, lease_s, poll_s, clock)
        if session_locks is not None and not callable(session_locks):
            raise ConfigError(f"session_locks must be callable, got {session_locks!r:.60}")
        if always_store is not None and not isinstance(always_store, AlwaysStore):
            raise ConfigError(f"always_store must be an AlwaysStore, got {always_store!r:.60}")
        if audit is not None and not isinstance(audit, ArgumentAudit):
            raise ConfigError(f"audit must be a toollatch.ledger.ArgumentAudit, got {audit!r:.60}")
        self._state = DispatchState(
            by_name,
            eager=eager,
            max_concurrency=max_concurrency,
            default_timeout_s=default_timeout_s,
            on_event=on_event,
            max_remembered_calls=max_remembered_calls,
            guard=guard,
            session_locks=session_locks,
            audit=audit,
            results=ResultShaper(result_limits, redaction, redactor),
            approvals=Approvals(_approval_policy(approvals), ledger, clock, always=always_store),
        )

    @property
    def default_timeout_s(self) -> float | None:
        """The run-time limit of a call whose tool sets none (None: no limit)."""
        return self._state.default_timeout_s

    @property
    def tools(self) -> Mapping[str, Tool[Any, Any]]:
        """The tools by name (read-only; a new mapping after :meth:`replace_tools`)."""
        return self._state.tools

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools' specs, for ``StreamParser(tools=...)`` or ``Gate``."""
        return tuple(t.spec for t in self._state.tools.values())

    def replace_tools(self, tools: Sequence[Tool[Any, Any]]) -> None:
        """Run ``tools`` from now on (a tool source's list changed; call it between rounds):
        a round already made keeps the tools it was made with (so its calls run the tools
        its parser's specs came from); the dedupe memory, the locks and the ``eager`` names
        stay (an ``eager`` name no tool has any more is ignored).
        Raises ``ConfigError`` as the constructor does, leaving the tools unchanged."""
        self._state.set_tools(_by_name(tools))

    def may_start_early(self, name: str) -> bool:
        """True when a call of ``name`` may be passed to :meth:`DispatchRound.start`."""
        return self._state.may_start_early(name, self._state.tools)

    def round(
        self,
        session: str = "default",
        *,
        on_event: OnEvent | None = None,
        gate: Gate | None = None,
        approval_session: str | None = None,
    ) -> DispatchRound:
        """The tool execution of one model round of ``session`` (an async context manager),
        with the current tools; ``on_event`` is told this round's :data:`ToolEvent` (after
        the dispatcher's own ``on_event``): one dispatcher serves concurrent runs, each
        with its own events. ``gate`` checks the edited arguments of an approval (default:
        the tools' schemas with the default limits, no policy: pass the run's).
        ``approval_session``: whose "always allow" decisions apply (default ``session``)."""
        for value in (session, approval_session or session):
            if not isinstance(value, str):
                raise UsageError(f"session must be a str, got {value!r:.60}")
        return DispatchRound(
            self._state, session, on_event=on_event, gate=gate, always=approval_session
        )

    @property
    def approvals(self) -> Approvals:
        """Its questions (which calls wait, and for what: :meth:`Approvals.kind_of`)."""
        return self._state.approvals

    # -- answering the calls that wait (see ._approvals) --------------------------------------

    async def approve(
        self,
        session: str,
        call_id: str,
        *,
        args_sha256: str,
        args: Mapping[str, Any] | str | None = None,
        always: bool = False,
        approval_session: str | None = None,
    ) -> Question:
        """Approve the waiting call ``call_id`` of ``session`` with the SHA-256 of the
        arguments it committed with (``approval_requested``'s ``args_sha256``): it runs now.
        ``args``: run it with these arguments instead (an object, or its JSON text), which
        pass the whole gate again (``EditRejected`` and the call keeps waiting when they
        do not); its result then tells the model what ran. ``always``: also run the tool's
        later calls in approval session ``approval_session`` (default ``session``) without
        asking, in every round that names it, kept in the ``always_store`` (:meth:`revoke`
        undoes it). Raises an ``ApprovalError``: ``NotAsked``, ``AlreadyAnswered``,
        ``StaleArguments`` (another digest), ``WrongKind`` (a client tool's call),
        ``OtherSession``, ``EditRejected``, ``TooManyAlways`` (``ApprovalPolicy.max_always``
        reached); ``LedgerError`` when the ledger fails."""
        if not isinstance(args_sha256, str):
            raise UsageError("args_sha256 must be the hex SHA-256 of the committed arguments")
        return await self._state.approvals.answer(
            session, call_id, kind="approval", decision="approved", digest=args_sha256,
            value=None if args is None else _edited_text(args),
            always=(approval_session or session) if always else None,
        )  # fmt: skip

    async def deny(self, session: str, call_id: str, reason: str = "denied") -> Question:
        """Deny the waiting call: it gets an ``approval_denied`` error result with
        ``reason`` (the model reads it and goes on). Raises as :meth:`approve`."""
        if not isinstance(reason, str):
            raise UsageError("reason must be a str")
        if len(reason) > MAX_DETAIL_CHARS:  # (the model reads it: a reason, not a document)
            reason = reason[:MAX_DETAIL_CHARS] + "..."
        return await self._state.approvals.answer(
            session, call_id, kind="approval", decision="denied", reason=reason
        )

    async def submit_result(self, session: str, call_id: str, value: Any) -> Question:
        """Give a waiting client tool's call its result: a str as it is, anything else as
        compact JSON. Raises as :meth:`approve` (``WrongKind`` for a server tool's call)."""
        return await self._state.approvals.answer(
            session, call_id, kind="client", decision="result", value=result_text(value)
        )

    async def revoke(self, approval_session: str, name: str) -> bool:
        """Calls of tool ``name`` in ``approval_session`` ask again (undoes
        ``approve(always=True)``); whether it was always allowed. ``LedgerError`` when the
        store fails."""
        return await self._state.approvals.revoke(approval_session, name)

    async def always_allowed(self, approval_session: str) -> list[str]:
        """The tools ``approval_session`` always allows, oldest decision first."""
        return await self._state.approvals.always(approval_session)

    def pending(self, session: str) -> list[Question]:
        """The questions of ``session`` waiting in this process."""
        return self._state.approvals.pending(session)

    async def questions(self, session: str) -> list[Question]:
        """Every question of ``session`` the store keeps, pending or answered, oldest first:
        with a ledger, those a process that exited left too (a restarted server lists them,
        and may answer them before the run is resumed). ``LedgerError`` when it fails."""
        return await self._state.approvals.store.questions(session)

    async def run(self, round_: Round, *, session: str = "default") -> list[ToolResult]:
        """Run every committed call of ``round_`` (no eager starts): ``finish`` in a round of
        its own. Cancelled, it cancels the calls and raises ``CancelledError``; the results
        are lost with it, so a loop that must record them uses :meth:`round` and ``abort``."""
        async with self.round(session) as r:
            return await r.finish(round_)


def _guard(
    ledger: Ledger | None, worker: str | None, lease_s: float, poll_s: float, clock: Clock
) -> LedgerGuard | None:
    if ledger is None:
        return None
    if not isinstance(ledger, Ledger):
        raise ConfigError(f"ledger must be a toollatch.ledger.Ledger, got {ledger!r:.60}")
    for what, value in (("lease_s", lease_s), ("poll_s", poll_s)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{what} must be a positive number of seconds, got {value!r}")
    if worker is None:
        worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    elif not isinstance(worker, str) or not worker:
        raise ConfigError(f"worker must be a non-empty str, got {worker!r:.60}")
    return LedgerGuard(ledger, worker=worker, lease_s=lease_s, poll_s=poll_s, clock=clock)


def _edited_text(args: Mapping[str, Any] | str) -> str:
    """Edited arguments as the text the gate parses (``UsageError`` for no JSON form)."""
    if isinstance(args, str):
        return args
    if not isinstance(args, Mapping):
        raise UsageError(f"args must be a mapping or JSON text, got {type(args).__name__}")
    try:
        return json.dumps(dict(args), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"args have no JSON form: {exc}") from None


def _approval_policy(policy: ApprovalPolicy | None) -> ApprovalPolicy:
    if policy is None:
        return ApprovalPolicy()
    if not isinstance(policy, ApprovalPolicy):
        raise ConfigError(f"approvals must be an ApprovalPolicy, got {policy!r:.60}")
    return policy


def _by_name(tools: Sequence[Tool[Any, Any]]) -> dict[str, Tool[Any, Any]]:
    by_name: dict[str, Tool[Any, Any]] = {}
    for t in tools:
        if not isinstance(t, Tool):
            raise ConfigError(f"Dispatcher tools must be Tool objects (@tool), got {t!r:.60}")
        if t.name in by_name:
            raise ConfigError(f"tool {t.name!r} is given twice")
        by_name[t.name] = t
    return by_name


def _check_positive_int(what: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
