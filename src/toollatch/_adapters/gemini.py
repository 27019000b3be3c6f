"""Gemini adapter (``streamGenerateContent?alt=sse`` chunks, or their JSONL): chunks -> events.

Theory of operation
-------------------
Every chunk is a ``GenerateContentResponse``: ``candidates[i].content.parts[]``, an optional
``candidates[i].finishReason`` and ``usageMetadata``. Reference:
https://ai.google.dev/api/generate-content#v1beta.GenerateContentResponse

A ``functionCall`` part normally arrives whole, its ``args`` a JSON *object*, not text. Because
the gate parses argument text exactly once, the adapter serializes the object once, canonically
(compact, key order as received), and sends it as a single ``ArgsDelta`` between
``CallOpened`` and ``CallClosed``. A call's key is its *position*: the running count of
function-call parts in its candidate over the whole stream, so it does not depend on how the
parts were split into chunks. Gemini usually sends no call id; the adapter then makes up a
stable one and records a ``SYNTHESIZED_ID`` anomaly so the output says so.

Vertex AI's ``streamFunctionCallArguments`` sends one call over several parts instead: a part
with the ``name`` and ``willContinue: true`` opens it, ``partialArgs`` leaf updates
(``{jsonPath, stringValue|numberValue|boolValue|nullValue, willContinue}``) build the object,
a string leaf with ``willContinue`` continues in the next update of the same path, bare
``{"willContinue": true}`` parts keep the stream alive, and a ``functionCall`` part *without*
``willContinue`` (often an empty ``{}``) ends the call. The adapter builds the object from the
leaves (a small JSONPath subset) and emits it at the end exactly like a whole call. References:
https://googleapis.github.io/js-genai/release_docs/interfaces/types.FunctionCall.html and
https://docs.cloud.google.com/dotnet/docs/reference/Google.Cloud.AIPlatform.V1Beta1/latest/Google.Cloud.AIPlatform.V1Beta1.PartialArg

``thoughtSignature`` values are opaque and must go back to the model with the part that
carried them, so each one becomes a ``ReasoningBlock`` naming that part. ``finishReason``
``STOP`` ends a candidate normally even when it made calls; the reason may come in a later,
content-less chunk (QUIRKS Q14). A stream that ends before every candidate it mentioned
reported a ``finishReason`` failed.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import orjson

from toollatch._adapters._base import Adapter, error_detail, short
from toollatch._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallClosed,
    CallKey,
    CallOpened,
    Ending,
    ReasoningBlock,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)

__all__ = ["GeminiAdapter"]

_ENDINGS: Final[Mapping[str, Ending]] = {"STOP": Ending.NORMAL, "MAX_TOKENS": Ending.TRUNCATED}
"""Every other finishReason (SAFETY, RECITATION, BLOCKLIST, PROHIBITED_CONTENT, SPII,
MALFORMED_FUNCTION_CALL, OTHER, unknown future values...) interrupts the candidate."""

_SERVER_PART_KINDS: Final = frozenset(
    {"executableCode", "codeExecutionResult", "toolCall", "toolResponse"}
)
"""Parts produced by tools Google runs itself (code execution, built-in tools): kept, not run."""

_MAX_SAFE_INTEGER: Final = 2**53
"""Gemini numbers are IEEE doubles (protobuf ``Struct``); larger integers may have changed."""

_MISSING: Final = object()

_PATH_SEGMENT = re.compile(r"\.([^\W\d]\w*)|\[(0|[1-9]\d*)\]|\['([^'\\]*)'\]|\[\"([^\"\\]*)\"\]")
"""One JSONPath (RFC 9535) segment of the subset Vertex uses: ``.name``, ``[2]``, ``['name']``
(no escapes, no wildcards, no slices)."""

PathSegments = tuple[str | int, ...]


def _canonical(value: object) -> str | None:
    """``value`` serialized once: compact, key order kept; None when not JSON (NaN, depth)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None


def _serialize(value: object) -> tuple[str | None, str | None]:
    """``(_canonical(value), JSONPath of its first integer above 2**53)``, or ``(None, None)``.

    orjson writes the very text of :func:`_canonical` for a plain tree (see :func:`_inspect`;
    every code point is escaped alike, checked over all of them), several times faster. It
    raises where it cannot write a tree (cycles and nesting over 255 levels, ints over 64
    bits, lone surrogates, non-string keys); json then decides, as it always did. Either way
    the walk only ever sees a tree that one of them wrote: a finite one.
    """
    try:
        fast = orjson.dumps(value)
    except orjson.JSONEncodeError:
        text = _canonical(value)
        return (text, _inspect(value)[0]) if text is not None else (None, None)
    path, plain = _inspect(value)
    if plain:
        return fast.decode(), path
    text = _canonical(value)  # e.g. floats (orjson writes NaN as null): json decides
    return (text, path) if text is not None else (None, None)


def _parse_path(path: object) -> PathSegments | None:
    """The segments of a ``$``-rooted JSONPath in the supported subset, or None."""
    if not isinstance(path, str) or not path.startswith("$"):
        return None
    segments: list[str | int] = []
    pos = 1
    while pos < len(path):
        match = _PATH_SEGMENT.match(path, pos)
        if match is None:
            return None
        name, index, single, double = match.groups()
        if index is not None:
            segments.append(int(index))
        else:
            segments.append(next(s for s in (name, single, double) if s is not None))
        pos = match.end()
    return tuple(segments)


def _is_finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


_LEAF_FIELDS: Final[Mapping[str, Callable[[object], bool]]] = {
    "stringValue": lambda v: isinstance(v, str),
    "numberValue": _is_finite_number,  # a double: "NaN"/"Infinity" strings are not JSON
    "boolValue": lambda v: isinstance(v, bool),
    "nullValue": lambda v: True,  # protobuf NullValue: JSON null or "NULL_VALUE"
}


def _leaf_value(update: Mapping[str, Any]) -> tuple[object, str | None]:
    """The value of one ``partialArgs`` entry, or an error description."""
    for name, valid in _LEAF_FIELDS.items():
        if name in update:
            value = None if name == "nullValue" else update[name]
            return (value, None) if valid(value) else (None, f"{name} has the wrong type")
    return None, "partialArgs entry without a value"


def _get(container: dict[str, Any] | list[Any], slot: str | int) -> Any:
    if isinstance(container, dict):
        return container.get(str(slot), _MISSING)
    return container[slot] if isinstance(slot, int) and slot < len(container) else _MISSING


def _put(container: dict[str, Any] | list[Any], slot: str | int, value: object) -> str | None:
    if isinstance(container, dict):
        container[str(slot)] = value
        return None
    if not isinstance(slot, int):
        return f"member {slot!r} of an array"  # unreachable: arrays only get integer segments
    if slot < len(container):
        container[slot] = value
    elif slot == len(container):
        container.append(value)
    else:
        return f"array index {slot} skips ahead of length {len(container)}"
    return None


def _assign(holder: list[Any], path: PathSegments, value: object, *, append: bool) -> str | None:
    """Set the leaf at ``path`` under ``holder[0]``, creating objects/arrays on the way."""
    parent: dict[str, Any] | list[Any] = holder
    slot: str | int = 0
    for segment in path:
        node = _get(parent, slot)
        wanted = dict if isinstance(segment, str) else list
        if node is _MISSING:
            node = wanted()
            if (error := _put(parent, slot, node)) is not None:
                return error
        elif not isinstance(node, wanted):
            return f"path crosses a {type(node).__name__} where a {wanted.__name__} was expected"
        parent, slot = node, segment
    if append and isinstance(value, str):
        old = _get(parent, slot)
        value = old + value if isinstance(old, str) else value
    return _put(parent, slot, value)


_PLAIN_LEAVES: Final = frozenset({str, int, bool, type(None)})
"""Leaf types orjson writes exactly as ``json.dumps``. Not float: orjson writes ``1e-05`` as
``0.00001``."""


def _inspect(value: object) -> tuple[str | None, bool]:
    """One walk over ``value``: the JSONPath of its first integer above 2**53 (ints and
    integral doubles), or None; and whether it is plain (see :func:`_serialize`)."""
    plain = True
    stack: list[tuple[str, object]] = [("$", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            plain = plain and type(node) is dict
            stack.extend((f"{path}.{k}", v) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            plain = plain and type(node) is list
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(node))))
        else:
            plain = plain and type(node) in _PLAIN_LEAVES
            if isinstance(node, int | float) and not isinstance(node, bool):
                integral = isinstance(node, int) or (math.isfinite(node) and node.is_integer())
                if integral and abs(node) > _MAX_SAFE_INTEGER:
                    return path, False
    return None, plain


@dataclass(slots=True)
class _Call:
    """One call being built (a whole call lives here for the duration of its own part)."""

    key: CallKey
    holder: list[Any]
    """``[arguments]``: a one-slot holder so that a ``$`` update can replace the root."""
    continuing: set[PathSegments] = field(default_factory=set)
    """String leaves whose last update had ``willContinue``: the next one appends."""
    failed: bool = False
    """A bad update failed the call; its remaining parts are absorbed silently."""


@dataclass(slots=True)
class _Candidate:
    calls: int = 0
    """Function-call parts so far: the next call's position."""
    parts: int = 0
    """All parts so far: names the blocks of non-call parts."""
    open: _Call | None = None
    """The Vertex streamed call whose closing part has not arrived yet."""
    finish_reason: str | None = None


class GeminiAdapter(Adapter):
    """Adapter for Gemini / Vertex AI ``streamGenerateContent`` chunks (SSE or JSONL).

    Keys are ``CallKey(attempt, candidate index, position)``. Never raises for provider
    misbehaviour (see :class:`~toollatch._adapters._base.Adapter`).
    """

    provider: ClassVar[str] = "gemini"

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self._candidates: dict[int, _Candidate] = {}
        self._failed = False
        self._last_usage: Mapping[str, Any] | None = None
        self._unknown_parts: set[str] = set()

    # -- Adapter hooks ----------------------------------------------------------------------

    def _stream_error(self, detail: str) -> list[StreamEvent]:
        """An SSE ``event: error`` frame also ends the stream."""
        if self._failed:
            return [_after_end("error event")]
        self._failed = True
        return super()._stream_error(detail)

    def _feed(self, event: Mapping[str, Any], sse_event: str | None = None) -> list[StreamEvent]:
        if self._failed:
            return [_after_end("chunk")]
        if "error" in event:
            # Errors mid-stream arrive as a chunk {"error": {code, message, status}}.
            self._failed = True
            err = event["error"]
            if isinstance(err, Mapping):
                err = {**err, "type": err.get("status")}  # e.g. UNAVAILABLE: 503: overloaded
            return [StreamFailed(detail=error_detail({"error": err}))]
        candidates = event.get("candidates") or []
        if not isinstance(candidates, list):
            return [_invalid("candidates is not a list")]
        indexed = [(_candidate_index(c, i), c) for i, c in enumerate(candidates)]
        events: list[StreamEvent] = []
        for index, candidate in indexed:
            events += self._content(index, candidate)
        usage = event.get("usageMetadata")
        if isinstance(usage, Mapping) and usage != self._last_usage:
            # Vertex repeats usageMetadata ({"trafficType": ...}) on every chunk: report changes.
            self._last_usage = usage
            events.append(UsageReported(usage=usage))
        for index, candidate in indexed:
            events += self._finish_reason(index, candidate)
        if not candidates:
            events += self._prompt_blocked(event)
        return events

    def _finish(self) -> list[StreamEvent]:
        if self._failed:
            return []
        pending = [i for i, c in self._candidates.items() if c.finish_reason is None]
        if self._candidates and not pending:
            return []
        return [StreamFailed(detail="stream ended without a finishReason")]

    # -- candidates -------------------------------------------------------------------------

    def _content(self, index: int, candidate: object) -> list[StreamEvent]:
        if not isinstance(candidate, Mapping):
            return [_invalid("candidate is not an object")]
        state = self._candidates.setdefault(index, _Candidate())
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, Mapping) else None
        if not isinstance(parts, list) or not parts:
            return []
        if state.finish_reason is not None:
            return [_after_end(f"content for candidate {index}")]
        events: list[StreamEvent] = []
        for part in parts:
            events += self._part(index, state, part)
        return events

    def _finish_reason(self, index: int, candidate: object) -> list[StreamEvent]:
        reason = candidate.get("finishReason") if isinstance(candidate, Mapping) else None
        if not isinstance(reason, str) or not reason:
            return []
        state = self._candidates.setdefault(index, _Candidate())
        if state.finish_reason is not None:
            same = reason == state.finish_reason
            return [] if same else [_after_end(f"finishReason {short(reason, 40)}")]
        state.finish_reason = reason
        ending = _ENDINGS.get(reason, Ending.INTERRUPTED)
        events: list[StreamEvent] = []
        if state.open is not None and ending is Ending.NORMAL:
            # Rule "closed_at_finish_reason": a streamed call whose terminating part never
            # came ends with the candidate (gemini/vertex_partial_args_missing_terminal.jsonl
            # shows the stream variant; a cut or filtered stream leaves it open to fail).
            events += self._close(state)
        events.append(RoundEnded(choice=index, ending=ending, stop_reason=reason))
        return events

    def _prompt_blocked(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        """A blocked prompt has no candidates, only ``promptFeedback.blockReason``."""
        feedback = event.get("promptFeedback")
        reason = feedback.get("blockReason") if isinstance(feedback, Mapping) else None
        if not isinstance(reason, str) or 0 in self._candidates:
            return []
        self._candidates[0] = _Candidate(finish_reason=reason)
        return [RoundEnded(choice=0, ending=Ending.INTERRUPTED, stop_reason=reason)]

    # -- parts ------------------------------------------------------------------------------

    def _part(self, index: int, state: _Candidate, part: object) -> list[StreamEvent]:
        if not isinstance(part, Mapping):
            return [_invalid("part is not an object")]
        ordinal = state.parts
        state.parts += 1
        signature = part.get("thoughtSignature")
        if "functionCall" in part:
            events, position = self._function_call(index, state, part["functionCall"])
            if signature and position is not None:
                data = {"thoughtSignature": signature, "call_position": position}
                events.append(ReasoningBlock(choice=index, block=f"sig:{position}", data=data))
            return events
        if "text" in part:
            return self._text(index, part, ordinal)
        if _SERVER_PART_KINDS & part.keys():
            return [ServerToolBlock(choice=index, block=f"part:{ordinal}", data=part)]
        if not part:
            return []
        if "thoughtSignature" in part and part.keys() <= {"thoughtSignature", "thought"}:
            return [ReasoningBlock(choice=index, block=f"part:{ordinal}", data=part)]
        kind = ",".join(sorted(part.keys()))
        if kind in self._unknown_parts:
            return []
        self._unknown_parts.add(kind)
        detail = f"unsupported part kind {short(kind, 80)!r}; ignored"
        return [Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail=detail)]

    def _text(self, index: int, part: Mapping[str, Any], ordinal: int) -> list[StreamEvent]:
        text = part["text"]
        if not isinstance(text, str):
            return [_invalid("text part without a string")]
        if part.get("thought") is True:
            # A thought summary: kept whole (with its signature, if any), never shown as text.
            return [ReasoningBlock(choice=index, block=f"part:{ordinal}", data=part)]
        events: list[StreamEvent] = [TextDelta(choice=index, text=text)] if text else []
        signature = part.get("thoughtSignature")
        if signature:
            # Signatures also ride on text parts, often empty ones; history must keep them.
            data = {"thoughtSignature": signature, "text_block": ordinal}
            events.append(ReasoningBlock(choice=index, block=f"sig:part:{ordinal}", data=data))
        return events

    # -- function calls ---------------------------------------------------------------------

    def _function_call(
        self, index: int, state: _Candidate, fc: object
    ) -> tuple[list[StreamEvent], int | None]:
        """Events of one ``functionCall`` part and the position of the call it belongs to."""
        if not isinstance(fc, Mapping):
            return [_invalid("functionCall is not an object")], None
        starts = "name" in fc or "args" in fc
        events: list[StreamEvent] = []
        if state.open is not None:
            if not starts:
                position = state.open.key.part
                events = self._continue(state, state.open, fc)
                return events, position if isinstance(position, int) else None
            # A new call began although the streamed one never ended: that one cannot be
            # trusted to be complete.
            events.append(_fail(state.open.key, "a new functionCall began before this one ended"))
            state.open = None
        if not starts:
            if fc.get("willContinue") and not fc.get("partialArgs"):
                return [], None  # keep-alive part with no call open: nothing to do
            detail = "functionCall part without a name while no call is open"
            return [Anomaly(kind=AnomalyKind.UNKNOWN_KEY, detail=detail)], None
        position = state.calls
        state.calls += 1
        return events + self._open(index, position, state, fc), position

    def _open(
        self, index: int, position: int, state: _Candidate, fc: Mapping[str, Any]
    ) -> list[StreamEvent]:
        key = CallKey(self.attempt, index, position)
        call_id = fc.get("id") if isinstance(fc.get("id"), str) and fc.get("id") else None
        synthesized = f"gemini:{self.attempt}:{position}"
        if index:
            synthesized = f"gemini:{self.attempt}:{index}:{position}"  # one id space per round
        name = fc.get("name")
        events: list[StreamEvent] = [CallOpened(key=key, call_id=call_id or synthesized, name=name)]
        if call_id is None:
            # Gemini often sends no id (all gemini/* fixtures); results pair by this one.
            detail = f"no call id from the provider; using {synthesized!r}"
            events.append(Anomaly(kind=AnomalyKind.SYNTHESIZED_ID, detail=detail, key=key))
        # A whole call without "args" has none: {} (vertex_partial_args_no_args_and_three_calls).
        args = fc.get("args")
        args = {} if args is None else args
        if fc.get("partialArgs"):
            args = copy.deepcopy(args)  # leaf updates must not write into the caller's dict
        state.open = call = _Call(key=key, holder=[args])
        return events + self._continue(state, call, fc)

    def _continue(self, state: _Candidate, call: _Call, fc: Mapping[str, Any]) -> list[StreamEvent]:
        """Apply a part's ``partialArgs`` to the open call; close it unless ``willContinue``."""
        updates = fc.get("partialArgs") or []
        if not isinstance(updates, list):
            updates = [updates]
        events: list[StreamEvent] = []
        for update in updates if not call.failed else []:
            error = _apply(call, update)
            if error is not None:
                call.failed = True
                events.append(_fail(call.key, error))
                break
        if not fc.get("willContinue"):
            events += self._close(state)
        return events

    def _close(self, state: _Candidate) -> list[StreamEvent]:
        """End the open call: its arguments as one canonical fragment, then ``CallClosed``."""
        call, state.open = state.open, None
        if call is None or call.failed:
            return []
        text, path = _serialize(call.holder[0])
        if text is None:
            return [_fail(call.key, "arguments cannot be serialized as JSON")]
        events: list[StreamEvent] = []
        if path is not None:
            detail = f"integer above 2**53 at {short(path, 120)}; it may have lost precision"
            events.append(Anomaly(kind=AnomalyKind.UNSAFE_NUMBER, detail=detail, key=call.key))
        return [*events, ArgsDelta(key=call.key, fragment=text), CallClosed(key=call.key)]


def _apply(call: _Call, update: object) -> str | None:
    """Apply one ``partialArgs`` leaf update to ``call``; an error description on failure."""
    if not isinstance(update, Mapping):
        return "partialArgs entry is not an object"
    path = _parse_path(update.get("jsonPath"))
    if path is None:
        return f"unsupported jsonPath {short(update.get('jsonPath'), 80)!r}"
    value, error = _leaf_value(update)
    if error is not None:
        return error
    append = path in call.continuing
    if isinstance(value, str) and update.get("willContinue"):
        call.continuing.add(path)  # more of this string follows (nested fixture, steps[1])
    else:
        call.continuing.discard(path)
    return _assign(call.holder, path, value, append=append)


def _candidate_index(candidate: object, position: int) -> int:
    index = candidate.get("index") if isinstance(candidate, Mapping) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else position


def _fail(key: CallKey, detail: str) -> Anomaly:
    return Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail, key=key, fails_call=True)


def _after_end(what: str) -> Anomaly:
    return Anomaly(kind=AnomalyKind.EVENT_AFTER_END, detail=f"{what} after the end; ignored")


def _invalid(detail: str) -> Anomaly:
    return Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail)
