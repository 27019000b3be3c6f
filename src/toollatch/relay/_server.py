"""Serving the relay with uvicorn (internal; public names in :mod:`toollatch.relay`).

``async with RelayServer() as relay`` starts, on the running loop: the scripted model server
(unless ``base_url`` is given), one shared httpx client for the runs' model requests
(on aiohttp's transport, see :mod:`._http`), and
uvicorn on ``host:port`` (port 0: any free one, read back from :attr:`RelayServer.url`). On
exit every run still going is cancelled (its calls paired) before the servers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import secrets
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn

from ..core._errors import ConfigError, UsageError
from ..core._preview import PreviewPolicy
from ..ledger import (
    ArgumentAudit,
    AuditPolicy,
    History,
    Ledger,
    LedgerError,
    LedgerKey,
)
from ..ledger._open import open_audit, open_history, open_ledger
from ..mcp import McpToolSource
from ..runtime._approvals import ApprovalPolicy
from ..runtime._run_setup import RunLimits
from ..scripted import Script
from ..scripted._server import ScriptedServer, http_implementation
from ..tools._tasks import join
from ..tools._tools import Tool
from ._app import PROVIDERS, Relay
from ._config import RelayLimits, redact_secrets
from ._guard import (
    BACKLOG,
    ConnectionCap,
    RelayAccess,
    connection_cap,
    guarded_protocol,
    is_loopback,
)
from ._http import model_http
from ._serving import listening_socket, started
from .store._open import (
    DEFAULT_LEASE_S,
    DEFAULT_OUTAGE_S,
    DEFAULT_TTL_S,
    check_store_url,
    open_run_store,
)


def check_durable(url: str | None, store: str | None, ledger: str | None) -> str | None:
    """``url`` (``durable``): None, or a ``postgresql://`` URL with a Redis run store, a
    ledger and the ``dbos`` package (else ``ConfigError``)."""
    if url is None:
        return None
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"--durable must be postgresql://USER@HOST:PORT/DB, got {url!r:.80}")
    if store in (None, "memory:"):
        raise ConfigError(
            "--durable needs a shared run store: --store redis://HOST:PORT/DB (relay.store); "
            "a survivor takes a dead worker's run over from it"
        )
    if ledger is None:
        raise ConfigError(
            "--durable needs a ledger the workers share (--ledger sqlite:///PATH on one host, "
            "redis://...): it knows which calls had started"
        )
    try:
        import dbos  # noqa: F401, PLC0415 (only to tell whether the extra is installed)
    except ImportError:
        raise ConfigError(
            "--durable needs the dbos package: pip install 'toollatch[durable]'"
        ) from None
    return url


DEFAULT_SHUTDOWN_GRACE_S = 10.0
"""How long a stopping relay waits for its cancelled runs to end (``relay.shutdown_grace_s``)."""

SCRIPTED_MODEL = "scripted"
_THRESHOLDS = (20_000, 20, 100)
"""The collector's thresholds once the heap is settled (Python's defaults: 700, 10, 10): a
young collection every 20,000 new objects, a middle one every 20 young ones, a full one
every 100 middle ones; see :func:`settle_heap`."""


def settle_heap() -> None:
    """Tune the garbage collector for a process that serves the relay, once it has started
    (``toollatch serve`` calls it): every object alive now is moved out of its reach
    (``gc.freeze``), and the collections are rarer (:data:`_THRESHOLDS`).

    A full collection pauses the loop, so every run in flight, for as long as it walks the
    heap. The modules, the app and the tools are never garbage, yet each walked them all:
    with 200 runs in flight the longest pause during a load was 46-109 ms, 20-72 ms after
    the freeze, and 10-21 ms with full collections ten times rarer as well
    (``benchmarks/bench_relay.py``, which reports it). Young collections every 20,000
    objects instead of 700 took the proxy's CPU per relayed event at 50 streams from a
    median 83 to 73 µs, and its wire p99 from 6.5 to 5.1 ms (18 levels side by side,
    ``benchmarks/README.md``). Cycles still go, in the rarer young collections. Not done by
    :class:`RelayServer` itself: in a process shared with other code (tests, an app that
    embeds the relay) objects frozen while still garbage would never be freed.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_THRESHOLDS)


class RelayServer:
    """The relay on ``host:port`` over a model: the scripted server (``scripts``, scaled by
    ``delay_scale``) by default, or ``base_url`` with ``provider`` and ``model``.

    ``tools`` (default: the example tools, in a temporary workspace per session),
    ``tool_source`` (MCP tools: entered, so connected, for the server's life), ``limits`` and
    ``previews`` go to :class:`Relay`. ``ledger``: a ledger URL (``sqlite:///PATH``,
    ``redis://HOST:PORT/DB``, ``memory:``; :func:`toollatch.ledger.open_ledger`, a SQLite
    file's folder created if missing) for the runs' calls and histories (None: none, and no
    resume); ``audit`` (opt-in, needs a ledger) keeps a redacted record of each call that did
    not commit, beside it (:func:`toollatch.ledger.open_audit`).

    Who may drive it (:mod:`._guard`): ``token`` (``"auto"``: a new random one, in
    :attr:`token`; required when ``host`` is not loopback), ``allowed_hosts`` (more ``Host``
    names than loopback's and the bound address), ``allowed_origins`` (more origins a POST
    may come from), ``models`` (the model names a request may pick; default: the scripted
    server's scripts, or ``model``). Raises ``ConfigError`` for a
    bad port, an audit without a ledger, a
    ``base_url`` without ``model``, an unknown provider, a bad token or host pattern, or a
    host that is not loopback without a token. ``redact_stored`` stores results and history
    through :func:`toollatch.relay.redact_secrets` (``ledger.redact``). ``run_limits``: each
    run's budgets (rounds, calls, the deadline; ``toollatch serve``: the ``relay:`` section's).
    ``approvals`` and ``approval_secret``: which calls wait for a person, and the key of the
    questions' tokens (:class:`Relay`; default: random per process).

    ``store``: where the runs live (``memory:``, the default: this process only;
    ``redis://HOST:PORT/DB``: shared by every worker on that Redis, so that any of them
    serves, resumes and cancels any run; :mod:`.store`), keeping an ended run
    ``store_ttl_s`` seconds, retrying a failed write for ``store_outage_s`` seconds before
    it cancels its runs. Each worker holds a lease of ``lease_s`` seconds, renewed every
    third of it: the runs of a worker whose lease expired (it died) are ended by a survivor,
    every call paired, ``run_ended.error`` naming the dead worker. A Redis that cannot be
    reached at start is a ``ConfigError``.
    ``durable`` (``postgresql://...``, the ``durable`` extra; needs a Redis ``store`` and a
    ``ledger``): each run of ``POST /runs`` and each chat message (``POST /api/chat``) is a
    DBOS workflow (:mod:`._durable`), so that when its worker dies a survivor finishes it
    (finished calls not run again, a started one ``outcome_unknown`` unless its tool is
    idempotent) and its readers' streams go on (a chat's answer stored in the chat); a
    call that waits for a person or a client waits in the ledger, answered on any worker
    (give the workers one ``approval_secret``: a survivor checks the tokens its readers
    got).
    Workers sharing a store must share the access token too: ``token="auto"`` (a token of
    this worker's own) with a shared store is a ``ConfigError``.

    Stopping (:meth:`stop`, ``toollatch serve`` on SIGTERM / SIGINT) first cancels every run
    as ``POST .../cancel`` does, each with ``run_ended.error`` naming the shutdown, and waits
    for them at most ``shutdown_grace_s`` seconds, so that every open event stream sends its
    runs' paired results, ``round_ended`` and ``run_ended``, and ends; only then does uvicorn
    close the connections (a reader that still has not read them gets 1 s more).
    """

    listen_fd: int | None = None
    """A listening socket's file descriptor to serve on instead of binding ``host:port``
    (``toollatch serve --workers N``: every worker accepts on the supervisor's socket)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        provider: str = "openai_chat",
        model: str | None = None,
        base_url: str | None = None,
        scripts: Mapping[str, Script] | None = None,
        delay_scale: float = 1.0,
        tools: Sequence[Tool[..., Any]] | None = None,
        tool_source: McpToolSource | None = None,
        limits: RelayLimits | None = None,
        previews: PreviewPolicy | None = None,
        ledger: str | None = None,
        audit: AuditPolicy | None = None,
        redact_stored: bool = False,
        token: str | None = None,
        allowed_hosts: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
        models: Sequence[str] | None = None,
        run_limits: RunLimits | None = None,
        shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
        approvals: ApprovalPolicy | None = None,
        approval_secret: bytes | None = None,
        store: str | None = None,
        store_ttl_s: float = DEFAULT_TTL_S,
        store_outage_s: float = DEFAULT_OUTAGE_S,
        lease_s: float = DEFAULT_LEASE_S,
        durable: str | None = None,
    ) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {port!r}")
        if provider not in PROVIDERS:
            raise ConfigError(f"provider must be one of {PROVIDERS}, got {provider!r}")
        if base_url is not None and not model:
            raise ConfigError("a model name is required with a base URL")
        self.host, self.port, self.provider, self.model = host, port, provider, model
        self.base_url = base_url
        self.tools, self.limits, self.previews = tools, limits, previews
        self.tool_source = tool_source
        self.run_limits = run_limits
        self.approvals, self.approval_secret = approvals, approval_secret
        if not (
            isinstance(shutdown_grace_s, int | float)
            and math.isfinite(shutdown_grace_s)
            and shutdown_grace_s > 0
        ):
            raise ConfigError(f"shutdown_grace_s must be positive, got {shutdown_grace_s!r}")
        self.shutdown_grace_s = float(shutdown_grace_s)
        self.stop_reason = "the relay is shutting down"
        """``run_ended.error`` of the runs a stop cancels (:meth:`stop` sets it)."""
        if audit is not None and ledger is None:
            raise ConfigError("the audit of uncommitted calls needs a ledger")
        self.ledger_url, self.audit = ledger, audit
        self.redact_stored = redact_stored
        self._scripted = (
            ScriptedServer(scripts, delay_scale=delay_scale) if base_url is None else None
        )
        for name, value in (
            ("store_ttl_s", store_ttl_s),
            ("store_outage_s", store_outage_s),
            ("lease_s", lease_s),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be positive, got {value!r}")
        check_store_url(store)
        self.store_url, self.store_ttl_s = store, float(store_ttl_s)
        self.store_outage_s, self.lease_s = float(store_outage_s), float(lease_s)
        self.durable_url = check_durable(durable, store, ledger)
        if token == "auto" and store not in (None, "memory:"):
            raise ConfigError(
                "workers sharing a run store must share one access token: give it "
                "(--token or TOOLLATCH_RELAY__TOKEN), not auto"
            )
        if token == "auto":
            token = secrets.token_urlsafe(32)
        if token is None and not is_loopback(host):
            raise ConfigError(
                f"listening on {host} (beyond loopback) needs an access token: --token, "
                "relay.token or TOOLLATCH_RELAY__TOKEN ('auto' makes one and prints it)"
            )
        self.token = token
        """The access token every request must carry (None: none, on loopback only)."""
        # a bound name is a Host to accept; a bound address is one already (an IP literal)
        literal = not host or ":" in host or host.replace(".", "").isdigit()
        bound = [] if literal else [host]
        self.access = RelayAccess(
            allowed_hosts=(*bound, *allowed_hosts),
            allowed_origins=tuple(allowed_origins),
            token=token,
            any_ip_host=not is_loopback(host),
        )
        if models is None and self._scripted is not None:
            models = tuple(self._scripted.scripts)
        default = model or SCRIPTED_MODEL  # (always allowed: a request may leave it out)
        self.models = (
            (default, *(m for m in models if m != default)) if models is not None else None
        )
        self.cap: ConnectionCap | None = None
        """The open connections (while serving)."""
        self._stack: contextlib.AsyncExitStack | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.relay: Relay | None = None
        self._bound: tuple[str, int] | None = None

    @property
    def token_url(self) -> str:
        """:attr:`url` with ``/?token=...`` (opening it sets the token's cookie), or ``url/``
        without a token."""
        return f"{self.url}/?token={self.token}" if self.token else f"{self.url}/"

    @property
    def url(self) -> str:
        """``http://host:port`` while serving; raises UsageError otherwise."""
        if self._bound is None:
            raise UsageError("the relay is not running (use `async with`)")
        host, port = self._bound
        return f"http://{host}:{port}"

    async def __aenter__(self) -> RelayServer:
        """Start everything; returns once the relay's socket accepts connections."""
        if self._stack is not None:
            raise UsageError("the relay is already running")
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        base_url_for: Callable[[str], str]
        if self._scripted is not None:
            scripted = await stack.enter_async_context(self._scripted)
            base_url_for = scripted.base_url
            providers = (self.provider, *(p for p in PROVIDERS if p != self.provider))
        else:
            url = self.base_url
            assert url is not None
            base_url_for, providers = (lambda _provider: url), (self.provider,)
        limits = self.limits or RelayLimits()
        cap = ConnectionCap(connection_cap(limits))
        http = [await stack.enter_async_context(model_http(limits.max_active_runs))]
        workspace = Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="toollatch-relay-"))
        )
        ledger, history = await self._open_ledger(stack)
        audit = None
        if self.audit is not None and self.ledger_url is not None:
            store = open_audit(self.ledger_url, create_folder=True)
            stack.push_async_callback(store.aclose)
            audit = ArgumentAudit(store, self.audit)
        if self.tool_source is not None:  # connected before the first run, closed after the last
            await stack.enter_async_context(self.tool_source)
        relay = Relay(
            base_url_for=base_url_for,
            providers=providers,
            model=self.model or SCRIPTED_MODEL,
            workspace=workspace,
            http=http,
            tools=self.tools,
            tool_source=self.tool_source,
            limits=self.limits,
            previews=self.previews,
            ledger=ledger,
            history=history,
            audit=audit,
            models=self.models,
            access=self.access,
            run_limits=self.run_limits,
            approvals=self.approvals,
            approval_secret=self.approval_secret,
            store=open_run_store(
                self.store_url,
                keep=limits.max_stored_runs,
                ttl_s=self.store_ttl_s,
                outage_s=self.store_outage_s,
                lease_s=self.lease_s,
                ledger=ledger,
                connections=limits.max_connections,
            ),
        )

        # (a ConfigError when it cannot be reached)
        await relay.store.open(relay.runs, relay.forwarded, relay.adopt_orphan)
        stack.push_async_callback(relay.store.aclose)  # (after the runs' ends are written)
        if self.durable_url is not None:  # (the store's worker id is its DBOS executor id)
            from ._durable import DurableRelay  # noqa: PLC0415 (the durable extra)

            durable = DurableRelay(relay, self.durable_url, lease_s=self.lease_s)
            durable.open()  # (on this loop: recovered runs run on it)
            stack.push_async_callback(durable.aclose)
            relay.durable = durable
        stack.push_async_callback(relay.runs.close, self.shutdown_grace_s)
        try:  # the runs that were waiting for an answer when the relay stopped
            await relay.restore()
        except LedgerError as exc:
            raise ConfigError(f"ledger {self.ledger_url}: {exc}") from None
        if self.listen_fd is None:
            sock = listening_socket(self.host, self.port, stack)
        else:  # (one of `serve --workers N`: the supervisor's socket, shared)
            sock = socket.socket(fileno=self.listen_fd)
            stack.callback(sock.close)
        server = _uvicorn(relay, limits, cap, self)
        task = await started(server, sock, "toollatch-relay")
        self._server, self._task, self.relay, self.cap = server, task, relay, cap
        self._bound = (self.host, sock.getsockname()[1])

    async def _open_ledger(
        self, stack: contextlib.AsyncExitStack
    ) -> tuple[Ledger | None, History | None]:
        """The ledger and history store of :attr:`ledger_url`, closed with the server; the
        ledger is read once here (a SQLite file and its folder are created), so that one
        that cannot be used is a ``ConfigError`` at start, not an error in every run."""
        if self.ledger_url is None:
            return None, None
        redactor = redact_secrets if self.redact_stored else None
        ledger = open_ledger(self.ledger_url, create_folder=True, redactor=redactor)
        stack.push_async_callback(ledger.aclose)
        try:
            await ledger.get(LedgerKey(scope="toollatch-relay", call_id="start"))
        except LedgerError as exc:
            raise ConfigError(f"ledger {self.ledger_url}: {exc}") from None
        history = open_history(self.ledger_url, redactor=redactor)
        stack.push_async_callback(history.aclose)
        return ledger, history

    async def serve_forever(self) -> None:
        """Wait until the server stops (Ctrl-C or :meth:`stop`)."""
        if self._task is None:
            raise UsageError("the relay is not running (use `async with`)")
        await asyncio.shield(self._task)

    def bind_for_workers(self, stack: contextlib.ExitStack) -> socket.socket:
        """A listening socket on ``host:port`` (closed with ``stack``), inheritable, for
        worker processes to accept on (:attr:`listen_fd`; ``toollatch serve --workers N``);
        ConfigError when it cannot be bound."""
        sock = listening_socket(self.host, self.port, stack)
        sock.listen(2048)
        sock.set_inheritable(True)
        return sock

    def stop(self, reason: str | None = None) -> None:
        """Ask the server to stop: the runs are cancelled (``reason``: their
        ``run_ended.error``, default "the relay is shutting down"), their event streams end,
        then the server; within ``shutdown_grace_s`` plus about a second."""
        if reason is not None:
            self.stop_reason = reason
        if self.relay is not None:  # (no run admitted from now: 503 shutting_down)
            self.relay.runs.closing = True
        if self._server is not None:
            self._server.should_exit = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Cancel the runs, stop uvicorn and the scripted server."""
        if self._stack is None:
            return
        try:
            if self.relay is not None:  # streams end, so uvicorn need not wait on them
                await self.relay.close(self.shutdown_grace_s, reason=self.stop_reason)
            self.stop()
            if self._task is not None:
                await join(self._task)
        finally:
            stack, self._stack = self._stack, None
            self._server = self._task = self.relay = None
            self._bound = None
            await stack.aclose()


class _RelayUvicorn(uvicorn.Server):
    """uvicorn whose shutdown first ends the relay's runs (bounded by the grace).

    uvicorn's own shutdown waits ``timeout_graceful_shutdown`` for the open responses, then
    cancels them: an events stream, which ends only with its run, would be cut before its
    run's end was sent. Here the runs are cancelled first, so the streams send the paired
    results, ``round_ended`` and ``run_ended`` and end by themselves."""

    def __init__(self, config: uvicorn.Config, relay: Relay, owner: RelayServer) -> None:
        super().__init__(config)
        self._relay, self._owner = relay, owner

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """End the runs (at most the owner's grace), then uvicorn's shutdown."""
        owner = self._owner
        await self._relay.close(owner.shutdown_grace_s, reason=owner.stop_reason)
        await super().shutdown(sockets)


def _uvicorn(
    relay: Relay, limits: RelayLimits, cap: ConnectionCap, owner: RelayServer
) -> uvicorn.Server:
    """uvicorn for the relay: as the scripted server's (``loopback_server``), with the
    guarded protocol (head size and time, the connection cap; :mod:`._guard`)."""
    implementation = http_implementation()
    config = uvicorn.Config(
        relay.app,
        http=guarded_protocol(implementation, limits, cap),
        ws="none",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
        backlog=BACKLOG,  # (also the accepts of one loop iteration, see BACKLOG)
        h11_max_incomplete_event_size=limits.max_header_bytes + 1,  # (the guard answers first)
    )
    return _RelayUvicorn(config, relay, owner)
