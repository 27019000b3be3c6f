"""Every subcommand keeps its flags: the option strings and positionals of each parser, and
the defaults that are not "unset", against a committed list. (The help texts are not pinned:
their wording may change; a flag, a positional or a default may not, without this list.)"""

from __future__ import annotations

import argparse
from typing import Any

from toollatch.cli import build_parser

OPTIONS: dict[str, set[str]] = {
    "": {"-h", "--help", "--version"},
    "replay": {
        "-h", "--help", "FILE", "--provider", "--tools", "--format", "--max-args-bytes",
        "--max-calls", "--max-depth", "--chunk-bytes", "--previews", "--preview-mode",
        "--preview-fields", "--preview-every",
    },
    "run": {
        "-h", "--help", "message", "--provider", "--model", "--base-url", "--tools", "--mcp",
        "--eager", "--max-rounds", "--deadline", "--workspace", "--json", "--full-results",
        "--ledger", "--session", "--resume", "--config",
    },
    "config": {"-h", "--help"},
    "config example": {"-h", "--help"},
    "config check": {"-h", "--help", "FILE"},
    "serve": {
        "-h", "--help", "--host", "--port", "--tools", "--provider", "--model", "--base-url",
        "--mcp", "--ledger", "--token", "--allow-host", "--allow-origin", "--allow-model",
        "--shutdown-grace", "--config",
    },
}  # fmt: skip
"""Per subcommand ("" is ``toollatch`` itself): its option strings, and its positionals by
their metavar (else their name)."""

DEFAULTS: dict[str, dict[str, Any]] = {
    "replay": {
        "--provider": "auto",
        "--format": "text",
        "--preview-mode": "full",
        "--preview-fields": "",
        "--preview-every": 256,
    },
}
"""The defaults other than None, False and argparse's SUPPRESS (there are none elsewhere)."""

SUBCOMMANDS = ("replay", "run", "config", "serve")
"""In the order ``toollatch --help`` lists them."""


def _parsers(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.ArgumentParser]:
    found = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found |= _parsers(child, f"{path} {name}".strip())
    return found


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]


def test_every_subcommand_has_its_committed_options():
    parsers = _parsers(build_parser())
    assert set(parsers) == set(OPTIONS)
    for path, parser in parsers.items():
        found = set()
        for action in _arguments(parser):
            found |= set(action.option_strings) or {action.metavar or action.dest}
        assert found == OPTIONS[path], path


def test_every_subcommand_keeps_its_defaults():
    unset = (None, False, argparse.SUPPRESS)
    for path, parser in _parsers(build_parser()).items():
        found = {
            a.option_strings[0]: a.default
            for a in _arguments(parser)
            if a.option_strings and a.default not in unset
        }
        assert found == DEFAULTS.get(path, {}), path


def test_the_subcommands_are_listed_in_their_order():
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert tuple(action.choices) == SUBCOMMANDS
