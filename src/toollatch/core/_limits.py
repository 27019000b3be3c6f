"""Every budget the pure core enforces, in one immutable value.

Each field carries its unit in its name and its default beside the reason for it. Limits are
checked when data is appended (never only at commit), so memory stays bounded by them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds on one round's input; pass a custom instance to the assembler, parser or CLI."""

    max_argument_bytes: int = 256 * 1024
    """UTF-8 bytes of argument text per call. 256 KiB holds a large file write; more is
    almost always a runaway generation. Exceeding it fails the call
    ``arguments_exceed_max_bytes`` and drops its further fragments."""

    max_calls_per_round: int = 32
    """Tool calls in one round (per choice). Providers cap parallel calls far below this;
    the 33rd and later calls get a FAILED placeholder ``too_many_tool_calls``, up to as many
    again; a call past twice the limit fails the whole stream (``stream_interrupted``) and is
    not kept, so a runaway of tiny calls costs bounded memory."""

    max_choices: int = 128
    """Choices (``n``) in one round: OpenAI accepts ``n`` up to 128. An event for one more
    choice fails the stream (``stream_interrupted``); nothing of that choice is kept."""

    max_json_depth: int = 64
    """Nesting depth of the argument JSON (objects and arrays). Real tool schemas rarely pass
    10; deep nesting is a denial-of-service vector for recursive consumers."""

    max_line_bytes: int = 8 * 1024 * 1024
    """Bytes in one SSE line (or JSONL line). A whole-arguments chunk is at most
    ``max_argument_bytes`` escaped (<= 6x) plus the envelope, so 8 MiB is generous."""

    max_event_bytes: int = 16 * 1024 * 1024
    """Bytes of ``data`` accumulated for one SSE event (several ``data:`` lines)."""

    max_text_bytes: int = 16 * 1024 * 1024
    """Characters of assistant text kept per choice for the round and its history message."""

    def __post_init__(self) -> None:
        for name in (
            "max_argument_bytes",
            "max_calls_per_round",
            "max_choices",
            "max_json_depth",
            "max_line_bytes",
            "max_event_bytes",
            "max_text_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Limits.{name} must be a positive integer, got {value!r}")
