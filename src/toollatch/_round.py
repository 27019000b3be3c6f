"""The finalized result of one attempt, and the error results every failed call gets.

A :class:`Round` is immutable. It lists every call of every choice in provider order with its
final state, the assistant text, the opaque reasoning and server-tool blocks in order, the
normalized ending and the provider's raw stop reason. It builds the history messages for the
next request (in the provider's own format) through :mod:`toollatch._messages`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._errors import ErrorCode
from ._events import Anomaly, CallKey, ReasoningBlock, RoundEnd, ServerToolBlock
from ._gate import CommittedCall
from ._state import CallState


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """What became of one call (committed or not) once the round was finalized."""

    key: CallKey
    """Identity inside the round."""
    position: int
    """Order of the call inside its choice (0-based)."""
    call_id: str | None
    """Provider call id (None if the provider never sent one)."""
    name: str | None
    """Tool name (None if the provider never sent one)."""
    state: CallState
    """``COMMITTED``, ``FAILED`` or ``CANCELLED`` once finalized."""
    arguments_text: str
    """The exact argument text as streamed (may be partial or invalid for failed calls)."""
    arguments: Mapping[str, Any] | None
    """The parsed arguments of a committed call; None otherwise."""
    error: ErrorCode | None
    """Why the call did not commit; None for committed calls."""
    detail: str
    """Short explanation of ``error`` (empty for committed calls)."""
    committed: CommittedCall | None
    """The executable call, for committed calls only."""

    @property
    def history_id(self) -> str:
        """The id the call carries in history and results: the provider's, or a stable one
        made up as ``toollatch_<attempt>_<choice>_<position>`` when the provider sent none."""
        k = self.key
        return self.call_id or f"toollatch_{k.attempt}_{k.choice}_{self.position}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TextSegment:
    """A run of assistant text in one provider block."""

    block: int | str | None
    """Provider block index (None when the provider has no text blocks)."""
    text: str
    """The text."""


Segment: TypeAlias = TextSegment | ReasoningBlock | ServerToolBlock | CallRecord
"""One item of a choice's content, in the order the provider streamed it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """The result paired with one call id: a tool's output, or a structured error."""

    tool_call_id: str
    """The call id this result answers."""
    name: str
    """The tool name of the call."""
    content: str
    """What the model reads: the tool's output, or ``"<code>: <detail>"`` for errors."""
    is_error: bool = False
    """True when the tool did not run or failed."""
    code: ErrorCode | None = None
    """Stable code of an error result."""

    def as_dict(self) -> dict[str, Any]:
        """``{"tool_call_id", "name", "is_error", "content"}`` (the replay JSON shape)."""
        return {
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "is_error": self.is_error,
            "content": self.content,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """One completion of the round (most requests have exactly one)."""

    index: int
    """Choice (candidate) index."""
    ended: RoundEnd
    """How this choice's stream ended."""
    stop_reason: str | None
    """The provider's raw finish/stop reason, if it sent one."""
    calls: tuple[CallRecord, ...]
    """Client tool calls in provider order."""
    content: tuple[Segment, ...]
    """Text runs, opaque blocks and calls, in stream order (for history)."""

    @property
    def text(self) -> str:
        """All assistant text of the choice, concatenated."""
        return "".join(s.text for s in self.content if isinstance(s, TextSegment))

    @property
    def blocks(self) -> tuple[ReasoningBlock | ServerToolBlock, ...]:
        """Reasoning and server-tool blocks, in order."""
        return tuple(s for s in self.content if isinstance(s, ReasoningBlock | ServerToolBlock))


@dataclass(frozen=True, slots=True, kw_only=True)
class Round:
    """The finalized result of one attempt (see the module docstring)."""

    provider: str
    """Adapter name (``openai_chat``, ``anthropic``...)."""
    attempt: int
    """Attempt number the keys carry."""
    choices: tuple[Choice, ...]
    """Every choice; ``choices[0]`` is what ``calls``/``text``/``ended`` describe."""
    usage: Mapping[str, Any] | None
    """The provider's last usage report, unchanged."""
    anomalies: tuple[Anomaly, ...]
    """Provider misbehaviour recorded during the round, in order."""
    error: str | None
    """The stream failure's detail, when the stream failed."""

    @property
    def _first(self) -> Choice:
        return self.choices[0]

    @property
    def ended(self) -> RoundEnd:
        """How choice 0 ended."""
        return self._first.ended

    @property
    def stop_reason(self) -> str | None:
        """Choice 0's raw stop reason."""
        return self._first.stop_reason

    @property
    def calls(self) -> tuple[CallRecord, ...]:
        """Choice 0's calls in provider order."""
        return self._first.calls

    @property
    def text(self) -> str:
        """Choice 0's text."""
        return self._first.text

    @property
    def blocks(self) -> tuple[ReasoningBlock | ServerToolBlock, ...]:
        """Choice 0's opaque blocks."""
        return self._first.blocks

    def committed(self) -> tuple[CommittedCall, ...]:
        """Choice 0's executable calls, in call order."""
        return tuple(c.committed for c in self.calls if c.committed is not None)

    def error_results(self) -> list[ToolResult]:
        """One error result per call of choice 0 that did not commit, in call order."""
        return [error_result(c) for c in self.calls if c.committed is None]

    def assistant_message(self) -> dict[str, Any]:
        """Choice 0 as the assistant message for history, in the provider's own format.

        OpenAI chat: ``{"role": "assistant", "content", "tool_calls"}``; Anthropic:
        ``{"role": "assistant", "content": [blocks]}``; Gemini: ``{"role": "model", "parts"}``;
        Bedrock: ``{"role": "assistant", "content": [...]}``; OpenAI Responses has no single
        message, so it is ``{"items": [input items]}`` — extend the next request's ``input``
        with ``["items"]``.
        """
        from ._messages import assistant_message  # noqa: PLC0415 (builders import _round)

        return assistant_message(self)

    def tool_results_messages(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
        """The message(s) carrying ``results`` (one per call id) for the next request.

        Results are put in call order; raises ``UsageError`` unless every call of choice 0
        that appears in the assistant message has exactly one result.
        """
        from ._messages import tool_results_messages  # noqa: PLC0415

        return tool_results_messages(self, results)


def error_result(call: CallRecord) -> ToolResult:
    """The structured error result of a call that will not run."""
    code = call.error or ErrorCode.PROTOCOL_VIOLATION
    detail = call.detail or _DEFAULT_DETAIL.get(code, "the call did not pass the commit gate")
    return ToolResult(
        tool_call_id=call.history_id,
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
