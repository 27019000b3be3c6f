"""The command line's shape. Every subcommand keeps its flags: the option strings and
positionals of each parser, and the defaults that are not "unset", against a committed list
(the help texts are not pinned: their wording may change; a flag, a positional or a default
may not, without this list). One module per subcommand declares them, and no function of
``toollatch.cli`` is over 40 lines (STYLE.md rule 11)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

import toollatch.cli
from toollatch.cli import build_parser

CLI = Path(toollatch.cli.__file__).parent
MAX_FUNCTION_LINES = 40

OPTIONS: dict[str, set[str]] = {
    "": {"-h", "--help", "--version"},
    "replay": {
        "-h", "--help", "FILE", "--provider", "--tools", "--format", "--max-args-bytes",
        "--max-calls", "--max-depth", "--chunk-bytes", "--previews", "--preview-mode",
        "--preview-fields", "--preview-every",
    },
    "run": {
        "-h", "--help", "message", "--provider", "--model", "--base-url", "--tools", "--mcp",
        "--eager", "--max-rounds", "--deadline", "--workspace", "--json", "--record",
        "--full-results", "--ledger", "--session", "--resume", "--config", "--approve",
        "--approval-timeout", "--max-always",
    },
    "config": {"-h", "--help"},
    "config example": {"-h", "--help"},
    "config check": {"-h", "--help", "FILE"},
    "serve": {
        "-h", "--help", "--host", "--port", "--tools", "--provider", "--model", "--base-url",
        "--mcp", "--ledger", "--token", "--allow-host", "--allow-origin", "--allow-model",
        "--shutdown-grace", "--max-run-events", "--max-chat-messages", "--max-chat-body-bytes",
        "--max-ui-bytes", "--result-text", "--store", "--store-ttl", "--store-outage", "--lease",
        "--workers", "--durable", "--max-always", "--config",
    },
    "proxy": {
        "-h", "--help", "--upstream", "--upstream-provider", "--host", "--port", "--calls",
        "--token", "--allow-host", "--record", "--idle-timeout", "--max-request-bytes",
        "--config",
    },
    "probe": {"-h", "--help", "--base-url", "--model", "--json", "--record", "--timeout"},
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
    # proxy: none (each unset flag falls back to TOOLLATCH_PROXY__* and proxy: in --config,
    # whose defaults test_config pins through CONFIG_EXAMPLE)
    "probe": {"--timeout": 120.0},
}
"""The defaults other than None, False and argparse's SUPPRESS (there are none elsewhere)."""

SUBCOMMANDS = ("replay", "run", "config", "serve", "proxy", "probe")
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


def test_each_subcommand_has_its_module():
    for name in SUBCOMMANDS:
        module = getattr(toollatch.cli, f"_{name}")
        assert name == module.NAME
        assert callable(module.add_parser)
        assert callable(module.command)


def test_no_function_of_the_command_line_is_over_40_lines():
    long = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    assert not long, long
