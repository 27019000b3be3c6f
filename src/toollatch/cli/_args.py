"""What every subcommand's parser shares: the parser class (a usage error is one
``toollatch: error: ...`` line and status 2) and the argument types."""

from __future__ import annotations

import argparse
import math
from typing import Any, NoReturn, Protocol

from ._output import fail

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
"""The providers ``serve`` can talk to (``replay`` reads every provider)."""
RUN_PROVIDERS = (*PROVIDERS, "bedrock")
"""The providers ``run`` can talk to (a model client's: :func:`toollatch.model_client`)."""

Subparsers = Any
"""``argparse``'s subparsers action (its class, ``argparse._SubParsersAction``, is private)."""


class Subcommand(Protocol):
    """What a subcommand's module provides (``toollatch.cli._replay``, ``_run``, ...)."""

    NAME: str
    """The subcommand's name on the command line."""

    def add_parser(self, subparsers: Subparsers) -> argparse.ArgumentParser:
        """Add the subcommand and its arguments to ``subparsers``; returns its parser."""
        ...

    def command(self, args: argparse.Namespace) -> int:
        """Carry out the subcommand with parsed ``args``; the exit status (never raises)."""
        ...


class CliParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line and status 2 (no usage text)."""

    def error(self, message: str) -> NoReturn:
        self.exit(fail(message))


def positive(text: str) -> int:
    """An integer >= 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A duration in seconds: a finite number >= 0 (0: no limit, where the flag says so)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value
