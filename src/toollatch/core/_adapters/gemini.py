"""Gemini adapter (``streamGenerateContent?alt=sse`` chunks, or their JSONL): chunks -> events.

Theory of operation
-------------------
Every chunk is a ``GenerateContentResponse``: ``candidates[i].content.parts[]``, an optional
``candidates[i].finishReason`` and ``usageMetadata``. Reference:
https://ai.google.dev/api/generate-content#v1beta.GenerateContentResponse

A ``functionCall`` part normally arrives whole, its ``args`` a JSON *object*, not text. The
adapter serializes the object once, canonically (compact, key order as received), and sends
it as a single ``ArgsDelta`` between ``CallOpened`` and ``CallClosed``. When the object is the
adapter's own decode of the event (not a caller's dict) and of exact JSON types, the delta
also carries it (``ArgsDelta.decoded``): the gate then checks that value as its strict parse
of the text would, instead of parsing the text it was just written to. A call's key is its
*position*: the running count of function-call parts in its candidate over the whole stream,
so it does not depend on how the parts were split into chunks. Gemini usually sends no call
id; the adapter then makes up a stable one and records a ``SYNTHESIZED_ID`` anomaly so the
output says so.

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

Hostile input (issue 11): nothing may commit with arguments the model did not send. A chunk,
candidate, content, part or ``functionCall`` that cannot be read, a candidate ``index`` that
is not an integer, and ``partialArgs`` for no open call are *lost events*: they may have
carried a fragment of any call, so every pending call fails (rules "lost_candidate",
"orphan_update"). A bad part of the open streamed call fails that call. A streamed call
never ended by its own part is not closed by ``STOP`` ("never_closed"); a second, different
``finishReason`` is passed on and the non-normal one sticks ("sticky_reason",
"unreadable_finish_reason"); a ``functionCall`` part after a candidate's end fails its calls
("call_part_after_end"); a chunk carrying ``args``/``partialArgs`` that repeats a key in
some object fails the call ("duplicate_key"); arguments nested deeper than ``_MAX_DEPTH``
fail ``depth_exceeded`` ("bounded_depth"); a streamed call's size is measured as its
updates arrive ("measured_as_streamed").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeGuard

import orjson

from .._errors import ErrorCode
from .._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    ArgsMeasured,
    CallClosed,
    CallKey,
    CallOpened,
    DecodedArguments,
    ReasoningBlock,
    RoundEnd,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)
from ._base import Adapter, canonical_json, error_detail, invalid, lost_event, short

__all__ = ["GeminiAdapter"]

_ENDINGS: Final[Mapping[str, RoundEnd]] = {
    "STOP": RoundEnd.NORMAL,
    "MAX_TOKENS": RoundEnd.TRUNCATED,
}
"""Every other finishReason (SAFETY, RECITATION, BLOCKLIST, PROHIBITED_CONTENT, SPII,
MALFORMED_FUNCTION_CALL, OTHER, unknown future values...) interrupts the candidate."""

_SERVER_PART_KINDS: Final = frozenset(
    {"executableCode", "codeExecutionResult", "toolCall", "toolResponse"}
)
"""Parts produced by tools Google runs itself (code execution, built-in tools): kept, not run."""

_MAX_SAFE_INTEGER: Final = 2**53
"""Gemini numbers are IEEE doubles (protobuf ``Struct``); larger integers may have changed."""

_MISSING: Final = object()

_MAX_DEPTH: Final = 255
"""Nesting the adapter builds or serializes for one call's arguments (rule
"bounded_depth"). The gate refuses more than ``Limits.max_json_depth`` (64 by default)
anyway; this bound is orjson's own write limit, so every tree the adapter serializes is
written without recursion, and no input (a ``partialArgs`` path of 100k segments, an
``args`` object nested 100k deep fed as a dict) can exhaust the stack or make a tree far
larger than the event that described it. Deeper arguments fail ``depth_exceeded``."""

_MAX_STREAMED_CHARS: Final = 16 * 1024 * 1024
"""Backstop on a Vertex streamed call's argument text, measured as the updates arrive
(rule "measured_as_streamed", see :meth:`GeminiAdapter._measure`): the
``Limits.max_event_bytes`` default, i.e. no streamed call may grow past what one whole
call in one SSE event could carry by default. Over it the call fails
``arguments_exceed_max_bytes`` and its tree is dropped."""

_MEASURE_STEP: Final = 4096
"""Growth of a streamed call's size bound between two ``ArgsMeasured`` events: the limit
applies within 4 KiB of where it falls, with one event per 4 KiB at most."""

_PATH_SEGMENT = re.compile(r"\.([^\W\d]\w*)|\[(0|[1-9]\d*)\]|\['([^'\\]*)'\]|\[\"([^\"\\]*)\"\]")
"""One JSONPath (RFC 9535) segment of the subset Vertex uses: ``.name``, ``[2]``, ``['name']``
(no escapes, no wildcards, no slices)."""

PathSegments = tuple[str | int, ...]


def _serialize(value: object) -> tuple[str | None, str | None]:
    """``(canonical_json(value), JSONPath of its first integer above 2**53)``, or ``(None, None)``
    (see :func:`_written`)."""
    text, path, _ = _written(value)
    return text, path


def _written(value: object, fast: bytes | None = None) -> tuple[str | None, str | None, int]:
    """:func:`_serialize`, and the text's UTF-8 size when ``value`` is exactly the tree the
    text parses back to (exact JSON types, no integer above 2**53), else -1: then the text
    alone goes on.

    orjson writes the very text of :func:`_canonical` for a plain tree (see :func:`_inspect`;
    every code point is escaped alike, checked over all of them), several times faster. It
    raises where it cannot write a tree (cycles and nesting over 255 levels, ints over 64
    bits, lone surrogates, non-string keys); json then decides, as it always did. Either way
    the walk only ever sees a tree that one of them wrote: a finite one. ``fast``, when
    given, is ``orjson.dumps(value)`` already made (see :meth:`GeminiAdapter._written_event`).
    """
    try:
        fast = orjson.dumps(value) if fast is None else fast
    except orjson.JSONEncodeError:
        text = canonical_json(value)
        return (text, _inspect(value)[0], -1) if text is not None else (None, None, -1)
    path, plain, exact = _inspect(value)
    if plain:
        return fast.decode(), path, len(fast)
    text = canonical_json(value)  # e.g. floats (orjson writes NaN as null): json decides
    if text is None:
        return None, None, -1
    return text, path, len(text.encode()) if exact and path is None else -1


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


class _Pieces:
    """A string leaf still growing (its last update had ``willContinue``): pieces joined once
    at the close, so a string sent in n pieces costs O(total), not O(n * total)."""

    __slots__ = ("chars", "parent", "pieces", "slot")

    def __init__(self, parent: dict[str, Any] | list[Any], slot: str | int, first: str) -> None:
        self.parent, self.slot, self.pieces, self.chars = parent, slot, [first], len(first)

    def add(self, piece: str) -> None:
        self.pieces.append(piece)
        self.chars += len(piece)

    def settle(self) -> None:
        """Put the joined string where this leaf is, if it is still there."""
        if _get(self.parent, self.slot) is self:
            _put(self.parent, self.slot, "".join(self.pieces))


def _type_name(node: object) -> str:
    return "str" if isinstance(node, _Pieces) else type(node).__name__


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


def _weight(value: object) -> int:
    """A lower bound on the characters of ``value``'s JSON text: a string's length, 1 for
    every other leaf, containers and keys not counted. Iterative (any depth)."""
    total = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            total += len(node)
        elif isinstance(node, _Pieces):
            total += node.chars
        else:
            total += 1
    return total


def _copy_tree(value: object) -> tuple[object, int] | None:
    """A copy of ``value``'s dicts and lists (leaves shared) and its :func:`_weight`, or
    None when it nests deeper than ``_MAX_DEPTH``. Iterative: ``copy.deepcopy`` recursed
    and let ``RecursionError`` out of ``feed()`` for deeply nested ``args``."""
    holder: list[Any] = [None]
    weight = 0
    stack: list[tuple[object, list[Any] | dict[str, Any], int | str, int]] = [(value, holder, 0, 0)]
    while stack:
        node, parent, slot, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= _MAX_DEPTH:
                return None
            if isinstance(node, dict):
                copied: dict[str, Any] | list[Any] = dict.fromkeys(node)
                stack.extend((v, copied, k, depth + 1) for k, v in node.items())
            else:
                copied = [None] * len(node)
                stack.extend((v, copied, i, depth + 1) for i, v in enumerate(node))
            parent[slot] = copied  # type: ignore[index]
        else:
            weight += len(node) if isinstance(node, str) else 1
            parent[slot] = node  # type: ignore[index]
    return holder[0], weight


def _too_deep(value: object) -> bool:
    """Whether ``value`` nests dicts/lists deeper than ``_MAX_DEPTH`` (iterative)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= _MAX_DEPTH:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return False


def _assign(
    call: _Call, path: PathSegments, value: object, *, append: bool, more: bool
) -> str | None:
    """Set the leaf at ``path`` of ``call``'s arguments, creating objects/arrays on the way;
    a string with ``append`` continues the one there, one with ``more`` may be continued.
    Keeps ``call.nbytes`` (the :func:`_weight` of the whole tree) up to date."""
    parent: dict[str, Any] | list[Any] = call.holder
    slot: str | int = 0
    for segment in path:
        node = _get(parent, slot)
        wanted = dict if isinstance(segment, str) else list
        if node is _MISSING:
            node = wanted()
            if (error := _put(parent, slot, node)) is not None:
                return error
        elif not isinstance(node, wanted):
            return f"path crosses a {_type_name(node)} where a {wanted.__name__} was expected"
        parent, slot = node, segment
    old = _get(parent, slot)
    if isinstance(value, str):
        if append and isinstance(old, _Pieces):
            old.add(value)
            call.nbytes += len(value)
            return None
        if more:
            value = _Pieces(parent, slot, value)
            call.strings.append(value)
    if (error := _put(parent, slot, value)) is not None:
        return error
    call.nbytes += _weight(value) - (0 if old is _MISSING else _weight(old))
    return None


_PLAIN_LEAVES: Final = frozenset({str, int, bool, type(None)})
"""Leaf types orjson writes exactly as ``json.dumps``. Not float: orjson writes ``1e-05`` as
``0.00001``."""


def _inspect(value: object) -> tuple[str | None, bool, bool]:
    """One walk over ``value``: the JSONPath of its first integer above 2**53 (ints and
    integral doubles), or None; whether it is plain (see :func:`_serialize`); and whether
    it is exact: plain but for floats (the types a JSON parse gives)."""
    containers = plain = exact = True
    stack: list[tuple[str, object]] = [("$", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            containers = containers and type(node) is dict
            stack.extend((f"{path}.{k}", v) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            containers = containers and type(node) is list
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(node))))
        else:
            kind = type(node)
            plain = plain and kind in _PLAIN_LEAVES
            exact = exact and (kind in _PLAIN_LEAVES or kind is float)
            if isinstance(node, int | float) and not isinstance(node, bool):
                integral = isinstance(node, int) or (math.isfinite(node) and node.is_integer())
                if integral and abs(node) > _MAX_SAFE_INTEGER:
                    return path, False, False
    return None, containers and plain, containers and exact


@dataclass(slots=True)
class _Call:
    """One call being built (a whole call lives here for the duration of its own part)."""

    key: CallKey
    holder: list[Any]
    """``[arguments]``: a one-slot holder so that a ``$`` update can replace the root."""
    continuing: set[PathSegments] = field(default_factory=set)
    """String leaves whose last update had ``willContinue``: the next one appends."""
    strings: list[_Pieces] = field(default_factory=list)
    """Every growing string leaf made so far, to join at the close."""
    nbytes: int = 0
    """A lower bound on the argument text's size (see :func:`_weight`), kept as updates
    arrive."""
    measured: int = 0
    """``nbytes`` as last told to the assembler (``ArgsMeasured``)."""
    failed: bool = False
    """A bad update failed the call; its remaining parts are absorbed silently."""
    owned: bool = False
    """The tree is the adapter's own (its decode, or its copy): it may go on decoded."""
    written: bytes | None = None
    """``orjson.dumps`` of the tree, when the duplicate-key check of the call's own closing
    part already made it (a whole call): its close does not write it again."""

    def drop(self) -> None:
        """The call failed: keep nothing of its arguments."""
        self.failed = True
        self.holder[0] = None
        self.continuing.clear()
        self.strings.clear()


@dataclass(slots=True)
class _Candidate:
    calls: int = 0
    """Function-call parts so far: the next call's position."""
    parts: int = 0
    """All parts so far: names the blocks of non-call parts."""
    open: _Call | None = None
    """The Vertex streamed call whose closing part has not arrived yet."""
    finish_reason: str | None = None
    """The first reason reported (a later different one is still passed on: see
    :meth:`GeminiAdapter._finish_reason`)."""
    spoiled: bool = False
    """A call part arrived after the end and failed every call of the candidate."""


class GeminiAdapter(Adapter):
    """Adapter for Gemini / Vertex AI ``streamGenerateContent`` chunks (SSE or JSONL).

    Keys are ``CallKey(attempt, candidate index, position)``. Never raises for provider
    misbehaviour (see :class:`~toollatch.core._adapters._base.Adapter`): a chunk, candidate, part
    or ``functionCall`` it cannot read fails every pending call (a lost event), a bad update
    of a streamed call fails that call.
    """

    provider: ClassVar[str] = "gemini"

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self._candidates: dict[int, _Candidate] = {}
        self._failed = False
        self._last_usage: Mapping[str, Any] | None = None
        self._unknown_parts: set[str] = set()
        self._duplicates: bool | None = None
        """The duplicate-key verdict of the chunk being translated, once asked (one strict
        re-read per chunk, however many calls it carries)."""

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
            return [StreamFailed(detail=_error_detail(event["error"]))]
        self._duplicates = None
        candidates = event.get("candidates")
        if candidates is None:
            candidates = []  # (a falsy 0, "" or {} is not "absent": it is unreadable)
        if not isinstance(candidates, list):
            return [lost_event("candidates is not a list")]
        events: list[StreamEvent] = []
        indexed: list[tuple[int, object]] = []
        for position, candidate in enumerate(candidates):
            index = _candidate_index(candidate, position)
            if index is None:
                # Rule "lost_candidate": its parts may continue any call (issue 11, item 1).
                events.append(
                    lost_event(f"candidate {position} has an index that is not an integer")
                )
            else:
                indexed.append((index, candidate))
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
            return [lost_event("candidate is not an object")]
        state = self._candidates.setdefault(index, _Candidate())
        content = candidate.get("content")
        if content is None:
            return []  # e.g. the content-less chunk that carries only the finishReason (Q14)
        parts = content.get("parts") if isinstance(content, Mapping) else _MISSING
        if parts is None:
            return []
        if not isinstance(parts, list):
            return [lost_event(f"content of candidate {index} has no readable parts list")]
        if not parts:
            return []
        if state.finish_reason is not None:
            return self._after_candidate_end(index, state, parts)
        events: list[StreamEvent] = []
        for part in parts:
            events += self._part(index, state, part)
        return events

    def _after_candidate_end(
        self, index: int, state: _Candidate, parts: list[Any]
    ) -> list[StreamEvent]:
        """Parts after the candidate's finishReason. Rule "call_part_after_end": a
        ``functionCall`` part (or a part that cannot be read) may continue any call of the
        candidate, none of which can grow any more, so all of them fail (issue 11, item 5);
        other parts are only recorded."""
        risky = any(not isinstance(p, Mapping) or "functionCall" in p for p in parts)
        if not risky or state.spoiled:
            return [_after_end(f"content for candidate {index}")]
        state.spoiled = True
        detail = f"a functionCall part for candidate {index} after its finishReason"
        return [
            Anomaly(
                kind=AnomalyKind.EVENT_AFTER_END,
                detail=detail,
                key=CallKey(self.attempt, index, position),
                fails_call=True,
            )
            for position in range(state.calls)
        ] or [_after_end(f"content for candidate {index}")]

    def _finish_reason(self, index: int, candidate: object) -> list[StreamEvent]:
        reason = candidate.get("finishReason") if isinstance(candidate, Mapping) else None
        if reason is None or reason == "":
            return []
        if not isinstance(reason, str):
            # Rule "unreadable_finish_reason": a reason we cannot read may have been
            # MAX_TOKENS; it must not be skipped while a later STOP ends the candidate.
            events: list[StreamEvent] = [invalid("finishReason is not a string")]
            reason, ending = "", RoundEnd.INTERRUPTED
        else:
            events, ending = [], _ENDINGS.get(reason, RoundEnd.INTERRUPTED)
        state = self._candidates.setdefault(index, _Candidate())
        if state.finish_reason is not None:
            # Rule "sticky_reason": a second, different reason is passed on, and the
            # assembler keeps the truncating or failing one of the two, whatever the order
            # (MAX_TOKENS then STOP, or STOP then SAFETY; issue 11, items 3/4).
            if reason == state.finish_reason:
                return events
            return [*events, RoundEnded(choice=index, ending=ending, stop_reason=reason or None)]
        state.finish_reason = reason
        # Rule "never_closed": a streamed call whose terminating part never came stays open;
        # the assembler fails it (never_closed) even at STOP. Its text may be cut anywhere:
        # gemini/vertex_partial_args_missing_terminal.jsonl ends its call with a last
        # partialArgs part without willContinue, which is a close (see _continue).
        if state.open is not None:
            state.open.drop()
            state.open = None
        events.append(RoundEnded(choice=index, ending=ending, stop_reason=reason or None))
        return events

    def _prompt_blocked(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        """A blocked prompt has no candidates, only ``promptFeedback.blockReason``."""
        feedback = event.get("promptFeedback")
        reason = feedback.get("blockReason") if isinstance(feedback, Mapping) else None
        if not isinstance(reason, str) or 0 in self._candidates:
            return []
        self._candidates[0] = _Candidate(finish_reason=reason)
        return [RoundEnded(choice=0, ending=RoundEnd.INTERRUPTED, stop_reason=reason)]

    # -- parts ------------------------------------------------------------------------------

    def _part(self, index: int, state: _Candidate, part: object) -> list[StreamEvent]:
        if not isinstance(part, Mapping):
            return [lost_event("part is not an object")]
        ordinal = state.parts
        state.parts += 1
        signature = part.get("thoughtSignature")
        if "functionCall" in part:
            events, position = self._function_call(index, state, part["functionCall"])
            if signature and position is not None:
                key = CallKey(self.attempt, index, position)
                data = {"thoughtSignature": signature}  # goes back on the call's part
                block = ReasoningBlock(choice=index, block=f"sig:{position}", data=data, call=key)
                events.append(block)
            return events
        if "text" in part:
            return self._text(index, part, ordinal)
        if _SERVER_PART_KINDS & part.keys():
            return [ServerToolBlock(choice=index, block=f"part:{ordinal}", data=part)]
        if not part:
            return []
        if "thoughtSignature" in part and part.keys() <= {"thoughtSignature", "thought"}:
            return [ReasoningBlock(choice=index, block=f"part:{ordinal}", data=part)]
        kind = ",".join(sorted(str(k) for k in part))
        if kind in self._unknown_parts:
            return []
        self._unknown_parts.add(kind)
        detail = f"unsupported part kind {short(kind, 80)!r}; ignored"
        return [Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail=detail)]

    def _text(self, index: int, part: Mapping[str, Any], ordinal: int) -> list[StreamEvent]:
        text = part["text"]
        if not isinstance(text, str):
            return [invalid("text part without a string")]  # (text: never a call's input)
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
            return [lost_event("functionCall is not an object")], None
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
            state.open.drop()
            state.open = None
        if not starts:
            if fc.get("partialArgs") not in (None, []):
                # Rule "orphan_update": leaf updates for no open call may belong to a call
                # whose opening part was lost (litellm#23815 accumulated such orphans).
                return [lost_event("partialArgs for no open functionCall")], None
            if fc.get("willContinue") is True:
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
        bad_name = name is not None and not isinstance(name, str)
        events: list[StreamEvent] = [
            CallOpened(key=key, call_id=call_id or synthesized, name=None if bad_name else name)
        ]
        if call_id is None:
            # Gemini often sends no id (all gemini/* fixtures); results pair by this one.
            detail = f"no call id from the provider; using {synthesized!r}"
            events.append(Anomaly(kind=AnomalyKind.SYNTHESIZED_ID, detail=detail, key=key))
        state.open = call = _Call(key=key, holder=[None])
        if bad_name:
            call.drop()
            events.append(_fail(key, "functionCall name is not a string"))
        # A whole call without "args" has none: {} (vertex_partial_args_no_args_and_three_calls).
        args = fc.get("args")
        args = {} if args is None else args
        if fc.get("partialArgs") is not None and not call.failed:
            # Leaf updates must not write into the caller's dict: an iterative copy.
            copied = _copy_tree(args)
            if copied is None:
                call.drop()
                events.append(_too_deep_anomaly(key))
            else:
                call.holder[0], call.nbytes = copied
                call.owned = True
        elif not call.failed:
            call.holder[0], call.owned = args, self._owned
        return events + self._continue(state, call, fc)

    def _continue(self, state: _Candidate, call: _Call, fc: Mapping[str, Any]) -> list[StreamEvent]:
        """Apply a part's ``partialArgs`` to the open call; close it unless ``willContinue``."""
        events: list[StreamEvent] = []
        more = _flag(fc)
        if not call.failed:
            events += self._check(call, fc)
        if not isinstance(more, bool):
            more = False  # (the call was failed by _check)
        if not more:
            events += self._close(state)
        return events

    def _check(self, call: _Call, fc: Mapping[str, Any]) -> list[StreamEvent]:
        """Read one part of the open call: its duplicate keys, its ``willContinue``, its
        updates (and the size they reach). The events that fail the call, if any."""
        if "args" in fc or "partialArgs" in fc:
            if self._duplicates is None:
                self._duplicates = self._duplicate_keys(self._written_event(call, fc))
            if self._duplicates:
                # Rule "duplicate_key": {"cmd":"ls","cmd":"rm -rf /"} decoded to its last
                # value (issue 11, item 6); also a repeated stringValue in an update.
                call.drop()
                return self._duplicate_key_anomaly(call.key)
        if not isinstance(_flag(fc), bool):
            call.drop()
            return [_fail(call.key, "willContinue is not a boolean")]
        updates = fc.get("partialArgs")
        if updates is None:
            return []
        if not isinstance(updates, list):
            call.drop()
            return [_fail(call.key, "partialArgs is not a list")]
        for update in updates:
            error = _apply(call, update)
            if error is not None:
                call.drop()
                return [error]
        return self._measure(call)

    def _written_event(self, call: _Call, fc: Mapping[str, Any]) -> bytes | None:
        """``orjson.dumps`` of the event being translated, for its duplicate-key check, when
        ``fc`` is a whole call (its ``args`` closed in this part): its ``args`` are written
        once, kept on ``call`` for its close, and stand in the event as that text (an
        ``orjson.Fragment``, written as is), so the event's dump is the very bytes
        ``orjson.dumps(event)`` gives, without writing the arguments a second time. None
        (the check then writes the event itself) for any other part."""
        args = call.holder[0]
        whole = fc.get("partialArgs") is None and _flag(fc) is False
        if not whole or args is not fc.get("args"):
            return None
        try:
            call.written = orjson.dumps(args)
        except orjson.JSONEncodeError:
            return None  # (the close decides, as without this)
        if self._data is None:
            return None  # (no check without the event's text)
        event = _with_args(self._native, fc, orjson.Fragment(call.written))
        if event is None:
            return None
        try:
            return orjson.dumps(event)
        except orjson.JSONEncodeError:
            return None

    def _measure(self, call: _Call) -> list[StreamEvent]:
        """Rule "measured_as_streamed": a streamed call's size is known as its updates arrive
        (``call.nbytes``, a lower bound on its text), not only at its close (issue 11: 400 MB
        were held before the assembler's limit saw the text).

        Hook: the assembler owns ``Limits.max_argument_bytes``. Once the stream vocabulary
        has an event saying "at least n bytes of argument text are coming for this call",
        this returns it whenever ``call.nbytes`` grew, and the assembler fails the call as
        soon as n is over its limit: ``ArgsMeasured`` each time the bound grew by
        ``_MEASURE_STEP`` (the final text is measured exactly at the close anyway). The
        ``_MAX_STREAMED_CHARS`` backstop bounds what the adapter itself holds."""
        if call.nbytes <= _MAX_STREAMED_CHARS:
            if call.nbytes - call.measured < _MEASURE_STEP:
                return []
            call.measured = call.nbytes
            return [ArgsMeasured(key=call.key, nbytes=call.nbytes)]
        call.drop()
        return [
            Anomaly(
                kind=AnomalyKind.ARGUMENTS_TOO_LARGE,
                detail=f"streamed arguments exceed {_MAX_STREAMED_CHARS} characters",
                key=call.key,
                fails_call=True,
                code=ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES,
            )
        ]

    def _close(self, state: _Candidate) -> list[StreamEvent]:
        """End the open call: its arguments as one canonical fragment, then ``CallClosed``."""
        call, state.open = state.open, None
        if call is None or call.failed:
            return []
        for pieces in call.strings:
            pieces.settle()
        args = call.holder[0]
        if _too_deep(args):
            return [_too_deep_anomaly(call.key)]
        text, path, nbytes = _written(args, call.written)
        if text is None:
            # e.g. an infinite or NaN double in args fed as a dict: never written as null.
            return [_fail(call.key, "arguments cannot be serialized as JSON")]
        events: list[StreamEvent] = []
        if path is not None:
            detail = f"integer above 2**53 at {short(path, 120)}; it may have lost precision"
            events.append(Anomaly(kind=AnomalyKind.UNSAFE_NUMBER, detail=detail, key=call.key))
        # The tree itself goes to the gate beside its text when it is what the text parses
        # back to and no caller holds it (DecodedArguments): the text is not parsed again.
        decoded = None
        if call.owned and nbytes >= 0:
            decoded = DecodedArguments(value=args, nbytes=nbytes)
        delta = ArgsDelta(key=call.key, fragment=text, decoded=decoded)
        return [*events, delta, CallClosed(key=call.key)]


def _with_args(event: object, fc: Mapping[str, Any], args: object) -> dict[str, Any] | None:
    """A copy of ``event`` with ``args`` in place of the ``args`` of its part whose
    ``functionCall`` is ``fc`` (the one object): only the containers on that path are
    copied, each key where it was. None unless that path is plain ``dict``s and ``list``s
    (the adapter's own decode; a subclass or another ``Mapping`` may iterate otherwise than
    orjson writes it)."""
    candidates = event.get("candidates") if _is_dict(event) else None
    if not _is_dict(event) or not _is_dict(fc) or not _is_list(candidates):
        return None
    for i, candidate in enumerate(candidates):
        content = candidate.get("content") if _is_dict(candidate) else None
        parts = content.get("parts") if _is_dict(content) else None
        if not _is_dict(candidate) or not _is_dict(content) or not _is_list(parts):
            continue
        for j, part in enumerate(parts):
            if _is_dict(part) and part.get("functionCall") is fc:
                copied = list(parts)
                copied[j] = {**part, "functionCall": {**fc, "args": args}}
                cands = list(candidates)
                cands[i] = {**candidate, "content": {**content, "parts": copied}}
                return {**event, "candidates": cands}
    return None


def _is_dict(value: object) -> TypeGuard[dict[str, Any]]:
    """Exactly a ``dict`` (what orjson decodes to), not a subclass."""
    return type(value) is dict


def _is_list(value: object) -> TypeGuard[list[Any]]:
    """Exactly a ``list``, not a subclass."""
    return type(value) is list


def _apply(call: _Call, update: object) -> Anomaly | None:
    """Apply one ``partialArgs`` leaf update to ``call``; the anomaly that fails it if bad."""
    if not isinstance(update, Mapping):
        return _fail(call.key, "partialArgs entry is not an object")
    raw_path = update.get("jsonPath")
    path = _parse_path(raw_path)
    if path is None:
        shown = short(raw_path, 80) if isinstance(raw_path, str) else type(raw_path).__name__
        return _fail(call.key, f"unsupported jsonPath {shown!r}")
    if len(path) >= _MAX_DEPTH:
        return _too_deep_anomaly(call.key)
    value, error = _leaf_value(update)
    if error is not None:
        return _fail(call.key, error)
    more = _flag(update)
    if not isinstance(more, bool):
        return _fail(call.key, "partialArgs willContinue is not a boolean")
    append = path in call.continuing
    if isinstance(value, str) and more:
        call.continuing.add(path)  # more of this string follows (nested fixture, steps[1])
    else:
        call.continuing.discard(path)
    error = _assign(call, path, value, append=append, more=more)
    return None if error is None else _fail(call.key, error)


def _flag(message: Mapping[str, Any]) -> object:
    """``willContinue``: False when absent or null (protobuf JSON), else as sent."""
    more = message.get("willContinue")
    return False if more is None else more


def _candidate_index(candidate: object, position: int) -> int | None:
    """The candidate's ``index`` (its position when absent), or None when unreadable."""
    index = candidate.get("index") if isinstance(candidate, Mapping) else None
    if index is None:
        return position
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def _error_detail(err: object) -> str:
    """The short description of an error chunk's ``error``, from its scalar fields only (a
    nested value's ``str()`` can recurse without bound)."""
    if not isinstance(err, Mapping):
        return f"error chunk ({type(err).__name__})"
    flat = {
        k: v
        for k, v in err.items()
        if k in ("code", "message", "status") and isinstance(v, str | int | float)
    }
    return error_detail({"error": {**flat, "type": flat.get("status")}})


def _fail(key: CallKey, detail: str) -> Anomaly:
    return Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail, key=key, fails_call=True)


def _too_deep_anomaly(key: CallKey) -> Anomaly:
    return Anomaly(
        kind=AnomalyKind.INVALID_PAYLOAD,
        detail=f"arguments nest deeper than {_MAX_DEPTH} levels",
        key=key,
        fails_call=True,
        code=ErrorCode.DEPTH_EXCEEDED,
    )


def _after_end(what: str) -> Anomaly:
    return Anomaly(kind=AnomalyKind.EVENT_AFTER_END, detail=f"{what} after the end; ignored")
