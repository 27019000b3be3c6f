"""``toollatch serve``: the relay on ``--host:--port`` (internal; :mod:`toollatch.cli` wires
:func:`add_serve_parser` and :func:`serve_command`).

Without ``--base-url`` the runs talk to the scripted model server (started here, on
loopback) with the example tools. Every run's calls go through a ledger (``--ledger URL``;
default: SQLite in the user's data folder; ``--ledger none``: no ledger, and no resume).
Exit status: 0 after Ctrl-C, 2 for a usage error (a bad ``--tools`` file, a port that cannot
be bound, ``--base-url`` without ``--model``, a ledger that cannot be opened).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
# (the parser is built on every `toollatch` invocation: the server's imports wait for `serve`)


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
        "--config",
        metavar="FILE",
        help="YAML configuration (relay host and port, model, previews); flags win over it",
    )
    return serve


def serve_command(args: argparse.Namespace) -> int:
    """Run ``toollatch serve`` with parsed ``args`` until interrupted; the exit status."""
    from .._errors import ConfigError, UsageError  # noqa: PLC0415
    from ..mcp import source_from_config  # noqa: PLC0415
    from ..runtime._command import CommandError, load_tool_file  # noqa: PLC0415
    from ..runtime._config import configured  # noqa: PLC0415
    from ..runtime._tools import Tool  # noqa: PLC0415
    from ._server import RelayServer  # noqa: PLC0415

    try:
        tools: list[Tool[..., Any]] | None = None
        for path in args.tools or ():
            tools = (tools or []) + load_tool_file(path)
        c = configured(args.config)  # (TOOLLATCH_... variables with or without --config)
        base_url = args.base_url or (c.model.base_url if c else None)
        model = args.model or (c.model.model if c else None)
        if base_url is not None and not model:
            raise CommandError("--model is required with --base-url")
        try:
            reserved = [t.name for t in tools or ()]
            source = source_from_config(c, args.mcp or (), reserved=reserved)
        except ConfigError as exc:
            raise CommandError(f"--mcp: {exc}") from None
        server = RelayServer(
            host=args.host or (c.relay.host if c else "127.0.0.1"),
            port=args.port if args.port is not None else (c.relay.port if c else 8000),
            provider=args.provider or (c.model.provider if c else "openai_chat"),
            model=model,
            base_url=base_url,
            tools=tools,
            tool_source=source,
            previews=c.preview_policy() if c else None,
            ledger=_ledger_url(args.ledger or (c.ledger.url if c else None)),
            audit=c.audit_policy() if c else None,
        )
        return asyncio.run(_serve(server))
    except (CommandError, ConfigError, UsageError) as exc:
        sys.stderr.write(f"toollatch: error: {' '.join(str(exc).split())}\n")
        return 2
    except KeyboardInterrupt:
        return 0


def _ledger_url(given: str | None) -> str | None:
    """``--ledger`` (or the config's ``ledger.url``): ``none`` is no ledger, nothing the
    default (SQLite in the user's data folder)."""
    from ..ledger import default_ledger_url  # noqa: PLC0415

    if given is None:
        return default_ledger_url()
    return None if given == "none" else given


async def _serve(server: Any) -> int:
    from ._server import settle_heap  # noqa: PLC0415

    async with server:
        settle_heap()
        ledger = server.ledger_url or "none"
        sys.stderr.write(f"toollatch relay on {server.url}/ (ledger {ledger}; Ctrl-C to stop)\n")
        sys.stderr.flush()
        await server.serve_forever()
    return 0
