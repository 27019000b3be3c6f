"""History builders: a finalized Round (+ results) -> the next request's messages (internal).

One module per provider. Every builder keeps three rules: the assistant message comes from the
finalized round, never from the delta list; reasoning and server-tool blocks are copied
byte-for-byte; every call that appears in the assistant message gets exactly one result, in
call order, so the next request is protocol-valid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._errors import UsageError
from .._round import CallRecord, Round, ToolResult
from . import anthropic, bedrock, gemini, openai_chat, openai_responses

_Builder = tuple[
    Callable[[Round], dict[str, Any]],
    Callable[[Round, Sequence[tuple[CallRecord, ToolResult]]], list[dict[str, Any]]],
]

_BUILDERS: dict[str, _Builder] = {
    "openai_chat": (openai_chat.assistant_message, openai_chat.tool_results_messages),
    "anthropic": (anthropic.assistant_message, anthropic.tool_results_messages),
    "openai_responses": (
        openai_responses.assistant_message,
        openai_responses.tool_results_messages,
    ),
    "gemini": (gemini.assistant_message, gemini.tool_results_messages),
    "bedrock": (bedrock.assistant_message, bedrock.tool_results_messages),
}


def in_history(call: CallRecord) -> bool:
    """Whether the call is written to history (a call without a name cannot be)."""
    return bool(call.name)


def _builder(round_: Round) -> _Builder:
    try:
        return _BUILDERS[round_.provider]
    except KeyError:
        raise UsageError(f"no history builder for provider {round_.provider!r}") from None


def assistant_message(round_: Round) -> dict[str, Any]:
    """Choice 0 of ``round_`` as an assistant message in the provider's format."""
    return _builder(round_)[0](round_)


def tool_results_messages(round_: Round, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """The message(s) carrying one result per call of the assistant message, in call order."""
    by_id: dict[str, ToolResult] = {}
    for result in results:
        if result.tool_call_id in by_id:
            raise UsageError(f"two results for call id {result.tool_call_id!r}")
        by_id[result.tool_call_id] = result
    pairs: list[tuple[CallRecord, ToolResult]] = []
    for call in round_.calls:
        found = by_id.pop(call.history_id, None)
        if not in_history(call):
            continue
        if found is None:
            raise UsageError(f"no result for call {call.history_id!r} ({call.name})")
        pairs.append((call, found))
    if by_id:
        raise UsageError(f"results for unknown call ids: {sorted(by_id)}")
    return _builder(round_)[1](round_, pairs)
