"""Exceptions and stable error codes (public namespace: re-exports only)."""

from .core._errors import (
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
