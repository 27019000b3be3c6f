"""``toollatch run``'s arguments, and its handler: the run itself is
:mod:`toollatch.cli._run_command`, imported only for ``run`` (it needs the ``[run]`` extra)."""

from __future__ import annotations

import argparse

from ._args import RUN_PROVIDERS, Subparsers, positive, seconds
from ._output import fail

NAME = "run"

RUN_VARIABLES = """\
environment (read with or without --config; flags win over them):
  TOOLLATCH_MODEL__BASE_URL, TOOLLATCH_MODEL__MODEL, TOOLLATCH_MODEL__PROVIDER
                        the model (as --base-url, --model, --provider)
  TOOLLATCH_MODEL__API_KEY_ENV
                        the variable holding the key (default: the provider's usual one:
                        OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY; bedrock:
                        AWS_BEARER_TOKEN_BEDROCK, else AWS_ACCESS_KEY_ID and
                        AWS_SECRET_ACCESS_KEY, signed for AWS_REGION)
  TOOLLATCH_LEDGER__URL the ledger (as --ledger)
  TOOLLATCH_DISPATCHER__DEFAULT_TIMEOUT_S
                        a tool's run-time limit when it sets none (seconds)
  TOOLLATCH_APPROVALS__TOOLS, TOOLLATCH_APPROVALS__TIMEOUT_S,
  TOOLLATCH_APPROVALS__MAX_ALWAYS
                        tools whose calls need approval ([a, b]); how long one waits;
                        tools a session may always allow
  TOOLLATCH_<SECTION>__<KEY>
                        any key of `toollatch config example`, e.g.
                        TOOLLATCH_RESULTS__MAX_BYTES=16384
"""
"""The variables ``run --help`` lists (every key has one: see ``toollatch config example``)."""


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``run`` and its arguments to ``subparsers``; returns its parser."""
    run: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="run an agent: the model streams, the gate commits, the tools run, repeat",
        description="Without --base-url: the scripted model server on loopback with the "
        "built-in example tools (no key, no network).",
        epilog=RUN_VARIABLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for add in (_model, _tools, _limits, _output, _durability, _approvals):
        add(run)
    run.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration (see `toollatch config example`); flags win over it",
    )
    return run


def _model(run: argparse.ArgumentParser) -> None:
    run.add_argument("message", nargs="?", help="the user's message (default: a demo question)")
    run.add_argument(
        "--provider",
        default=None,
        choices=RUN_PROVIDERS,
        help="default: the config's model.provider, else openai_chat",
    )
    run.add_argument("--model", help="model name (default with the scripted server: scripted)")
    run.add_argument("--base-url", help="the provider's base URL (as its official SDK takes it)")


def _tools(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--tools",
        action="append",
        metavar="FILE.py",
        help="register every @toollatch.tool function of FILE.py (repeatable; replaces the "
        "examples)",
    )
    run.add_argument(
        "--mcp",
        action="append",
        metavar="SERVER",
        help="the tools of an MCP server: 'stdio:COMMAND ARGS...' or http://HOST:PORT/PATH "
        "(repeatable; replaces the examples; needs the [mcp] extra)",
    )
    run.add_argument(
        "--eager",
        action="append",
        metavar="NAME[,NAME...]",
        help="tools that may start before their round ends (besides eager=True ones)",
    )


def _limits(run: argparse.ArgumentParser) -> None:
    run.add_argument("--max-rounds", type=positive, default=None, metavar="N", help="default 8")
    run.add_argument(
        "--deadline",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="wall-clock limit of the whole run; at it the round in flight is cancelled, every "
        "call paired (default: the config's relay.deadline_s, 900; 0: none)",
    )


def _output(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--workspace",
        metavar="DIR",
        help="where the example write_file writes (default: a new temporary folder, kept; "
        "the run prints its path)",
    )
    run.add_argument("--json", action="store_true", help="one JSON agent event per line")
    run.add_argument(
        "--record",
        metavar="DIR",
        help="save each model response there as a fixture `toollatch replay` reads "
        "(credentials masked; headers never stored)",
    )
    run.add_argument(
        "--full-results",
        action="store_true",
        help="--json's tool_finished carries each whole result (still redacted), not a "
        "200-character preview",
    )


def _durability(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--ledger",
        metavar="URL",
        help="a durable call ledger: sqlite:///PATH or redis://HOST:PORT/DB (a call id runs at "
        "most once across processes and restarts)",
    )
    run.add_argument(
        "--session",
        metavar="ID",
        help="the run's session (the ledger's scope); default: a new id per run with --ledger",
    )
    run.add_argument(
        "--resume",
        metavar="ID",
        help="continue the stored run of session ID (needs --ledger; MESSAGE, if given, is a "
        "new user turn after it)",
    )


def _approvals(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--approve",
        choices=("ask", "all", "none"),
        default=None,
        help="calls that need a person's approval: ask (default: name and full arguments on "
        "standard error, y/N read from standard input), all (approve every one), none (deny "
        "every one, reason 'not approved')",
    )
    run.add_argument(
        "--approval-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="an unanswered call fails approval_expired after this long (default: the "
        "config's approvals.timeout_s, 300; 0: never)",
    )
    run.add_argument(
        "--max-always",
        type=positive,
        default=None,
        metavar="N",
        help="tools the session may 'always allow' (answer a at the prompt; default: the "
        "config's approvals.max_always, 32)",
    )


def command(args: argparse.Namespace) -> int:
    """``toollatch run``: the runtime is imported only here (it needs the ``[run]`` extra)."""
    try:
        from ._run_command import run_command  # noqa: PLC0415 (the [run] extra, lazily)
    except ImportError as exc:
        return fail(f"toollatch run needs the [run] extra (pip install 'toollatch[run]'): {exc}")
    return run_command(args)
