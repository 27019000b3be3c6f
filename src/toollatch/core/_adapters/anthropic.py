"""Anthropic Messages streaming events -> stream events.

Theory of operation: the Messages API streams one message as numbered *content blocks*
(https://docs.anthropic.com/en/docs/build-with-claude/streaming). Each block is announced by
``content_block_start`` (carrying its type), grows through ``content_block_delta`` events and
ends with ``content_block_stop``; the message ends with ``message_delta`` (``stop_reason``,
cumulative usage) followed by ``message_stop``. The block ``index`` is the key of everything:
a client ``tool_use`` block becomes the call ``CallKey(attempt, 0, index)``, whose argument
text is the ``input_json_delta.partial_json`` fragments, passed on unparsed. Every other block
is kept by this adapter until its stop and then emitted whole, in Anthropic's own history
shape: ``thinking`` / ``redacted_thinking`` as a :class:`ReasoningBlock`, server-executed tool
blocks (``server_tool_use``, ``mcp_tool_use`` and every ``*_tool_result``) as a
:class:`ServerToolBlock`. Text is forwarded as it arrives.

A ``content_block_stop`` is not proof that a call is complete: Anthropic also stops a block
that ``max_tokens`` cut (see the rule in :data:`_ENDINGS`). The round's stop reason
decides, and the assembler applies it. Provider misbehaviour never raises: it becomes an
``Anomaly`` (failing the affected call when there is one) or a ``StreamFailed``.

Rules that keep a wrong text from committing (issue 11):

* *Lost event.* An event whose block cannot be told (an ``index`` that is not an integer, a
  block never started or started twice, no ``delta`` object, no readable ``type``), or that
  may carry a fragment for a block that cannot take one (``input_json_delta`` on a text
  block, ``partial_json`` in an event of unknown type), may have been part of any call: it
  fails every pending call (:func:`lost_event`). A refused delta on a call's own block fails
  that call (an unknown delta type included).
* *No stop, no commit.* Open blocks are never closed for the provider: a call without its
  ``content_block_stop`` reaches the round's end open, and the assembler fails it.
* *Sticky reason.* A truncating or failing ``stop_reason`` is never replaced by a later one.
* *Nothing after the end.* A delta after ``message_stop`` fails the call it names (every
  pending call when it names none); a later ``message_delta`` reason still reaches the
  assembler, which keeps a truncating or failing one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from .._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallKey,
    ReasoningBlock,
    RoundEnd,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)
from ._base import error_detail, lost_event, round_end, short
from ._blocks import Block, BlockAdapter, Kind, index_of, invalid, lost_block, str_or_none

# How each stop_reason ends the round (https://docs.anthropic.com/en/api/handling-stop-reasons).
_ENDINGS: dict[str, RoundEnd] = {
    "tool_use": RoundEnd.NORMAL,
    "end_turn": RoundEnd.NORMAL,
    "stop_sequence": RoundEnd.NORMAL,
    "pause_turn": RoundEnd.NORMAL,  # a server-tool loop paused; the blocks it sent are complete
    # Cut by a token limit. The cut block may still get a content_block_stop (Anthropic's tool
    # runner documents it; pydantic-ai#3118, anthropic-sdk-python#794) or none at all (fixture
    # anthropic/max_tokens_truncated_tool_use.sse): the call must fail either way.
    "max_tokens": RoundEnd.TRUNCATED,
    "model_context_window_exceeded": RoundEnd.TRUNCATED,
    "refusal": RoundEnd.INTERRUPTED,  # the model declined mid-stream: nothing it began may run
}

_KNOWN_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
)


# -- content blocks ----------------------------------------------------------------------------


_DELTA_FIELDS: dict[str, tuple[frozenset[Kind], str]] = {
    "text_delta": (frozenset({Kind.TEXT}), "text"),
    "input_json_delta": (frozenset({Kind.CALL, Kind.SERVER_CALL}), "partial_json"),
    "thinking_delta": (frozenset({Kind.THINKING}), "thinking"),
    "signature_delta": (frozenset({Kind.THINKING}), "signature"),
    # Citations annotate a text block (fixture server_web_search_with_citations.sse). They are
    # not needed to replay the text or to pair results, so they are accepted and not kept.
    "citations_delta": (frozenset({Kind.TEXT}), "citation"),
}
"""Delta type -> (block kinds it may extend, field carrying its payload)."""


_BLOCK_KINDS: dict[str, Kind] = {
    "tool_use": Kind.CALL,
    "text": Kind.TEXT,
    "thinking": Kind.THINKING,
    "redacted_thinking": Kind.REDACTED,
    "server_tool_use": Kind.SERVER_CALL,
    "mcp_tool_use": Kind.SERVER_CALL,
}


def _block_kind(block_type: object) -> Kind:
    if not isinstance(block_type, str):
        return Kind.IGNORED
    # web_search_tool_result, web_fetch_tool_result, code_execution_tool_result,
    # tool_search_tool_result, mcp_tool_result...: every server result is named like this.
    if block_type.endswith("_tool_result"):
        return Kind.SERVER_RESULT
    return _BLOCK_KINDS.get(block_type, Kind.IGNORED)


class AnthropicAdapter(BlockAdapter):
    """Translates Anthropic Messages stream events (dicts or SDK objects) into stream events.

    One instance per attempt. ``message_id`` and ``model`` are filled from ``message_start``
    for the rim (logging, history). See the module docstring for the rules.
    """

    provider: ClassVar[str] = "anthropic"
    _END = "message end"

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self.message_id: str | None = None
        """``message.id`` from ``message_start``, once seen."""
        self.model: str | None = None
        """``message.model`` from ``message_start``, once seen."""
        self._stop_reason: str | None = None
        self._usage: Mapping[str, Any] = {}  # message_start's, under message_delta's

    # -- entry points -----------------------------------------------------------------------

    def _continuation(
        self, event: dict[str, Any], sse_event: str | None
    ) -> tuple[CallKey, str] | None:
        # An input_json_delta for an open client tool_use block: exactly the checks _feed and
        # _block_delta make for it (block started, a call, not stopped: ``_open_calls``), with
        # exact-type tests that only send stranger values down the general path. Subscripts
        # (a missing member raises, caught below) cost less than .get() calls, once per event.
        try:
            if event["type"] != "content_block_delta" or self._ended:
                return None
            index, delta = event["index"], event["delta"]
            if type(index) is not int or type(delta) is not dict:
                return None
            fragment = delta["partial_json"]
            if type(fragment) is not str or delta["type"] != "input_json_delta":
                return None
            return self._open_calls[index], fragment
        except KeyError:
            return None

    def _feed(self, event: Mapping[str, Any], sse_event: str | None = None) -> list[StreamEvent]:
        kind = event.get("type", sse_event)
        if kind == "ping":
            return []  # keep-alive, may come anywhere (text_then_tool_use_no_args_pings.jsonl)
        if kind == "error":
            return self._stream_error(error_detail(event))
        if not isinstance(kind, str):
            return [lost_event(f"an event without a readable type ({short(kind, 40)})")]
        if kind not in _KNOWN_EVENTS:
            if _may_carry_fragment(event):
                return [lost_event(f"event of unknown type {short(kind, 60)!r} with a fragment")]
            # Anthropic may add event types (its versioning policy): one that carries no
            # fragment is reported once and skipped.
            return self._once(
                AnomalyKind.UNKNOWN_EVENT,
                f"event:{kind}",
                f"unknown event type {short(kind, 60)!r} ignored",
            )
        if self._ended:
            return self._after_end(kind, event)
        match kind:
            case "message_start":
                return self._message_start(event)
            case "content_block_start":
                return self._block_start(event)
            case "content_block_delta":
                return self._block_delta(event)
            case "content_block_stop":
                return self._block_stop(event)
            case "message_delta":
                return self._message_delta(event)
            case _:
                return self._message_stop()

    def _finish(self) -> list[StreamEvent]:
        if self._ended:
            return []
        reason = self._stop_reason
        if reason is not None and _ENDINGS.get(reason) is RoundEnd.TRUNCATED:
            # Truncated either way: a missing message_stop cannot make it any less final.
            return [RoundEnded(ending=RoundEnd.TRUNCATED, stop_reason=reason)]
        suffix = f" (stop_reason {reason!r})" if reason else ""
        return [StreamFailed(detail=f"stream ended without message_stop{suffix}")]

    # -- message level ----------------------------------------------------------------------

    def _message_start(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        message = event.get("message")
        if not isinstance(message, dict):
            return [invalid("message_start without a message object")]
        self.message_id = str_or_none(message.get("id"))
        self.model = str_or_none(message.get("model"))
        usage = message.get("usage")
        if not isinstance(usage, dict):
            return []
        self._usage = usage
        return [UsageReported(usage=usage)]

    def _message_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        reason = _reason(event)
        if reason is _UNREADABLE:  # it may have said max_tokens: nothing may commit on it
            return [lost_event("message_delta without a readable delta.stop_reason")]
        events: list[StreamEvent] = []
        if isinstance(reason, str):
            events += self._set_reason(reason)
        # cumulative for the message, per the streaming docs; a count it leaves out (the
        # input tokens: https://docs.anthropic.com/en/docs/build-with-claude/streaming shows
        # ``{"output_tokens": 15}``) stays message_start's, so the round's usage has both
        usage = event.get("usage")
        if isinstance(usage, dict):
            events.append(UsageReported(usage={**self._usage, **usage}))
        return events

    def _set_reason(self, reason: str) -> list[StreamEvent]:
        """Rule "sticky reason": a truncating or failing (or unknown) ``stop_reason`` stays,
        whatever comes after it (issue 11: ``max_tokens`` then ``tool_use`` committed)."""
        current = self._stop_reason
        if current is None or _ENDINGS.get(current) is RoundEnd.NORMAL:
            self._stop_reason = reason
            return []
        if reason == current:
            return []
        return [
            Anomaly(
                kind=AnomalyKind.REASON_OVERRIDDEN,
                detail=f"stop_reason {short(reason, 60)!r} after {current!r}; the first sticks",
            )
        ]

    def _message_stop(self) -> list[StreamEvent]:
        self._ended = True
        return round_end(self._stop_reason, _ENDINGS, "stop_reason")

    def _after_end(self, kind: str, event: Mapping[str, Any]) -> list[StreamEvent]:
        """Rule "nothing after the end": an event after ``message_stop`` (or a stream error).

        A delta naming a call's block fails that call; one that may be a fragment but names
        no call fails every pending call; a readable ``stop_reason`` goes to the assembler,
        which keeps a truncating or failing one over a normal one (in either order).
        """
        if kind == "content_block_delta":
            index, fragment = index_of(event.get("index")), _may_carry_fragment(event)
            if late := self._late_delta(index, fragment, "content_block_delta"):
                return late
        if kind == "message_delta":
            reason = _reason(event)
            if isinstance(reason, str):
                return round_end(reason, _ENDINGS, "stop_reason")
        return self._once(
            AnomalyKind.EVENT_AFTER_END, f"after:{kind}", f"{kind} after the message ended"
        )

    # -- content blocks ---------------------------------------------------------------------

    def _block_start(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index = index_of(event.get("index"))
        start = event.get("content_block")
        if index is None or not isinstance(start, dict):
            return [lost_event("content_block_start without an integer index and a content_block")]
        if index in self._blocks:  # which block do the next deltas extend? unknown
            return [lost_event(f"content block {index} started twice")]
        block = Block(_block_kind(start.get("type")), start)
        if block.kind is not Kind.CALL:
            self._blocks[index] = block
        match block.kind:
            case Kind.CALL:
                # Rule "input in the start": streamed, a tool_use start's input is {} and the
                # arguments are the deltas. A non-empty object (the non-streamed shape) is the
                # arguments sent as an object: serialized once, with an anomaly, and checked
                # for repeated keys. Deltas after it are appended, so a call that carries
                # both does not parse and fails (the SDK would keep only the deltas: ambiguous).
                id_, name = start.get("id"), start.get("name")
                return self._open_call(index, start, id_, name, "tool_use start")
            case Kind.TEXT:
                text = start.get("text")
                return [TextDelta(text=text, block=index)] if isinstance(text, str) and text else []
            case Kind.THINKING:
                # Usually "thinking": "" and "signature": "" (thinking_then_mcp_tool_use.sse).
                block.parts.append(str_or_none(start.get("thinking")) or "")
                block.signature.append(str_or_none(start.get("signature")) or "")
                return []
            case Kind.IGNORED:
                kind = short(start.get("type"), 60)
                return self._once(
                    AnomalyKind.UNKNOWN_EVENT, f"block:{kind}", f"unknown content block {kind!r}"
                )
            case _:
                return []

    def _block_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index = index_of(event.get("index"))
        delta = event.get("delta")
        if index is None or not isinstance(delta, dict):
            return [lost_event("content_block_delta without an integer index and a delta")]
        block = self._blocks.get(index)
        if block is None:
            return [lost_block(index, "content_block_delta")]
        if block.closed:
            return self._refused(
                index, _is_fragment(delta), AnomalyKind.FRAGMENT_AFTER_CLOSE, "delta after stop"
            )
        if block.kind is Kind.IGNORED:
            return []
        delta_type = delta.get("type")
        if not isinstance(delta_type, str) or delta_type not in _DELTA_FIELDS:
            dtype = short(delta_type, 60)
            if block.kind is Kind.CALL or _may_carry_fragment(event):
                return self._refused(
                    index, _is_fragment(delta), AnomalyKind.UNKNOWN_EVENT, f"delta {dtype!r}"
                )
            return self._once(
                AnomalyKind.UNKNOWN_EVENT, f"delta:{dtype}", f"unknown delta {dtype!r}"
            )
        kinds, name = _DELTA_FIELDS[delta_type]
        value = delta.get(name)
        if block.kind not in kinds or (name != "citation" and not isinstance(value, str)):
            return self._refused(
                index, _is_fragment(delta), AnomalyKind.INVALID_PAYLOAD, f"bad {delta_type}"
            )
        return self._apply_delta(index, block, delta_type, value)

    def _apply_delta(
        self, index: int, block: Block, delta_type: str, value: Any
    ) -> list[StreamEvent]:
        match delta_type:
            case "text_delta":
                return [TextDelta(text=value, block=index)]
            case "input_json_delta" if block.kind is Kind.CALL:
                return [ArgsDelta(key=self._open_calls[index], fragment=value)]
            case "signature_delta":
                block.signature.append(value)
            case "citations_delta":
                pass
            case _:  # thinking_delta, or a server tool's input_json_delta
                block.parts.append(value)
        return []

    def _block_stop(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        return self._stop_block(index_of(event.get("index")), "content_block_stop")

    def _stopped_block(self, index: int, block: Block) -> list[StreamEvent]:
        match block.kind:
            case Kind.THINKING:
                # Text and signature byte-for-byte: the API rejects an altered thinking block.
                data = {
                    "type": "thinking",
                    "thinking": "".join(block.parts),
                    "signature": "".join(block.signature),
                }
                return [ReasoningBlock(block=index, data=data)]
            case Kind.REDACTED:
                return [ReasoningBlock(block=index, data=block.start)]
            case Kind.SERVER_CALL:
                return _server_call_block(index, block)
            case Kind.SERVER_RESULT:
                return [ServerToolBlock(block=index, data=block.start)]
            case _:
                return []

    # -- helpers ----------------------------------------------------------------------------

    def _label(self, block: Block) -> str:
        return short(block.start.get("type"), 40)


def _server_call_block(index: int, block: Block) -> list[StreamEvent]:
    """A finished ``server_tool_use``/``mcp_tool_use`` in history shape: streamed input parsed.

    The input is recorded, never executed, so parsing it here does not cross the gate.
    """
    text = "".join(block.parts)
    events: list[StreamEvent] = []
    data: dict[str, Any] = dict(block.start)
    if text:
        try:
            data["input"] = json.loads(text)
        except (ValueError, RecursionError):
            events.append(invalid(f"content block {index}: server tool input is not JSON"))
            data["input"] = {}
    elif not isinstance(data.get("input"), dict):
        data["input"] = {}
    events.append(ServerToolBlock(block=index, data=data))
    return events


_UNREADABLE = object()
""":func:`_reason` of a ``message_delta`` whose ``delta`` or ``stop_reason`` has the wrong type."""


def _reason(event: Mapping[str, Any]) -> object:
    """A ``message_delta``'s ``stop_reason``: a str, None (not sent), or ``_UNREADABLE``."""
    delta = event.get("delta")
    if not isinstance(delta, dict):
        return _UNREADABLE
    reason = delta.get("stop_reason")
    return reason if reason is None or isinstance(reason, str) else _UNREADABLE


def _is_fragment(delta: Mapping[str, Any]) -> bool:
    """Whether a delta may carry argument text: an ``input_json_delta``, or ``partial_json``."""
    return delta.get("type") == "input_json_delta" or "partial_json" in delta


def _may_carry_fragment(event: Mapping[str, Any]) -> bool:
    delta = event.get("delta")
    return isinstance(delta, dict) and _is_fragment(delta)
