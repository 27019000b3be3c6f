"""``toollatch config example|check FILE``: its arguments and its handler. The configuration
itself is :mod:`toollatch.cli._app_config`, imported only here (it needs the ``[run]``
extra)."""

from __future__ import annotations

import argparse
import sys

from ..core._errors import ConfigError
from ._args import CliParser, Subparsers
from ._output import fail

NAME = "config"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``config`` and its two subcommands to ``subparsers``; returns its parser."""
    config: argparse.ArgumentParser = subparsers.add_parser(
        NAME, help="print an example configuration, or check one"
    )
    config_sub = config.add_subparsers(dest="config_command", required=True, parser_class=CliParser)
    config_sub.add_parser("example", help="print a commented example (every key, its default)")
    check = config_sub.add_parser(
        "check", help="validate FILE (and TOOLLATCH_... overrides); print the effective config"
    )
    check.add_argument("file", metavar="FILE")
    return config


def command(args: argparse.Namespace) -> int:
    """``toollatch config example`` / ``check FILE``: the example or the effective
    configuration on standard output (0); every problem on standard error (2)."""
    try:
        from ._app_config import EXAMPLE, load_config  # noqa: PLC0415 (the [run] extra, lazily)
    except ImportError as exc:
        return fail(f"toollatch config needs the [run] extra (pip install 'toollatch[run]'): {exc}")
    if args.config_command == "example":
        sys.stdout.write(EXAMPLE)
        return 0
    try:
        config = load_config(args.file)
    except ConfigError as exc:  # (one line per problem: not folded into one as fail() does)
        sys.stderr.write(f"toollatch: error: {exc}\n")
        return 2
    sys.stdout.write(config.effective())
    return 0
