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
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from .._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallClosed,
    CallKey,
    CallOpened,
    ReasoningBlock,
    RoundEnd,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)
from ._base import Adapter, error_detail, lost_event, round_end, short
from ._spelling import raw_continuation

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

_DELTA_PREFIX = (
    b'{"type":"content_block_delta","index":%d,"delta":{"type":"input_json_delta","partial_json":'
)
"""How the API spells a call's fragment event up to the fragment; ``}}`` follows it, often
padded with spaces between the braces (anthropic/max_tokens_truncated_tool_use.sse). See
``RawContinuation``."""

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


class _Kind(Enum):
    CALL = "call"
    """Client ``tool_use``: streamed to the assembler as a call."""
    TEXT = "text"
    THINKING = "thinking"
    REDACTED = "redacted_thinking"
    SERVER_CALL = "server_call"
    """``server_tool_use`` / ``mcp_tool_use``: run by Anthropic, input streamed like a call
    (fixtures ``server_web_search_with_citations.sse``, ``thinking_then_mcp_tool_use.sse``)."""
    SERVER_RESULT = "server_result"
    """``*_tool_result``: arrives whole in ``content_block_start``
    (fixture ``server_tool_search_then_tool_use.sse``)."""
    IGNORED = "ignored"
    """A block type this adapter does not know: reported once, then dropped."""


_DELTA_FIELDS: dict[str, tuple[frozenset[_Kind], str]] = {
    "text_delta": (frozenset({_Kind.TEXT}), "text"),
    "input_json_delta": (frozenset({_Kind.CALL, _Kind.SERVER_CALL}), "partial_json"),
    "thinking_delta": (frozenset({_Kind.THINKING}), "thinking"),
    "signature_delta": (frozenset({_Kind.THINKING}), "signature"),
    # Citations annotate a text block (fixture server_web_search_with_citations.sse). They are
    # not needed to replay the text or to pair results, so they are accepted and not kept.
    "citations_delta": (frozenset({_Kind.TEXT}), "citation"),
}
"""Delta type -> (block kinds it may extend, field carrying its payload)."""


_BLOCK_KINDS: dict[str, _Kind] = {
    "tool_use": _Kind.CALL,
    "text": _Kind.TEXT,
    "thinking": _Kind.THINKING,
    "redacted_thinking": _Kind.REDACTED,
    "server_tool_use": _Kind.SERVER_CALL,
    "mcp_tool_use": _Kind.SERVER_CALL,
}


def _block_kind(block_type: object) -> _Kind:
    if not isinstance(block_type, str):
        return _Kind.IGNORED
    # web_search_tool_result, web_fetch_tool_result, code_execution_tool_result,
    # tool_search_tool_result, mcp_tool_result...: every server result is named like this.
    if block_type.endswith("_tool_result"):
        return _Kind.SERVER_RESULT
    return _BLOCK_KINDS.get(block_type, _Kind.IGNORED)


@dataclass(slots=True)
class _Block:
    kind: _Kind
    start: Mapping[str, Any]
    """The ``content_block`` object of ``content_block_start``, as received."""
    parts: list[str] = field(default_factory=list)
    """Thinking text, or a server tool's input JSON text, in stream order."""
    signature: list[str] = field(default_factory=list)
    """Thinking ``signature_delta`` fragments."""
    closed: bool = False


def _index(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


class AnthropicAdapter(Adapter):
    """Translates Anthropic Messages stream events (dicts or SDK objects) into stream events.

    One instance per attempt. ``message_id`` and ``model`` are filled from ``message_start``
    for the rim (logging, history). See the module docstring for the rules.
    """

    provider: ClassVar[str] = "anthropic"

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self.message_id: str | None = None
        """``message.id`` from ``message_start``, once seen."""
        self.model: str | None = None
        """``message.model`` from ``message_start``, once seen."""
        self._blocks: dict[int, _Block] = {}
        self._open_calls: dict[int, CallKey] = {}
        """Key of every client ``tool_use`` block started and not stopped yet, by index."""
        self._stop_reason: str | None = None
        self._ended = False
        """``message_stop`` arrived, or the stream failed: nothing more may change the round."""
        self._reported: set[str] = set()

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
            return [_invalid("message_start without a message object")]
        self.message_id = _str_or_none(message.get("id"))
        self.model = _str_or_none(message.get("model"))
        usage = message.get("usage")
        return [UsageReported(usage=usage)] if isinstance(usage, dict) else []

    def _message_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        reason = _reason(event)
        if reason is _UNREADABLE:  # it may have said max_tokens: nothing may commit on it
            return [lost_event("message_delta without a readable delta.stop_reason")]
        events: list[StreamEvent] = []
        if isinstance(reason, str):
            events += self._set_reason(reason)
        usage = event.get("usage")  # cumulative for the message, per the streaming docs
        if isinstance(usage, dict):
            events.append(UsageReported(usage=usage))
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
        self._end()
        return round_end(self._stop_reason, _ENDINGS, "stop_reason")

    def _after_end(self, kind: str, event: Mapping[str, Any]) -> list[StreamEvent]:
        """Rule "nothing after the end": an event after ``message_stop`` (or a stream error).

        A delta naming a call's block fails that call; one that may be a fragment but names
        no call fails every pending call; a readable ``stop_reason`` goes to the assembler,
        which keeps a truncating or failing one over a normal one (in either order).
        """
        if kind == "content_block_delta":
            index = _index(event.get("index"))
            block = None if index is None else self._blocks.get(index)
            if index is not None and block is not None and block.kind is _Kind.CALL:
                return [
                    self._block_anomaly(
                        AnomalyKind.EVENT_AFTER_END, index, "delta after the message ended"
                    )
                ]
            if block is None or _may_carry_fragment(event):
                return [lost_event("content_block_delta after the message ended")]
        if kind == "message_delta":
            reason = _reason(event)
            if isinstance(reason, str):
                return round_end(reason, _ENDINGS, "stop_reason")
        return self._once(
            AnomalyKind.EVENT_AFTER_END, f"after:{kind}", f"{kind} after the message ended"
        )

    def _stream_error(self, detail: str) -> list[StreamEvent]:
        """An ``error`` event: fails the stream, or is only recorded once the message ended."""
        if self._ended:
            return [Anomaly(kind=AnomalyKind.STREAM_ERROR, detail=f"after message end: {detail}")]
        self._end()
        return [StreamFailed(detail=detail)]

    def _end(self) -> None:
        """Nothing more may change the round: no fragment takes the raw shortcut either."""
        self._ended = True
        self._raw = None

    # -- content blocks ---------------------------------------------------------------------

    def _block_start(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index = _index(event.get("index"))
        start = event.get("content_block")
        if index is None or not isinstance(start, dict):
            return [lost_event("content_block_start without an integer index and a content_block")]
        if index in self._blocks:  # which block do the next deltas extend? unknown
            return [lost_event(f"content block {index} started twice")]
        block = _Block(_block_kind(start.get("type")), start)
        self._blocks[index] = block
        match block.kind:
            case _Kind.CALL:
                key = self._open_calls[index] = self._key(index)
                self._raw = raw_continuation(_DELTA_PREFIX % index, b"}}", key)
                opened = CallOpened(
                    key=key,
                    call_id=_str_or_none(start.get("id")),
                    name=_str_or_none(start.get("name")),
                )
                return [opened, *self._start_input(key, start.get("input"))]
            case _Kind.TEXT:
                text = start.get("text")
                return [TextDelta(text=text, block=index)] if isinstance(text, str) and text else []
            case _Kind.THINKING:
                # Usually "thinking": "" and "signature": "" (thinking_then_mcp_tool_use.sse).
                block.parts.append(_str_or_none(start.get("thinking")) or "")
                block.signature.append(_str_or_none(start.get("signature")) or "")
                return []
            case _Kind.IGNORED:
                kind = short(start.get("type"), 60)
                return self._once(
                    AnomalyKind.UNKNOWN_EVENT, f"block:{kind}", f"unknown content block {kind!r}"
                )
            case _:
                return []

    def _block_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index = _index(event.get("index"))
        delta = event.get("delta")
        if index is None or not isinstance(delta, dict):
            return [lost_event("content_block_delta without an integer index and a delta")]
        block = self._blocks.get(index)
        if block is None:
            return [_lost_block(index, "content_block_delta")]
        if block.closed:
            return self._refused(index, delta, AnomalyKind.FRAGMENT_AFTER_CLOSE, "delta after stop")
        if block.kind is _Kind.IGNORED:
            return []
        delta_type = delta.get("type")
        if not isinstance(delta_type, str) or delta_type not in _DELTA_FIELDS:
            dtype = short(delta_type, 60)
            if block.kind is _Kind.CALL or _may_carry_fragment(event):
                return self._refused(index, delta, AnomalyKind.UNKNOWN_EVENT, f"delta {dtype!r}")
            return self._once(
                AnomalyKind.UNKNOWN_EVENT, f"delta:{dtype}", f"unknown delta {dtype!r}"
            )
        kinds, name = _DELTA_FIELDS[delta_type]
        value = delta.get(name)
        if block.kind not in kinds or (name != "citation" and not isinstance(value, str)):
            return self._refused(index, delta, AnomalyKind.INVALID_PAYLOAD, f"bad {delta_type}")
        return self._apply_delta(index, block, delta_type, value)

    def _apply_delta(
        self, index: int, block: _Block, delta_type: str, value: Any
    ) -> list[StreamEvent]:
        match delta_type:
            case "text_delta":
                return [TextDelta(text=value, block=index)]
            case "input_json_delta" if block.kind is _Kind.CALL:
                return [ArgsDelta(key=self._open_calls[index], fragment=value)]
            case "signature_delta":
                block.signature.append(value)
            case "citations_delta":
                pass
            case _:  # thinking_delta, or a server tool's input_json_delta
                block.parts.append(value)
        return []

    def _block_stop(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index = _index(event.get("index"))
        if index is None:
            return [lost_event("content_block_stop without an integer index")]
        block = self._blocks.get(index)
        if block is None:
            return [_lost_block(index, "content_block_stop")]
        if block.closed:
            return [self._block_anomaly(AnomalyKind.FRAGMENT_AFTER_CLOSE, index, "stopped twice")]
        block.closed = True
        match block.kind:
            case _Kind.CALL:
                self._raw = None  # (blocks come one after another: the open one just stopped)
                return [CallClosed(key=self._open_calls.pop(index))]
            case _Kind.THINKING:
                # Text and signature byte-for-byte: the API rejects an altered thinking block.
                data = {
                    "type": "thinking",
                    "thinking": "".join(block.parts),
                    "signature": "".join(block.signature),
                }
                return [ReasoningBlock(block=index, data=data)]
            case _Kind.REDACTED:
                return [ReasoningBlock(block=index, data=block.start)]
            case _Kind.SERVER_CALL:
                return _server_call_block(index, block)
            case _Kind.SERVER_RESULT:
                return [ServerToolBlock(block=index, data=block.start)]
            case _:
                return []

    # -- helpers ----------------------------------------------------------------------------

    def _key(self, index: int) -> CallKey:
        return CallKey(self.attempt, 0, index)

    def _block_anomaly(self, kind: AnomalyKind, index: int, what: str) -> Anomaly:
        """An anomaly about block ``index``; it fails the call when the block is a call."""
        block = self._blocks[index]
        is_call = block.kind is _Kind.CALL
        return Anomaly(
            kind=kind,
            detail=f"content block {index} ({short(block.start.get('type'), 40)}): {what}",
            key=self._key(index) if is_call else None,
            fails_call=is_call,
        )

    def _refused(
        self, index: int, delta: Mapping[str, Any], kind: AnomalyKind, what: str
    ) -> list[StreamEvent]:
        """A delta block ``index`` cannot take: it fails that block's call; on another block
        it is a lost event when it may be a fragment (of some call), else only recorded."""
        if self._blocks[index].kind is not _Kind.CALL and _is_fragment(delta):
            return [lost_event(f"content block {index}: {what}")]
        return [self._block_anomaly(kind, index, what)]

    def _start_input(self, key: CallKey, given: object) -> list[StreamEvent]:
        """Rule "input in the start": streamed, a ``tool_use`` start's ``input`` is ``{}``
        and the arguments are the deltas. A non-empty object (the Messages API's non-streamed
        shape) is the arguments sent as an object: serialized once, with an anomaly, and
        checked for repeated keys. Deltas after it are appended, so a call that carries
        both does not parse and fails (the SDK would keep only the deltas: ambiguous)."""
        return self._arguments_object(key, given, "tool_use start")

    def _once(self, kind: AnomalyKind, tag: str, detail: str) -> list[StreamEvent]:
        """``Anomaly(kind, detail)`` the first time ``tag`` is seen, then nothing."""
        if tag in self._reported:
            return []
        self._reported.add(tag)
        return [Anomaly(kind=kind, detail=detail)]


def _server_call_block(index: int, block: _Block) -> list[StreamEvent]:
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
            events.append(_invalid(f"content block {index}: server tool input is not JSON"))
            data["input"] = {}
    elif not isinstance(data.get("input"), dict):
        data["input"] = {}
    events.append(ServerToolBlock(block=index, data=data))
    return events


def _invalid(detail: str) -> Anomaly:
    return Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail)


def _lost_block(index: int, event_type: str) -> Anomaly:
    """An event for a block that never started: its start was lost, and with it which call
    (if any) the event belongs to."""
    return Anomaly(
        kind=AnomalyKind.UNKNOWN_KEY,
        detail=f"{event_type} for block {index}, never started",
        fails_pending=True,
    )


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
