"""The finalized result of one attempt: plain, immutable data.

A :class:`Round` lists every call of every choice in provider order with its final state, the
assistant text, the opaque reasoning and server-tool blocks in order, how each choice ended and
the provider's raw stop reason. It carries everything the next request needs (every call's id,
made up when the provider sent none, and the provider fields that go back with a call) and
builds nothing: the history builders are functions of a Round in :mod:`toollatch.messages`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias

from ._errors import ErrorCode
from ._events import Anomaly, CallKey, ReasoningBlock, RoundEnd, ServerToolBlock
from ._gate import CommittedCall
from ._state import CallState

NO_EXTRAS: Mapping[str, Any] = MappingProxyType({})
"""The empty, read-only ``CallRecord.extras`` of a call without provider extras."""


def made_up_call_id(key: CallKey, position: int) -> str:
    """The stable id of a call the stream gave none: ``toollatch_<attempt>_<choice>_<position>``."""
    return f"toollatch_{key.attempt}_{key.choice}_{position}"


MAX_ID_CHARS = 40
"""A derived id is at most this long (the OpenAI chat limit, the smallest known)."""


def derived_id(call_id: str, taken: Collection[str], tag: str = "dup") -> str:
    """``<call_id>_<tag><n>`` for the smallest ``n >= 2`` not in ``taken``, at most
    :data:`MAX_ID_CHARS` characters (the head of ``call_id`` is kept). ``dup``: a repeat
    inside one round (this module); ``r``: an id an earlier round already used
    (:func:`history_call_ids`)."""
    n = 2
    while True:
        suffix = f"_{tag}{n}"
        candidate = call_id[: MAX_ID_CHARS - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        n += 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """What became of one call (committed or not) once the round was finalized."""

    key: CallKey
    """Identity inside the round."""
    position: int
    """Order of the call inside its choice (0-based)."""
    call_id: str
    """The id the call's result is paired with: the provider's, or a stable one toollatch
    made up when the provider sent none (then ``id_made_up`` is true)."""
    id_made_up: bool
    """True when the provider sent no id for this call. Such an id pairs results inside
    toollatch; history for a provider that pairs by position (Gemini) leaves it out."""
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
    early: bool = False
    """True when the call was committed before the round ended (an eager tool the provider
    had moved on from); it stays COMMITTED whatever the round's end."""
    argument_bytes: int = 0
    """The UTF-8 size of the argument text as it was counted while it streamed (for an
    overflowed call: the count at which it failed, its text being gone)."""
    extras: Mapping[str, Any]
    """Provider fields that go back with this call in history, exactly as received (a Gemini
    ``thoughtSignature`` on its ``functionCall`` part, a chat tool call's ``extra_content``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TextRun:
    """A run of assistant text in one provider block."""

    block: int | str | None
    """Provider block index (None when the provider has no text blocks)."""
    text: str
    """The text."""


ContentItem: TypeAlias = TextRun | ReasoningBlock | ServerToolBlock | CallRecord
"""One item of a choice's content, in the order the provider streamed it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """The result paired with one call id: a tool's output, or a structured error."""

    tool_call_id: str
    """The ``call_id`` of the call this result answers."""
    name: str
    """The tool name of the call."""
    content: str
    """What the model reads: the tool's output, or ``"<code>: <detail>"`` for errors."""
    is_error: bool = False
    """True when the tool did not run or failed."""
    code: ErrorCode | None = None
    """Stable code of an error result."""
    truncated_from: int | None = None
    """The UTF-8 size of ``content`` before it was cut to a size budget (it then ends with a
    marker stating both sizes); None when it was not cut."""

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
    content: tuple[ContentItem, ...]
    """Text runs, opaque blocks and calls, in stream order (for history)."""

    @property
    def text(self) -> str:
        """All assistant text of the choice, concatenated."""
        return "".join(s.text for s in self.content if isinstance(s, TextRun))

    @property
    def blocks(self) -> tuple[ReasoningBlock | ServerToolBlock, ...]:
        """Reasoning and server-tool blocks, in order."""
        return tuple(s for s in self.content if isinstance(s, ReasoningBlock | ServerToolBlock))


@dataclass(frozen=True, slots=True, kw_only=True)
class Round:
    """The finalized result of one attempt (see the module docstring).

    ``ended``, ``stop_reason``, ``calls``, ``text`` and ``blocks`` describe ``choices[0]``.
    """

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
    def ended(self) -> RoundEnd:
        """How choice 0 ended."""
        return self.choices[0].ended

    @property
    def stop_reason(self) -> str | None:
        """Choice 0's raw stop reason."""
        return self.choices[0].stop_reason

    @property
    def calls(self) -> tuple[CallRecord, ...]:
        """Choice 0's calls in provider order."""
        return self.choices[0].calls

    @property
    def text(self) -> str:
        """Choice 0's text."""
        return self.choices[0].text

    @property
    def blocks(self) -> tuple[ReasoningBlock | ServerToolBlock, ...]:
        """Choice 0's opaque blocks."""
        return self.choices[0].blocks

    def committed(self) -> tuple[CommittedCall, ...]:
        """Choice 0's executable calls, in call order."""
        return tuple(c.committed for c in self.calls if c.committed is not None)


def reasoning_text(data: Mapping[str, Any]) -> str:
    """The readable text of a reasoning block in its provider's format ("" when it has none,
    e.g. Anthropic's ``redacted_thinking``)."""
    for key in ("thinking", "reasoning_content"):
        if isinstance(data.get(key), str):
            return str(data[key])
    if data.get("thought") is True and isinstance(data.get("text"), str):
        return str(data["text"])
    summary = data.get("summary")
    if isinstance(summary, list):
        return "\n\n".join(
            s["text"] for s in summary if isinstance(s, Mapping) and isinstance(s.get("text"), str)
        )
    return ""
