"""Agent runs as DBOS workflows, so that another process finishes a run whose worker died
(the ``durable`` extra; internal, exported lazily as ``toollatch.runtime.DurableRuns``).

Theory of operation. A run is one DBOS workflow (its id is the run's conversation id) over
PostgreSQL. Its steps, in order:

- **the model round** (``toollatch.model_round``): one request, its stream fed to a parser
  and the gate, with no eager start (a call may run only as its own step); the step's
  recorded output is the :class:`~toollatch.Round` (committed calls, text, stop reason);
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

Workflows and steps are registered when this module is imported, under fixed names; their
arguments are plain data (the agent's registered name, the conversation id, the history),
so every worker must :meth:`DurableRuns.register` the same agents under the same names
before :meth:`DurableRuns.launch`.
"""

from __future__ import annotations

import asyncio
import base64
import copyreg
import inspect
import io
import json
import pickle
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync
from dbos._serialization import Serializer

from ..core._errors import UsageError
from ..core._gate import Gate
from ..core._preview import PreviewUpdated
from ..core._round import Round, ToolResult
from ..core._specs import ToolSpec
from ._agent import Agent, user_message
from ._agent_events import AgentEvent, TextEvent
from ._agent_run import AgentRun

_AGENTS: dict[str, Agent] = {}
"""The agents of this process by registered name (a workflow names its agent)."""

EventSink = Callable[[str, int, AgentEvent], Awaitable[None] | None]
"""Told each agent event of a durable run: ``(run_id, number, event)``, numbered from 0 in
the run's order. A recovered run tells the events of the steps it replays again, under the
same numbers (the same events): a sink keeps the first of each number (the Redis run log
refuses an id written twice). Its events are per step: a round's text comes whole, with
its calls, once the round's step returned; no previews."""

_SINKS: dict[str, EventSink] = {}


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
    if agent is None:
        raise UsageError(f"no agent is registered as {name!r} in this process")
    return agent


def _run(name: str, conversation: str, history: list[dict[str, Any]]) -> AgentRun:
    agent = _agent(name)
    # (Agent._setup: the snapshot a run takes; one process, one room)
    return AgentRun(agent._setup(conversation), history, conversation=conversation)


@DBOS.step(name="toollatch.model_round")
async def _model_round(name: str, conversation: str, history: list[dict[str, Any]]) -> Round | str:
    """Ask the model once: the Round, or why no stream began (the run's error)."""
    run = _run(name, conversation, history)
    tools = await run._setup.tools.refresh()
    # no eager start: each committed call runs as its own step after the round
    specs = tuple(replace(s, eager=False) for s in tools.specs)
    parser, _edits = run._parser(replace(tools, specs=specs, eager=()))
    async with run._setup.dispatcher.round(conversation) as dispatch:
        round_ = await run._stream(parser, dispatch, tools.requested)
    if round_ is None:
        return run.error or "the model request failed"
    return round_


@DBOS.step(name="toollatch.call")
async def _call(
    name: str, conversation: str, round_: Round, index: int
) -> tuple[ToolResult, list[AgentEvent]]:
    """Run call ``index`` of ``round_`` (a failed call gets its error result): the result
    and the call's tool events (``tool_started``, ``tool_finished``...), recorded with it."""
    setup = _agent(name)._setup(conversation)
    first = round_.choices[0]
    one = replace(round_, choices=(replace(first, calls=(first.calls[index],)),))
    gate = Gate(setup.tools.current.specs, limits=setup.limits, policy=setup.policy)
    told: list[AgentEvent] = []
    async with setup.dispatcher.round(conversation, gate=gate, on_event=told.append) as dispatch:
        (result,) = await dispatch.finish(one)
    return result, told


async def _tell(name: str, run: AgentRun, told: int) -> int:
    """Hand the run's new events to the agent's sink, numbered from ``told``; the count."""
    sink = _SINKS.get(name)
    while run._events:
        event = run._events.popleft()
        if event is None or isinstance(event, PreviewUpdated):
            continue
        if sink is not None:
            answer = sink(run.conversation, told, event)
            if inspect.isawaitable(answer):
                await answer
        told += 1
    return told


@DBOS.workflow(name="toollatch.agent_run")
async def _agent_run(name: str, conversation: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    # The events are made by this (deterministic) code from the steps' recorded outputs, so a
    # recovered run tells the events of its replayed steps again, under the same numbers.
    run = _run(name, conversation, history)
    limits = run._setup.run_limits
    told = 0
    while len(run.rounds) < limits.max_rounds:
        asked = await _model_round(name, conversation, run.history)
        if isinstance(asked, str):
            run.error = asked
            break
        if asked.text:
            run._emit(TextEvent(text=asked.text))  # the round's text, whole
        # a round's calls are told with it: keys of earlier rounds are not theirs (a round
        # asked again in another process numbers its attempt from that process's counter)
        run._opened.clear()
        run._decided(asked)
        told = await _tell(name, run, told)
        results = []
        for i in range(len(asked.calls)):
            result, events = await _call(name, conversation, asked, i)
            results.append(result)
            for event in events:
                run._emit(event)
            told = await _tell(name, run, told)
        run._close(asked, results)
        told = await _tell(name, run, told)
        if not await run._again(asked):
            break
    ended = run._run_ended()
    run._emit(ended)
    await _tell(name, run, told)
    return {
        "rounds": ended.rounds,
        "calls": ended.calls,
        "history": ended.history,
        "error": ended.error,
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

    def __init__(self, url: str, *, executor_id: str, app: str = "toollatch") -> None:
        if not url.startswith(("postgresql://", "postgres://")):
            raise UsageError(f"a durable store is a postgresql:// URL, got {url!r:.60}")
        if not executor_id:
            raise UsageError("executor_id must be a non-empty str")
        self.executor_id = executor_id
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

    def register(self, name: str, agent: Agent, *, on_event: EventSink | None = None) -> None:
        """Make ``agent`` the one runs named ``name`` use in this process. It needs a
        ledger (the only record of whether a dead worker's tool had started). ``on_event``
        is told the events of its runs that this process drives (see ``EventSink``)."""
        if not isinstance(agent, Agent):
            raise UsageError(f"register takes an Agent, got {agent!r:.60}")
        if agent.ledger is None:
            raise UsageError("a durable agent needs a ledger shared by the workers")
        _AGENTS[name] = agent
        if on_event is not None:
            _SINKS[name] = on_event
        else:
            _SINKS.pop(name, None)

    def launch(self) -> None:
        """Start the engine (this process's own pending runs are recovered by DBOS)."""
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
    ) -> str:
        """Start a run of the agent registered as ``agent`` under ``run_id`` (the workflow
        id and the conversation; starting an id again is the same run, not a new one)."""
        entries = [dict(m) for m in history]
        if message is not None:
            entries.append(user_message(_agent(agent).client.provider, message))
        if not entries:
            raise UsageError("a run needs a message or a history")
        with SetWorkflowID(run_id):
            handle = await DBOS.start_workflow_async(_agent_run, agent, run_id, entries)
        self._started[run_id] = handle
        return run_id

    async def result(self, run_id: str) -> DurableResult:
        """Wait for run ``run_id`` to end, here or on any worker."""
        handle = self._started.pop(run_id, None)
        if handle is None:  # another worker's, or recovered: its row, polled
            handle = await DBOS.retrieve_workflow_async(run_id)
        ended = await handle.get_result(polling_interval_sec=_POLL_S)
        return DurableResult(run_id=run_id, **ended)

    async def recover(self, executor_ids: Sequence[str]) -> list[str]:
        """Take over the pending runs of the (dead) workers ``executor_ids``: the ids of the
        runs re-enqueued, each to be finished by one live worker."""
        ids = [e for e in executor_ids if isinstance(e, str) and e]
        if not ids:
            raise UsageError("recover needs the executor ids of the dead workers")
        handles = await asyncio.to_thread(DBOS._recover_pending_workflows, ids)
        return [h.workflow_id for h in handles]
