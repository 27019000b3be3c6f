"""``toollatch config example|check FILE``'s arguments, and its handler: the configuration
itself is :mod:`toollatch.cli._app_config`, imported only for ``config`` (it needs the
``[run]`` extra)."""

from __future__ import annotations

import argparse

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
    """``toollatch config example|check FILE``: exit 0, or 2 with every problem listed."""
    try:
        from ._app_config import config_command  # noqa: PLC0415 (the [run] extra, lazily)
    except ImportError as exc:
        return fail(f"toollatch config needs the [run] extra (pip install 'toollatch[run]'): {exc}")
    return config_command(args)
