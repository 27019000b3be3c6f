"""Q19: the hallucinated ``multi_tool_use.parallel`` wrapper call (internal).

Some OpenAI models occasionally emit ONE call to a tool nobody defined, ``multi_tool_use.parallel``,
whose arguments list the calls they meant to make in parallel:
``{"tool_uses": [{"recipient_name": "functions.get_weather", "parameters": {...}}, ...]}``
(LiteLLM handles it in ``handle_parallel_tool_calls.py``). Once the round ended normally, the
assembler expands such a call into its inner calls, each then going through the gate on its own,
and records an anomaly. A malformed wrapper is left alone: the gate refuses it.
"""

from __future__ import annotations

import json

from ._gate import strict_loads

PARALLEL_WRAPPER = "multi_tool_use.parallel"


def inner_calls(text: str, *, max_depth: int) -> list[tuple[str, str]] | None:
    """``(name, argument text)`` of each wrapped call, or None if ``text`` is not a wrapper."""
    try:
        value = strict_loads(text, max_depth=max_depth)
    except Exception:
        return None
    uses = value.get("tool_uses") if isinstance(value, dict) else None
    if not isinstance(uses, list) or not uses:
        return None
    found: list[tuple[str, str]] = []
    for use in uses:
        name = use.get("recipient_name") if isinstance(use, dict) else None
        params = use.get("parameters", {}) if isinstance(use, dict) else None
        if not isinstance(name, str) or not name or not isinstance(params, dict):
            return None
        text = json.dumps(params, ensure_ascii=False, separators=(",", ":"))
        found.append((name.removeprefix("functions."), text))
    return found
