"""``toollatch serve``'s arguments, and its handler: the relay itself is started by
:mod:`toollatch.cli._serve_command`, imported only for ``serve`` (it needs the ``[run]``
extra)."""

from __future__ import annotations

import argparse

from ._args import PROVIDERS, Subparsers, positive, positive_seconds

NAME = "serve"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``serve`` and its arguments to ``subparsers``; returns its parser."""
    serve: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="serve the relay: a live page of agent runs (SSE) on the scripted model",
        description="Serve agent runs to a browser over SSE, with a live page at /.",
    )
    serve.add_argument("--host", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (8000)")
    for add in (_model, _access, _run_bounds, _browser):
        add(serve)
    serve.add_argument(
        "--shutdown-grace",
        type=positive_seconds,
        metavar="SECONDS",
        help="on SIGTERM / Ctrl-C, wait this long for the cancelled runs to end (every open "
        "event stream gets their results and run_ended), then exit (default: the config's "
        "relay.shutdown_grace_s, 10)",
    )
    _store(serve)
    _durable(serve)
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration (relay host and port, model, previews); flags win over it",
    )
    return serve


def _browser(serve: argparse.ArgumentParser) -> None:
    """What the chats keep and what reaches the browser."""
    serve.add_argument(
        "--max-chat-messages",
        type=positive,
        metavar="N",
        help="history entries a chat keeps on the server (POST /api/chat; a full chat refuses "
        "more with 409; default: the config's relay.max_chat_messages, 400)",
    )
    serve.add_argument(
        "--max-chat-body-bytes",
        type=positive,
        metavar="N",
        help="largest POST /api/chat body (413 beyond; default: the config's "
        "relay.max_chat_body_bytes, 1048576)",
    )
    serve.add_argument(
        "--max-ui-bytes",
        type=positive,
        metavar="N",
        help="largest tool UI payload (ToolOutcome.ui, as JSON) sent to the browser; a larger "
        "one is left out (default: the config's relay.max_ui_bytes, 65536)",
    )
    serve.add_argument(
        "--max-always",
        type=positive,
        metavar="N",
        help="tools one browser session may 'always allow' (kept in the ledger; default: the "
        "config's approvals.max_always, 32)",
    )
    serve.add_argument(
        "--result-text",
        choices=("summary", "always", "never"),
        help="when the browser gets a redacted preview of a result's text: summary (no UI "
        "payload, or a failed call), always, never (default: the config's relay.result_text, "
        "summary)",
    )


def _run_bounds(serve: argparse.ArgumentParser) -> None:
    """What each run keeps (the other relay bounds are config keys only)."""
    serve.add_argument(
        "--max-run-events",
        type=positive,
        metavar="N",
        help="events stored per run: a run reaching it is cancelled, and only the events "
        "that pair its calls and end it are kept past it (default: the config's "
        "relay.max_run_events, 20000)",
    )


def _store(serve: argparse.ArgumentParser) -> None:
    """Where the runs live (several workers share a Redis)."""
    serve.add_argument(
        "--store",
        metavar="URL",
        help="where the runs live: memory: (this process) or redis://HOST:PORT/DB (shared: "
        "any worker on that Redis serves, resumes and cancels any run; the [redis] extra; "
        "default: the config's relay.store, memory:)",
    )
    serve.add_argument(
        "--store-ttl",
        type=positive_seconds,
        metavar="SECONDS",
        help="how long a shared store keeps an ended run (default: relay.store_ttl_s, 3600)",
    )
    serve.add_argument(
        "--store-outage",
        type=positive_seconds,
        metavar="SECONDS",
        help="how long to retry an unreachable shared store before this worker's runs are "
        "cancelled (default: relay.store_outage_s, 5)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="N worker processes accepting on one port (needs a shared --store; default 1)",
    )
    serve.add_argument(
        "--lease",
        type=positive_seconds,
        metavar="SECONDS",
        help="a worker's lease with a shared store: a worker silent this long is taken as "
        "dead and its runs are ended by another (default: relay.lease_s, 10)",
    )


def _durable(serve: argparse.ArgumentParser) -> None:
    """Runs a surviving worker finishes (DBOS on PostgreSQL)."""
    serve.add_argument(
        "--durable",
        metavar="URL",
        help="postgresql://USER@HOST:PORT/DB: each run of POST /runs is a DBOS workflow, so "
        "a dead worker's run is finished by another (needs --store redis://, a --ledger and "
        "the [durable] extra; default: relay.durable, none)",
    )


def _model(serve: argparse.ArgumentParser) -> None:
    """The tools, the model and the ledger."""
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


def _access(serve: argparse.ArgumentParser) -> None:
    """Who may drive the relay: the token, the hosts, the origins, the models."""
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


def command(args: argparse.Namespace) -> int:
    """``toollatch serve`` until a signal stops it; the exit status."""
    from ._serve_command import serve_command  # noqa: PLC0415 (the [run] extra, lazily)

    return serve_command(args)
