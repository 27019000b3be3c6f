"""Amazon Bedrock ConverseStream events -> stream events.

Theory of operation: ConverseStream is a union stream
(https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStreamOutput.html;
the member shapes below are those of botocore's ``bedrock-runtime`` 2023-09-30 service model).
boto3 yields each event as a one-key dict naming it: ``messageStart``, ``contentBlockStart``,
``contentBlockDelta``, ``contentBlockStop``, ``messageStop``, ``metadata``, or an exception
(``throttlingException``...). The raw ``application/vnd.amazon.eventstream`` framing carries
the name in the ``:event-type`` (or ``:exception-type``) header and the payload *without* the
wrapper key; :meth:`BedrockAdapter.feed_frame` accepts both.

``contentBlockIndex`` is the key of everything. A ``contentBlockStart.start.toolUse`` opens the
call ``CallKey(attempt, 0, index)``; its ``delta.toolUse.input`` strings are the argument text,
passed on unparsed; ``contentBlockStop`` closes it. A toolUse with ``type: server_tool_use`` and
a ``toolResult`` block are run by Bedrock itself: they are kept here and emitted whole at their
stop as :class:`ServerToolBlock`; reasoning content becomes a :class:`ReasoningBlock`. Both are
in Bedrock's own history shape (one ``ContentBlock`` union member each). ``messageStop`` ends
the round; the ``metadata`` event (usage) legitimately comes after it.

Rules that keep a wrong text from committing (issue 11):

* *Lost event.* An event whose block cannot be told (a ``contentBlockIndex`` that is not an
  integer, a toolUse delta or a stop for a block never started, a block started twice, a
  payload that is not an object, several delta members), or a ``toolUse`` delta on a block
  that cannot take one, may have been part of any call: it fails every pending call
  (:func:`lost_event`). A refused delta on a call's own block fails that call (an unknown
  delta member included).
* *No stop, no commit.* Open blocks are never closed for the provider: a call without its
  ``contentBlockStop`` reaches the round's end open, and the assembler fails it.
* *Sticky reason.* A second ``messageStop`` still reaches the assembler, which keeps a
  truncating or failing reason over a normal one, in either order.
* *Nothing after the end.* A delta after ``messageStop`` fails the call it names (every
  pending call when it names none).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from .._events import (
    AnomalyKind,
    ArgsDelta,
    CallKey,
    Frame,
    ReasoningBlock,
    RoundEnd,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)
from ._base import lost_event, round_end, short
from ._blocks import Block, BlockAdapter, Kind, index_of, invalid, lost_block, str_or_none

# How each MessageStopEvent.stopReason ends the round (botocore's StopReason enum).
_ENDINGS: dict[str, RoundEnd] = {
    "tool_use": RoundEnd.NORMAL,
    "end_turn": RoundEnd.NORMAL,
    "stop_sequence": RoundEnd.NORMAL,
    # Cut by a token limit: never repair the partial call into a runnable one
    # (LibreChat-AI/agents#280, a truncated Bedrock create_file retried forever).
    "max_tokens": RoundEnd.TRUNCATED,
    "model_context_window_exceeded": RoundEnd.TRUNCATED,
    # Filtered, or Bedrock itself says the output (or a tool use in it) is malformed.
    "guardrail_intervened": RoundEnd.INTERRUPTED,
    "content_filtered": RoundEnd.INTERRUPTED,
    "malformed_model_output": RoundEnd.INTERRUPTED,
    "malformed_tool_use": RoundEnd.INTERRUPTED,
}

_EVENTS = frozenset(
    {
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    }
)


def _is_exception(name: str) -> bool:
    # internalServerException, modelStreamErrorException, validationException,
    # throttlingException, serviceUnavailableException: Smithy names every error member of an
    # event stream "...Exception", so one added later fails the stream too.
    return name.endswith("Exception")


# -- content blocks ----------------------------------------------------------------------------


_DELTA_KINDS: dict[str, Kind] = {
    "text": Kind.TEXT,
    "toolUse": Kind.CALL,
    "reasoningContent": Kind.REASONING,
    "toolResult": Kind.SERVER_RESULT,
    # Citations annotate the text block they arrive on; not needed to replay text or calls.
    "citation": Kind.TEXT,
}
"""Delta union member -> the kind of block it extends (or starts, when none started)."""


class BedrockAdapter(BlockAdapter):
    """Translates ConverseStream events (boto3 dicts or event-stream frames) into stream events.

    One instance per attempt; see the module docstring for the rules.
    """

    provider: ClassVar[str] = "bedrock"
    _END = "messageStop"

    # -- entry points -----------------------------------------------------------------------

    def feed_frame(self, frame: Frame) -> list[StreamEvent]:
        """One event-stream frame: ``event`` = ``:event-type``/``:exception-type``, ``data`` =
        the JSON payload without the wrapper key (the base class wraps nothing)."""
        if _is_exception(frame.event) and not frame.data.strip():
            frame = frame._replace(data="{}")  # an exception without a body still fails
        return super().feed_frame(frame)

    def _continuation(
        self, event: dict[str, Any], sse_event: str | None
    ) -> tuple[CallKey, str] | None:
        # A contentBlockDelta whose only delta member is toolUse.input text for an open client
        # toolUse block, wrapped (boto3, JSON Lines) or not (event stream: the header names
        # it): exactly the checks of _feed, _block_delta and _apply_delta for it, with
        # exact-type tests that only send stranger values down the general path.
        # (Subscripts: a missing member raises, caught below; cheaper than .get() per event.)
        try:
            if len(event) == 1:
                payload = event["contentBlockDelta"]
            elif sse_event == "contentBlockDelta":
                payload = event  # a payload that names no event is the one its header names
            else:
                return None
            if type(payload) is not dict or self._ended:
                return None
            index, delta = payload["contentBlockIndex"], payload["delta"]
            if type(index) is not int or type(delta) is not dict or len(delta) != 1:
                return None
            tool_use = delta["toolUse"]
            if type(tool_use) is not dict:
                return None
            fragment = tool_use["input"]
            if type(fragment) is not str:
                return None
            return self._open_calls[index], fragment
        except KeyError:
            return None

    def _feed(self, event: Mapping[str, Any], sse_event: str | None = None) -> list[StreamEvent]:
        if sse_event not in (None, "message") and not _is_wrapped(event):
            # A raw event-stream payload: the header names it. ("message" is the name SSE and
            # JSON Lines frames get by default: their event is wrapped, maybe in a new name.)
            event = {sse_event: event}
        if len(event) != 1:
            return [lost_event(f"expected a one-key ConverseStream event, got {len(event)} keys")]
        ((name, payload),) = event.items()
        if not isinstance(name, str):  # (only from a dict fed directly: JSON keys are text)
            return [lost_event(f"an event named by a {type(name).__name__}")]
        if _is_exception(name):
            message = payload.get("message") if isinstance(payload, Mapping) else payload
            return self._stream_error(short(f"{name}: {message}" if message else name))
        if name not in _EVENTS:
            if _may_carry_fragment(payload):
                return [lost_event(f"event {short(name, 60)!r} of unknown type with a toolUse")]
            return self._once(
                AnomalyKind.UNKNOWN_EVENT, f"event:{name}", f"unknown event {short(name, 60)!r}"
            )
        if not isinstance(payload, Mapping):
            if name in ("messageStart", "metadata"):  # (neither carries a fragment or a reason)
                return [invalid(f"{name} payload is not an object")]
            return [lost_event(f"{name} payload is not an object")]
        if name == "metadata":  # comes after messageStop by design; metrics/trace not kept
            usage = payload.get("usage")
            return [UsageReported(usage=usage)] if isinstance(usage, Mapping) else []
        if self._ended:
            return self._after_end(name, payload)
        match name:
            case "messageStart":
                return []  # carries only the role
            case "contentBlockStart":
                return self._block_start(payload)
            case "contentBlockDelta":
                return self._block_delta(payload)
            case "contentBlockStop":
                return self._block_stop(payload)
            case _:
                return self._message_stop(payload)

    def _finish(self) -> list[StreamEvent]:
        if self._ended:
            return []
        return [StreamFailed(detail="stream ended without messageStop")]

    # -- message level ----------------------------------------------------------------------

    def _message_stop(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        # additionalModelResponseFields (model-specific extras) are not needed for calls.
        self._ended = True
        return round_end(str_or_none(payload.get("stopReason")), _ENDINGS, "stopReason")

    def _after_end(self, name: str, payload: Mapping[str, Any]) -> list[StreamEvent]:
        """Rule "nothing after the end": an event after ``messageStop`` (or an exception).

        A delta naming a call's block fails that call; a toolUse delta naming no call, or an
        unreadable delta, fails every pending call; a second ``messageStop`` goes to the
        assembler, which keeps a truncating or failing reason over a normal one.
        """
        if name == "messageStop":
            return self._message_stop(payload)
        if name == "contentBlockDelta":
            index = index_of(payload.get("contentBlockIndex"))
            fragment = _may_carry_fragment(payload)
            if late := self._late_delta(index, fragment, "contentBlockDelta"):
                return late
        return self._once(
            AnomalyKind.EVENT_AFTER_END, f"after:{name}", f"{name} after the message ended"
        )

    # -- content blocks ---------------------------------------------------------------------

    def _block_start(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        index = index_of(payload.get("contentBlockIndex"))
        start = payload.get("start")
        if index is None or not isinstance(start, Mapping):
            return [lost_event("contentBlockStart without an integer index and a start")]
        if index in self._blocks:  # which block do the next deltas extend? unknown
            return [lost_event(f"content block {index} started twice")]
        tool_use, tool_result = start.get("toolUse"), start.get("toolResult")
        if isinstance(tool_use, Mapping):
            if tool_use.get("type") == "server_tool_use":
                self._blocks[index] = Block(Kind.SERVER_CALL, tool_use)
                return []
            # Rule "input in the start": ToolUseBlockStart has no input (the arguments are the
            # deltas' text). One sent anyway, as a non-empty object (the non-streamed
            # ToolUseBlock shape), is the arguments sent as an object: serialized once, with
            # an anomaly, and checked for repeated keys; deltas after it make the text
            # unparseable, so a call carrying both fails. Anything else there fails the call.
            id_, name = tool_use.get("toolUseId"), tool_use.get("name")
            return self._open_call(index, tool_use, id_, name, "toolUse start")
        if isinstance(tool_result, Mapping):
            self._blocks[index] = Block(Kind.SERVER_RESULT, tool_result)
            return []
        self._blocks[index] = Block(Kind.IGNORED)
        member = short(",".join(map(str, start)), 60)
        return self._once(AnomalyKind.UNKNOWN_EVENT, f"start:{member}", f"block start {member!r}")

    def _block_delta(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        index = index_of(payload.get("contentBlockIndex"))
        delta = payload.get("delta")
        members = [m for m in delta if m in _DELTA_KINDS] if isinstance(delta, Mapping) else []
        if index is None or not isinstance(delta, Mapping) or len(members) > 1:
            return [lost_event("contentBlockDelta without an integer index and one delta member")]
        block = self._blocks.get(index)
        if not members:
            names = short(",".join(map(str, delta)), 60)
            if block is not None and block.kind is Kind.CALL:
                return [self._block_anomaly(AnomalyKind.UNKNOWN_EVENT, index, f"delta {names!r}")]
            return self._once(AnomalyKind.UNKNOWN_EVENT, f"delta:{names}", f"delta {names!r}")
        member = members[0]
        kind = _DELTA_KINDS[member]
        if block is None:
            if kind is Kind.CALL:
                return [lost_block(index, "toolUse delta")]
            block = self._blocks[index] = Block(kind)  # implicit start (text, reasoning)
        if block.closed:
            return self._refused(
                index, member == "toolUse", AnomalyKind.FRAGMENT_AFTER_CLOSE, "delta after stop"
            )
        if block.kind is Kind.IGNORED:
            return []
        if kind is not block.kind and {kind, block.kind} != {Kind.CALL, Kind.SERVER_CALL}:
            return self._refused(
                index, member == "toolUse", AnomalyKind.INVALID_PAYLOAD, f"{member} delta"
            )
        return self._apply_delta(index, block, member, delta[member])

    def _apply_delta(self, index: int, block: Block, member: str, value: Any) -> list[StreamEvent]:
        match member, value:
            case "text", str():
                return [TextDelta(text=value, block=index)]
            case "toolUse", {"input": str(fragment)} if block.kind is Kind.CALL:
                return [ArgsDelta(key=self._open_calls[index], fragment=fragment)]
            case "toolUse", {"input": str(fragment)}:
                block.parts.append(fragment)  # a server tool's input, kept for history
            case "reasoningContent", Mapping() if _add_reasoning(block, value):
                pass
            case "toolResult", list() if _add_result(block, value):
                pass
            case "citation", _:
                pass
            case _:
                what = f"malformed {member} delta"
                return self._refused(index, member == "toolUse", AnomalyKind.INVALID_PAYLOAD, what)
        return []

    def _block_stop(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        return self._stop_block(index_of(payload.get("contentBlockIndex")), "contentBlockStop")

    def _stopped_block(self, index: int, block: Block) -> list[StreamEvent]:
        match block.kind:
            case Kind.REASONING:
                return [ReasoningBlock(block=index, data=_reasoning_data(block))]
            case Kind.SERVER_CALL:
                return _server_call_block(index, block)
            case Kind.SERVER_RESULT:
                result = {**block.start, "content": block.content}
                return [ServerToolBlock(block=index, data={"toolResult": result})]
            case _:
                return []


def _is_wrapped(event: Mapping[str, Any]) -> bool:
    """True for the boto3 shape ``{"<event name>": payload}``."""
    if len(event) != 1:
        return False
    name = next(iter(event))
    return name in _EVENTS or _is_exception(name)


def _add_reasoning(block: Block, value: Mapping[str, Any]) -> bool:
    """Append a ReasoningContentBlockDelta (one of text / signature / redactedContent)."""
    text, signature = value.get("text"), value.get("signature")
    if isinstance(text, str):
        block.parts.append(text)
    elif isinstance(signature, str):
        block.signature.append(signature)
    elif isinstance(value.get("redactedContent"), str | bytes):
        block.redacted.append(value["redactedContent"])
    else:
        return False
    return True


def _add_result(block: Block, items: list[Any]) -> bool:
    """Append ToolResultBlockDelta items (``{"text"}`` pieces of one text, or ``{"json"}``)."""
    for item in items:
        if not isinstance(item, Mapping):
            return False
        text = item.get("text")
        if (
            isinstance(text, str)
            and block.content
            and isinstance(block.content[-1].get("text"), str)
        ):
            block.content[-1] = {"text": block.content[-1]["text"] + text}
        else:
            block.content.append(dict(item))
    return True


def _reasoning_data(block: Block) -> dict[str, Any]:
    """The block as a ``ContentBlock.reasoningContent`` for history, byte-for-byte."""
    if block.redacted:
        return {"reasoningContent": {"redactedContent": _join_redacted(block.redacted)}}
    text: dict[str, str] = {"text": "".join(block.parts)}
    if block.signature:
        text["signature"] = "".join(block.signature)
    return {"reasoningContent": {"reasoningText": text}}


def _join_redacted(pieces: list[Any]) -> Any:
    """One piece (the norm) as is; several: bytes joined, base64 texts joined as bytes."""
    if len(pieces) == 1 or not all(isinstance(p, type(pieces[0])) for p in pieces):
        return pieces[0] if len(pieces) == 1 else pieces
    if isinstance(pieces[0], bytes):
        return b"".join(pieces)
    try:
        raw = b"".join(base64.b64decode(p, validate=True) for p in pieces)
    except ValueError:
        return "".join(pieces)
    return base64.b64encode(raw).decode("ascii")


def _server_call_block(index: int, block: Block) -> list[StreamEvent]:
    """A finished server toolUse in history shape, its streamed input parsed.

    The input is recorded, never executed, so parsing it here does not cross the gate.
    """
    text = "".join(block.parts)
    events: list[StreamEvent] = []
    tool_use: dict[str, Any] = dict(block.start)
    try:
        tool_use["input"] = json.loads(text) if text else {}
    except (ValueError, RecursionError):
        events.append(invalid(f"content block {index}: server tool input is not JSON"))
        tool_use["input"] = {}
    events.append(ServerToolBlock(block=index, data={"toolUse": tool_use}))
    return events


def _may_carry_fragment(payload: object) -> bool:
    """Whether a payload holds a ``delta`` with a ``toolUse`` member (argument text)."""
    if not isinstance(payload, Mapping):
        return False
    delta = payload.get("delta")
    return isinstance(delta, Mapping) and "toolUse" in delta
