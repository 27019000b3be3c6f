"""One run of an :class:`Agent` (internal; the theory is in :mod:`._agent`): :class:`AgentRun`
drives the rounds (model request, the stream fed to a fresh parser and a dispatch round, the
history appended) and turns the parser's notices, the Round and the results into agent
events, in order, on the run's queue. It reads only its :class:`~._run_setup.RunSetup` (a
frozen snapshot of the agent) and keeps every piece of run state itself, its tool events
included (its dispatch rounds tell them to the run), so runs of one agent never share a
queue, a budget or a flag."""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..core._assembler import CallAnnounced, CallReady, TextReceived
from ..core._errors import ErrorCode, UsageError
from ..core._events import CallKey, RoundEnd
from ..core._gate import CommittedCall, Gate, RunBudget
from ..core._messages._ids import history_call_ids, id_repairs, pair_results
from ..core._pipeline import StreamParser
from ..core._preview import PreviewUpdated
from ..core._round import Round, ToolResult
from ..core._specs import ToolSpec
from ..tools._tasks import join
from ._agent_events import (
    AgentEvent,
    CallCommittedEvent,
    CallFailedEvent,
    CallOpenedEvent,
    RoundEndedEvent,
    RunEndedEvent,
    TextEvent,
)
from ._clients import ModelError, StreamInterrupted, StreamTimeout
from ._dispatcher import DispatchRound
from ._resume import StoredHistory, lost_results, round_entries
from ._run_setup import RoundTools, RunSetup


class AgentRun:
    """One run of an :class:`Agent` (made by :meth:`Agent.run`): ``async for event in run``
    (see the module docstring).

    ``history`` is the provider-format history, valid to send again after every round;
    ``rounds`` the rounds played; ``error`` why the run stopped early (a model error), if it
    did (the run deadline included: then ``deadline_passed`` is true); ``conversation`` the
    id its call ids are deduped under (see :meth:`Agent.run`).
    :meth:`cancel` stops the run: the round in flight is cancelled, every call paired.
    """

    def __init__(
        self,
        setup: RunSetup,
        history: list[dict[str, Any]],
        *,
        resume: bool = False,
        conversation: str | None = None,
        approval_session: str | None = None,
    ) -> None:
        self._setup = setup
        self.history = history
        self.conversation = conversation or setup.session
        self.approval_session = approval_session or setup.session
        """Whose "always allow" decisions this run reads and adds to (see :meth:`approve`)."""
        self._resume = resume
        store = setup.history_store
        self._stored = StoredHistory(store, setup.session) if store is not None else None
        self.rounds: list[Round] = []
        self.results: list[list[ToolResult]] = []
        self.error: str | None = None
        # the driver's events for the consumer, in order (None ends them); ``_wake`` is the
        # future the consumer waits on when it has read them all (one hand-over per batch:
        # a read's events wake the consumer once, and no coroutine is made per event)
        self._events: deque[AgentEvent | PreviewUpdated | None] = deque()
        self._wake: asyncio.Future[None] | None = None
        self._driver: asyncio.Task[None] | None = None
        self._budget = RunBudget(setup.run_limits.max_tool_calls)
        self._opened: set[CallKey] = set()
        self._cancelled = False
        self._started = False
        self._broken = 0  # rounds in a row whose stream broke (see _again)
        self._gates: tuple[RoundTools, Gate, Gate] | None = None  # (see _gates_of)
        self.deadline_passed = False
        """Whether ``RunLimits.deadline_s`` ended the run (``error`` then says so)."""

    def cancel(self, reason: str | None = None) -> None:
        """Stop the run; the events still end with ``round_ended`` and ``run_ended``.
        Asked before the run began (or before its driver's first step), no round is played:
        the events are just ``run_ended``. ``reason`` (e.g. the server shutting down) becomes
        ``error`` (``run_ended.error``); without it a cancelled run has no error."""
        if reason is not None and not self._cancelled:
            self.error = reason
        self._cancelled = True
        if self._driver is not None and self._started:
            # (a task cancelled before its first step would never run _drive's finally)
            self._driver.cancel()

    # -- answering the calls that wait for a person or a client ----------------------------

    async def approve(
        self,
        call_id: str,
        *,
        args_sha256: str,
        args: Mapping[str, Any] | str | None = None,
        always: bool = False,
    ) -> None:
        """Approve the call ``call_id`` this run waits on (an ``approval_requested`` event),
        naming the SHA-256 of its committed arguments (the event's ``args_sha256``): it runs
        now, exactly once. ``args``: approve it with edited arguments, which pass the whole
        gate again (strict parse, size, schema, the run's policy; ``EditRejected`` leaves
        the call waiting), and the result tells the model what ran. ``always``: later calls
        of the same tool in this run's :attr:`approval_session` run without asking, in this
        run and every other run of that session (kept in the ledger: a resumed or restarted
        run too) until :meth:`revoke`; at most ``ApprovalPolicy.max_always`` tools per
        session. Raises an ``ApprovalError`` (``NotAsked``, ``AlreadyAnswered``,
        ``StaleArguments``, ``WrongKind``, ``OtherSession``, ``EditRejected``,
        ``TooManyAlways``) and changes nothing then."""
        await self._setup.dispatcher.approve(
            self.conversation, call_id, args_sha256=args_sha256, args=args, always=always,
            approval_session=self.approval_session,
        )  # fmt: skip

    async def deny(self, call_id: str, reason: str = "denied") -> None:
        """Deny the waiting call: it gets an ``approval_denied`` error result with
        ``reason``, which the model reads; the run goes on. Raises as :meth:`approve`."""
        await self._setup.dispatcher.deny(self.conversation, call_id, reason)

    async def submit_result(self, call_id: str, value: Any) -> None:
        """The result of a client tool's call (a ``client_call`` event): a str, or any
        JSON-able value. Raises as :meth:`approve` (``WrongKind`` for a server tool)."""
        await self._setup.dispatcher.submit_result(self.conversation, call_id, value)

    async def revoke(self, name: str) -> bool:
        """Calls of tool ``name`` in this run's :attr:`approval_session` ask again (undoes
        ``approve(..., always=True)``, for every run of the session); whether it was always
        allowed. ``LedgerError`` when the ledger fails."""
        return await self._setup.dispatcher.revoke(self.approval_session, name)

    async def always_allowed(self) -> list[str]:
        """The tools this run's :attr:`approval_session` always allows, oldest first."""
        return await self._setup.dispatcher.always_allowed(self.approval_session)

    @property
    def pending(self) -> list[str]:
        """Ids of the calls this run waits on (in this process), oldest first."""
        return [q.key.call_id for q in self._setup.dispatcher.pending(self.conversation)]

    async def __aiter__(self) -> AsyncIterator[AgentEvent]:
        if self._driver is not None:
            raise UsageError("an AgentRun can be iterated once")
        if self._stored is not None:  # (misuse raises here, before any event)
            self.history = await self._stored.begin(self.history, resume=self._resume)
            await self._stored.mark(len(self.history), [], self._setup.client.provider)
        on_preview = self._setup.on_preview
        loop = asyncio.get_running_loop()
        self._driver = loop.create_task(self._drive())
        events = self._events
        try:
            while True:
                if not events:
                    self._wake = loop.create_future()
                    await self._wake
                    continue
                event = events.popleft()
                if event is None:
                    break
                if isinstance(event, PreviewUpdated):
                    if on_preview is not None:
                        on_preview(event)  # in order with the events around it
                else:
                    yield event
        finally:
            if not self._driver.done():
                self._driver.cancel()
            await join(self._driver)  # (a cancel of the consumer still propagates)

    # -- the driver ------------------------------------------------------------------------

    async def _drive(self) -> None:
        self._started = True
        limits = self._setup.run_limits
        deadline = asyncio.timeout(limits.deadline_s)
        try:
            async with deadline:
                while not self._cancelled and len(self.rounds) < limits.max_rounds:
                    if not await self._round():
                        break
        except TimeoutError:
            if not deadline.expired():
                raise
            # the round in flight was cancelled by _round (every call paired); the run did
            # not end of itself, so it says why (and ``toollatch run`` exits 124)
            self.deadline_passed = True
            self.error = (
                f"the run's deadline passed ({limits.deadline_s:g} s): the round in flight "
                "was cancelled"
            )
        except asyncio.CancelledError:
            pass  # cancel(): the round in flight was closed by _round
        finally:
            self._emit(self._run_ended())
            self._put(None)

    async def _round(self) -> bool:
        """Play one round; True when the model should be asked again."""
        setup = self._setup
        tools = await setup.tools.refresh()
        # no await from here to the dispatch round: it runs the tools the parser checks against
        parser, gate = self._parser(tools)
        round_scope = setup.dispatcher.round(
            self.conversation, on_event=self._emit, gate=gate,
            approval_session=self.approval_session,
        )  # fmt: skip
        async with round_scope as dispatch:
            round_: Round | None = None
            try:
                round_ = await self._stream(parser, dispatch, tools.requested)
                if round_ is None:
                    return False  # the request failed before its stream began
                round_ = _with_id_repairs(round_)
                self._decided(round_)
                if round_.ended is RoundEnd.NORMAL and not self._cancelled:
                    # (a cancel() told while the round was decided starts no call)
                    await self._mark(round_)
                    results = await dispatch.finish(round_)
                else:
                    results = await dispatch.abort(round_)
            except BaseException:
                # cancel() or the deadline, while streaming or running: the round is
                # cancelled (a finished parser keeps its Round), every call paired
                if round_ is None:
                    round_ = _with_id_repairs(parser.cancel())
                    self._decided(round_)
                self._close(round_, await dispatch.abort(round_))
                await self._persist()
                raise
            self._close(round_, results)
        await self._persist()
        # a round ended at a size limit (``limited``) is asked again when it had calls: their
        # error results go back to the model like any failed call's
        return await self._again(round_)

    def _parser(self, tools: RoundTools) -> tuple[StreamParser, Gate]:
        """The next round's parser (observers told the round starts), and the gate that
        edited arguments of an approval pass (the parser's checks but the call budget, which
        the call they replace spent)."""
        setup = self._setup
        provider = setup.client.provider
        for observer in setup.observers:
            observer.on_round_start(provider, len(self.rounds) + 1)
        reserved = history_call_ids(provider, self.history)
        checks, gate = self._gates_of(tools)
        parser = StreamParser(
            provider,
            framing=setup.client.framing,
            gate=checks,
            attempt=setup.next_attempt(_made_up_attempt(provider, self.history, reserved)),
            eager=tools.eager,
            observe=True,
            previews=setup.previews,
            # an id the history already holds is a new call (call_0 in every response)
            reserved_ids=reserved,
        )
        return parser, gate

    def _gates_of(self, tools: RoundTools) -> tuple[Gate, Gate]:
        """The gates of ``tools`` under the run's limits and policy, made once per tool set
        (a ``Gate`` holds no state of a call; the run's call budget is the run's own): the
        parser's, with the budget, and the one edited arguments of an approval pass (the
        parser's checks but the budget, which the call they replace spent)."""
        made = self._gates
        if made is None or made[0] is not tools:
            limits, policy = self._setup.limits, self._setup.policy
            made = self._gates = (
                tools,
                Gate(tools.specs, limits=limits, policy=policy, budget=self._budget),
                Gate(tools.specs, limits=limits, policy=policy),
            )
        return made[1], made[2]

    async def _again(self, round_: Round) -> bool:
        """Whether to ask the model again after ``round_``: after tool calls; after a stream
        that broke (an error event, a drop, a stall: a new attempt) at most the client's
        ``RetryPolicy.stream_retries`` times in a row, each after its backoff. A normal or
        truncated answer without calls is the end; so is one more broken stream, or one
        with no round left, and then the run ends with ``error`` set (it got no answer)."""
        if round_.ended is not RoundEnd.INTERRUPTED:
            self._broken = 0
            return bool(round_.calls)
        self._broken += 1
        client = self._setup.client
        if self._broken > client.retry.stream_retries or (
            len(self.rounds) >= self._setup.run_limits.max_rounds
        ):
            times = "once" if self._broken == 1 else f"{self._broken} times in a row"
            last = round_.error or "the stream ended without its end"
            self.error = f"{client.provider}: no answer: the stream broke {times}; last: {last}"
            return False
        await client.pause_before_retry(self._broken)
        return True

    async def _mark(self, round_: Round) -> None:
        """Before ``round_``'s calls run: what a survivor stores should this worker die
        while they do (see :mod:`._resume`)."""
        if self._stored is not None and round_.committed():
            drop = self._setup.drop_failed
            entries = round_entries(round_, lost_results(round_), drop)
            paired = None if drop else round_  # (dropped calls: the entries stand as they are)
            await self._stored.mark(len(self.history), entries, round_.provider, paired)

    async def _persist(self) -> None:
        """Store the history's new entries (with a ``history_store``)."""
        if self._stored is not None:
            await self._stored.persist(self.history)

    async def _stream(
        self, parser: StreamParser, dispatch: DispatchRound, specs: Sequence[ToolSpec]
    ) -> Round | None:
        """Feed the round's stream; None when no stream began (``error`` is set)."""
        setup = self._setup
        stream = setup.client.stream(
            self.history,
            tools=specs,
            system=setup.system,
            max_tokens=setup.max_tokens,
        )
        try:
            async with stream as chunks:
                stall = _StallWatch(setup.run_limits.call_stall_s)
                watch, open_bytes, feed = stall.limit_s > 0, parser.open_argument_bytes, parser.feed
                try:
                    async for chunk in chunks:
                        # (per chunk: most reads of arguments bring no notice)
                        if notices := feed(chunk):
                            self._notices(notices, dispatch)
                        if self._cancelled:
                            # cancel() came while this read was told (an observer's bound,
                            # e.g. the relay's max_run_events): the task's cancellation
                            # arrives only at a read that waits, and buffered reads do not
                            return parser.cancel()
                        if parser.over:
                            # nothing more can change the round (it ended at a size limit,
                            # or failed): stop reading; leaving the stream closes the response
                            break
                        if watch and stall.stalled(open_bytes()):
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
        observers, provider = self._setup.observers, self._setup.client.provider
        for notice in notices:
            for observer in observers:
                observer.on_notice(provider, notice)
            if isinstance(notice, TextReceived):
                if notice.choice == 0:
                    self._emit(TextEvent(text=notice.text))
            elif isinstance(notice, CallAnnounced):
                if notice.key.choice == 0 and notice.call_id and notice.name:
                    self._open(notice.key, notice.call_id, notice.name)
            elif isinstance(notice, CallReady):
                if self._cancelled:
                    continue  # never started: the round's abort pairs it as cancelled
                call = notice.call
                self._open(call.key, call.call_id, call.name)
                self._emit(
                    CallCommittedEvent(
                        id=call.call_id, name=call.name, arguments=call.arguments, early=True
                    )
                )
                if not self._cancelled:  # (an observer may cancel at call_committed)
                    self._start(dispatch, call)
            elif isinstance(notice, PreviewUpdated) and self._setup.on_preview is not None:
                self._put(notice)  # UIs (the relay), not the agent events

    def _start(self, dispatch: DispatchRound, call: object) -> None:
        """Start an eager call; a refusal for not being committed is told to observers
        (``tool_execute_rejected_not_committed_total``) before it propagates."""
        try:
            dispatch.start(call)  # type: ignore[arg-type]  # the dispatcher checks the type
        except UsageError as exc:
            if not isinstance(call, CommittedCall):
                for observer in self._setup.observers:
                    observer.on_not_committed(self._setup.client.provider, str(exc))
            raise

    def _open(self, key: CallKey, call_id: str, name: str) -> None:
        if key not in self._opened:
            self._opened.add(key)
            self._emit(CallOpenedEvent(id=call_id, name=name))

    def _decided(self, round_: Round) -> None:
        """``call_committed`` / ``call_failed`` for every call not told yet, in call order."""
        for observer in self._setup.observers:
            observer.on_round(self._setup.client.provider, round_)
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
        self.history += round_entries(round_, results, self._setup.drop_failed)
        self._emit(
            RoundEndedEvent(
                round=len(self.rounds), ended=str(round_.ended), stop_reason=round_.stop_reason
            )
        )

    def _run_ended(self) -> RunEndedEvent:
        calls = []
        for round_, results in zip(self.rounds, self.results, strict=True):
            # paired as the history pairs them (calls may share an id: a model bug)
            for call, result in pair_results(round_, results)[0]:
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
        for observer in self._setup.observers:
            observer.on_event(self._setup.client.provider, event)
        self._put(event)

    def _put(self, item: AgentEvent | PreviewUpdated | None) -> None:
        """Hand ``item`` to the consumer (wakes it if it waits)."""
        self._events.append(item)
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():  # (cancelled when the consumer was)
                wake.set_result(None)


_MADE_UP_ID = re.compile(r"gemini:([0-9]{1,18}):")
"""The ids the Gemini adapter makes up for calls without one: ``gemini:<attempt>:...``."""


def _made_up_attempt(
    provider: str, history: Sequence[Mapping[str, Any]], ids: frozenset[str]
) -> int:
    """For Gemini, which sends no call ids (the adapter makes up ``gemini:<attempt>:<n>``,
    and the history sent back does not carry them): the number of model turns in
    ``history``, or the highest attempt in a made-up id it holds, whichever is more; 0 for
    the other providers. The next request's attempt is above it, so a conversation
    continued from its history (``--resume``: a new process, whose attempts start again at
    1) makes ids it never made before; and a round cut off by a crash and asked again gets
    the attempt it had (with no broken stream before it), so its calls meet their ledger
    entries as any provider's do."""
    if provider != "gemini":
        return 0
    turns = sum(1 for m in history if isinstance(m, Mapping) and m.get("role") == "model")
    found = (int(m.group(1)) for i in ids if (m := _MADE_UP_ID.match(i)))
    return max([turns, *found])


def _with_id_repairs(round_: Round) -> Round:
    """``round_`` with an anomaly for each call whose repeated id the history writes under
    a derived id or leaves out (:mod:`toollatch.core._messages._ids`), so observers see it."""
    repairs = id_repairs(round_)
    return replace(round_, anomalies=(*round_.anomalies, *repairs)) if repairs else round_


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
