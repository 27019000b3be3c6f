"""``toollatch serve``: the relay on ``--host:--port`` (internal; :mod:`toollatch.cli` wires
:func:`add_serve_parser` and :func:`serve_command`).

Without ``--base-url`` the runs talk to the scripted model server (started here, on
loopback) with the example tools. Every run's calls go through a ledger (``--ledger URL``;
default: SQLite in the user's data folder; ``--ledger none``: no ledger, and no resume).
Who may drive it: ``--host`` beyond loopback needs ``--token`` (or ``relay.token``,
``TOOLLATCH_RELAY__TOKEN``; ``auto`` makes one), printed once with the URL at start;
``--allow-host`` / ``--allow-origin`` add ``Host`` names and origins (a reverse proxy);
``--allow-model`` the models the browser may pick. The ``relay:`` section and
``TOOLLATCH_RELAY__*`` also set the limits (:class:`~toollatch.relay.RelayLimits`).
SIGTERM and SIGINT (Ctrl-C) cancel every run as ``POST .../cancel`` does (every call
paired; ``run_ended.error`` names the shutdown), let each open events stream send that and
end, then stop, within ``--shutdown-grace`` (``relay.shutdown_grace_s``, 10 s) and about a
second more; a second signal exits at once.
Exit status: 143 after SIGTERM, 130 after SIGINT, 2 for a usage error (a bad ``--tools``
file, a port that cannot be bound, ``--base-url`` without ``--model``, a ledger that cannot
be opened, a host beyond loopback without a token).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
# (the parser is built on every `toollatch` invocation: the server's imports wait for `serve`)


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _count(text: str) -> int:
    """A positive integer (argparse type)."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an ``argparse`` subparsers object; returns its parser."""
    serve: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="serve the relay: a live page of agent runs (SSE) on the scripted model",
        description="Serve agent runs to a browser over SSE, with a live page at /.",
    )
    serve.add_argument("--host", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (8000)")
    serve.add_argument(
        "--tools",
        action="append",
        metavar="FILE.py",
        help="Python file(s) of @toollatch.tool functions (default: examples)",
    )
    serve.add_argument(
        "--provider", choices=PROVIDERS, help="wire format / provider (default openai_chat)"
    )
    serve.add_argument("--model", help="model name (default with the scripted server: scripted)")
    serve.add_argument("--base-url", help="the provider's base URL (default: the scripted server)")
    serve.add_argument(
        "--mcp",
        action="append",
        metavar="SERVER",
        help="the tools of an MCP server: 'stdio:COMMAND ARGS...' or http://HOST:PORT/PATH "
        "(repeatable; replaces the examples; needs the [mcp] extra)",
    )
    serve.add_argument(
        "--ledger",
        metavar="URL",
        help="call ledger and run histories: sqlite:///PATH, redis://HOST:PORT/DB or none "
        "(default: sqlite in the user's data folder, $XDG_DATA_HOME/toollatch/ledger.db)",
    )
    serve.add_argument(
        "--token",
        help="access token every request must carry (auto: make one; required with a --host "
        "beyond loopback; better in TOOLLATCH_RELAY__TOKEN, which ps does not show)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="a Host name to accept besides loopback's (NAME, *.SUFFIX or *; repeatable)",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        metavar="ORIGIN",
        help="an origin POSTs may come from besides the relay's own (repeatable)",
    )
    serve.add_argument(
        "--allow-model",
        action="append",
        metavar="NAME",
        help="a model the browser may pick (repeatable; default: --model only)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=_seconds,
        metavar="SECONDS",
        help="on SIGTERM / Ctrl-C, wait this long for the cancelled runs to end (every open "
        "event stream gets their results and run_ended), then exit (default: the config's "
        "relay.shutdown_grace_s, 10)",
    )
    serve.add_argument(
        "--max-chat-messages",
        type=_count,
        metavar="N",
        help="history entries a chat keeps on the server (POST /api/chat; a full chat refuses "
        "more with 409; default: the config's relay.max_chat_messages, 400)",
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration (relay host and port, model, previews); flags win over it",
    )
    return serve


def serve_command(args: argparse.Namespace) -> int:
    """Run ``toollatch serve`` with parsed ``args`` until interrupted; the exit status."""
    from ..core._errors import ConfigError, UsageError  # noqa: PLC0415
    from ..mcp import source_from_config  # noqa: PLC0415
    from ..relay import RelayLimits, RelayServer  # noqa: PLC0415
    from ..tools._tools import Tool  # noqa: PLC0415
    from ._app_config import load_config  # noqa: PLC0415
    from ._run_command import CommandError, load_tool_file  # noqa: PLC0415

    try:
        tools: list[Tool[..., Any]] | None = None
        for path in args.tools or ():
            tools = (tools or []) + load_tool_file(path)
        c = load_config(args.config)  # (no file: the defaults and TOOLLATCH_ variables)
        r = c.relay
        limits = RelayLimits(
            max_active_runs=r.max_active_runs,
            max_stored_runs=max(RelayLimits().max_stored_runs, r.max_active_runs),
            max_session_runs=r.max_session_runs,
            max_session_readers=r.max_session_readers,
            max_connections=r.max_connections,
            max_header_bytes=r.max_header_bytes,
            header_timeout_s=r.header_timeout_s,
            idle_timeout_s=r.idle_timeout_s,
            body_timeout_s=r.body_timeout_s,
            max_chat_messages=args.max_chat_messages or r.max_chat_messages,
        )
        models = args.allow_model or r.models
        base_url = args.base_url or c.model.base_url
        model = args.model or c.model.model
        if base_url is not None and not model:
            raise CommandError("--model is required with --base-url")
        try:
            reserved = [t.name for t in tools or ()]
            source = source_from_config(c, args.mcp or (), reserved=reserved)
        except ConfigError as exc:
            raise CommandError(f"--mcp: {exc}") from None
        server = RelayServer(
            host=args.host or r.host,
            port=args.port if args.port is not None else r.port,
            provider=args.provider or c.model.provider,
            model=model,
            base_url=base_url,
            tools=tools,
            tool_source=source,
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
        )
        _console_log()
        return asyncio.run(_serve(server))
    except (CommandError, ConfigError, UsageError) as exc:
        sys.stderr.write(f"toollatch: error: {' '.join(str(exc).split())}\n")
        return 2
    except KeyboardInterrupt:  # (before the handlers are installed, or after they are gone)
        return 128 + signal.SIGINT


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


async def _serve(server: Any) -> int:
    from ..relay._server import settle_heap  # noqa: PLC0415

    stopping = _Stopping(server)
    async with server:
        settle_heap()
        ledger = _ledger_shown(server.ledger_url)
        url = server.token_url  # (with the token, once: opening it sets the token's cookie)
        with stopping.installed():
            sys.stderr.write(f"toollatch relay on {url} (ledger {ledger}; Ctrl-C to stop)\n")
            sys.stderr.flush()
            await server.serve_forever()
    return 0 if stopping.received is None else 128 + stopping.received


class _Stopping:
    """SIGTERM and SIGINT while serving: the first stops the relay (:meth:`RelayServer.stop`:
    every run cancelled, each events stream sent its runs' ends, at most the grace), and the
    exit status is then 128 + the signal's number (143, 130); a second exits at once.

    Installed on the loop once the relay serves: uvicorn's own handlers (which stop it with
    the streams cut, and raise the signal again at its end) are replaced for the while. Where
    the loop cannot take signal handlers (not the main thread, Windows) nothing is installed.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, server: Any) -> None:
        self.server = server
        self.received: int | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, for the block."""
        loop = asyncio.get_running_loop()
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
        sys.stderr.write(
            f"toollatch: {name}: cancelling the runs, stopping within {grace:g} s "
            "(again to exit at once)\n"
        )
        sys.stderr.flush()
        self.server.stop(f"the relay is shutting down ({name}): the run was cancelled")
