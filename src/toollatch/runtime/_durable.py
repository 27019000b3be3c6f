"""Agent runs as DBOS workflows, so that another process finishes a run whose worker died
(the ``durable`` extra; internal, exported lazily as ``toollatch.runtime.DurableRuns``).

Theory of operation. A run is one DBOS workflow (its id is the run's conversation id) over
PostgreSQL. Its steps, in order:

- **the model round** (``toollatch.model_round``): one request, its stream fed to a parser
  and the gate, with no eager start (a call may run only as its own step); the step's
  recorded output is the :class:`~toollatch.Round` (committed calls, text, stop reason),
  with the events it made (text deltas, ``call_opened``, previews for a live sink,
  ``call_committed`` / ``call_failed``) and the number of the first;
- **a call's question** (``toollatch.question``), only for a call that waits for a
  person's approval or a client tool's result: the question stored in the agent's ledger
  (a recovered step finds the stored one, answered or not), its event the step's record;
  then **its answer** (``toollatch.answer``), waited for there (:meth:`DurableRuns.answers`,
  in any process sharing the ledger, writes it). The round's questions are asked at once,
  as a plain run asks them: their steps run together, their events are told once they all
  returned, in call order, then their answers' steps wait together (concurrent steps keep
  DBOS's replay deterministic: see :func:`_asked_together`); the call steps then find them
  answered;
- **each call of the round** (``toollatch.call``), in call order: the call run by the
  agent's dispatcher on its ledger, under the ledger's call id, which the tool reads as its
  idempotency key (:func:`toollatch.ledger.current_call`); the step's recorded output is its
  :class:`~toollatch.ToolResult` (a failed call's error result too).

DBOS records a step's output once the step returns, and a recovered workflow replays the
recorded outputs instead of running their steps again. So when a worker dies:

- a round that had not returned is asked again (a new attempt: its stream is gone);
- a call whose step had returned is not run again (its recorded result is replayed);
- a call whose step had begun but not returned is run again *through the ledger*, which
  knows what DBOS cannot (whether the tool had started): a call the dead worker had
  ``started`` gets ``outcome_unknown`` (once its lease ran out), unless its tool is
  ``idempotent``; a call only ``claimed`` runs; a ``completed`` one returns its stored result.
  That is why a durable agent needs a ledger shared by the workers (SQLite on one machine,
  Redis, ...).

Recovery of another executor's workflows is DBOS's: each worker launches with its own
``executor_id``, and a survivor calls :meth:`DurableRuns.recover` with the dead worker's id
(DBOS re-enqueues that executor's PENDING workflows, only those, and any live executor
dequeues each exactly once). DBOS 3.4 exposes that as ``DBOS._recover_pending_workflows``
(what its Conductor calls); deciding *which* worker is dead (a lease) is the caller's.

Events (see ``EventSink``): the workflow tells each step's recorded events after the step,
then the events its own code makes (``round_ended``, ``run_ended``), so a replay tells the
same events under the same numbers. A *live* sink (one with an ``AttemptHook``) is also told
a round's events while its step runs (:class:`_Pump`), which makes numbers a step never
recorded when its worker dies mid-round: the next attempt asks the hook where its events
begin (past the dead attempt's, which the hook closes), and records that number.

Observers (the agent's ``observers``: the relay's Prometheus metrics) are told each event
once, by the process that made it: a step's events from inside the step (a call's run time
is the tool's), the workflow's own once one of its steps ran in this process. A replayed
step's events, told again to the sink, are not told to the observers again: the dead
worker's had counted them.

Workflows and steps are registered when this module is imported, under fixed names; their
arguments are plain data (the agent's registered name, the conversation id, the history),
so every worker must :meth:`DurableRuns.register` the same agents under the same names
before :meth:`DurableRuns.launch` (or one :meth:`DurableRuns.register_factory` that makes
the agent of any name it is asked for: the relay's, whose agents differ per model and
session).

Budgets, the deadline and a cancel are decided inside the steps, so that what a step decided
is recorded with it and a recovered run replays the same decision: the model round is told
the calls the run has committed so far (``RunLimits.max_tool_calls`` spans the run, not a
round), and both steps read the run's deadline (an absolute time, a workflow argument: it
does not move when another worker takes the run over) and :meth:`DurableRuns.cancel`'s mark
(this process's: a cancel reaches the worker driving the run). A round past the deadline or
cancelled is not asked (or its stream is cut, and nothing of it told); a call past it or
cancelled is aborted (``cancelled``: never started, or started with its outcome unknown);
the run then ends (``error`` naming the deadline or the cancel's reason). A cut round a live
sink had events of is closed (its calls failed, ``round_ended``); one with none told is not
told at all.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import copyreg
import inspect
import io
import json
import pickle
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeVar, cast

import psycopg
from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync
from dbos._error import DBOSWorkflowCancelledError
from dbos._serialization import Serializer

from ..core._errors import ErrorCode, UsageError
from ..core._events import ReasoningBlock
from ..core._gate import CommittedCall, Gate, RunBudget
from ..core._messages import error_result
from ..core._preview import PreviewUpdated
from ..core._round import CallRecord, Round, ToolResult, reasoning_text
from ..core._specs import ToolSpec
from ..ledger import (
    ApprovalError,
    Ledger,
    LedgerError,
    QuestionKind,
    digest_of,
)
from ..tools._results import made_error
from ..tools._tasks import join
from ._agent import Agent, user_message
from ._agent_events import AgentEvent, ApprovalRequestedEvent
from ._agent_run import AgentRun
from ._approvals import Approvals
from ._resume import LOST_DETAIL, ledger_fate, note_entries, round_entries

_T = TypeVar("_T")

_AGENTS: dict[str, Agent] = {}
"""The agents of this process by registered name (a workflow names its agent)."""

Told = AgentEvent | PreviewUpdated | ReasoningBlock
"""What a sink is told: an agent event, a round's reasoning block (one with readable text:
:func:`toollatch.core._round.reasoning_text`; the relay's ``reasoning`` event), or (a live
sink only) a call's preview."""

EventSink = Callable[[str, int, Told], Awaitable[None] | None]
"""Told each agent event of a durable run: ``(run_id, number, event)``, numbered from 0 in
the run's order. A recovered run tells the events of the steps it replays again, under the
same numbers (the same events, recorded with their steps): a sink keeps the first of each
number (the Redis run log refuses an id written twice). Without an :data:`AttemptHook`, a
round's events come at its step's end, whole (no previews); with one the sink is *live*:
it is told the round's events as they are made (text deltas, ``call_opened``, previews;
the round's reasoning blocks when its stream ended, before its ``call_committed``), before
the step ends."""

AttemptHook = Callable[[str, int], Awaitable[int]]
"""Makes a sink live (see ``EventSink``): told ``(run_id, number)`` when a model round's
attempt begins at event ``number``, it returns the number that attempt's first event gets.
That is ``number``, unless an earlier attempt of the same round (a dead worker's, its step
never recorded) had told events from ``number`` on: the hook then closes what that attempt
left open (every call it opened paired, its round ended ``interrupted``) and returns the
number after its newest event, so that no number is told twice with different events."""

Fence = Callable[[str], Awaitable[bool]]
"""Told ``run_id`` before each step of a run runs here (a model round, a call): False when
this process no longer drives the run (another worker took it over while this one was
paused): the step does nothing (:class:`RunLost`)."""


class RunLost(DBOSWorkflowCancelledError):
    """Raised in a run's step or sink when this process lost the run to another worker (a
    :data:`Fence` said so, or the sink found it): DBOS records nothing of that step (as for
    a cancelled workflow's), and this process's execution of the workflow stops there and
    waits for the outcome the run's new driver records. A ``BaseException``."""


_SINKS: dict[str, EventSink] = {}
_ATTEMPTS: dict[str, AttemptHook] = {}
_FENCES: list[Fence] = []

AgentFactory = Callable[[str], Agent]
"""Makes the agent of a registered name this process has not registered itself
(:meth:`DurableRuns.register_factory`); raises ``UsageError`` for a name it does not know."""

_FACTORY: list[tuple[AgentFactory, EventSink | None, AttemptHook | None]] = []

_STEPPED: set[str] = set()
"""The runs a step of which ran in this process since their workflow began here: DBOS
replays a recovered run's recorded steps without running them, then runs the rest here, so
until one runs, the workflow's events were made (and observed) by the dead worker."""


@dataclass(slots=True)
class _Turn:
    """Where a run this process executes stands (:meth:`DurableRuns.interrupted`): its
    history so far (the message, the rounds it finished), and the round whose calls run,
    with their results so far (in call order)."""

    name: str
    """The run's agent's registered name (its ledger knows what became of its calls)."""
    run: AgentRun
    round_: Round | None = None
    results: list[ToolResult] = field(default_factory=list)


_TURNS: dict[str, _Turn] = {}
"""The runs whose workflow executes in this process, until it returns (or, when it failed,
until :meth:`DurableRuns.interrupted` is asked)."""

_CANCELLED: dict[str, str | None] = {}
"""The runs :meth:`DurableRuns.cancel` marked in this process, with their reasons."""
_CANCELS: dict[str, asyncio.Event] = {}
"""Set when a run is cancelled: a step in flight stops."""


@dataclass(frozen=True, slots=True)
class _Stopped:
    """What a step records when the run must end: the deadline passed, or it was cancelled."""

    error: str | None
    cancelled: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableResult:
    """How a durable run ended: what ``run_ended`` says of a run."""

    run_id: str
    """The workflow id: the run's conversation, the ledger's scope of its call ids."""
    rounds: int
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Every call paired with its result: id, name, state, is_error, error (code)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    cancelled: bool = False
    """Whether :meth:`DurableRuns.cancel` ended it."""


class _Pickler(pickle.Pickler):
    """A ToolSpec (in a committed call) is written as its data: its compiled validator
    does not pickle, and the reader builds it again; a read-only mapping (the committed
    arguments) is written as its dict."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: _unfrozen}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, ToolSpec):
            return json.dumps([obj.name, obj.parameters, obj.description, obj.eager, obj.timeout_s])
        return None


def _frozen(entries: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(entries)


def _unfrozen(mapping: MappingProxyType[str, Any]) -> tuple[Any, tuple[dict[str, Any]]]:
    return _frozen, (dict(mapping),)


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        name, parameters, description, eager, timeout_s = json.loads(pid)
        return ToolSpec(
            name=name,
            parameters=parameters,
            description=description,
            eager=eager,
            timeout_s=timeout_s,
        )


class _Serializer(Serializer):
    """DBOS's pickle, with :class:`_Pickler`'s ToolSpecs (what the steps record: a Round,
    a ToolResult, the run's end as plain data)."""

    def serialize(self, data: Any) -> str:
        out = io.BytesIO()
        _Pickler(out).dump(data)
        return base64.b64encode(out.getvalue()).decode()

    def deserialize(self, serialized_data: str) -> Any:
        return _Unpickler(io.BytesIO(base64.b64decode(serialized_data))).load()

    def name(self) -> str:
        return "toollatch_pickle"


def _agent(name: str) -> Agent:
    agent = _AGENTS.get(name)
    if agent is None and _FACTORY:
        agent = _FACTORY[0][0](name)
    if agent is None:
        raise UsageError(f"no agent is registered as {name!r} in this process")
    return agent


def _sink(name: str) -> EventSink | None:
    if name in _AGENTS:
        return _SINKS.get(name)
    return _FACTORY[0][1] if _FACTORY else None


def _attempt_hook(name: str) -> AttemptHook | None:
    if name in _AGENTS:
        return _ATTEMPTS.get(name)
    return _FACTORY[0][2] if _FACTORY else None


async def _fenced(name: str, conversation: str) -> None:
    """Raise :class:`RunLost` when the fence says this process lost the run."""
    if name not in _AGENTS and _FENCES and not await _FENCES[0](conversation):
        raise RunLost(f"run {conversation[-24:][:6]}… is driven by another worker now")


def _run(name: str, conversation: str, history: list[dict[str, Any]]) -> AgentRun:
    agent = _agent(name)
    # (Agent._setup: the snapshot a run takes; one process, one room)
    return AgentRun(agent._setup(conversation), history, conversation=conversation)


def _stop_of(conversation: str, deadline_at: float | None) -> _Stopped | None:
    """Why the run must not go on (None: it may)."""
    if conversation in _CANCELLED:
        return _Stopped(_CANCELLED[conversation], cancelled=True)
    if deadline_at is not None and time.time() >= deadline_at:
        return _Stopped("the run's deadline passed: the round in flight was cancelled")
    return None


async def _until_stopped(
    work: Awaitable[Any], conversation: str, deadline_at: float | None
) -> tuple[Any, _Stopped | None]:
    """``work``'s value, or the stop (a cancel, the deadline) that cut it first."""
    task = asyncio.ensure_future(work)
    cancel = _CANCELS.setdefault(conversation, asyncio.Event())
    waiting = asyncio.ensure_future(cancel.wait())
    timeout = None if deadline_at is None else max(0.0, deadline_at - time.time())
    try:
        await asyncio.wait({task, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller was cancelled: the work goes with it, not on alone
        task.cancel()
        with contextlib.suppress(Exception):  # (the cancel is what propagates)
            await join(task)
        raise
    finally:
        waiting.cancel()
    if task.done():
        return task.result(), None
    task.cancel()
    await join(task)
    stop = _stop_of(conversation, deadline_at if not cancel.is_set() else None)
    return None, stop or _Stopped("the run's deadline passed: the round in flight was cancelled")


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a model round's step records: the Round (or why no stream began: the run's
    error; or why the run stops), the number its first event got, and its events (told
    again, under the same numbers, when a recovered run replays the step)."""

    outcome: Round | str | _Stopped
    first: int
    events: tuple[Told, ...]
    results: tuple[ToolResult, ...] = ()
    """A round cut by a stop after some of its events were told: its calls' results (the
    round is then closed with them; ``outcome`` is the stop, ``cut`` the round)."""
    cut: Round | None = None


class _Pump:
    """Tells a live sink a round's events as the stream makes them (a task woken by the
    run's hand-over future, as :meth:`AgentRun.__aiter__` is), and keeps them all for the
    step's record."""

    def __init__(self, name: str, run: AgentRun, first: int, live: bool) -> None:
        self._sink = _sink(name) if live else None
        self.live = live
        self._run, self.told, self.kept = run, first, list[Told]()
        self._closing = False
        self._task = asyncio.get_running_loop().create_task(self._loop()) if live else None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.drain()
            if self._closing:
                return
            self._run._wake = loop.create_future()
            await self._run._wake

    async def drain(self) -> None:
        """Tell (and keep) every event made so far."""
        events = self._run._events
        while events:
            event = events.popleft()
            if event is None:
                continue
            self.kept.append(event)
            if self._sink is not None:
                answer = self._sink(self._run.conversation, self.told, event)
                if inspect.isawaitable(answer):
                    await answer
            self.told += 1

    async def close(self) -> tuple[Told, ...]:
        """Stop the task (never mid-tell) and tell what is left; the round's events."""
        if self._task is not None:
            self._closing = True
            wake = self._run._wake
            if wake is not None and not wake.done():
                wake.set_result(None)
            await self._task
        await self.drain()
        return tuple(self.kept)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _ignore(_preview: PreviewUpdated) -> None:
    """(A live round's previews go on the run's events: see ``AgentRun._notices``.)"""


@DBOS.step(name="toollatch.model_round")
async def _model_round(
    name: str,
    conversation: str,
    history: list[dict[str, Any]],
    used: int = 0,
    deadline_at: float | None = None,
    told: int = 0,
) -> _Asked:
    """Ask the model once, its events numbered from ``told`` (or past an earlier attempt's:
    see ``AttemptHook``) and told live to a live sink. ``used``: the calls the run
    committed in earlier rounds (its call budget)."""
    await _fenced(name, conversation)
    _STEPPED.add(conversation)
    hook = _attempt_hook(name)
    first = told if hook is None else await hook(conversation, told)
    if (stop := _stop_of(conversation, deadline_at)) is not None:
        return _Asked(stop, first, ())
    run = _run(name, conversation, history)
    if hook is not None and run._setup.previews is not None:
        run._setup = replace(run._setup, on_preview=_ignore)
    budget = RunBudget(run._setup.run_limits.max_tool_calls)
    budget.used = used
    run._budget = budget
    tools = await run._setup.tools.refresh()
    # no eager start: each committed call runs as its own step after the round
    specs = tuple(replace(s, eager=False) for s in tools.specs)
    parser, _edits = run._parser(replace(tools, specs=specs, eager=()))
    pump = _Pump(name, run, first, hook is not None)
    try:
        async with run._setup.dispatcher.round(conversation) as dispatch:
            streamed = run._stream(parser, dispatch, tools.requested)
            round_, stop = await _until_stopped(streamed, conversation, deadline_at)
            if stop is not None:
                return await _cut(run, pump, parser.cancel(), dispatch, stop, first)
            if round_ is not None:
                _decided(run, round_)
        events = await pump.close()
    finally:
        pump.cancel()
    if round_ is None:
        return _Asked(run.error or "the model request failed", first, events)
    assert isinstance(round_, Round)
    return _Asked(round_, first, events)


async def _cut(
    run: AgentRun, pump: _Pump, round_: Round, dispatch: Any, stop: _Stopped, first: int
) -> _Asked:
    """A round a stop cut: nothing told yet, it is not told at all; else its calls are
    failed and paired (the workflow closes the round with their results)."""
    await pump.drain()
    if not pump.live or not pump.kept:
        return _Asked(stop, first, ())
    _decided(run, round_)
    results = tuple(await dispatch.abort(round_))
    return _Asked(stop, first, await pump.close(), results, round_)


def _decided(run: AgentRun, round_: Round) -> None:
    """The round's end, as a plain run tells it: its reasoning blocks with readable text
    (what a plain relay run's observer makes ``reasoning`` events of when the stream ended:
    ``relay._runs._Feed.on_round``), then ``call_committed`` / ``call_failed``."""
    # (a round step's run is never iterated: its queue is the pump's, which tells blocks too)
    queue = cast("deque[Told | None]", run._events)
    for block in round_.blocks:
        if isinstance(block, ReasoningBlock) and block.choice == 0 and reasoning_text(block.data):
            queue.append(block)
    run._decided(round_)


def _asks(name: str, conversation: str, round_: Round, index: int) -> bool:
    """Whether call ``index`` of ``round_`` waits for an answer before it runs (a person's
    approval, a client tool's result): then its question is a step of its own."""
    return _asking(name, conversation, round_, index) is not None


@DBOS.step(name="toollatch.question")
async def _question(
    name: str,
    conversation: str,
    round_: Round,
    index: int,
    approval_session: str | None = None,
    deadline_at: float | None = None,
) -> tuple[AgentEvent, ...]:
    """Ask call ``index``'s question in the ledger, without waiting for its answer (its
    :func:`_answer` step waits): its event (``approval_requested`` / ``client_call``), the
    step's record, which the workflow tells. Asked before (a dead worker's step), the stored
    question is found, answered or not, and its event is the same. None: the call is always
    allowed in ``approval_session`` (it runs unasked), or the question could not be stored
    (the call's step says why), or the run stops."""
    await _fenced(name, conversation)
    _STEPPED.add(conversation)
    asking = _asking(name, conversation, round_, index)
    if asking is None or _stop_of(conversation, deadline_at) is not None:
        return ()
    approvals, call, kind = asking
    try:
        question = await approvals.ask(conversation, call, kind, approval_session)
    except (ApprovalError, LedgerError):
        return ()
    if question is None:
        return ()
    event = ApprovalRequestedEvent(
        id=call.call_id, name=call.name, arguments=call.arguments,
        args_sha256=question.digest, session=conversation,
        expires_at=question.expires_at, kind=question.kind,
    )  # fmt: skip
    return (event,)


@DBOS.step(name="toollatch.answer")
async def _answer(
    name: str,
    conversation: str,
    round_: Round,
    index: int,
    approval_session: str | None = None,
    deadline_at: float | None = None,
) -> bool:
    """Wait for the answer to call ``index``'s question (asked by its :func:`_question`
    step), written to the ledger by any worker; the call's step then finds it answered.
    Whether it was answered: a cancel or the deadline closes the question (``cancelled``),
    as does a stop found before the wait; a worker that stops leaves it waiting for a
    survivor (its step re-run there)."""
    await _fenced(name, conversation)
    _STEPPED.add(conversation)
    asking = _asking(name, conversation, round_, index)
    if asking is None:
        return False
    approvals, call, kind = asking
    stop = _stop_of(conversation, deadline_at)
    if stop is None:
        setup = _agent(name)._setup(conversation)
        gate = Gate(setup.tools.current.specs, limits=setup.limits, policy=setup.policy)
        waited = approvals.wait(
            conversation, call, kind, _unsaid, gate, always=approval_session, keep_on_cancel=True
        )  # (told by its question's step; a worker that stops leaves it for a survivor)
        try:
            _answered, stop = await _until_stopped(waited, conversation, deadline_at)
        except (ApprovalError, LedgerError):
            return False
    if stop is not None:  # (the run's own cancel or deadline: the question is closed)
        await approvals.close(conversation, call.call_id, digest_of(call.name, call.arguments))
    return stop is None


def _asking(
    name: str, conversation: str, round_: Round, index: int
) -> tuple[Approvals, CommittedCall, QuestionKind] | None:
    """What call ``index`` of ``round_`` asks, and where (None: it asks nothing)."""
    setup = _agent(name)._setup(conversation)
    call = round_.calls[index].committed
    tool = setup.dispatcher.tools.get(call.name) if call is not None else None
    approvals = setup.dispatcher.approvals
    kind = None if tool is None or call is None else approvals.kind_of(tool, call, conversation)
    if call is None or kind is None:
        return None
    return approvals, call, kind


def _unsaid(_event: ApprovalRequestedEvent) -> None:
    """(An answer's wait tells nothing: its question's step made the event.)"""


async def _asked_together(
    name: str,
    conversation: str,
    round_: Round,
    approval_session: str | None,
    deadline_at: float | None,
) -> tuple[list[AgentEvent], list[int]]:
    """The questions of ``round_``'s calls that ask, each asked in its own step, all at once:
    their events, and the calls whose answers are waited for (with :func:`_waited_together`).

    Concurrent steps are deterministic in DBOS: a step's id (its ``function_id``, what a
    recovery replays it by) is taken from the workflow's counter when the step function is
    *called*, not when its coroutine first runs (dbos 3.4 ``_core.py`` ``decorate_step``:
    ``ctx.snapshot_step_ctx()`` in the wrapper; ``_context.py`` ``snapshot_step_ctx``), and
    each step runs in a context of its own (``EnterDBOSStepCtx``); so steps called in call
    order here get the same ids in every execution of the workflow, whatever order they end
    in. (https://www.dbos.dev/blog/async-python-is-secretly-deterministic)"""
    indexes = [i for i in range(len(round_.calls)) if _asks(name, conversation, round_, i)]
    steps = [
        _question(name, conversation, round_, i, approval_session, deadline_at) for i in indexes
    ]
    asked = await _together(steps)
    events = [event for told in asked for event in told]
    return events, [i for i, told in zip(indexes, asked, strict=True) if told]


async def _waited_together(
    name: str,
    conversation: str,
    round_: Round,
    indexes: list[int],
    approval_session: str | None,
    deadline_at: float | None,
) -> None:
    """Wait for the answers of calls ``indexes``, each in its own step, all at once (called
    in call order: see :func:`_asked_together`)."""
    steps = [_answer(name, conversation, round_, i, approval_session, deadline_at) for i in indexes]
    await _together(steps)


async def _together(steps: Sequence[Awaitable[_T]]) -> list[_T]:
    """The values of ``steps``, run at once; one that raises (``RunLost``: a fence) stops the
    others (no step left waiting for an answer in a worker that lost the run)."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:  # (their errors retrieved: the first one raised)
            if not task.cancelled():
                task.exception()


@DBOS.step(name="toollatch.call")
async def _call(
    name: str,
    conversation: str,
    round_: Round,
    index: int,
    deadline_at: float | None = None,
    approval_session: str | None = None,
) -> tuple[ToolResult, list[AgentEvent]]:
    """Run call ``index`` of ``round_`` (a failed call gets its error result): the result
    and the call's tool events (``approval_answered``, ``tool_started``,
    ``tool_finished``...), recorded with it. A call that asked (:func:`_question`) finds
    its answer in the ledger. A cancel or the deadline aborts it (``cancelled``). The
    agent's observers are told the events as they happen, here: a replayed step's are not
    told again (and its run time is the tool's, not the step's record's)."""
    await _fenced(name, conversation)
    _STEPPED.add(conversation)
    setup = _agent(name)._setup(conversation)
    first = round_.choices[0]
    one = replace(round_, choices=(replace(first, calls=(first.calls[index],)),))
    gate = Gate(setup.tools.current.specs, limits=setup.limits, policy=setup.policy)
    told: list[AgentEvent] = []
    observers, provider = setup.observers, setup.client.provider

    def tell(event: AgentEvent) -> None:
        told.append(event)
        for observer in observers:
            observer.on_event(provider, event)

    async with setup.dispatcher.round(
        conversation, gate=gate, on_event=tell, approval_session=approval_session
    ) as dispatch:
        if _stop_of(conversation, deadline_at) is not None:
            (result,) = await dispatch.abort(one)
        else:
            results, stop = await _until_stopped(dispatch.finish(one), conversation, deadline_at)
            if stop is not None:
                results = await dispatch.abort(one)
            (result,) = results
    return result, told


async def _tell(name: str, run: AgentRun, told: int) -> int:
    """Hand the run's new events to the agent's sink, numbered from ``told``; the count."""
    sink = _sink(name)
    while run._events:
        event = run._events.popleft()
        if event is None or isinstance(event, PreviewUpdated):
            continue
        told = await _told(sink, run.conversation, told, event)
    return told


async def _told(sink: EventSink | None, conversation: str, number: int, event: Told) -> int:
    if sink is not None:
        answer = sink(conversation, number, event)
        if inspect.isawaitable(answer):
            await answer
    return number + 1


async def _retell(name: str, conversation: str, asked: _Asked) -> int:
    """Tell a round step's recorded events under their numbers (a live sink had them:
    it keeps the first of each number); the number after them."""
    sink, told = _sink(name), asked.first
    for event in asked.events:
        told = await _told(sink, conversation, told, event)
    return told


async def _fate_of(ledger: Ledger | None, scope: str, call: CallRecord) -> ToolResult:
    """What became of a committed call of a run that cannot go on here (the call's step
    did not return): what the ledger says (:func:`._resume.ledger_fate`: a durable call's
    tool starts only once claimed, so one it holds no record of never ran), else
    ``outcome_unknown`` (it started, or the ledger cannot tell)."""
    if ledger is not None:
        known = await ledger_fate(ledger, scope, unclaimed_not_run=True)(call.call_id)
        if known is not None:
            return known
    return made_error(call.call_id, call.name or "", ErrorCode.OUTCOME_UNKNOWN, LOST_DETAIL)


def _forget(conversation: str) -> None:
    """Drop what this process kept of a run whose workflow returned here."""
    _CANCELLED.pop(conversation, None)
    _CANCELS.pop(conversation, None)
    _STEPPED.discard(conversation)
    _TURNS.pop(conversation, None)


@DBOS.workflow(name="toollatch.agent_run")
async def _agent_run(
    name: str,
    conversation: str,
    history: list[dict[str, Any]],
    deadline_at: float | None = None,
    approval_session: str | None = None,
) -> dict[str, Any]:
    # The events are made by this (deterministic) code from the steps' recorded outputs (a
    # round's, recorded with it), so a recovered run tells the events of its replayed steps
    # again, under the same numbers. The agent's observers are told each event once, by
    # the process that made it: a step's events by its step; the workflow's own (round_ended,
    # run_ended) once a step ran here (before: replayed, the dead worker's observers had them).
    run = _run(name, conversation, history)
    turn = _TURNS[conversation] = _Turn(name, run)
    _STEPPED.discard(conversation)
    observed = run._setup
    run._setup = replace(observed, observers=())

    def observe() -> None:  # (once a step ran here: the workflow's own events are ours)
        if conversation in _STEPPED:
            run._setup = observed

    limits = run._setup.run_limits
    told = 0
    used = 0
    cancelled = False
    while len(run.rounds) < limits.max_rounds:
        asked = await _model_round(name, conversation, run.history, used, deadline_at, told)
        observe()
        told = await _retell(name, conversation, asked)
        outcome = asked.outcome
        if isinstance(outcome, _Stopped):
            run.error, cancelled = outcome.error, outcome.cancelled
            if asked.cut is not None:  # (its events were told: the round is closed)
                run._close(asked.cut, list(asked.results))
                told = await _tell(name, run, told)
            break
        if isinstance(outcome, str):
            run.error = outcome
            break
        used += sum(1 for c in outcome.calls if c.committed is not None)
        results: list[ToolResult] = []
        turn.round_, turn.results = outcome, results
        questions, waiting = await _asked_together(
            name, conversation, outcome, approval_session, deadline_at
        )
        observe()
        for event in questions:
            run._emit(event)
        told = await _tell(name, run, told)
        await _waited_together(name, conversation, outcome, waiting, approval_session, deadline_at)
        for i in range(len(outcome.calls)):
            result, events = await _call(
                name, conversation, outcome, i, deadline_at, approval_session
            )
            observe()
            results.append(result)
            for event in events:
                run._put(event)  # (observed in its step)
            told = await _tell(name, run, told)
        run._close(outcome, results)
        turn.round_ = None
        told = await _tell(name, run, told)
        if not await run._again(outcome):
            break
    ended = run._run_ended()
    run._emit(ended)
    await _tell(name, run, told)
    _forget(conversation)
    return {
        "rounds": ended.rounds,
        "calls": ended.calls,
        "history": ended.history,
        "error": ended.error,
        "cancelled": cancelled,
    }


_POLL_S = 0.1
"""How often :meth:`DurableRuns.result` reads the end of a run this process did not start
(DBOS's default is 1 s: a finished run would wait up to that long for its reader)."""


class DurableRuns:
    """This process's DBOS engine for agent runs (one per process: DBOS is).

    ``url``: the PostgreSQL system database (``postgresql://...``; DBOS creates it and its
    tables). ``executor_id``: this worker's name among the workers sharing the database
    (each needs its own, and the same one again after a restart recovers its own runs).
    Use as ``async with DurableRuns(url, executor_id=...) as runs:`` (launch / shut down).
    """

    Lost = RunLost
    """What a sink or fence raises when this process lost a run (:class:`RunLost`)."""

    def __init__(self, url: str, *, executor_id: str, app: str = "toollatch") -> None:
        if not url.startswith(("postgresql://", "postgres://")):
            raise UsageError(f"a durable store is a postgresql:// URL, got {url!r:.60}")
        if not executor_id:
            raise UsageError("executor_id must be a non-empty str")
        self.executor_id = executor_id
        self._url = url
        config: DBOSConfig = {
            "name": app,
            "system_database_url": url,
            "executor_id": executor_id,
            "log_level": "WARNING",
            "serializer": _Serializer(),
        }
        self._config = config
        self._launched = False
        # the runs started here: their handles await the workflow's task, no polling
        self._started: dict[str, WorkflowHandleAsync[dict[str, Any]]] = {}

    def register(
        self,
        name: str,
        agent: Agent,
        *,
        on_event: EventSink | None = None,
        on_attempt: AttemptHook | None = None,
    ) -> None:
        """Make ``agent`` the one runs named ``name`` use in this process. It needs a
        ledger (the only record of whether a dead worker's tool had started). ``on_event``
        is told the events of its runs that this process drives (see ``EventSink``); with
        ``on_attempt`` (see ``AttemptHook``) it is told a round's events live."""
        if not isinstance(agent, Agent):
            raise UsageError(f"register takes an Agent, got {agent!r:.60}")
        if agent.ledger is None:
            raise UsageError("a durable agent needs a ledger shared by the workers")
        _AGENTS[name] = agent
        _SINKS.pop(name, None)
        _ATTEMPTS.pop(name, None)
        if on_event is not None:
            _SINKS[name] = on_event
        if on_attempt is not None:
            _ATTEMPTS[name] = on_attempt

    def register_factory(
        self,
        make: AgentFactory,
        *,
        on_event: EventSink | None = None,
        on_attempt: AttemptHook | None = None,
        fence: Fence | None = None,
    ) -> None:
        """Make the agent of any name not registered with :meth:`register` with ``make``
        (called at each step: cache what it builds); ``on_event`` and ``on_attempt`` as in
        :meth:`register`, for those runs; ``fence`` (see :data:`Fence`) is asked before each
        of their steps. Every worker registers the same factory before :meth:`launch`."""
        _FACTORY[:] = [(make, on_event, on_attempt)]
        _FENCES[:] = [fence] if fence is not None else []

    def launch(self) -> None:
        """Start the engine (this process's own pending runs are recovered by DBOS).
        Called from a running event loop's thread (not ``await``-ed in a thread), DBOS
        runs the runs it recovers or dequeues on that loop: their steps and sink share
        the caller's loop (its HTTP clients, its objects)."""
        DBOS(config=self._config)
        DBOS.launch()
        self._launched = True

    def destroy(self) -> None:
        """Stop the engine; runs in flight stay PENDING for a recovery."""
        if self._launched:
            self._launched = False
            DBOS.destroy(destroy_registry=False)

    async def __aenter__(self) -> DurableRuns:
        await asyncio.to_thread(self.launch)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.destroy)

    async def start(
        self,
        agent: str,
        message: str | None = None,
        *,
        run_id: str,
        history: Sequence[Mapping[str, Any]] = (),
        approval_session: str | None = None,
        conversation: str | None = None,
    ) -> str:
        """Start a run of the agent registered as ``agent`` under ``run_id`` (the workflow
        id and the conversation; starting an id again is the same run, not a new one). Its
        deadline is the agent's ``RunLimits.deadline_s`` from now, wherever it goes on.
        ``approval_session``: whose "always allow" decisions its calls read (default
        ``run_id``); a call that asks waits for its answer in the agent's ledger, where
        :meth:`answers` (any worker's) writes it. ``conversation`` (default ``run_id``):
        another conversation for a run that continues an ended one's history under a new
        workflow id: its call ids' ledger scope, the id its sink, fence, :meth:`cancel` and
        :meth:`answers` know it by (one run of a conversation at a time)."""
        entries = [dict(m) for m in history]
        runner = _agent(agent)
        if message is not None:
            entries.append(user_message(runner.client.provider, message))
        if not entries:
            raise UsageError("a run needs a message or a history")
        deadline_s = runner.run_limits.deadline_s
        deadline_at = None if deadline_s is None else time.time() + deadline_s
        with SetWorkflowID(run_id):
            handle = await DBOS.start_workflow_async(
                _agent_run, agent, conversation or run_id, entries, deadline_at, approval_session
            )
        self._started[run_id] = handle
        return run_id

    def answers(self, agent: str, run_id: str, approval_session: str | None = None) -> AgentRun:
        """What answers run ``run_id``'s questions from this process, wherever the run goes
        on: its ``approve`` / ``deny`` / ``submit_result`` / ``revoke`` write to the ledger
        of the agent registered as ``agent``, where the run's waiting step reads them (at
        once in this process, within ``Approvals.poll_s`` in another). It drives nothing."""
        setup = _agent(agent)._setup(run_id)
        return AgentRun(setup, [], conversation=run_id, approval_session=approval_session)

    async def result(self, run_id: str) -> DurableResult:
        """Wait for run ``run_id`` to end, here or on any worker."""
        # (in a context of its own: awaited in a task that a workflow's sink started, e.g. the
        # relay's driver of a run taken over, DBOS would read the status as a step of that
        # workflow (dbos 3.4 ``DBOS.retrieve_workflow_async``: ``snapshot_step_context``),
        # taking the id its next step is replayed by: DBOSUnexpectedStepError)
        loop = asyncio.get_running_loop()
        return await loop.create_task(self._result(run_id), context=contextvars.Context())

    async def _result(self, run_id: str) -> DurableResult:
        handle = self._started.pop(run_id, None)
        if handle is None:  # another worker's, or recovered: its row, polled
            handle = await DBOS.retrieve_workflow_async(run_id)
        ended = await handle.get_result(polling_interval_sec=_POLL_S)
        return DurableResult(run_id=run_id, **ended)

    def cancel(self, run_id: str, reason: str | None = None) -> None:
        """Cancel run ``run_id``, which this process drives: its step in flight stops (a
        round is not told, a call is aborted: ``cancelled``) and it ends (``reason``: its
        ``run_ended.error``; ``cancelled`` true)."""
        _CANCELLED.setdefault(run_id, reason)
        _CANCELS.setdefault(run_id, asyncio.Event()).set()

    async def recover(self, executor_ids: Sequence[str]) -> list[str]:
        """Take over the pending runs of the (dead) workers ``executor_ids``: the ids of the
        runs re-enqueued, each to be finished by one live worker."""
        ids = [e for e in executor_ids if isinstance(e, str) and e]
        if not ids:
            raise UsageError("recover needs the executor ids of the dead workers")
        handles = await asyncio.to_thread(DBOS._recover_pending_workflows, ids)
        return [h.workflow_id for h in handles]

    async def reachable(self, timeout_s: float = 1.0) -> bool:
        """Whether the engine's PostgreSQL takes a connection within ``timeout_s`` seconds.
        (DBOS itself never gives up on a lost database: a step's record waits for it,
        retrying, however long it is gone.)"""
        try:
            async with asyncio.timeout(timeout_s):
                connection = await psycopg.AsyncConnection.connect(self._url)
                await connection.close()
        except (TimeoutError, OSError, psycopg.Error):
            return False
        return True

    def forget(self, run_id: str) -> None:
        """Drop what this process keeps of run ``run_id`` for :meth:`interrupted` (its
        workflow stopped here without returning: lost to another worker, or abandoned)."""
        _TURNS.pop(run_id, None)

    async def interrupted(self, run_id: str, at: int) -> list[dict[str, Any]]:
        """The history entries past ``at`` of run ``run_id``, whose workflow failed or
        cannot go on (PostgreSQL lost) in this process, as the run would leave them
        interrupted: its entries past ``at`` (its message, the rounds it finished), then the
        round whose calls were running, each call paired with its result, else with what
        the agent's ledger says of it (:func:`_fate_of`), then a note that the answer was
        interrupted when the last entry is not the model's (the next message then never
        follows a user turn); [] for a run not executed here. What this process kept of the
        run is dropped: a second ask gets []."""
        turn = _TURNS.pop(run_id, None)
        if turn is None:
            return []
        run, round_ = turn.run, turn.round_
        setup = run._setup
        ledger = _agent(turn.name).ledger
        entries = [dict(m) for m in run.history[at:]]
        if round_ is not None:
            results = list(turn.results)
            for call in round_.calls[len(results) :]:
                if call.committed is None:
                    results.append(error_result(call))
                else:
                    results.append(await _fate_of(ledger, run_id, call))
            entries += round_entries(round_, results, setup.drop_failed)
        if not entries or entries[-1].get("role") not in ("assistant", "model"):
            entries += note_entries(setup.client.provider)
        return entries
