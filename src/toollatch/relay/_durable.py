"""Relay runs as DBOS workflows, taken over by a surviving worker (internal; ``toollatch
serve --durable postgresql://...``, the ``durable`` extra, with a shared Redis run store).

Theory of operation. A run of ``POST /runs`` (a new one or a resumed one), of a chat and
of AG-UI is a workflow of :class:`toollatch.runtime.DurableRuns` (see
:mod:`toollatch.runtime._durable`: each model round one step recording the round, each
committed call one step under the ledger's call id, which the tool reads as its idempotency
key). Its conversation, and its workflow id, is the run's ledger scope
(:func:`._requests.run_scope_of`: the session's digest and the run id), its agent's name the
plain data that rebuilds the agent in any worker (provider, model, the session's tools, an
AG-UI run's frontend tools): every worker registers one factory (:meth:`DurableRelay._agent`)
before DBOS launches.

Events. The workflow numbers its events from 0, and event ``n`` is the run's frame ``id:
n + 1``: the sink (:meth:`DurableRelay._tell`) appends each to the run's log as the relay's
own observer would (``shown``; a preview as ``call_preview``), and the Redis writer copies it
to the shared log. The sink is live (it has an attempt hook, :meth:`DurableRelay._attempt`):
a model round's text deltas, ``call_opened`` and previews reach the log as the model streams
them, and its ``reasoning`` events (as a plain run's, when its stream ended) before its
``call_committed``, not when the round's step ends, so the page and the AI SDK / AG-UI
streams move during the round. A workflow recovered elsewhere tells its replayed steps'
events again under the same numbers (a round step records its events and the number they
began at); the worker driving it keeps only the numbers past what its log (or the shared
log) has, so a reader's ``Last-Event-ID`` goes on with no event lost or twice.

A dead attempt. The worker that died mid-round had written that attempt's events live, but
its step was never recorded: the recovered workflow asks the round again from the number
the attempt began at. Before its first event, the attempt hook reads the log: events past
that number are the dead attempt's, and they are closed as the lease path closes a dead run
(:func:`.store._orphans.closing_events` without its ``run_ended``: each opened call
``call_failed`` ``stream_interrupted``, each committed one ``tool_finished`` ``cancelled``,
as no call step had begun, the round ``round_ended`` ``interrupted``); the new attempt's
events are numbered after the log's newest id. So an id a reader got keeps its event, no id
is skipped, and every call opened is ended before its id opens again (the new attempt may
reuse the model's call ids).

Takeover. Each worker's DBOS ``executor_id`` is its Redis worker id. When the lease sweep
wins a dead worker's run (:meth:`._app.Relay.adopt_orphan`), the survivor asks DBOS to
recover that executor's pending workflows (once per dead worker); the runs among them are
"resumed", the others ended the Redis way (every call paired). A recovered workflow is
run by whichever live worker dequeues it: on its first step or event there, that worker
takes the run over in the store (:meth:`RedisRunStore.take_over`: owner, ``running``) and
goes on with the run's log after the shared log's newest id. Readers on every worker read
such a run from the shared log (:meth:`._app.Relay.find_run`). An AG-UI run's thread gets a
keeper there (:meth:`.protocols._agui.AguiEndpoint.resume`, its thread id
``kept["agui_thread"]``): its thread is busy there, and its answers are taken there. A run
nobody took over within :data:`_UNTAKEN_S` (the worker that dequeued its workflow had lost
the run to a Redis restart, and refuses it) is ended by the sweep's winner the Redis way; a
workflow whose run is over when it gets to a worker runs no further step there (as a lost
run's).

Histories. A run starts from a stored history and writes what it added at its end: a
chat's message (``POST /api/chat``, ``POST /runs {"chat_id"}``) the chat's history (its
branch's, :mod:`._chats`), an AG-UI run (``POST /agui``) its thread's
(:class:`.protocols._agui.StoredThreads`: the thread's provider is stored beside it before
the workflow starts; the thread's keeper, told the run's events on the worker driving it,
saves nothing), a run of ``POST /runs`` its own (under its ledger scope, from nothing),
which ``POST /runs {"resume"}`` continues. The new entries are written when the workflow
tells ``run_ended``, before that event reaches the log, by whichever worker drives the run
then: a reader that sees the end (the AI SDK's ``finish``, AG-UI's ``RUN_FINISHED``) finds
the history stored, and the next message, on any worker, continues it. The history's key
and the length it had are kept beside the run (:attr:`RelayRun.kept` ``history`` and
``history_at``, in the run's Redis metadata), where a worker that takes the run over reads
them (:meth:`RedisRunStore.take_over`). Written with the length as the append's ``at``, the
entries are written once (a told-again end is skipped; a second writer gets
``HistoryConflict``). An AG-UI run's calls have the run's own ledger scope, not the
thread's as on the plain path: its thread's history, each run's written whole at its end,
has every call paired, so no later run asks a call of it again.

Resumed runs. ``POST /runs {"resume": id}`` continues the run's own stored history under
its id, in its conversation (so its ledger scope: a call id the model asks again that an
earlier run of it finished returns that result), as a workflow of a new id (a DBOS workflow
id started again is the same workflow, not a new one): ``<scope>~<random>``, kept beside
the run (``kept["workflow"]``), whence a worker that takes it over, or recovers a dead
worker's workflows, knows it. Its log starts again from id 1, as on the plain path.

PostgreSQL lost. DBOS never gives up on its database: a step's record waits for it,
retrying, so a run goes on once PostgreSQL is back (a restart), and until then its workflow
waits. A worker that stops meanwhile (:meth:`DurableRelay.handing_over`: it asks PostgreSQL
for a connection first) hands nothing over, as no survivor could recover a workflow: each
of its runs has its step cancelled and is ended here, every call paired (the ledger says
what became of a call whose step did not return), and its history gets its turn (the
chat's, the AG-UI thread's, the run's own): the user's message, the rounds it finished, the
round it cut off with each call's fate, and an assistant note that the answer was
interrupted (:meth:`DurableRuns.interrupted`), so the next message, on any worker, follows
an assistant turn. So does a run whose workflow failed. The stopping worker then exits
without DBOS's thread that still waits (``toollatch serve``); the workflow stays pending in
PostgreSQL, unrecorded past its last step.

What is not durable: a run whose worker dies (SIGKILL) while PostgreSQL is lost, or whose
recovered workflow no survivor can drive (its model not served there), is ended the Redis
way (every call paired), and what it added is not stored in its history: its chat's or
thread's next message goes on from before it, and a run of ``POST /runs`` that had stored
nothing is not resumable (404). An AG-UI answer to a run a survivor took over streams the
run again from its first event (where the client's last stream ended is known to the dead
worker only), as after a restart.

Questions. A call that waits for a person (``approval_requested``) or a client tool's result
(``client_call``) waits in its own workflow step (:mod:`toollatch.runtime._durable`), for the
answer in the ledger's question store. The run's :attr:`RelayRun.agent_run` is an answerer
(:meth:`DurableRuns.answers`) that writes there, so an answer posted to any worker (the
answer routes, the AI SDK's answer message) reaches the owner's run as any answer does
(forwarded), and the owner writes it to the ledger. A worker that takes a run over reads
the questions its shared log carries (``asked``, signed again with its ``approval_secret``,
which the workers must share for the tokens its readers got to hold) and its agent's name
(``kept["agent"]``); the recovered step waits for the same question, its event told again
under the same number (the log has it once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core._errors import ConfigError, UsageError
from ..core._events import ReasoningBlock
from ..core._preview import PreviewUpdated
from ..core._round import reasoning_text
from ..ledger import HistoryConflict, LedgerError
from ..runtime import DurableRuns
from ..runtime._agent import Agent
from ..runtime._agent_events import AgentEvent, RunEndedEvent
from ..runtime._agent_run import AgentRun
from ..runtime._clients import model_client
from ..runtime._run_setup import RunLimits
from ..tools._tools import Tool
from ._answers import approval_scope, sign
from ._requests import run_scope_of
from ._restore import client_tool_specs, client_tools
from ._runs import RelayRun, preview_json
from .protocols._agui import StoredThreads, Thread
from .store._base import StoreUnavailable
from .store._orphans import closing_events, read_log
from .store._redis import RedisRunStore

if TYPE_CHECKING:
    from ._app import Relay

_log = logging.getLogger("toollatch.relay")

_SETTLE_S = 1.0
"""How long after a recovered workflow's end its run may still be written by its driver."""

_UNTAKEN_S = 15.0
"""How long a lease sweep's winner waits for a worker to take a recovered workflow's run
over (its first step or event there) before it ends the run the Redis way: a workflow
dequeued by the very worker that lost the run (a Redis restart lost its lease: it refuses
the workflow, its own execution fenced) has no driver, and its run would never end."""

_ASKED_AGAIN = "its round is asked again (a new attempt)"
"""Why a dead worker's attempt of a round was closed (the calls' ``detail`` says it)."""

_PROBE_S = 1.0
"""How long a stopping worker waits for its PostgreSQL to take a connection (else its
durable runs are ended here, not handed over: see :meth:`DurableRelay.handing_over`)."""

_STRANDED_S = 1.0
"""How long a run cancelled by a worker stopping with PostgreSQL lost is given to stop its
step (a tool's cancel written to the ledger) before the run is ended here."""

_STRANDED = (
    "the relay is shutting down and its durable store (PostgreSQL) is unreachable: the run "
    "was ended"
)
"""The ``run_ended.error`` of such a run."""

_QUESTIONS = frozenset({"approval_requested", "client_call", "approval_answered"})
"""The events of a run's log that :func:`._answers.sign` reads (a taken-over run's)."""

_AGENTS_KEPT = 256
"""Agents kept built (one per provider, model and session's tools); the oldest rebuilt."""


class DurableRelay:
    """The relay's runs on DBOS (see the module docstring). ``url``: the PostgreSQL
    system database; ``lease_s``: the ledger claims' lease (a dead worker's started call is
    ``outcome_unknown`` once it ran out)."""

    def __init__(self, relay: Relay, url: str, *, lease_s: float) -> None:
        if not isinstance(relay.store, RedisRunStore):
            raise ConfigError("--durable needs a shared run store: --store redis://HOST:PORT/DB")
        if relay.ledger is None:
            raise ConfigError("--durable needs a ledger shared by the workers (--ledger)")
        self.relay, self.store = relay, relay.store
        self.url, self.lease_s = url, lease_s
        self.engine = DurableRuns(url, executor_id=relay.store.worker, app="toollatch-relay")
        self._agents: OrderedDict[str, Agent] = OrderedDict()
        self._runs: dict[str, RelayRun] = {}  # workflow id -> the run this worker drives
        # workflow id -> the number of its next new event (its log's newest id, unless the
        # log left events out: a run past max_run_events drops its text and previews)
        self._next: dict[str, int] = {}
        self._recovered: set[str] = set()  # workflow ids recovered by this worker's sweeps
        # workflow id -> the history key its end is kept under (a chat's, an AG-UI thread's,
        # the run's own) and the history's length at the run's start
        self._chats: dict[str, tuple[str, int]] = {}
        self._observers: dict[str, list[Any]] = {}  # workflow id -> told its events here
        self._recovering: dict[str, asyncio.Task[list[str]]] = {}  # dead worker -> recovery
        self._watches: set[asyncio.Task[None]] = set()  # recovered runs nobody took yet
        self._lost: set[str] = set()  # workflow ids this worker lost to another (fenced)
        self._stranded = asyncio.Event()  # set: stopping with PostgreSQL lost
        # workflow ids whose run was ended without them (here, or before a recovery got here)
        self._abandoned: set[str] = set()
        relay.store.on_lost = self._lose
        relay.store.goes_on = self.hand_over

    def open(self) -> None:
        """Register the factory and launch DBOS on the running loop (its recovered runs
        then run on the relay's loop); ``ConfigError`` when PostgreSQL cannot be used."""
        self.engine.register_factory(
            self._agent, on_event=self._tell, on_attempt=self._attempt, fence=self._fence
        )
        try:
            self.engine.launch()
        except Exception as exc:  # (DBOS raises its own errors, or psycopg's)
            self.engine.destroy()
            shown = self.url.rsplit("@", maxsplit=1)[-1]
            raise ConfigError(f"durable store {shown}: {type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        """Stop DBOS (the runs in flight stay pending: a survivor recovers them) and close
        the agents' model clients."""
        for task in list(self._watches):
            task.cancel()
        await asyncio.to_thread(self.engine.destroy)
        for agent in self._agents.values():
            with contextlib.suppress(Exception):
                await agent.client.aclose()
        self._agents.clear()

    # -- starting a run ----------------------------------------------------------------------

    def start(
        self,
        run: RelayRun,
        provider: str,
        model: str,
        message: str | None,
        *,
        history: Sequence[Mapping[str, Any]] = (),
        chat: str | None = None,
        resumed: bool = False,
        tools: Sequence[Tool[..., Any]] = (),
        observers: Sequence[Any] = (),
        thread: str | None = None,
    ) -> None:
        """Start ``run`` (admitted, recorded in the store) as a workflow: ``message`` after
        ``history``, the history stored under ``chat`` (a chat's or an AG-UI thread's key;
        default: the run's own scope), to which its new entries are written at its end.
        ``resumed``: it continues an ended run of the same id (its own stored history), as
        a workflow of a new id in the same conversation. ``tools``: client tools (AG-UI's
        frontend tools, named in its agent's name); ``observers``: told its events on this
        worker (an AG-UI thread's keeper); ``thread``: the AG-UI thread id of ``chat``."""
        relay = self.relay
        own = relay.tools is None and relay.tool_source is None  # (the session's examples)
        parts: list[Any] = [provider, model, run.session_key[:24] if own else ""]
        if tools:
            parts.append(client_tool_specs(tools))
        name = json.dumps(parts)
        workflow = run_scope_of(run.session_key, run.id)
        workflow_id = f"{workflow}~{secrets.token_hex(6)}" if resumed else workflow
        self._agent(name)  # (a ConfigError / UsageError now, not in the workflow)
        self._runs[workflow] = run
        key = chat or workflow
        self._chats[workflow] = (key, len(history))
        # (see RelayRun.kept; before its first write; ``agent``: a survivor's answers)
        run.kept = {"conversation": workflow, "agent": name}
        run.kept.update(history=key, history_at=str(len(history)))
        if workflow_id != workflow:
            run.kept["workflow"] = workflow_id
        if thread is not None:
            run.kept["agui_thread"] = thread
        if observers:
            self._observers[workflow] = list(observers)
        approval = approval_scope(run.session_key)

        async def started() -> None:
            if thread is not None:
                await self._thread_kept(run, key, provider)
            await self.engine.start(
                name, message, run_id=workflow_id, history=history,
                approval_session=approval, conversation=workflow,
            )  # fmt: skip
            await self._wait(run, workflow, workflow_id)

        async def body() -> None:
            await self._drive(run, workflow, started())

        answers = self.engine.answers(name, workflow, approval)
        run.drive(body, self._stopper(workflow), self._closing(workflow), answers=answers)

    async def _thread_kept(self, run: RelayRun, key: str, provider: str) -> None:
        """An AG-UI thread's provider stored beside its history (:class:`StoredThreads`'s
        ``/meta``), before its first run: its end writes only the thread's messages."""
        threads = self.relay.agui.threads
        if not isinstance(threads, StoredThreads):
            return
        try:
            await threads.save_under(key, Thread(provider, ()))
        except HistoryConflict:
            pass  # (another run of the thread wrote it first)
        except (LedgerError, UsageError) as exc:
            _log.error("run %s…: its thread's provider was not kept: %s", run.id[:6], exc)

    def _stopper(self, workflow: str) -> Callable[[str | None], None]:
        def stop(reason: str | None) -> None:
            self.engine.cancel(workflow, reason)

        return stop

    def _closing(self, workflow: str) -> Any:
        async def closing() -> None:
            self._runs.pop(workflow, None)
            self._next.pop(workflow, None)
            self._chats.pop(workflow, None)
            self._observers.pop(workflow, None)
            self.engine.forget(workflow)  # (a workflow lost here never returned)

        return closing

    async def _wait(self, run: RelayRun, workflow: str, workflow_id: str) -> None:
        """Wait for the workflow ``workflow_id`` (of the conversation ``workflow``) to end;
        when it failed without ``run_ended`` (a step's record refused, a bug), end the run
        here (:meth:`_failed`)."""
        try:
            await self.engine.result(workflow_id)
        except Exception as exc:
            if run.handed_over:
                return  # (DBOS stopped under it: a survivor recovers it)
            _log.error("run %s…: its workflow failed: %s: %s", run.id[:6], type(exc).__name__, exc)
            await self._failed(
                run, workflow, f"the durable run failed: {type(exc).__name__}: {exc}"
            )

    async def _drive(self, run: RelayRun, workflow: str, work: Awaitable[None]) -> None:
        """``work`` (the run's workflow, waited for), unless this worker stops with its
        PostgreSQL lost first (:meth:`handing_over`): the workflow can record nothing more
        then (DBOS waits for the database however long it is gone), so its step is
        cancelled (a tool stops), and the run is ended here (:meth:`_failed`); the
        workflow stays pending in PostgreSQL, and nothing of it is told here any more."""
        task = asyncio.ensure_future(work)
        stranded = asyncio.ensure_future(self._stranded.wait())
        try:
            done, _ = await asyncio.wait({task, stranded}, return_when=asyncio.FIRST_COMPLETED)
            if task not in done:
                self.engine.cancel(workflow, _STRANDED)
                done, _ = await asyncio.wait({task}, timeout=_STRANDED_S)
            if task in done:
                await task  # (what it raised, if it did)
                return
        finally:
            stranded.cancel()
            if not task.done():
                task.cancel()
        self._abandoned.add(workflow)  # (nothing more of its workflow is told)
        _log.error("run %s…: ended here, its durable store is unreachable", run.id[:6])
        await self._failed(run, workflow, _STRANDED)

    async def _failed(self, run: RelayRun, workflow: str, error: str) -> None:
        """End ``run``, whose workflow failed or cannot go on, every call paired: its turn
        is stored first in its history (its chat's, AG-UI thread's or own: its message and
        the round it cut off, as
        :meth:`DurableRuns.interrupted` makes them), once, then the end is logged."""
        chat = self._chats.pop(workflow, None)
        entries = await self.engine.interrupted(workflow, 0 if chat is None else chat[1])
        if chat is not None and entries:
            await self._keep_chat(run, *chat, entries)
        if not await run.ending():
            await self._end(run, error)

    async def _end(self, run: RelayRun, error: str, *, run_ended: bool = True) -> None:
        """Append the events that end ``run`` from what its log holds (the shared log's
        frames before this log's own); ``run_ended`` False: only what closes its calls and
        its round (an interrupted attempt's)."""
        frames = [] if run.log.start == 0 else await self.store.logged(run.id)
        frames = frames[: run.log.start]
        _missed, own, _cursor = run.log.frames(0, run.log.last_id + 1)
        seen = read_log([*frames, *own])
        if seen.ended:
            return
        known = await self.store.known(run.id, run.session_key, seen)
        events = closing_events(seen, error, known)
        for event in events if run_ended else events[:-1]:
            run.append(run.shown(event))

    async def handing_over(self) -> Callable[[RelayRun], bool]:
        """What a stopping worker leaves to a survivor: :meth:`hand_over`'s runs, unless
        its PostgreSQL takes no connection (within :data:`_PROBE_S`): no survivor could
        recover a workflow then, and this worker's cannot record another step, so none is
        handed over; each of its runs is cancelled and ended here (:meth:`_drive`)."""
        if not self._stranded.is_set() and await self.engine.reachable(_PROBE_S):
            return self.hand_over
        if not self._stranded.is_set():
            _log.error("the durable store (PostgreSQL) is unreachable: the runs are ended here")
            self._stranded.set()
        return lambda _run: False

    def hand_over(self, run: RelayRun) -> bool:
        """Whether a stopping worker leaves ``run`` to a survivor instead of cancelling it:
        a durable run of this worker (its workflow stays pending in PostgreSQL once DBOS
        stops here; the events it tells until then reach the shared log before this
        worker's lease is dropped, and the survivor goes on after them)."""
        return run in self._runs.values()

    # -- the workflow's side -----------------------------------------------------------------

    def _agent(self, name: str) -> Agent:
        """The agent of a workflow's name (built once, kept among the newest)."""
        agent = self._agents.get(name)
        if agent is not None:
            self._agents.move_to_end(name)
            return agent
        try:
            provider, model, tools_key, *specs = json.loads(name)
            frontend = client_tools({"client_tools": specs[0]}) if specs else []
        except (ValueError, TypeError, KeyError, ConfigError):
            raise UsageError(f"not a relay run's agent: {name[:80]!r}") from None
        relay = self.relay
        if provider not in relay.providers or model not in relay.models:
            raise UsageError(f"{provider} / {model} is not served by this worker")
        tools = relay.tools
        if tools is None and relay.tool_source is None:
            tools = relay.session_tools(tools_key)
        agent = Agent(
            model_client(
                provider, model=model, base_url=relay.base_url_for(provider), http=relay.http[0]
            ),
            (*(tools or ()), *frontend),
            previews=relay.previews,
            observers=[relay.metrics] if relay.metrics is not None else [],
            tool_source=relay.tool_source,
            ledger=relay.ledger,
            lease_s=self.lease_s,
            run_limits=relay.run_limits or RunLimits(),
            approvals=relay.approvals,
            always_store=relay.always_store,
        )
        self._agents[name] = agent
        while len(self._agents) > _AGENTS_KEPT:
            _old, dropped = self._agents.popitem(last=False)
            asyncio.get_running_loop().create_task(dropped.client.aclose())
        return agent

    async def _tell(
        self, workflow: str, number: int, event: AgentEvent | PreviewUpdated | ReasoningBlock
    ) -> None:
        """The workflow's event ``number`` into its run's log (once per number); a
        reasoning block as the ``reasoning`` event a plain run's observer makes of it."""
        run = await self._driven(workflow)
        if run is None:
            return
        told = self._next.get(workflow, run.log.last_id)
        if number < told:
            return  # (a replayed step's event, or a live round's told again: the log has it)
        if number > told:  # (never expected: the workflow tells every number)
            _log.error("run %s…: event %d after %d", run.id[:6], number, told)
        self._next[workflow] = number + 1
        if isinstance(event, PreviewUpdated):
            run.append(preview_json(event))
            return
        if isinstance(event, ReasoningBlock):
            run.append({"type": "reasoning", "text": reasoning_text(event.data)})
            return
        if isinstance(event, RunEndedEvent) and workflow in self._chats:
            if not await self._fence(workflow):  # (the chat is the new driver's to write)
                raise DurableRuns.Lost(f"run {run.id[:6]}… is driven by another worker now")
            key, at = self._chats.pop(workflow)
            await self._keep_chat(run, key, at, event.history[at:])
        for observer in self._observers.get(workflow, ()):
            observer.on_event("", event)  # (before the log: as the plain path's observers)
        run.observer.on_event("", event)

    async def _keep_chat(
        self, run: RelayRun, key: str, at: int, entries: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append a run's new history ``entries`` at ``at`` to ``key``: its chat's, its
        AG-UI thread's or its own (before its ``run_ended`` is logged: see the module
        docstring)."""
        try:
            await self.relay.chats.history.append(key, [dict(m) for m in entries], at=at)
        except HistoryConflict as exc:  # (already written: a driver before this one)
            _log.warning("run %s…: its chat's history was written already: %s", run.id[:6], exc)
        except (LedgerError, UsageError) as exc:
            _log.error("run %s…: its chat's history was not kept: %s", run.id[:6], exc)

    async def _attempt(self, workflow: str, number: int) -> int:
        """A model round's attempt begins at event ``number``: the number its first event
        gets. Past ``number``, the log may hold an earlier attempt of the round, streamed
        live by a worker that died before its step was recorded: that attempt is closed
        (its calls paired, its round ended ``interrupted``) and the new one goes on after."""
        run = await self._driven(workflow)
        if run is None:
            return number
        if run.log.last_id > number:
            _log.warning("run %s…: its round is asked again (a new attempt)", run.id[:6])
            await self._end(run, _ASKED_AGAIN, run_ended=False)
            self._next[workflow] = run.log.last_id
        return max(number, self._next.get(workflow, number))

    async def _driven(self, workflow: str) -> RelayRun | None:
        """The run of a workflow this worker drives (taken over on first contact);
        ``DurableRuns.Lost`` when this worker lost it to another."""
        if workflow in self._lost or workflow in self._abandoned:
            raise DurableRuns.Lost(f"run {workflow[-24:][:6]}… is driven by another worker now")
        run = self._runs.get(workflow)
        return run if run is not None else await self._take(workflow)

    async def _fence(self, workflow: str) -> bool:
        """Whether this worker may run the workflow's next step (see
        :data:`toollatch.runtime._durable.Fence`): not when it lost the run, which the
        store says, nor when the run is over (a run not driven here yet is taken over
        first: a recovered workflow whose run ended runs no step)."""
        if workflow in self._abandoned:
            return False
        if workflow not in self._runs and workflow not in self._lost:
            try:
                await self._driven(workflow)
            except DurableRuns.Lost:
                return False
        run = self._runs.get(workflow)
        if workflow in self._lost or (run is not None and not await self.store.holds(run.id)):
            if run is not None and run.lost is None:
                self.store.lost(run)
            return False
        return True

    def _lose(self, run: RelayRun) -> bool:
        """(:attr:`RedisRunStore.on_lost`) Another worker has ``run`` now: its workflow's
        execution here stops at its next step or event, recording nothing (``DurableRuns.Lost``:
        no cancel, which would be recorded); True for a durable run of this worker."""
        workflow = next((w for w, r in self._runs.items() if r is run), None)
        if workflow is None:
            return False
        self._lost.add(workflow)
        return True

    async def _take(self, workflow: str) -> RelayRun | None:
        """A recovered workflow this worker now drives: its run, taken over in the store,
        its log going on after the shared one (None: the store is unreachable).
        ``DurableRuns.Lost`` when the run is gone or over (a survivor ended it: its calls
        were paired in its log, so no step of its workflow runs any more)."""
        run_id = workflow[-24:]
        try:
            taken = await self.store.take_over(run_id)
        except StoreUnavailable as exc:
            _log.error("run %s… could not be taken over: %s", run_id[:6], exc)
            return None
        if taken is None:
            self._abandoned.add(workflow)
            _log.warning("run %s…: its run is over, its recovered workflow stops", run_id[:6])
            raise DurableRuns.Lost(f"run {run_id[:6]}… is over")
        session_key, last, kept = taken
        relay = self.relay
        run = RelayRun(
            "", relay.previews, relay.limits, run_id=run_id, session_key=session_key,
            approval_secret=relay.approval_secret, start=last,
        )  # fmt: skip
        run.kept = dict(kept)
        chat, at = kept.get("history"), kept.get("history_at", "")
        if chat is not None and at.isdigit():
            self._chats[workflow] = (chat, int(at))
        answers = await self._asked(run, workflow)
        relay.runs.keep(run)
        thread = kept.get("agui_thread")
        if thread is not None:  # (kept first: its thread is busy here, its answers taken here)
            self._observers[workflow] = [relay.agui.resume(run, thread, "", saves=False)]
        self.store.mirrored(run)
        self._runs[workflow] = run
        _log.warning("run %s…: taken over from a dead worker (after event %d)", run_id[:6], last)

        workflow_id = kept.get("workflow", workflow)

        async def body() -> None:
            await self._drive(run, workflow, self._wait(run, workflow, workflow_id))

        run.drive(body, self._stopper(workflow), self._closing(workflow), answers=answers)
        return run

    async def _asked(self, run: RelayRun, workflow: str) -> AgentRun | None:
        """What a taken-over ``run`` asked (its shared log's questions, signed again: with
        the workers' shared ``approval_secret`` their tokens are the ones its readers got),
        and where its answers go (None: its agent cannot be made here)."""
        try:
            frames = await self.store.logged(run.id)
        except StoreUnavailable as exc:
            _log.error("run %s…: its questions could not be read: %s", run.id[:6], exc)
            frames = []
        for frame in frames:
            _head, _, body = frame.partition(b"\ndata: ")
            with contextlib.suppress(ValueError):
                data = json.loads(body)
                if isinstance(data, dict) and data.get("type") in _QUESTIONS:
                    sign(self.relay.approval_secret, run.asked, data)
        name = run.kept.get("agent")
        try:
            self._agent(name or "")
        except (ConfigError, UsageError) as exc:
            _log.error("run %s…: its answers cannot be taken here: %s", run.id[:6], exc)
            return None
        assert name is not None
        return self.engine.answers(name, workflow, approval_scope(run.session_key))

    # -- the lease sweep's side --------------------------------------------------------------

    async def recovered(
        self, run_id: str, session: str, owner: str, workflow_id: str | None = None
    ) -> bool:
        """Whether the dead worker ``owner``'s run goes on as a recovered workflow (its
        executor's pending workflows recovered once, by this worker); ``workflow_id``:
        the run's, when not its scope (``kept["workflow"]``: a resumed run's)."""
        workflow = workflow_id or run_scope_of(session, run_id)
        if workflow in self._recovered:
            return True
        task = self._recovering.get(owner)
        if task is None:
            task = asyncio.get_running_loop().create_task(self.engine.recover([owner]))
            self._recovering[owner] = task
        try:
            ids: Sequence[str] = await task
        except Exception as exc:  # (PostgreSQL unreachable: the run is ended the Redis way)
            _log.error("worker %s's runs could not be recovered: %s", owner, exc)
            self._recovering.pop(owner, None)
            return False
        self._recovered.update(ids)
        if workflow not in self._recovered:
            return False
        watch = asyncio.get_running_loop().create_task(
            self._watch(run_id, session, owner, workflow)
        )
        self._watches.add(watch)
        watch.add_done_callback(self._watches.discard)
        return True

    async def _watch(self, run_id: str, session: str, owner: str, workflow: str) -> None:
        """Once the recovered workflow is over, or :data:`_UNTAKEN_S` after its recovery,
        end its run the Redis way if no worker took it over (the workflow failed before its
        first event, e.g. PostgreSQL lost; or nobody drives it: the worker that dequeued it
        had lost the run). A worker that takes it over later finds it over and runs no
        step of it (:meth:`_take`)."""
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_UNTAKEN_S):
                    with contextlib.suppress(Exception):  # (failed: the run may have no end yet)
                        await self.engine.result(workflow)
                    await asyncio.sleep(_SETTLE_S)  # (the worker that drove it writes its end)
            if await self.store.end_if_held(run_id, owner, session):
                _log.warning(
                    "run %s…: its recovered workflow ended, nobody had taken it", run_id[:6]
                )
        except Exception as exc:  # (the store lost too: a later sweep sees the run)
            _log.error("run %s…: its recovery could not be watched: %s", run_id[:6], exc)
