"""The normalized stream vocabulary every adapter speaks, and the frames decoders produce.

Adapters translate a provider's native events into these *stream events*; the assembler
consumes nothing else. All events are immutable data. Naming: ``...Delta`` for fragments,
past participles for boundaries the protocol announced (``CallOpened``, ``CallClosed``,
``RoundEnded``), ``...Block`` for opaque units kept for history and never executed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from ._errors import ErrorCode


class CallKey(NamedTuple):
    """Identity of one call inside one round: never a tool name, never a delta's array position.

    ``part`` is the provider's own stable key: OpenAI chat tool-call ``index`` (or the call id
    when a server omits it), Anthropic content-block ``index``, Responses ``item_id``, Gemini part
    position, Bedrock ``contentBlockIndex``.
    """

    attempt: int
    """Which model request this call belongs to; a retry is a new attempt with new buffers."""
    choice: int
    """Choice (candidate) index; 0 unless the request asked for several completions."""
    part: int | str
    """The provider's key for the call inside that choice."""


class Frame(NamedTuple):
    """One decoded transport frame: an SSE event, or one AWS event-stream message."""

    event: str
    """SSE ``event:`` field (``"message"`` when absent) or the event-stream ``:event-type``."""
    data: str
    """The payload text: SSE ``data:`` lines joined with ``\\n``."""
    id: str | None = None
    """SSE ``id:`` field, if any."""
    retry: int | None = None
    """SSE ``retry:`` field in milliseconds, if any."""


class RoundEnd(StrEnum):
    """How a round (one attempt's stream) ended; decides whether any call may commit."""

    NORMAL = "normal"
    """The provider announced a normal end; complete calls may commit."""
    TRUNCATED = "truncated"
    """The output was cut by a token limit; every call fails ``truncated``."""
    INTERRUPTED = "interrupted"
    """The stream failed, was filtered, or stopped without a terminal signal."""
    CANCELLED = "cancelled"
    """The caller cancelled the round; every unfinished call is ``cancelled``."""
    LIMITED = "limited"
    """toollatch ended the round at a size limit: a call failed ``arguments_exceed_max_bytes``
    or the text passed ``max_text_bytes``, and no call could still commit, so the rest of the
    stream was not read (``RoundOver``). Every call already had its outcome."""


class AnomalyKind(StrEnum):
    """Stable names of the provider misbehaviours toollatch records (never raises for)."""

    INVALID_PAYLOAD = "invalid_payload"
    """A frame's data is not the JSON object the protocol promises."""
    UNKNOWN_EVENT = "unknown_event"
    """An event type this adapter does not know; ignored."""
    UNKNOWN_KEY = "unknown_key"
    """A fragment or close for a call that was never opened."""
    FRAGMENT_AFTER_CLOSE = "fragment_after_close"
    """Argument text for a call that was already closed or failed."""
    ID_CHANGED = "id_changed"
    """A different call id arrived for an open call."""
    NAME_CHANGED = "name_changed"
    """A different tool name arrived for an open call."""
    DUPLICATE_CALL_ID = "duplicate_call_id"
    """The same call id was used by two different calls of one round."""
    CALL_ID_RENAMED = "call_id_renamed"
    """A call repeated an earlier call's id in its round: the history sent back gives it a
    derived id (``<id>_dup<n>``, named in the detail) in the call and in its result."""
    CALL_ID_REUSED = "call_id_reused"
    """A call used an id that an earlier round of the conversation had already used (servers
    that number ids per response send ``call_0`` in every one): it is a new call, under the
    derived id ``<id>_r<n>`` named in the detail, everywhere (dispatch, ledger, events,
    history)."""
    DUPLICATE_CALL_DROPPED = "duplicate_call_dropped"
    """A call repeated an earlier call's id in its round: the history sent back (OpenAI
    Responses) leaves it and its result out."""
    ARGUMENTS_MISMATCH = "arguments_mismatch"
    """The provider's final argument text differs from the fragments it streamed."""
    OBJECT_ARGUMENTS = "object_arguments"
    """Arguments arrived as a JSON object instead of a string; serialized once, canonically."""
    DONE_WITHOUT_FINISH_REASON = "done_without_finish_reason"
    """OpenAI-style ``[DONE]`` arrived although no choice reported a finish reason."""
    EVENT_AFTER_END = "event_after_end"
    """Content arrived after the round's terminal signal; ignored."""
    TOO_MANY_CALLS = "too_many_calls"
    """More calls than ``Limits.max_calls_per_round``; the extra ones failed."""
    ARGUMENTS_TOO_LARGE = "arguments_too_large"
    """A call's argument text went over ``Limits.max_argument_bytes``."""
    TEXT_TOO_LARGE = "text_too_large"
    """Assistant text went over ``Limits.max_text_bytes``; the rest was dropped."""
    STREAM_ERROR = "stream_error"
    """The provider reported an error inside the stream."""
    FRAMING_ERROR = "framing_error"
    """The transport bytes could not be framed (size limit, corrupt binary frame)."""
    SYNTHESIZED_ID = "synthesized_id"
    """The provider sent no call id; toollatch made a stable one up (the anomaly's ``key``
    names the call, whose ``CallRecord.id_made_up`` is then true)."""
    UNSAFE_NUMBER = "unsafe_number"
    """An integer above 2**53 arrived through a double-precision channel."""
    WRAPPER_EXPANDED = "wrapper_expanded"
    """A hallucinated ``multi_tool_use.parallel`` wrapper was expanded into its inner calls."""
    NEVER_CLOSED = "never_closed"
    """A call of a provider with per-call closes was still open when the round ended."""
    INCOMPLETE_ITEM = "incomplete_item"
    """The provider marked a call's item incomplete (Responses ``status: incomplete``): the
    call fails ``truncated`` whatever the round's end."""
    DUPLICATE_KEY = "duplicate_key"
    """Arguments sent as a JSON object repeat a key: which value the model meant is unknown."""
    REASON_OVERRIDDEN = "reason_overridden"
    """A later terminal reason tried to replace a truncating or failing one; the first sticks."""
    TOO_MANY_CHOICES = "too_many_choices"
    """More choices than ``Limits.max_choices``; the stream was failed."""


# -- stream events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta:
    """A fragment of assistant-visible text."""

    choice: int = 0
    """Choice (candidate) the text belongs to."""
    text: str
    """The fragment, appended in order."""
    block: int | str | None = None
    """Provider content-block index, when the provider groups text into blocks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOpened:
    """The provider started a tool call. ``call_id``/``name`` may come later (CallIdentified)."""

    key: CallKey
    """The call's identity for the rest of the round."""
    call_id: str | None = None
    """The provider's call id (the id results must be paired with), if already known."""
    name: str | None = None
    """The tool name, if already known."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallIdentified:
    """A later chunk carried the id and/or name of an open call. Identical repeats are no-ops."""

    key: CallKey
    """The call being identified."""
    call_id: str | None = None
    """The call id, or None when this chunk did not carry one."""
    name: str | None = None
    """The tool name, or None when this chunk did not carry one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgsDelta:
    """An opaque fragment of a call's argument text, appended in stream order."""

    key: CallKey
    """The call the fragment belongs to."""
    fragment: str
    """Raw text; never parsed until the call is closed and the round allows it."""
    whole: bool = False
    """The fragment is the call's entire argument text (a server that sent the arguments as
    a JSON object, serialized once): any other fragment before or after it fails the call."""
    decoded: DecodedArguments | None = field(default=None, compare=False)
    """The value ``fragment`` is the text of, when the adapter already holds it decoded
    (Gemini's ``args`` object): the gate then checks this value instead of parsing the text
    again (see :class:`DecodedArguments`). Honoured only while ``fragment`` stays the call's
    whole text; ignored once anything else is appended. Not compared: by contract it is
    what ``fragment`` says, so two deltas with one text are equal."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodedArguments:
    """A call's argument value as the stream already decoded it, carried beside its text.

    The contract (the adapter's): ``value`` is a tree of exact ``dict``/``list``/``str``/
    ``int``/``float``/``bool``/``None``, owned by the stream (no caller holds it), and the
    text it travels with is its canonical JSON spelling, so that the gate's strict parse of
    that text would give this very tree (same key order, same number types). The gate still
    applies every check its strict parse applies to a parsed tree (types, finite numbers,
    lone surrogates, depth against its own limit): both input forms give the same committed
    call or the same rejection code (tests/test_gate_decoded.py)."""

    value: object
    """The decoded argument value (usually a dict)."""
    nbytes: int
    """UTF-8 size of the text, so the assembler need not measure it again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallClosed:
    """The protocol itself announced that this call's arguments are complete."""

    key: CallKey
    """The call being closed."""
    arguments: str | None = None
    """The provider's own full argument text, when it sends one at the end (Responses
    ``.done``). Used when nothing was streamed; a disagreement is a protocol violation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSettled:
    """The provider has moved on from this call: its arguments can get no more text and the
    stream did not cut them (eager start, see ``Assembler``).

    Emitted where a provider's own signal proves it: a Responses ``output_item.done`` with
    status ``completed``; in OpenAI chat (no per-call close) a later call's ``index``
    opening, where the earlier call still open is settled only if its text already parses
    strictly as one complete JSON object. The assembler itself treats a later call, text or
    block of the same choice, or a normal stop reason, as moving on from every call the
    provider closed before.
    """

    key: CallKey
    """The call the provider moved on from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningBlock:
    """An opaque reasoning/thinking unit, kept byte-for-byte for history, never executed."""

    choice: int = 0
    """Choice the block belongs to."""
    block: int | str
    """Provider position of the block (content-block index, output index...)."""
    data: Mapping[str, Any]
    """The block in the provider's own history format (e.g. Anthropic ``thinking`` with its
    ``signature``, a Responses ``reasoning`` item with ``encrypted_content``)."""
    call: CallKey | None = None
    """Set when the block is not an item of its own but fields of that call's history entry
    (a Gemini ``thoughtSignature`` on a ``functionCall`` part, a chat tool call's
    ``extra_content``): ``data`` holds those fields and becomes the call's
    ``CallRecord.extras``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerToolBlock:
    """A tool use (or its result) the provider ran itself: recorded for history, never run."""

    choice: int = 0
    """Choice the block belongs to."""
    block: int | str
    """Provider position of the block."""
    data: Mapping[str, Any]
    """The block in the provider's own history format."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgsMeasured:
    """At least ``nbytes`` of argument text are coming for an open call whose arguments the
    provider streams as a tree of updates, not as text (Vertex ``partialArgs``): the byte
    limit applies as they arrive, before the text exists."""

    key: CallKey
    """The call being measured."""
    nbytes: int
    """A lower bound on the size of the call's argument text, in UTF-8 bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageReported:
    """Token usage as the provider reported it (its own shape, unchanged)."""

    usage: Mapping[str, Any]
    """Provider usage object."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundEnded:
    """The provider's terminal signal for one choice (finish/stop reason)."""

    choice: int = 0
    """Choice that ended."""
    ending: RoundEnd
    """Normalized ending; only ``NORMAL`` lets calls commit."""
    stop_reason: str | None = None
    """The provider's raw reason (``tool_calls``, ``stop``, ``max_tokens``...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFailed:
    """The stream cannot be trusted past this point (error event, dropped connection, idle)."""

    code: ErrorCode = ErrorCode.STREAM_INTERRUPTED
    """The code every unfinished call gets (``stream_interrupted`` or ``idle_timeout``)."""
    detail: str = ""
    """A short human-readable reason (the provider's error message, at most a few hundred
    characters)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Anomaly:
    """Provider misbehaviour that was recorded instead of raised."""

    kind: AnomalyKind
    """Stable name of the misbehaviour."""
    detail: str
    """Short human-readable description, never raw argument text."""
    key: CallKey | None = None
    """The affected call, when one is."""
    fails_call: bool = False
    """When true, the assembler fails ``key``'s call with ``code``."""
    fails_pending: bool = False
    """When true, the event could not be read or matched to a call (a *lost event*): it may
    have carried a fragment of any call, so the assembler fails every call of the round not
    yet decided (open, or closed and waiting for the gate) with ``code``."""
    code: ErrorCode = ErrorCode.PROTOCOL_VIOLATION
    """The error code of the calls this anomaly fails (``truncated`` for an item the provider
    marked incomplete; ``protocol_violation`` otherwise)."""


StreamEvent = (
    TextDelta
    | CallOpened
    | CallIdentified
    | ArgsDelta
    | ArgsMeasured
    | CallClosed
    | CallSettled
    | ReasoningBlock
    | ServerToolBlock
    | UsageReported
    | RoundEnded
    | StreamFailed
    | Anomaly
)
"""Union of everything an adapter may emit."""
