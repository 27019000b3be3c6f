"""The content-block state machine Anthropic Messages and Bedrock ConverseStream share.

Theory of operation: both APIs stream one message as numbered *content blocks*. A block is
started (Anthropic always, Bedrock for calls and tool results; its text and reasoning blocks
start with their first delta), grows through deltas, and stops; the message then ends.
The block index is the key of everything: a client tool-use block is the call
``CallKey(attempt, 0, index)``, whose argument text is its deltas' fragments, passed on
unparsed; every other block is kept until its stop and emitted whole by the adapter. The two
APIs differ in their field names and in what their non-call blocks hold, not in the rules,
which live here once:

* a block started twice, or a delta or stop whose index is unknown, is a *lost event*
  (:func:`lost_block`): which call it belonged to is unknown, so every pending call fails;
* a delta or stop for a stopped block, a second stop, a refused delta: an anomaly that fails
  the block's call, or, on another block, a lost event when it may carry a fragment;
* nothing is ever closed for the provider: a call without its stop reaches the round's end
  open, and the assembler fails it;
* after the message ended (or the stream failed) a delta naming a call fails that call, one
  that names none but may be a fragment fails every pending call; an error is only recorded.

:class:`BlockAdapter` holds the state (the blocks, the open calls, the anomalies reported
once, whether the message ended); the adapters subclass it and supply the label a block
goes by in details (:meth:`BlockAdapter._label`) and what a stopped non-call block becomes
(:meth:`BlockAdapter._stopped_block`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from .._events import (
    Anomaly,
    AnomalyKind,
    CallClosed,
    CallKey,
    CallOpened,
    StreamEvent,
    StreamFailed,
)
from ._base import Adapter, invalid, lost_event

__all__ = ["Block", "BlockAdapter", "Kind", "index_of", "invalid", "lost_block", "str_or_none"]


class Kind(Enum):
    """What a content block is (the values name it in anomaly details)."""

    CALL = "call"
    """A client tool use: streamed to the assembler as a call."""
    TEXT = "text"
    THINKING = "thinking"
    """Anthropic ``thinking``."""
    REDACTED = "redacted_thinking"
    """Anthropic ``redacted_thinking``."""
    REASONING = "reasoning"
    """Bedrock ``reasoningContent``."""
    SERVER_CALL = "server_call"
    """A tool the provider runs itself; its input streams like a call's, kept for history."""
    SERVER_RESULT = "server_result"
    """The result of a server tool."""
    IGNORED = "ignored"
    """A block type the adapter does not know: reported once, then dropped."""


@dataclass(slots=True)
class Block:
    """One content block, from its start to its stop."""

    kind: Kind
    start: Mapping[str, Any] = field(default_factory=dict)
    """The block's start object, as received ({} for a block started by its first delta)."""
    parts: list[str] = field(default_factory=list)
    """Thinking or reasoning text, or a server tool's input JSON text, in stream order."""
    signature: list[str] = field(default_factory=list)
    """Signature fragments of a thinking or reasoning block."""
    redacted: list[Any] = field(default_factory=list)
    """Bedrock ``redactedContent`` pieces: bytes from boto3, base64 text from the wire."""
    content: list[dict[str, Any]] = field(default_factory=list)
    """Bedrock server tool result content blocks, adjacent text pieces merged."""
    closed: bool = False


def index_of(value: object) -> int | None:
    """A block index: an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def lost_block(index: int, what: str) -> Anomaly:
    """An event for a block that never started: its start was lost, and with it which call
    (if any) the event belongs to."""
    return Anomaly(
        kind=AnomalyKind.UNKNOWN_KEY,
        detail=f"{what} for block {index}, never started",
        fails_pending=True,
    )


class BlockAdapter(Adapter):
    """An adapter for a stream of numbered content blocks (see the module docstring)."""

    _END: ClassVar[str]
    """How a stream error after the end is described (``after <_END>: <detail>``)."""

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self._blocks: dict[int, Block] = {}
        self._open_calls: dict[int, CallKey] = {}
        """Key of every client tool-use block started and not stopped yet, by index."""
        self._ended = False
        """The message ended, or the stream failed: nothing more may change the round."""
        self._reported: set[str] = set()

    # -- hooks ------------------------------------------------------------------------------

    def _label(self, block: Block) -> str:
        """What ``block`` is called in anomaly details."""
        return block.kind.value

    def _stopped_block(self, index: int, block: Block) -> list[StreamEvent]:
        """The events of a non-call block that just stopped."""
        return []

    # -- the shared rules -------------------------------------------------------------------

    def _key(self, index: int) -> CallKey:
        return CallKey(self.attempt, 0, index)

    def _open_call(
        self, index: int, start: Mapping[str, Any], call_id: object, name: object, where: str
    ) -> list[StreamEvent]:
        """Start the client tool-use block ``index``: the call opens, with the arguments its
        start may carry as an object (``start["input"]``, see ``_arguments_object``)."""
        self._blocks[index] = Block(Kind.CALL, start)
        key = self._open_calls[index] = self._key(index)
        opened = CallOpened(key=key, call_id=str_or_none(call_id), name=str_or_none(name))
        return [opened, *self._arguments_object(key, start.get("input"), where)]

    def _stop_block(self, index: int | None, what: str) -> list[StreamEvent]:
        """A stop event for block ``index`` (None: unreadable); ``what`` names the event."""
        if index is None:
            return [lost_event(f"{what} without an integer index")]
        block = self._blocks.get(index)
        if block is None:
            return [lost_block(index, what)]
        if block.closed:
            return [self._block_anomaly(AnomalyKind.FRAGMENT_AFTER_CLOSE, index, "stopped twice")]
        block.closed = True
        if block.kind is Kind.CALL:
            return [CallClosed(key=self._open_calls.pop(index))]
        return self._stopped_block(index, block)

    def _block_anomaly(self, kind: AnomalyKind, index: int, what: str) -> Anomaly:
        """An anomaly about block ``index``; it fails the call when the block is a call."""
        block = self._blocks[index]
        is_call = block.kind is Kind.CALL
        return Anomaly(
            kind=kind,
            detail=f"content block {index} ({self._label(block)}): {what}",
            key=self._key(index) if is_call else None,
            fails_call=is_call,
        )

    def _refused(
        self, index: int, fragment: bool, kind: AnomalyKind, what: str
    ) -> list[StreamEvent]:
        """A delta block ``index`` cannot take: it fails that block's call; on another block
        it is a lost event when it may be a ``fragment`` (of some call), else only recorded."""
        if self._blocks[index].kind is not Kind.CALL and fragment:
            return [lost_event(f"content block {index}: {what}")]
        return [self._block_anomaly(kind, index, what)]

    def _late_delta(self, index: int | None, fragment: bool, what: str) -> list[StreamEvent]:
        """Rule "nothing after the end" for a delta (``what`` names it): it fails the call
        its block is; ``[]`` when it names a known non-call block and may not be a
        ``fragment`` (the caller then records it once)."""
        block = None if index is None else self._blocks.get(index)
        if index is not None and block is not None and block.kind is Kind.CALL:
            return [
                self._block_anomaly(
                    AnomalyKind.EVENT_AFTER_END, index, "delta after the message ended"
                )
            ]
        if block is None or fragment:
            return [lost_event(f"{what} after the message ended")]
        return []

    def _stream_error(self, detail: str) -> list[StreamEvent]:
        """An error event: fails the stream, or is only recorded once the message ended."""
        if self._ended:
            return [Anomaly(kind=AnomalyKind.STREAM_ERROR, detail=f"after {self._END}: {detail}")]
        self._ended = True
        return [StreamFailed(detail=detail)]

    def _once(self, kind: AnomalyKind, tag: str, detail: str) -> list[StreamEvent]:
        """``Anomaly(kind, detail)`` the first time ``tag`` is seen, then nothing."""
        if tag in self._reported:
            return []
        self._reported.add(tag)
        return [Anomaly(kind=kind, detail=detail)]
