"""One id per call in the history sent back, when a model gave two calls of a round one id
(internal, pure).

The gate fails the later call of a repeated id (``duplicate_call_id``) and the earlier one
runs, so the round has two results for one id. No provider accepts that back: OpenAI chat
refuses a repeated ``tool_calls[].id`` ("Duplicate value for 'tool_call_id'"), Anthropic
"`tool_use` ids must be unique" (trycua/cua#524), the Responses API a repeated function
call ``call_id``, and Bedrock and Gemini pair by the ids they sent. The history therefore
writes each later call of a repeated id in the provider's valid way:

* OpenAI chat, Anthropic, Bedrock, Gemini: the call stays in the assistant turn under a
  *derived* id, ``<id>_dup<n>`` (the provider's id, cut so the whole stays within 40
  characters: OpenAI chat refuses longer tool call ids, microsoft/autogen#6377; only
  ``[A-Za-z0-9_]`` is added, the characters Anthropic and Bedrock allow,
  HKUDS/nanobot#4356), and its error result answers that id: the model reads that this
  call was not run and why;
* OpenAI Responses: the call is left out of the turn with its result (its item carries the
  server's own item id, which a call id the server never issued would not match), with a
  reasoning item right before it (it may not be sent without its following item), as
  :mod:`._repair` drops a call.

Each such call is told as an :class:`~toollatch.Anomaly` (:func:`id_repairs`):
``call_id_renamed`` or ``duplicate_call_dropped``. The Round itself keeps the provider's
ids (the events show what the model sent); only the history differs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._errors import ErrorCode
from .._events import Anomaly, AnomalyKind, CallKey, ReasoningBlock
from .._round import CallRecord, ContentItem, Round, ToolResult, derived_id

_DROPS = frozenset({"openai_responses"})
"""Providers whose history leaves a repeated id's later call out rather than renaming it."""


@dataclass(frozen=True, slots=True)
class _Repair:
    key: CallKey
    call_id: str
    renamed: str | None
    """The derived id; None when the call is dropped from the history."""


def _repairs(round_: Round) -> list[_Repair]:
    """The later calls of each repeated id among choice 0's named calls, in call order."""
    calls = [c for c in round_.calls if c.name]
    seen: set[str] = set()
    taken = {c.call_id for c in round_.calls}
    repairs = []
    for call in calls:
        if call.call_id not in seen:
            seen.add(call.call_id)
            continue
        renamed = None
        if round_.provider not in _DROPS:
            renamed = derived_id(call.call_id, taken)
            taken.add(renamed)
        repairs.append(_Repair(call.key, call.call_id, renamed))
    return repairs


def history_round(round_: Round) -> Round:
    """``round_`` as its history is written: each later call of a repeated id renamed or
    left out (see the module docstring); ``round_`` itself when no id repeats."""
    repairs = _repairs(round_)
    if not repairs:
        return round_
    renamed = {r.key: r.renamed for r in repairs if r.renamed is not None}
    dropped = {r.key for r in repairs if r.renamed is None}
    choice = round_.choices[0]

    def fixed(call: CallRecord) -> CallRecord:
        new_id = renamed.get(call.key)
        return call if new_id is None else replace(call, call_id=new_id)

    content: list[ContentItem] = [
        fixed(item) if isinstance(item, CallRecord) else item for item in choice.content
    ]
    choice = replace(choice, calls=tuple(fixed(c) for c in choice.calls), content=tuple(content))
    return without_calls(replace(round_, choices=(choice, *round_.choices[1:])), dropped)


def without_calls(round_: Round, keys: Collection[CallKey]) -> Round:
    """``round_`` without choice 0's calls of ``keys`` (in its calls and its content), and
    for OpenAI Responses without a reasoning item right before one of them."""
    if not keys:
        return round_
    choice = round_.choices[0]
    kept: list[ContentItem] = []
    for item in choice.content:
        if isinstance(item, CallRecord) and item.key in keys:
            reasoning = kept and isinstance(kept[-1], ReasoningBlock)
            if round_.provider == "openai_responses" and reasoning:
                kept.pop()
            continue
        kept.append(item)
    repaired = replace(
        choice, calls=tuple(c for c in choice.calls if c.key not in keys), content=tuple(kept)
    )
    return replace(round_, choices=(repaired, *round_.choices[1:]))


def id_repairs(round_: Round) -> tuple[Anomaly, ...]:
    """One anomaly per call whose id the history changes or leaves out (none when no id
    repeats): ``call_id_renamed`` naming the derived id, or ``duplicate_call_dropped``."""
    anomalies = []
    for r in _repairs(round_):
        if r.renamed is not None:
            kind, detail = (
                AnomalyKind.CALL_ID_RENAMED,
                f"call id {r.call_id!r} repeats an earlier call's; in the history sent back "
                f"this call is {r.renamed!r}",
            )
        else:
            kind, detail = (
                AnomalyKind.DUPLICATE_CALL_DROPPED,
                f"call id {r.call_id!r} repeats an earlier call's; the history sent back "
                "leaves this call and its result out",
            )
        anomalies.append(Anomaly(kind=kind, detail=detail, key=r.key))
    return tuple(anomalies)


def pair_results(
    round_: Round, results: Sequence[ToolResult]
) -> tuple[list[tuple[CallRecord, ToolResult | None]], dict[str, list[ToolResult]]]:
    """Each call of choice 0 with its result (None when there is none), and the results
    left over by id.

    A result answers the call of its ``tool_call_id``. When calls share an id (a model bug),
    their results share it too: the call that failed ``duplicate_call_id`` takes a
    ``duplicate_call_id`` result, the other one any other result, else they go in order.
    A result given the derived id of :func:`history_round` answers that call.
    """
    pool: dict[str, list[ToolResult]] = {}
    for result in results:
        pool.setdefault(result.tool_call_id, []).append(result)
    written = {c.key: c.call_id for c in history_round(round_).calls}
    pairs: list[tuple[CallRecord, ToolResult | None]] = []
    for call in round_.calls:
        own = written.get(call.key, call.call_id)
        found = _take(pool.get(own), call) if own != call.call_id else None
        if found is None:
            found = _take(pool.get(call.call_id), call)
        pairs.append((call, found))
    return pairs, {k: v for k, v in pool.items() if v}


def _take(candidates: list[ToolResult] | None, call: CallRecord) -> ToolResult | None:
    if not candidates:
        return None
    duplicate = call.committed is None and call.error is ErrorCode.DUPLICATE_CALL_ID
    for i, result in enumerate(candidates):
        if (result.code is ErrorCode.DUPLICATE_CALL_ID) == duplicate:
            return candidates.pop(i)
    return candidates.pop(0)


# -- ids an earlier round already used ---------------------------------------------------------

_ID_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    # provider -> (where a call or result keeps its id: a block/item/part key, the id field)
    "anthropic": (("tool_use", "id"), ("server_tool_use", "id"), ("tool_result", "tool_use_id")),
    "bedrock": (("toolUse", "toolUseId"), ("toolResult", "toolUseId")),
    "gemini": (("functionCall", "id"), ("functionResponse", "id")),
}


def history_call_ids(provider: str, history: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Every call id the entries of ``history`` (the provider's own format, as the builders
    of this package write it) already use, in a call or in a result.

    Servers that number call ids per response (vLLM, Ollama, llama.cpp: ``call_0``,
    ``call_1``... in every response) reuse an id an earlier round of the same conversation
    already used. Such a call is a *new* call: the agent hands these ids to the round's
    parser (``reserved_ids``), which gives a call reusing one a derived id,
    ``<id>_r<n>`` (:func:`derived_id`), before anything (dispatch, ledger, events, history)
    sees it. An id the history does not hold yet (a round cut off by a crash, asked again
    on resume) is not renamed: the ledger answers it as the call it was. Entries that are
    not of the expected shape are skipped (the provider judges them).
    """
    ids: set[str] = set()
    for entry in history:
        if not isinstance(entry, Mapping):
            continue
        if provider == "openai_chat":
            _chat_ids(entry, ids)
        elif provider == "openai_responses":
            if entry.get("type") in ("function_call", "function_call_output"):
                _add(ids, entry.get("call_id"))
        else:
            fields = _ID_FIELDS.get(provider, ())
            blocks = entry.get("parts") if provider == "gemini" else entry.get("content")
            for block in blocks if isinstance(blocks, list) else ():
                if isinstance(block, Mapping):
                    _block_ids(provider, block, fields, ids)
    return frozenset(ids)


def _chat_ids(entry: Mapping[str, Any], ids: set[str]) -> None:
    _add(ids, entry.get("tool_call_id"))
    calls = entry.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, Mapping):
            _add(ids, call.get("id"))


def _block_ids(
    provider: str, block: Mapping[str, Any], fields: tuple[tuple[str, str], ...], ids: set[str]
) -> None:
    for where, field in fields:
        if provider == "anthropic":  # {"type": "tool_use", "id"}
            if block.get("type") == where:
                _add(ids, block.get(field))
        elif isinstance(inner := block.get(where), Mapping):  # {"toolUse": {"toolUseId"}}
            _add(ids, inner.get(field))


def _add(ids: set[str], value: object) -> None:
    if isinstance(value, str) and value:
        ids.add(value)
