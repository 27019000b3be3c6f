"""History builders: a finalized Round (+ results) -> the next request's history (internal).

One module per provider. Every builder keeps three rules: the history comes from the finalized
round, never from the delta list; reasoning and server-tool blocks are copied byte-for-byte;
every call written to history gets exactly one result, in call order, so the next request is
protocol-valid. Builders read only the Round: ids (made up or not) and the provider fields that
go back with a call are fields of its :class:`CallRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._errors import ErrorCode, UsageError
from .._round import CallRecord, Round, ToolResult
from . import anthropic, bedrock, gemini, openai_chat, openai_responses
from ._ids import history_round, pair_results

_Builder = tuple[
    Callable[[Round], list[dict[str, Any]]],
    Callable[[Round, Sequence[tuple[CallRecord, ToolResult]]], list[dict[str, Any]]],
]

_BUILDERS: dict[str, _Builder] = {
    "openai_chat": (openai_chat.assistant_messages, openai_chat.tool_results_messages),
    "anthropic": (anthropic.assistant_messages, anthropic.tool_results_messages),
    "openai_responses": (
        openai_responses.assistant_messages,
        openai_responses.tool_results_messages,
    ),
    "gemini": (gemini.assistant_messages, gemini.tool_results_messages),
    "bedrock": (bedrock.assistant_messages, bedrock.tool_results_messages),
}


def _builder(round_: Round) -> _Builder:
    try:
        return _BUILDERS[round_.provider]
    except KeyError:
        raise UsageError(f"no history builder for provider {round_.provider!r}") from None


def assistant_messages(round_: Round) -> list[dict[str, Any]]:
    """Choice 0 of ``round_`` as history entries in the provider's own format, to append to
    the next request's history.

    One entry for every provider but OpenAI Responses: OpenAI chat ``{"role": "assistant",
    "content", "tool_calls"?}``; Anthropic and Bedrock ``{"role": "assistant", "content":
    [blocks]}``; Gemini ``{"role": "model", "parts"}``. OpenAI Responses has no single
    message: the entries are the turn's input items (reasoning, messages, function calls),
    to append to the next request's ``input``. Calls without a name are left out (no provider
    accepts them); a later call repeating an earlier call's id is written under a derived
    id, or left out for OpenAI Responses (see :mod:`._ids`). Raises ``UsageError`` for a
    provider without a builder.
    """
    return _builder(round_)[0](history_round(round_))


def tool_results_messages(round_: Round, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """The history entries carrying ``results`` for the next request, put in call order.

    ``results`` answer the calls of choice 0 by ``call_id``, in any order; typically the
    tools' outputs for ``round_.committed()`` plus :func:`error_results`. Raises
    ``UsageError`` unless every call written by :func:`assistant_messages` has exactly one
    result and every result answers such a call (a result for a nameless call is dropped).
    Calls that share an id (a model bug) each take one of that id's results (the one that
    failed ``duplicate_call_id`` its error result), written under the call's history id.
    """
    pairs, left = pair_results(round_, results)
    written = history_round(round_)
    kept = {c.key: c for c in written.calls}
    out: list[tuple[CallRecord, ToolResult]] = []
    for call, found in pairs:
        if not call.name:
            continue  # not in history (see assistant_messages)
        if found is None:
            raise UsageError(f"no result for call {call.call_id!r} ({call.name})")
        if call.key in kept:  # (else a repeated id's call left out of the history)
            out.append((kept[call.key], found))
    ids = {c.call_id for c in round_.calls}
    if twice := sorted(i for i in left if i in ids):
        raise UsageError(f"two results for call id {twice[0]!r}")
    if left:
        raise UsageError(f"results for unknown call ids: {sorted(left)}")
    return _builder(round_)[1](written, out)


def results_for(
    provider: str, pairs: Sequence[tuple[CallRecord, ToolResult]]
) -> list[dict[str, Any]]:
    """The history entries carrying ``pairs`` (each call as its history wrote it, with its
    result, in call order) in ``provider``'s format: what :func:`tool_results_messages`
    writes once it has paired them (the builders read only each call's id, name and
    ``id_made_up``). Raises ``UsageError`` for a provider without a builder."""
    round_ = Round(provider=provider, attempt=0, choices=(), usage=None, anomalies=(), error=None)
    return _builder(round_)[1](round_, pairs)


def error_results(round_: Round) -> list[ToolResult]:
    """One error result per call of choice 0 that did not commit, in call order."""
    return [error_result(c) for c in round_.calls if c.committed is None]


def error_result(call: CallRecord) -> ToolResult:
    """The structured error result of a call that will not run: ``is_error``, its code, and
    ``"<code>: <detail>. The tool was not run."`` (never the argument text)."""
    code = call.error or ErrorCode.PROTOCOL_VIOLATION
    detail = call.detail or _DEFAULT_DETAIL.get(code, "the call did not pass the commit gate")
    return ToolResult(
        tool_call_id=call.call_id,
        name=call.name or "",
        content=f"{code}: {detail.rstrip('.')}. The tool was not run.",
        is_error=True,
        code=code,
    )


_DEFAULT_DETAIL = {
    ErrorCode.CANCELLED: "cancelled before it ran.",
    ErrorCode.TRUNCATED: "the response hit its token limit before the arguments were complete.",
    ErrorCode.STREAM_INTERRUPTED: "the stream ended before the provider finished the response.",
}
