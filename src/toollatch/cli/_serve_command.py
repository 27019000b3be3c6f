"""``toollatch serve``: the relay on ``--host:--port`` (internal: the arguments are in
:mod:`toollatch.cli._serve`, which imports this module only for ``serve``).

Without ``--base-url`` the runs talk to the scripted model server (started here, on
loopback) with the example tools. Every run's calls go through a ledger (``--ledger URL``;
default: SQLite in the user's data folder; ``--ledger none``: no ledger, and no resume).
Who may drive it: ``--host`` beyond loopback needs ``--token`` (or ``relay.token``,
``TOOLLATCH_RELAY__TOKEN``; ``auto`` makes one), printed once with the URL at start;
``--allow-host`` / ``--allow-origin`` add ``Host`` names and origins (a reverse proxy);
``--allow-model`` the models the browser may pick. The ``relay:`` section and
``TOOLLATCH_RELAY__*`` also set the limits (:class:`~toollatch.relay.RelayLimits`).
``--store redis://HOST:PORT/DB`` (``relay.store``) keeps the runs in Redis, so that several
workers on it serve any run (a Redis that cannot be reached at start: exit status 2).
SIGTERM and SIGINT (Ctrl-C) cancel every run as ``POST .../cancel`` does (every call
paired; ``run_ended.error`` names the shutdown), let each open events stream send that and
end, then stop, within ``--shutdown-grace`` (``relay.shutdown_grace_s``, 10 s) and about a
second more; a second signal exits at once. With a shared store the runs first go on for
most of the grace (a new run is 503; reads of other workers' runs end at once). With
``--durable`` and its PostgreSQL lost, the worker ends its runs and exits without DBOS's
thread that waits for the database (DBOS retries until it is back).
Exit status: 143 after SIGTERM, 130 after SIGINT, 2 for a usage error (a bad ``--tools``
file, a port that cannot be bound, ``--base-url`` without ``--model``, a ledger that cannot
be opened, a host beyond loopback without a token).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..core._errors import ConfigError, UsageError
from ..mcp import McpToolSource, source_from_config
from ..relay import RelayServer
from ..relay._config import RelayLimits
from ..tools._tools import Tool
from ._app_config import Config, RelayConfig, load_config
from ._run_command import CommandError, load_tool_file

WORKER_FD = "TOOLLATCH_SERVE_WORKER_FD"
"""Set by ``serve --workers N`` for its workers: the listening socket they all accept on."""


def serve_command(args: argparse.Namespace) -> int:
    """Run ``toollatch serve`` with parsed ``args`` until interrupted; the exit status."""
    try:
        server = _server(args)
        _console_log()
        workers = args.workers if args.workers is not None else 1
        if workers < 1:
            raise CommandError(f"--workers must be 1 or more, got {workers}")
        if workers > 1 and os.environ.get(WORKER_FD) is None:
            return _supervise(server, workers)
        if os.environ.get(WORKER_FD) is not None:
            server.listen_fd = int(os.environ[WORKER_FD])
        stopping = _Stopping(server)
        try:
            status = asyncio.run(_serve(server, stopping))
            if server.durable_url is not None:
                _leave_stuck_threads(status)
        finally:
            stopping.disarm()
        return status
    except (CommandError, ConfigError, UsageError) as exc:
        sys.stderr.write(f"toollatch: error: {' '.join(str(exc).split())}\n")
        return 2
    except KeyboardInterrupt:  # (before the handlers are installed, or after they are gone)
        return 128 + signal.SIGINT


_THREADS_S = 1.0
"""How long a stopped ``--durable`` worker waits for the threads DBOS left running."""


def _leave_stuck_threads(status: int) -> None:
    """Exit at once with ``status`` (``os._exit``) when a thread still runs
    :data:`_THREADS_S` after the relay stopped: DBOS's executor, its record of a step
    waiting for a lost PostgreSQL (DBOS retries until the database is back, and the
    interpreter's exit would wait for it). The step stays unrecorded, its workflow pending
    in PostgreSQL; the relay had ended its run (:meth:`.DurableRelay.handing_over`)."""
    until = time.monotonic() + _THREADS_S
    left = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        thread.join(max(0.0, until - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    if left:
        sys.stderr.write(
            f"toollatch: warning: {', '.join(left)} still waiting for the durable store "
            "(PostgreSQL unreachable): exiting without it\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(status)


def _supervise(server: RelayServer, workers: int) -> int:
    """``--workers N``: bind the port once here, start N copies of this command that accept
    on that one socket (inherited; the kernel gives each connection to one of them), pass
    SIGTERM / SIGINT on to them and wait. With the in-memory store a ``CommandError`` naming
    ``--store`` (a worker would not see the others' runs)."""
    if server.store_url in (None, "memory:"):
        raise CommandError(
            f"--workers {workers} needs a shared run store: --store redis://HOST:PORT/DB "
            "(relay.store); with memory: a worker would not see the others' runs"
        )
    with contextlib.ExitStack() as stack:
        sock = server.bind_for_workers(stack)
        env = {**os.environ, WORKER_FD: str(sock.fileno())}
        command = [sys.executable, "-c", _REENTRY, *sys.argv[1:]]
        children = [
            subprocess.Popen(command, env=env, pass_fds=(sock.fileno(),)) for _ in range(workers)
        ]
        host, port = sock.getsockname()[:2]
        sys.stderr.write(f"toollatch: {workers} workers on http://{host}:{port}\n")
        sys.stderr.flush()
        received: list[int] = []

        def forward(signum: int, _frame: Any) -> None:
            received.append(signum)
            for child in children:
                if child.poll() is None:
                    child.send_signal(signum)

        for signum in _Stopping.SIGNALS:
            signal.signal(signum, forward)
        statuses = [child.wait() for child in children]
    if received:
        return 128 + received[0]
    return max(statuses, key=abs)


_REENTRY = "import sys; from toollatch.cli import main; sys.exit(main())"
"""How a worker of ``--workers N`` runs this command again (in a fresh interpreter)."""


def _server(args: argparse.Namespace) -> RelayServer:
    """The relay of the flags over the config (``--config``, else the defaults and the
    ``TOOLLATCH_`` variables). Raises CommandError, ConfigError or UsageError."""
    tools: list[Tool[..., Any]] | None = None
    for path in args.tools or ():
        tools = (tools or []) + load_tool_file(path)
    c = load_config(args.config)  # (no file: the defaults and TOOLLATCH_ variables)
    r = c.relay
    limits = _relay_limits(r, args)
    models = args.allow_model or r.models
    base_url = args.base_url or c.model.base_url
    model = args.model or c.model.model
    if base_url is not None and not model:
        raise CommandError("--model is required with --base-url")
    return RelayServer(
        host=args.host or r.host,
        port=args.port if args.port is not None else r.port,
        provider=args.provider or c.model.provider,
        model=model,
        base_url=base_url,
        tools=tools,
        tool_source=_mcp_source(args, c, tools),
        previews=c.preview_policy() if args.config else None,
        ledger=_ledger_url(args.ledger or c.ledger.url),
        audit=c.audit_policy(),
        redact_stored=c.ledger.redact,
        limits=limits,
        token=args.token or r.token,
        allowed_hosts=[*r.allowed_hosts, *(args.allow_host or ())],
        allowed_origins=[*r.allowed_origins, *(args.allow_origin or ())],
        models=models or None,
        run_limits=c.run_limits(),
        shutdown_grace_s=args.shutdown_grace or r.shutdown_grace_s,
        approvals=replace(c.approval_policy(), max_always=args.max_always)
        if args.max_always is not None
        else c.approval_policy(),
        approval_secret=_approval_secret(r),
        **_store_options(args, r),
    )


def _store_options(args: argparse.Namespace, r: RelayConfig) -> dict[str, Any]:
    """The shared store's arguments of :class:`RelayServer`: flags over the config."""
    return {
        "store": args.store or r.store,
        "store_ttl_s": args.store_ttl or r.store_ttl_s,
        "store_outage_s": args.store_outage or r.store_outage_s,
        "lease_s": args.lease or r.lease_s,
        "durable": args.durable or r.durable,
    }


def _approval_secret(r: RelayConfig) -> bytes | None:
    """The key of approval tokens from the variable ``relay.approval_secret_env`` names
    (None: not configured, a random one per process). ConfigError when it is unset or
    shorter than 16 bytes."""
    if r.approval_secret_env is None:
        return None
    value = os.environ.get(r.approval_secret_env, "")
    if len(value.encode()) < 16:
        raise ConfigError(
            f"relay.approval_secret_env: ${r.approval_secret_env} must hold at least 16 bytes"
        )
    return value.encode()


def _relay_limits(r: RelayConfig, args: argparse.Namespace) -> RelayLimits:
    """The config's ``relay:`` limits (at least as many runs stored as may be active), and
    ``--max-run-events``, ``--max-chat-messages``, ``--max-chat-body-bytes``,
    ``--max-ui-bytes``, ``--result-text``."""
    return RelayLimits(
        max_active_runs=r.max_active_runs,
        max_stored_runs=max(r.max_stored_runs, r.max_active_runs),
        max_run_events=args.max_run_events or r.max_run_events,
        max_kept_bytes=r.max_kept_bytes,
        max_body_bytes=r.max_body_bytes,
        max_message_chars=r.max_message_chars,
        heartbeat_s=r.heartbeat_s,
        sse_batch=r.sse_batch,
        max_session_runs=r.max_session_runs,
        max_session_readers=r.max_session_readers,
        max_connections=r.max_connections,
        max_header_bytes=r.max_header_bytes,
        header_timeout_s=r.header_timeout_s,
        idle_timeout_s=r.idle_timeout_s,
        body_timeout_s=r.body_timeout_s,
        max_chat_messages=args.max_chat_messages or r.max_chat_messages,
        max_chat_body_bytes=args.max_chat_body_bytes or r.max_chat_body_bytes,
        max_ui_bytes=args.max_ui_bytes or r.max_ui_bytes,
        result_text=args.result_text or r.result_text,
    )


def _mcp_source(
    args: argparse.Namespace, c: Config, tools: list[Tool[..., Any]] | None
) -> McpToolSource | None:
    """The MCP servers of the config and of ``--mcp`` (not connected)."""
    try:
        reserved = [t.name for t in tools or ()]
        return source_from_config(c, args.mcp or (), reserved=reserved)
    except ConfigError as exc:
        raise CommandError(f"--mcp: {exc}") from None


def _console_log() -> None:
    """toollatch's warnings and errors (a run the model failed, a tool file that broke) on
    standard error, one line each, unless the process configured logging itself."""
    import logging  # noqa: PLC0415

    logger = logging.getLogger("toollatch")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("toollatch: %(levelname)s: %(name)s: %(message)s"))
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    logger.setLevel(min(logger.getEffectiveLevel(), logging.WARNING))


def _ledger_shown(url: str | None) -> str:
    """The ledger as the start line names it: a SQLite file by its absolute path (what a
    relative ``sqlite:///ledger.db`` resolved to), a Redis URL without its password."""
    from urllib.parse import urlsplit, urlunsplit  # noqa: PLC0415

    from ..ledger import sqlite_file  # noqa: PLC0415

    if url is None:
        return "none"
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return sqlite_file(url)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}:***@" if parts.username else ":***@"
        return urlunsplit((parts.scheme, user + host, parts.path, parts.query, ""))
    return url


def _ledger_url(given: str | None) -> str | None:
    """``--ledger`` (or the config's ``ledger.url``): ``none`` is no ledger, nothing the
    default (SQLite in the user's data folder)."""
    from ..ledger import default_ledger_url  # noqa: PLC0415

    if given is None:
        return default_ledger_url()
    return None if given == "none" else given


async def _serve(server: RelayServer, stopping: _Stopping | None = None) -> int:
    from ..relay._server import settle_heap  # noqa: PLC0415

    stopping = stopping or _Stopping(server)
    async with server:
        settle_heap()
        ledger = _ledger_shown(server.ledger_url)
        url = server.token_url  # (with the token, once: opening it sets the token's cookie)
        with stopping.installed():
            store = (
                ""
                if server.store_url in (None, "memory:")
                else f", runs in {_ledger_shown(server.store_url)}"
            )
            sys.stderr.write(f"toollatch relay on {url} (ledger {ledger}{store}; Ctrl-C to stop)\n")
            sys.stderr.flush()
            await server.serve_forever()
    return 0 if stopping.received is None else 128 + stopping.received


_OVERRUN_S = 15.0
"""How long a stop may go on past its grace (the run store's last writes, at most about 10 s;
DBOS's own stop) before the process leaves anyway (:class:`_Stopping`)."""


class _Stopping:
    """SIGTERM and SIGINT while serving: the first stops the relay (:meth:`RelayServer.stop`:
    every run cancelled, each events stream sent its runs' ends, at most the grace), and the
    exit status is then 128 + the signal's number (143, 130); a second exits at once. A stop
    still going on ``overrun_s`` after its grace exits with that status too, after writing
    where each thread and task was: the bound the first signal announced holds, and what
    held the stop is on stderr (a durable worker once took 40 s to stop: a Redis command had
    swallowed the run store's cancel; its runs stay pending in PostgreSQL for a survivor).

    Installed on the loop once the relay serves: uvicorn's own handlers (which stop it with
    the streams cut, and raise the signal again at its end) are replaced for the while. Where
    the loop cannot take signal handlers (not the main thread, Windows) nothing is installed.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, server: RelayServer, overrun_s: float = _OVERRUN_S) -> None:
        self.server = server
        self.received: int | None = None
        self.overrun_s = overrun_s
        self._watchdog: threading.Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def disarm(self) -> None:
        """The stop is over (the process is about to return its status): no forced exit."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _overran(self, name: str, after_s: float) -> None:
        stacks = []
        frames = sys._current_frames()
        for thread in threading.enumerate():
            frame = frames.get(thread.ident) if thread.ident is not None else None
            if frame is not None and thread is not threading.current_thread():
                stacks.append(f"thread {thread.name}:\n{''.join(traceback.format_stack(frame))}")
        stacks.extend(self._tasks())
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"toollatch: warning: still stopping {after_s:g} s after {name}: exiting now; "
                f"where each thread and task was:\n{''.join(stacks)}"
            )
            sys.stderr.flush()
        os._exit(128 + (self.received or signal.SIGTERM))

    def _tasks(self) -> list[str]:
        """Where each of the loop's tasks waits (read from this thread while the loop's own
        waits or runs: a best effort, for the record only)."""
        if self._loop is None:
            return []
        shown = []
        with contextlib.suppress(Exception):
            for task in asyncio.all_tasks(self._loop):
                out = io.StringIO()
                task.print_stack(limit=12, file=out)
                shown.append(f"task {task.get_name()}: {out.getvalue()}")
        return shown

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, for the block."""
        loop = self._loop = asyncio.get_running_loop()
        installed = []
        for signum in self.SIGNALS:
            try:
                loop.add_signal_handler(signum, self._on_signal, signum)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append(signum)
        try:
            yield
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            sys.stderr.write(f"toollatch: {name} again: exiting now\n")
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(128 + self.received)
        self.received = signum
        grace = self.server.shutdown_grace_s
        doing = "cancelling" if self.server.store_url in (None, "memory:") else "finishing"
        sys.stderr.write(
            f"toollatch: {name}: {doing} the runs, stopping within {grace:g} s "
            "(again to exit at once)\n"
        )
        sys.stderr.flush()
        after_s = grace + self.overrun_s
        self._watchdog = threading.Timer(after_s, self._overran, args=(name, after_s))
        self._watchdog.daemon = True
        self._watchdog.start()
        self.server.stop(f"the relay is shutting down ({name}): the run was cancelled")
