"""``toollatch`` command line: ``replay`` recorded streams through the commit gate, ``run``
an agent, check its ``config``, ``serve`` the relay, ``proxy`` a model server through the gate,
``probe`` a model server's quirks.

One module per subcommand declares its arguments (``add_parser(subparsers)``) and holds its
handler (``command(args)``, the exit status): :mod:`~toollatch.cli._replay`,
:mod:`~toollatch.cli._run`, :mod:`~toollatch.cli._config`, :mod:`~toollatch.cli._serve`,
:mod:`~toollatch.cli._proxy`, :mod:`~toollatch.cli._probe`. The
heavy parts (the runtime, the relay, the whole-app configuration: the ``[run]`` extra) are
imported only by the subcommand that runs them (``_run_command``, ``_serve_command``,
``_app_config``), so ``toollatch replay`` imports neither asyncio nor httpx.

A usage error is one ``toollatch: error: ...`` line on standard error and status 2, never a
traceback. ``toollatch replay --format json`` is a stable contract (see
:mod:`toollatch.cli._replay_output`); what is printed is printable whatever the input (see
:mod:`toollatch.cli._output`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import _config, _probe, _proxy, _replay, _run, _serve
from ._args import CliParser, Subcommand
from ._output import display_name, json_text
from ._replay import replay_bytes, replay_stream
from ._replay_output import preview_json, preview_text, round_json, round_text
from ._run import RUN_VARIABLES

_SUBCOMMANDS: tuple[Subcommand, ...] = (_replay, _run, _config, _serve, _proxy, _probe)
"""The subcommands' modules, in the order ``toollatch --help`` lists them."""


def _version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("toollatch")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = CliParser(prog="toollatch", description="Commit-gated streamed tool calls.")
    parser.add_argument("--version", action="version", version=f"toollatch {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CliParser)
    for subcommand in _SUBCOMMANDS:
        subcommand.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toollatch`` script; returns the exit status (never raises).

    A usage error, an unreadable file and anything unexpected while replaying a file end with
    one ``toollatch: error: ...`` line on standard error and status 2; files before it were
    printed in full.
    """
    try:
        return _main(argv)
    except BrokenPipeError:  # e.g. `toollatch replay ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed its line (or the help)
        return exc.code if isinstance(exc.code, int) else 2
    return {s.NAME: s.command for s in _SUBCOMMANDS}[args.command](args)


__all__ = [
    "RUN_VARIABLES",
    "build_parser",
    "display_name",
    "json_text",
    "main",
    "preview_json",
    "preview_text",
    "replay_bytes",
    "replay_stream",
    "round_json",
    "round_text",
]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
