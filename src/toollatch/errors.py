"""Exceptions and stable error codes (public namespace: re-exports only)."""

from ._errors import (
    ConfigError,
    ErrorCode,
    InvariantBroken,
    StreamDecodeError,
    ToolLatchError,
    UsageError,
)

__all__ = [
    "ConfigError",
    "ErrorCode",
    "InvariantBroken",
    "StreamDecodeError",
    "ToolLatchError",
    "UsageError",
]
