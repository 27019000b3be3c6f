"""Helpers shared by the history builders (internal)."""

from __future__ import annotations

from typing import Any

from .._gate import strict_loads
from .._round import CallRecord


def arguments_object(call: CallRecord) -> dict[str, Any]:
    """The call's arguments as an object for history: parsed if possible, else ``{}``.

    A truncated or invalid argument text is never replayed as-is (providers reject the next
    request — MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#55); the paired error result
    tells the model what went wrong.
    """
    if call.arguments is not None:
        return dict(call.arguments)
    try:
        value = strict_loads(call.arguments_text, max_depth=10_000)
    except Exception:
        return {}
    return value if isinstance(value, dict) else {}


def arguments_text(call: CallRecord) -> str:
    """The exact argument text when it is a valid JSON object, else ``"{}"``."""
    if call.arguments is not None:
        return call.arguments_text if call.arguments_text.strip() else "{}"
    obj = arguments_object(call)
    return call.arguments_text if obj else "{}"
