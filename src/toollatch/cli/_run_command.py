"""``toollatch run``: one agent run from the command line (internal; the arguments are in
:mod:`toollatch.cli._run`, which imports this module only for ``run``).

Without ``--base-url`` the run talks to the scripted model server (started here, on
loopback) with the built-in example tools: no key, no network. ``--mcp`` (and the config's
``mcp.servers``) adds the tools of MCP servers (:mod:`toollatch.mcp`) instead of the
examples; they are connected before the run and closed after it. ``--json`` prints one agent
event per line (the contract in :mod:`toollatch.runtime._agent_events`); otherwise a live
terminal view shows the streaming text and one line per call with its state and timings.
Exit status: 0 when the run ended (whatever its calls' outcomes), 1 when the model could not
be reached or answered an error (one line on standard error), 124 when the run's deadline
passed (``run_ended.error`` says so, every call paired), 2 for a usage error, 130 / 143
when SIGINT / SIGTERM cancelled the run (its events still end with ``round_ended`` and
``run_ended``, whose ``error`` names the signal, every call paired; a second signal exits at
once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from ..core._errors import ConfigError, ToolLatchError, UsageError
from ..ledger import ArgumentAudit
from ..ledger._open import open_audit, open_history, open_ledger
from ..mcp import McpToolSource, source_from_config
from ..runtime._agent import Agent
from ..runtime._agent_events import AgentEvent, ToolFinishedEvent
from ..runtime._agent_run import AgentRun
from ..runtime._approvals import ApprovalPolicy
from ..runtime._clients import ModelClient, ModelError, model_client
from ..runtime._run_setup import RunLimits
from ..scripted import ScriptedServer
from ..tools._examples import example_tools
from ..tools._tools import Tool
from ._app_config import Config, configured
from ._approve import Answerer
from ._output import visible

DEFAULT_MESSAGE = "What is the weather in Oslo and in Zürich? Write it down in notes/weather.md."
SCRIPTED_MODEL = "scripted"
RESULT_CHARS = 160
"""Most characters of a call's result line in the terminal view (a longer one ends in ``…``;
so does one wider than the terminal)."""
DEADLINE_EXIT = 124
"""The exit status of a run ended by its deadline (``--deadline``, ``relay.deadline_s``): as
``timeout(1)``'s."""


class CommandError(Exception):
    """A usage error of ``toollatch run`` (exit status 2)."""


class _ConfigProblems(CommandError):
    """Configuration problems: told one per line, as ``toollatch config check`` tells them."""


def load_tool_file(path: str) -> list[Tool[..., Any]]:
    """Import ``path`` and return every ``@toollatch.runtime.tool`` object it defines, in
    definition order. Raises :class:`CommandError` when it cannot be imported or has none."""
    file = Path(path)
    if not file.is_file():
        raise CommandError(f"--tools {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"toollatch_user_tools_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise CommandError(f"--tools {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise CommandError(f"--tools {path}: {type(exc).__name__}: {exc}") from None
    found = [v for v in vars(module).values() if isinstance(v, Tool)]
    if not found:
        raise CommandError(f"--tools {path}: no function decorated with @toollatch.tool")
    return found


def run_command(args: argparse.Namespace) -> int:
    """Run ``toollatch run`` with parsed ``args``; returns the exit status."""
    try:
        return asyncio.run(_run(args))
    except CommandError as exc:
        return _fail(str(exc), 2, lines=isinstance(exc, _ConfigProblems))
    except KeyboardInterrupt:
        return 130


async def _run(args: argparse.Namespace) -> int:
    config = _load(args)
    args.provider = args.provider or (config.model.provider if config else "openai_chat")
    base_url = args.base_url or (config.model.base_url if config else None)
    model = args.model or (config.model.model if config else None)
    if base_url is None:
        model = model or SCRIPTED_MODEL
        args.demo = model == SCRIPTED_MODEL  # (the demo script, whatever the message)
        async with ScriptedServer() as server:
            return await _with_model(args, server.base_url(args.provider), model, config)
    if not model:
        raise CommandError("--model is required with --base-url")
    return await _with_model(args, base_url, model, config)


def _load(args: argparse.Namespace) -> Config | None:
    """The ``--config`` file with the ``TOOLLATCH_...`` overrides, read with or without the
    flag; None with neither (then the run has the library's defaults, eager tools starting
    early)."""
    path = getattr(args, "config", None)
    try:
        return configured(path)
    except ConfigError as exc:
        where = f"--config {path}" if path else "environment"
        raise _ConfigProblems(f"{where}: {exc}") from None


def _agent(
    args: argparse.Namespace,
    client: ModelClient,
    tools: list[Tool[..., Any]],
    c: Config | None,
    source: McpToolSource | None = None,
) -> Agent:
    """The run's agent: flags over the config file over the defaults."""
    eager = [n.strip() for item in args.eager or () for n in item.split(",") if n.strip()]
    durable = _durable(args, c)
    if source is not None:
        durable["tool_source"] = source
    deadline = getattr(args, "deadline", None)  # (--deadline 0: no deadline)
    approvals = _approvals(args, c.approval_policy() if c is not None else ApprovalPolicy())
    if c is None:
        limits = RunLimits(max_rounds=args.max_rounds or RunLimits().max_rounds)
        if deadline is not None:
            limits = replace(limits, deadline_s=deadline or None)
        return Agent(client, tools, eager=eager, run_limits=limits, approvals=approvals, **durable)
    options = {**c.agent_options(), **durable, "approvals": approvals}
    options["eager"] = (*options["eager"], *eager)
    if eager:  # --eager names tools to start early: the master switch follows the flag
        options["eager_start"] = True
    if args.max_rounds is not None:
        options["run_limits"] = replace(options["run_limits"], max_rounds=args.max_rounds)
    if deadline is not None:
        options["run_limits"] = replace(options["run_limits"], deadline_s=deadline or None)
    return Agent(client, tools, **options)


def _approvals(args: argparse.Namespace, policy: ApprovalPolicy) -> ApprovalPolicy:
    """``policy`` with ``--approval-timeout`` (0: no expiry) and ``--max-always``."""
    timeout = getattr(args, "approval_timeout", None)
    if timeout is not None:
        policy = replace(policy, timeout_s=timeout or None)
    if getattr(args, "max_always", None) is not None:
        policy = replace(policy, max_always=args.max_always)
    return policy


def _durable(args: argparse.Namespace, c: Config | None = None) -> dict[str, Any]:
    """``ledger``, ``audit`` and ``session`` for the Agent from ``--ledger`` (else the
    config's ``ledger.url``; ``none``: no ledger) and ``--session``: with a ledger, each run
    is its own session unless one is named (the ledger's scope)."""
    found: dict[str, Any] = {}
    url = getattr(args, "ledger", None) or (c.ledger.url if c is not None else None)
    url = None if url == "none" else url
    resume = getattr(args, "resume", None)
    if resume and getattr(args, "session", None) and args.session != resume:
        raise CommandError("--resume names the session: --session must be the same or absent")
    if resume and not url:
        raise CommandError("--resume needs the --ledger the run was stored in")
    if resume or getattr(args, "session", None):
        found["session"] = resume or args.session
    audit = c.audit_policy() if c is not None else None
    if audit is not None and not url:
        raise CommandError("ledger.audit_uncommitted needs a ledger (--ledger or ledger.url)")
    if url:
        try:
            redactor = c.stored_redactor() if c is not None else None  # (ledger.redact)
            found["ledger"] = open_ledger(url, redactor=redactor)
            found["history_store"] = open_history(url, redactor=redactor)
            if audit is not None:
                found["audit"] = ArgumentAudit(open_audit(url), audit)
        except (ConfigError, UsageError) as exc:
            raise CommandError(f"--ledger {url}: {exc}") from None
        found.setdefault("session", f"run-{uuid.uuid4().hex}")
        if c is not None:
            found["lease_s"] = c.ledger.lease_s
    return found


def _tools(
    args: argparse.Namespace, config: Config | None
) -> tuple[list[Tool[..., Any]], McpToolSource | None]:
    """The ``--tools`` files' tools and the MCP servers' source; the examples when there are
    neither, writing in ``--workspace`` or else a new temporary folder that is kept (its
    path is told: ``args.workspace`` is set to it)."""
    tools: list[Tool[..., Any]] = []
    for path in args.tools or ():
        tools += load_tool_file(path)
    source = _mcp_source(args, config, tools)
    if not tools and source is None:
        if not args.workspace:
            args.workspace = tempfile.mkdtemp(prefix="toollatch-run-")
        args.examples = True
        tools = example_tools(Path(args.workspace))
    return tools, source


DEMO_NOTICE = (
    "the model is toollatch's scripted demo (no --base-url): it plays one weather "
    "conversation, whatever the message"
)


def notice(args: argparse.Namespace) -> str | None:
    """What ``run`` says once before the events: that the model is the scripted demo, and
    where the example tools write; None when neither applies."""
    said = [DEMO_NOTICE] if getattr(args, "demo", False) else []
    if getattr(args, "examples", False):
        said.append(f"the example tools write in {args.workspace} (kept; --workspace DIR)")
    return "; ".join(said) or None


def _mcp_source(
    args: argparse.Namespace, config: Config | None, tools: list[Tool[..., Any]]
) -> McpToolSource | None:
    """The MCP servers of the config's ``mcp`` section and of ``--mcp`` (not connected)."""
    try:
        return source_from_config(
            config, getattr(args, "mcp", None) or (), reserved=[t.name for t in tools]
        )
    except ConfigError as exc:
        raise CommandError(f"--mcp: {exc}") from None


def _api_key(config: Config | None) -> str | None:
    """The key from ``model.api_key_env`` (None: the provider's usual variable)."""
    name = config.model.api_key_env if config else None
    if name is None:
        return None
    if not os.environ.get(name):
        raise CommandError(f"model.api_key_env: the variable {name} is not set")
    return os.environ[name]


async def _with_model(
    args: argparse.Namespace, base_url: str, model: str, config: Config | None
) -> int:
    tools, source = _tools(args, config)
    try:
        client = model_client(
            args.provider,
            model=model,
            base_url=base_url,
            api_key=_api_key(config),
            limits=config.client_limits() if config else None,
            retry=config.retry_policy() if config else None,
            record=args.record,
        )
    except (ConfigError, UsageError) as exc:
        raise CommandError(str(exc)) from None
    async with client, contextlib.AsyncExitStack() as closing:
        try:
            if source is not None:
                await closing.enter_async_context(source)
            agent = _agent(args, client, tools, config, source)
        except (ConfigError, UsageError) as exc:
            raise CommandError(str(exc)) from None
        _close_stores(agent, closing)
        signals = _Signals()
        error, deadline = await _show(args, agent, signals)
    return _status(signals, error, deadline=deadline)


def _close_stores(agent: Agent, closing: contextlib.AsyncExitStack) -> None:
    """Close the agent's ledger, history store and audit store when ``closing`` closes."""
    if agent.ledger is not None:
        closing.push_async_callback(agent.ledger.aclose)
    if agent.history_store is not None:
        closing.push_async_callback(agent.history_store.aclose)
    if agent.audit is not None:
        closing.push_async_callback(agent.audit.store.aclose)


async def _show(
    args: argparse.Namespace, agent: Agent, signals: _Signals
) -> tuple[str | None, bool]:
    """Run ``agent`` and show its events (``--json`` or the terminal view), cancelled by the
    first signal; (``run_ended.error`` or the model's error, whether the deadline passed)."""
    told = notice(args)
    full = getattr(args, "full_results", False)
    view = _JsonView(full_results=full, notice=told) if args.json else _LiveView(told)
    resume = bool(getattr(args, "resume", None))
    message = args.message if resume else args.message or DEFAULT_MESSAGE
    try:
        with signals.cancelling(agent.run(message, resume=resume)) as run:
            answerer = Answerer(getattr(args, "approve", None) or "ask", view.paused)
            error = await view.show(answerer.events(run))
            return error, run.deadline_passed
    except ModelError as exc:
        return str(exc), False
    except ToolLatchError as exc:
        raise CommandError(str(exc)) from None


def _status(signals: _Signals, error: str | None, *, deadline: bool) -> int:
    """The exit status: 128 + the signal that cancelled the run; 124 when its deadline
    passed; 1 when the model failed (one error line); else 0."""
    if signals.received is not None:
        return 128 + signals.received
    if error and deadline:
        return _fail(error, DEADLINE_EXIT)
    if error:
        return _fail(f"model: {error}", 1)
    return 0


def cancelled_by(signum: int) -> str:
    """``run_ended.error`` of a run a signal cancelled: "interrupted (SIGINT): the run was
    cancelled", "terminated (SIGTERM): ..." (the relay's shutdown says it its own way)."""
    how = "interrupted" if signum == signal.SIGINT else "terminated"
    return f"{how} ({signal.Signals(signum).name}): the run was cancelled"


class _Signals:
    """SIGINT and SIGTERM while the run is shown: the first cancels it as ``run.cancel()``
    does (every call paired, ``round_ended`` and ``run_ended`` still shown, the latter's
    ``error`` naming the signal: :func:`cancelled_by`; the exit status is then 128 + the
    signal's number: 130, 143); a second ends the process at once.

    Installed on the loop (``loop.add_signal_handler``), after the scripted server started
    (uvicorn's own handlers, set when it starts serving, are replaced while the run is
    shown). Where the loop cannot take signal handlers (not the main thread, Windows),
    nothing is installed and a signal keeps its default effect.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: int | None = None
        """The first signal's number, once one came."""
        self._run: AgentRun | None = None

    @contextlib.contextmanager
    def cancelling(self, run: AgentRun) -> Iterator[AgentRun]:
        """``run``, cancelled by the first signal while the block runs."""
        loop = asyncio.get_running_loop()
        installed = []
        self._run = run
        for signum in self.SIGNALS:
            try:
                loop.add_signal_handler(signum, self._on_signal, signum)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append(signum)
        try:
            yield run
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            sys.stderr.write(f"toollatch: {name} again: exiting now\n")
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(128 + self.received)
        self.received = signum
        sys.stderr.write(f"toollatch: {name}: cancelling the run (again to exit at once)\n")
        sys.stderr.flush()
        if self._run is not None:
            self._run.cancel(cancelled_by(signum))


def _fail(message: str, status: int, *, lines: bool = False) -> int:
    """``toollatch: error: ...`` on standard error: one line, or with ``lines`` one line
    per line of ``message`` (the later ones indented); ``status``."""
    if not lines:
        sys.stderr.write(f"toollatch: error: {visible(' '.join(message.split()))}\n")
        return status
    first, *rest = [" ".join(line.split()) for line in message.splitlines() if line.strip()]
    sys.stderr.write(f"toollatch: error: {visible(first)}\n")
    sys.stderr.writelines(f"  {visible(line)}\n" for line in rest)
    return status


class _JsonView:
    """One JSON object per agent event per line (``tool_finished`` with a result preview,
    or the whole redacted result with ``full_results``)."""

    def __init__(self, *, full_results: bool = False, notice: str | None = None) -> None:
        self.full_results = full_results
        self.notice = notice
        """Said once, as the ``notice`` key of the first event (see :func:`notice`)."""

    def paused(self) -> contextlib.AbstractContextManager[object]:
        """Held around a prompt (nothing to pause: the prompt goes to standard error)."""
        return contextlib.nullcontext()

    async def show(self, events: AsyncIterable[AgentEvent]) -> str | None:
        error = None
        out = sys.stdout
        async for event in events:
            if isinstance(event, ToolFinishedEvent):
                data = event.to_json(full_result=self.full_results)
            else:
                data = event.to_json()
            if self.notice is not None:
                data["notice"], self.notice = self.notice, None
            if data["type"] == "run_ended":
                error = data["error"]
            out.write(orjson.dumps(data).decode() + "\n")
            out.flush()
        return error


@dataclass
class _CallLine:
    name: str
    status: str = "streaming"
    arguments: str = ""
    opened: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    early: bool = False
    result: str = ""
    """What the call gave, on one line: its result's preview, or why it failed."""


class _LiveView:
    """Streaming text above, a line per call below, updated in place (rich)."""

    def __init__(self, notice: str | None = None) -> None:
        self.notice = notice
        """Shown once, dim, above the run (see :func:`notice`)."""
        self.console = _console()
        self.text: list[str] = []
        self.calls: dict[str, _CallLine] = {}
        self.rounds = 0
        self._live: Live | None = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The live display stopped (drawn as it is) while a prompt asks, then again."""
        live = self._live
        if live is None:
            yield
            return
        live.stop()
        try:
            yield
        finally:
            live.start()

    async def show(self, events: AsyncIterable[AgentEvent]) -> str | None:
        error = None
        with Live(self._render(), console=self.console, refresh_per_second=12) as live:
            self._live = live
            async for event in events:
                data = event.to_json()
                handler: Callable[[dict[str, Any]], None] | None = getattr(
                    self, f"_on_{data['type']}", None
                )
                if handler is not None:
                    handler(data)
                if data["type"] == "run_ended":
                    error = data["error"]
                live.update(self._render())
        if not self.console.is_terminal:
            self.console.print()  # (Live leaves the last line open on a pipe)
        return error

    def _on_text(self, data: dict[str, Any]) -> None:
        self.text.append(visible(data["text"], lines=True))

    def _on_call_opened(self, data: dict[str, Any]) -> None:
        self.calls.setdefault(data["id"], _CallLine(name=visible(data["name"])))

    def _on_call_committed(self, data: dict[str, Any]) -> None:
        line = self.calls.setdefault(data["id"], _CallLine(name=visible(data["name"])))
        line.status, line.early = "committed", data["early"]
        line.arguments = visible(_arguments_text(data["arguments"]))

    def _on_call_failed(self, data: dict[str, Any]) -> None:
        key = data["id"]
        if key in self.calls and self.calls[key].status != "streaming":
            key = f"{key} (repeat)"  # a model bug: another call of the round had this id
        line = self.calls.setdefault(key, _CallLine(name=visible(data["name"] or "?")))
        line.status = visible(f"failed: {data['error']}")
        line.result = one_line(data["detail"])  # (the gate's reason; never the raw arguments)

    def _on_approval_requested(self, data: dict[str, Any]) -> None:
        self._waiting(data, "asking")  # (a person: the status column is 12 wide)

    def _on_client_call(self, data: dict[str, Any]) -> None:
        self._waiting(data, "at client")

    def _on_approval_answered(self, data: dict[str, Any]) -> None:
        self._waiting(data, visible(data["decision"]))

    def _waiting(self, data: dict[str, Any], status: str) -> None:
        line = self.calls.setdefault(data["id"], _CallLine(name=visible(data["name"])))
        line.status = status

    def _on_tool_started(self, data: dict[str, Any]) -> None:
        line = self.calls[data["id"]]
        line.status, line.started = "running", time.monotonic()

    def _on_tool_finished(self, data: dict[str, Any]) -> None:
        line = self.calls[data["id"]]
        line.finished = time.monotonic()
        line.status = visible(f"error: {data['error']}") if data["is_error"] else "done"
        text = data.get("result") or ""
        if data["is_error"] and data["error"] and text.startswith(f"{data['error']}: "):
            text = text[len(data["error"]) + 2 :]  # (the state names the code already)
        line.result = one_line(text)

    def _on_round_ended(self, data: dict[str, Any]) -> None:
        self.rounds = data["round"]
        self.text.append("\n")

    def _render(self) -> Group:
        """The text, then per call its row (id, tool, arguments, state, timings) and, once
        known, a line under it with what it gave (the table's rows are one line each: every
        column is ``no_wrap``), then the rounds."""
        table = Table(box=None, show_header=False, pad_edge=False)
        longest = max((len(line.name) for line in self.calls.values()), default=4)
        table.add_column("id", no_wrap=True, overflow="ellipsis", max_width=26, style="dim")
        table.add_column("tool", no_wrap=True, min_width=longest)
        table.add_column("arguments", no_wrap=True, overflow="ellipsis", max_width=30)
        table.add_column("state", no_wrap=True, min_width=len("done (early)"))
        table.add_column("time", no_wrap=True, overflow="ellipsis")
        for call_id, line in self.calls.items():
            arguments = line.arguments if len(line.arguments) <= 48 else line.arguments[:47] + "…"
            table.add_row(
                Text(visible(call_id)),
                Text(line.name, style="bold"),
                Text(arguments),
                Text(line.status + (" (early)" if line.early else ""), style=_style(line.status)),
                Text(_timing(line), style="dim"),
            )
        parts: list[RenderableType] = []
        if self.notice:
            parts.append(Text(f"toollatch: {visible(self.notice)}", style="dim"))
        parts.append(Text("".join(self.text).rstrip()))
        rows = self.console.render_lines(table, self.console.options, pad=False)
        for row, line in zip(rows, self.calls.values(), strict=False):
            parts.append(Segments([*row, Segment.line()]))
            if line.result:
                shown = (
                    line.result[: RESULT_CHARS - 1] + "…"
                    if len(line.result) > RESULT_CHARS
                    else line.result
                )
                style = "red" if _style(line.status) == "red" else "dim"
                parts.append(Text(f"  ↳ {shown}", style=style, no_wrap=True, overflow="ellipsis"))
        parts.append(Text(f"rounds: {self.rounds}", style="dim"))
        return Group(*parts)


PIPE_COLUMNS = 4096
"""The view's width on a pipe or in a file without ``COLUMNS``: wide enough that nothing is
cut to a terminal's width (rich's default there is 80 columns); the arguments and the result
lines stay bounded by their own limits."""


def _console() -> Console:
    """The view's console: a terminal's own width, else ``COLUMNS``, else
    :data:`PIPE_COLUMNS`."""
    console = Console(highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(highlight=False, width=PIPE_COLUMNS)
    return console


def one_line(text: str) -> str:
    """``text`` safe for the terminal on one line: whitespace runs (newlines too) as one
    space, every control character escaped (:func:`visible`)."""
    return visible(" ".join(text.split()))


def _arguments_text(arguments: Any) -> str:
    """The committed arguments as compact JSON (the stdlib for what orjson refuses)."""
    try:
        return orjson.dumps(arguments).decode()
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), default=repr)


def _style(state: str) -> str:
    if state.startswith(("failed", "error")):
        return "red"
    if state in ("asking", "at client"):
        return "magenta"
    return {"done": "green", "running": "yellow", "committed": "cyan"}.get(state, "")


def _timing(line: _CallLine) -> str:
    if line.started is None:
        return ""
    end = line.finished if line.finished is not None else time.monotonic()
    waited = (line.started - line.opened) * 1000
    return f"waited {waited:.0f} ms, ran {(end - line.started) * 1000:.0f} ms"
