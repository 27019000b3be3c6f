"""OpenAI Responses API adapter: semantic stream events -> stream events.

Theory of operation
-------------------
The Responses API streams *output items* (``message``, ``reasoning``, ``function_call`` and the
hosted tools' items), each announced by ``response.output_item.added`` and finished by
``response.output_item.done``; a function call's argument text arrives in between as
``response.function_call_arguments.delta`` events and is repeated in full by
``response.function_call_arguments.done``. Reference:
https://platform.openai.com/docs/api-reference/responses-streaming

A call's key is the item's own ``id`` (``item_id`` on the argument events), falling back to its
``output_index`` when a server omits the id; deltas are routed by that key, never by "the last
call", because fragments of parallel calls may interleave (microsoft/agent-framework#8337).
The id results are paired with is the item's ``call_id``, not its ``id``.

The first ``.done`` of a call (arguments or item) closes it and carries the provider's full
text; the assembler compares it with the streamed fragments, and uses it alone when nothing
was streamed (LM Studio, ``compat_lmstudio/responses_no_argument_deltas.jsonl``); a second
``.done`` must carry the same text. These ``.done`` events are a call's only close: the item
``response.completed`` lists does not count, so a call without one fails ``never_closed``
(that list can only fail a call: listed incomplete, not completed, or with other arguments).
An item done with ``status: "incomplete"`` fails ``truncated``; one with any status but
``completed`` (or none) fails. Reasoning and hosted-tool items are emitted whole from
``output_item.done``, as opaque blocks for history.

An event that cannot be read or matched to a call (no type, a type that is not a string, a
delta or item that names no call by a string id or an integer ``output_index``) may have
carried any call's text: it is a *lost event* and fails every pending call. The round ends on
``response.completed`` / ``incomplete`` / ``failed`` or an ``error`` event; a later terminal
event still goes on (a truncating or failing one sticks, in either order), a call's event
after it fails that call, anything else after it is an anomaly, and a stream without a
terminal event failed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from .._errors import ErrorCode
from .._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallClosed,
    CallIdentified,
    CallKey,
    CallOpened,
    CallSettled,
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

__all__ = ["OpenAIResponsesAdapter"]

_TERMINAL_RESPONSE_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed"}
)

_STATUS_EVENTS = {"incomplete": "response.incomplete", "failed": "response.failed"}
"""A ``response.completed`` whose response says another status is handled as that event."""

_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})
_CALL_EVENTS = _ITEM_EVENTS | {
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
}
"""Events that may carry a function call's text (deltas, full text, an item's arguments)."""
_CALL_EVENT_PREFIX = "response.function_call"

_ABSENT = object()

_HARMLESS_EVENTS = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    }
)
"""Events whose content reaches us anyway through ``output_item.done`` (reasoning text and
summaries are inside the reasoning item; final text equals the deltas), or that carry none."""

_HOSTED_TOOL_PROGRESS = re.compile(r"^response\.[a-z_]+_(?:call|tools)(?:_[a-z]+)?\.[a-z_]+$")
"""Progress events of hosted tools (``response.web_search_call.searching``,
``response.mcp_call_arguments.delta``, ``response.code_interpreter_call_code.done``,
``response.mcp_list_tools.completed``...): the finished item arrives in ``output_item.done``."""

_CLIENT_EXECUTED_ITEMS = frozenset(
    {"custom_tool_call", "computer_call", "local_shell_call", "shell_call", "apply_patch_call"}
)
"""Items the *client* is expected to run but whose input is not JSON arguments. toollatch
records them for history and says so with an anomaly; it never runs them."""

_FILTERED_REASONS = frozenset({"content_filter"})
"""``incomplete_details.reason`` values that mean the output was filtered, not cut short."""


class OpenAIResponsesAdapter(Adapter):
    """Adapter for ``POST /v1/responses`` with ``stream: true`` (and compatible servers).

    Emits ``CallOpened``/``ArgsDelta``/``CallClosed`` keyed ``CallKey(attempt, 0, item_id)``,
    ``TextDelta`` per output text delta, ``ReasoningBlock``/``ServerToolBlock`` for whole
    reasoning and hosted-tool items, and a terminal ``RoundEnded`` or ``StreamFailed`` per
    terminal event (the assembler keeps the worst). Never raises for provider misbehaviour
    (see :class:`~toollatch.core._adapters._base.Adapter`).
    """

    provider: ClassVar[str] = "openai_responses"

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self._parts_by_index: dict[int, int | str] = {}
        """``output_index`` -> call key part, for events that omit ``item_id``."""
        self._keys: dict[str, CallKey] = {}
        """Key of every call announced under an item id (built once, not per delta)."""
        self._opened: set[int | str] = set()
        self._identities: dict[int | str, tuple[str | None, str | None]] = {}
        """Call id and name each call was opened with."""
        self._added_text: dict[int | str, bytes] = {}
        """Digest of the argument text an ``output_item.added`` carried (rule
        "arguments_in_added_item"). Digests, not texts: the adapter keeps a few bytes per call
        whatever the arguments' size, also for calls the assembler no longer keeps."""
        self._closed: dict[int | str, bytes | None] = {}
        """Closed calls, with the digest of the full text their first ``.done`` carried."""
        self._ended = False
        self._unknown_types: set[str] = set()

    # -- Adapter hooks ----------------------------------------------------------------------

    def _continuation(
        self, event: dict[str, Any], sse_event: str | None
    ) -> tuple[CallKey, str] | None:
        # A non-empty string delta for a call announced under its item id: the general path
        # (_feed, _args_delta, _key) would build the very same key. (Subscripts: a missing
        # member raises, caught below; cheaper than .get() once per event.)
        try:
            if event["type"] != "response.function_call_arguments.delta" or self._ended:
                return None
            delta, item_id = event["delta"], event["item_id"]
            if type(delta) is not str or not delta or type(item_id) is not str:
                return None
            return self._keys[item_id], delta
        except KeyError:
            return None

    def _stream_error(self, detail: str) -> list[StreamEvent]:
        """An SSE ``event: error`` frame fails the round, also after its terminal event (a
        failing signal always sticks: the assembler keeps the first failure)."""
        self._ended = True
        return super()._stream_error(detail)

    def _feed(self, event: Mapping[str, Any], sse_event: str | None = None) -> list[StreamEvent]:
        # The payload's own "type" wins over the SSE event name (they agree in every recording);
        # the name stands in only for a payload without one. A "type" that is not a string
        # cannot be read: the event may have been any call's fragment (a lost event).
        etype = event.get("type", _ABSENT)
        if etype is _ABSENT:
            etype = sse_event if sse_event and sse_event != "message" else None
            if etype is None:
                return [lost_event("event without a type")]
        elif not isinstance(etype, str):
            return [lost_event(f"event type is a {type(etype).__name__}, not a string")]
        if self._ended:
            return self._after_end(etype, event)
        match etype:
            case "response.output_item.added":
                return self._item_added(event)
            case "response.output_item.done":
                return self._item_done(event)
            case "response.function_call_arguments.delta":
                return self._args_delta(event)
            case "response.function_call_arguments.done":
                return self._args_done(event)
            case "response.output_text.delta" | "response.refusal.delta":
                return self._text_delta(event)
            case "response.completed" | "response.incomplete" | "response.failed":
                return self._terminal(etype, event)
            case "error":
                self._ended = True
                return [StreamFailed(detail=_error_event_detail(event))]
        return self._unhandled(etype)

    def _finish(self) -> list[StreamEvent]:
        if self._ended:
            return []
        return [StreamFailed(detail="stream ended without a terminal response event")]

    # -- output items -----------------------------------------------------------------------

    def _item_added(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        item = event.get("item")
        if not isinstance(item, Mapping):
            return [lost_event("output_item.added without an item object")]
        itype = item.get("type")
        if not isinstance(itype, str):
            # (It may have announced a call, with the start of its arguments.)
            return [lost_event(f"output_item.added: item type is a {type(itype).__name__}")]
        if itype != "function_call":
            return []  # reasoning/message/hosted items are emitted whole at output_item.done
        part = self._register(item, event.get("output_index"))
        if part is None:
            return [lost_event("function_call item with neither an id nor an output_index")]
        key = self._call_key(part)
        text, anomalies = self._argument_text(item.get("arguments"), key)
        call_id, name, bad = self._identity(item, key)
        if part in self._opened:
            # A repeated announcement: identical id/name is a no-op for the assembler,
            # a different one is its ID_CHANGED / NAME_CHANGED anomaly. Argument text other
            # than the first announcement's is a fragment we cannot place: the call fails.
            events: list[StreamEvent] = [CallIdentified(key=key, call_id=call_id, name=name)]
            if text and _digest(text) != self._added_text.get(part):
                detail = "a repeated output_item.added carries other argument text"
                events.append(_failing(AnomalyKind.ARGUMENTS_MISMATCH, detail, key))
            return events + bad + anomalies
        events = self._open(part, key, call_id, name) + bad
        # Rule "arguments_in_added_item": a server may put (the start of) the arguments in
        # the added item itself; OpenAI and every recording send "" here.
        if text:
            self._added_text[part] = _digest(text)
            events.append(ArgsDelta(key=key, fragment=text))
        return events + anomalies

    def _item_done(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        item = event.get("item")
        if not isinstance(item, Mapping):
            return [lost_event("output_item.done without an item object")]
        itype = item.get("type")
        if not isinstance(itype, str):
            # (An object or a list here once escaped as a TypeError from the set lookup.)
            return [lost_event(f"output_item.done: item type is a {type(itype).__name__}")]
        index = event.get("output_index")
        block: int | str = index if type(index) is int else short(item.get("id", "?"), 200)
        if itype == "function_call":
            return self._function_call_done(item, index)
        if itype == "message":
            return []  # its text already arrived as output_text deltas
        if itype == "reasoning":
            # Kept whole (incl. encrypted_content) so the next request can pass it back.
            return [ReasoningBlock(block=block, data=item)]
        events: list[StreamEvent] = [ServerToolBlock(block=block, data=item)]
        if itype in _CLIENT_EXECUTED_ITEMS:
            events.append(
                Anomaly(
                    kind=AnomalyKind.UNKNOWN_EVENT,
                    detail=f"{itype} items are not supported; recorded, not run",
                )
            )
        return events

    def _function_call_done(self, item: Mapping[str, Any], index: object) -> list[StreamEvent]:
        part = self._register(item, index)
        if part is None:
            return [lost_event("function_call item with neither an id nor an output_index")]
        key = self._call_key(part)
        call_id, name, events = self._identity(item, key)
        if part not in self._opened:
            # Rule "call_only_at_item_done": a server that skips output_item.added still
            # announces the whole call here, with its end; open it first.
            events = self._open(part, key, call_id, name) + events
        elif (call_id, name) != self._identities[part] and (call_id or name):
            # The finished item names another call than its announcement did.
            events.insert(0, CallIdentified(key=key, call_id=call_id, name=name))
        status = item.get("status")
        if status == "incomplete":
            # Rule "incomplete_item_fails_truncated": the provider itself says the call was cut
            # (max_output_tokens), even when response.completed follows (issue 11, item 3).
            detail = "the provider marked the function_call item incomplete"
            return [
                *events,
                _failing(AnomalyKind.INCOMPLETE_ITEM, detail, key, ErrorCode.TRUNCATED),
            ]
        if status is not None and status != "completed":
            # Rule "only_completed_items_close": "in_progress" (or anything unknown) on the
            # item's own end is a contradiction; the call is not trusted. An absent status
            # counts as completed: the done event itself is the end signal.
            detail = f"function_call item done with status {short(status, 40)!r}"
            return [*events, _failing(AnomalyKind.INVALID_PAYLOAD, detail, key)]
        events += self._close(key, item.get("arguments"))
        if status == "completed":
            # Rule "completed_item_settles": the provider says this call's item is complete
            # (a cut one is "incomplete"): it has moved on from the call (eager start).
            events.append(CallSettled(key=key))
        return events

    def _open(
        self, part: int | str, key: CallKey, call_id: str | None, name: str | None
    ) -> list[StreamEvent]:
        self._opened.add(part)
        self._identities[part] = (call_id, name)
        return [CallOpened(key=key, call_id=call_id, name=name)]

    def _identity(
        self, item: Mapping[str, Any], key: CallKey
    ) -> tuple[str | None, str | None, list[StreamEvent]]:
        """The item's call id and name (``None`` when absent), and the anomaly that fails the
        call when either is something other than a string (it cannot be paired or run)."""
        call_id, name = item.get("call_id"), item.get("name")
        wrong = [f for f, v in (("call_id", call_id), ("name", name)) if not _str_or_none(v)]
        if not wrong:
            return call_id, name, []
        detail = f"function_call item whose {' and '.join(wrong)} is not a string"
        return (
            call_id if isinstance(call_id, str) else None,
            name if isinstance(name, str) else None,
            [_failing(AnomalyKind.INVALID_PAYLOAD, detail, key)],
        )

    # -- argument and text deltas -----------------------------------------------------------

    def _args_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        key = self._key(event)
        if key is None:
            return [lost_event("function_call_arguments.delta that names no call")]
        delta = event.get("delta")
        if not isinstance(delta, str):
            detail = "function_call_arguments.delta without a string delta"
            if key.part in self._opened:
                return [_failing(AnomalyKind.INVALID_PAYLOAD, detail, key)]
            return [lost_event(detail)]
        # Keyed by the event's own item id: parallel calls' fragments may interleave
        # (microsoft/agent-framework#8337, bifrost#1829). An unknown key reaches the
        # assembler as is, which fails every pending call (a lost fragment); one for a closed
        # call fails that call (FRAGMENT_AFTER_CLOSE).
        return [ArgsDelta(key=key, fragment=delta)] if delta else []

    def _args_done(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        key = self._key(event)
        if key is None or key.part not in self._opened:
            return [lost_event("function_call_arguments.done that names no announced call")]
        arguments = event.get("arguments")
        if arguments is None:
            # Rule "done_without_text_is_no_close": the provider's full text is what shows a
            # dropped or repeated fragment; without it, output_item.done has to close the call.
            detail = "function_call_arguments.done without arguments; waiting for the item"
            return [Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail, key=key)]
        return self._close(key, arguments)

    def _close(self, key: CallKey, arguments: object) -> list[StreamEvent]:
        text, anomalies = self._argument_text(arguments, key)
        if key.part in self._closed:
            # output_item.done after function_call_arguments.done: already closed; the two
            # full texts must agree (the assembler compared the first with the fragments).
            first = self._closed[key.part]
            if text is not None and first is not None and _digest(text) != first:
                detail = "output_item.done's arguments differ from function_call_arguments.done"
                anomalies.append(_failing(AnomalyKind.ARGUMENTS_MISMATCH, detail, key))
            return anomalies
        self._closed[key.part] = None if text is None else _digest(text)
        return [CallClosed(key=key, arguments=text), *anomalies]

    def _argument_text(self, value: object, key: CallKey) -> tuple[str | None, list[StreamEvent]]:
        """The provider's argument text: strings as they are, objects serialized with an
        anomaly (and a failing one when the event repeats a key)."""
        if value is None or isinstance(value, str):
            return value, []
        # Rule "object_arguments": some compatible servers send the arguments as a JSON object
        # (the chat-completions analogue is llama.cpp#20198, QUIRKS Q9); serialize once and say
        # so. Its decoded form kept one value of a repeated key: the event's text is re-read
        # and the call fails if one was (issue 11, item 6).
        text = canonical_json(value)
        if text is None:
            detail = "arguments are neither text nor serializable JSON"
            return None, [_failing(AnomalyKind.INVALID_PAYLOAD, detail, key)]
        detail = "arguments arrived as JSON, not text; serialized canonically"
        anomaly = Anomaly(kind=AnomalyKind.OBJECT_ARGUMENTS, detail=detail, key=key)
        return text, [anomaly, *self._duplicate_key_anomaly(key)]

    def _text_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        delta = event.get("delta")
        if not isinstance(delta, str):
            return [invalid("text delta without a string delta")]
        index = event.get("output_index")
        block = index if type(index) is int else None
        return [TextDelta(text=delta, block=block)] if delta else []

    # -- round end and the rest -------------------------------------------------------------

    def _terminal(
        self, etype: str, event: Mapping[str, Any], *, usage: bool = True
    ) -> list[StreamEvent]:
        self._ended = True
        response = event.get("response")
        response = response if isinstance(response, Mapping) else {}
        events: list[StreamEvent] = []
        if usage and isinstance(response.get("usage"), Mapping):
            events.append(UsageReported(usage=response["usage"]))
        status = response.get("status")
        if etype == "response.completed" and status is not None and status != "completed":
            # Rule "completed_needs_completed_status": the event and its response disagree;
            # the worse of the two stands.
            etype = _STATUS_EVENTS.get(status, "") if isinstance(status, str) else ""
            if not etype:
                detail = f"response.completed with status {short(status, 40)!r}; not trusted"
                events.append(invalid(detail))
                events.append(RoundEnded(ending=RoundEnd.INTERRUPTED, stop_reason="completed"))
                return events
        if etype == "response.completed":
            if usage:  # (the first terminal event only)
                events += self._cross_check(response.get("output"))
            events.append(RoundEnded(ending=RoundEnd.NORMAL, stop_reason="completed"))
        elif etype == "response.incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, Mapping) else None
            reason = reason if isinstance(reason, str) and reason else "incomplete"
            filtered = reason in _FILTERED_REASONS
            ending = RoundEnd.INTERRUPTED if filtered else RoundEnd.TRUNCATED
            events.append(RoundEnded(ending=ending, stop_reason=reason))
        else:
            error = response.get("error")
            detail = error_detail({"error": error}) if error else "response.failed"
            events.append(StreamFailed(detail=detail))
        return events

    def _cross_check(self, output: object) -> list[StreamEvent]:
        """Rule "completed_output_cross_check": the items ``response.completed`` lists never
        close a call (only its ``.done`` events do), but they can fail one: a function_call
        item listed ``incomplete`` (``truncated``), with another status than ``completed``, or
        with other arguments than its first ``.done`` carried (``protocol_violation``)."""
        if not isinstance(output, list):
            return []
        events: list[StreamEvent] = []
        for item in output:
            if not isinstance(item, Mapping) or item.get("type") != "function_call":
                continue
            item_id = item.get("id")
            if not isinstance(item_id, str) or item_id not in self._opened:
                continue
            key, status = self._keys[item_id], item.get("status")
            arguments, first = item.get("arguments"), self._closed.get(item_id)
            if status == "incomplete":
                detail = "response.completed lists the function_call item as incomplete"
                events.append(
                    _failing(AnomalyKind.INCOMPLETE_ITEM, detail, key, ErrorCode.TRUNCATED)
                )
            elif status is not None and status != "completed":
                detail = f"response.completed lists the item with status {short(status, 40)!r}"
                events.append(_failing(AnomalyKind.INVALID_PAYLOAD, detail, key))
            elif isinstance(arguments, str) and first is not None and _digest(arguments) != first:
                detail = "response.completed lists the item with other arguments"
                events.append(_failing(AnomalyKind.ARGUMENTS_MISMATCH, detail, key))
        return events

    def _unhandled(self, etype: str) -> list[StreamEvent]:
        if etype.startswith(_CALL_EVENT_PREFIX):
            # An unknown event of the function-call family may have carried any call's text.
            # (Checked first: the hosted tools' pattern matches this family's names too.)
            return [lost_event(f"unknown function-call event {short(etype, 80)!r}")]
        if etype in _HARMLESS_EVENTS or _HOSTED_TOOL_PROGRESS.match(etype):
            return []
        if etype in self._unknown_types:
            return []
        self._unknown_types.add(etype)
        return [Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail=f"unknown event type {etype!r}")]

    def _after_end(self, etype: str, event: Mapping[str, Any]) -> list[StreamEvent]:
        """An event after the round's terminal event."""
        if etype in _TERMINAL_RESPONSE_EVENTS:
            # Rule "terminal_reasons_stick": a later terminal event goes on to the assembler,
            # where a truncating or failing reason wins over a normal one in either order
            # (issue 11, item 4); its usage is not taken.
            return self._terminal(etype, event, usage=False)
        if etype == "error":
            return [StreamFailed(detail=_error_event_detail(event))]
        detail = f"{short(etype, 80)} after the terminal event"
        if etype in _CALL_EVENTS or etype.startswith(_CALL_EVENT_PREFIX):
            # Rule "no_fragment_after_the_end": argument text (or a call's item) after the
            # terminal event; the call it names cannot grow any more and fails, and one that
            # names no known call may be any pending call's (issue 11, item 5).
            key: CallKey | None
            if etype in _ITEM_EVENTS:
                item = event.get("item")
                itype = item.get("type") if isinstance(item, Mapping) else None
                if isinstance(itype, str) and itype != "function_call":
                    return [Anomaly(kind=AnomalyKind.EVENT_AFTER_END, detail=detail + "; ignored")]
                key = self._key(item, event) if isinstance(item, Mapping) else None
            else:
                key = self._key(event)
            if key is not None and key.part in self._opened:
                return [_failing(AnomalyKind.EVENT_AFTER_END, detail, key)]
            return [Anomaly(kind=AnomalyKind.EVENT_AFTER_END, detail=detail, fails_pending=True)]
        return [Anomaly(kind=AnomalyKind.EVENT_AFTER_END, detail=detail + "; ignored")]

    # -- keys -------------------------------------------------------------------------------

    def _register(self, item: Mapping[str, Any], index: object) -> int | str | None:
        """The key part of a function_call item (its id, else its output index), remembered;
        ``None`` when it has neither (or an id that is not a string): it cannot be keyed."""
        item_id = item.get("id")
        part: int | str
        if isinstance(item_id, str) and item_id:
            part = item_id
        elif item_id is not None and item_id != "":
            return None
        elif type(index) is int:  # (not a bool: True would be output 1)
            part = self._parts_by_index.get(index, index)
        else:
            return None
        if type(index) is int:
            self._parts_by_index.setdefault(index, part)
        return part

    def _key(
        self, source: Mapping[str, Any], envelope: Mapping[str, Any] | None = None
    ) -> CallKey | None:
        """The key an event names: its ``item_id`` (an item's ``id``), else what its
        ``output_index`` was added as; ``None`` when neither is usable (the event cannot be
        matched to a call). An empty id counts as absent (compatible servers send one)."""
        item_id = source.get("item_id" if envelope is None else "id")
        if isinstance(item_id, str) and item_id:
            return CallKey(self.attempt, 0, item_id)
        if item_id is not None and item_id != "":
            return None
        index = (source if envelope is None else envelope).get("output_index")
        if type(index) is not int:
            return None
        return CallKey(self.attempt, 0, self._parts_by_index.get(index, index))

    def _call_key(self, part: int | str) -> CallKey:
        """The key of an announced call; one with an item id is kept for the fast path."""
        key = CallKey(self.attempt, 0, part)
        if type(part) is str:
            self._keys[part] = key
        return key


def _digest(text: str) -> bytes:
    """A 16-byte digest of ``text``, to tell two argument texts apart without keeping them."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _str_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def _failing(
    kind: AnomalyKind, detail: str, key: CallKey, code: ErrorCode = ErrorCode.PROTOCOL_VIOLATION
) -> Anomaly:
    """An anomaly that fails ``key``'s call with ``code``."""
    return Anomaly(kind=kind, detail=detail, key=key, fails_call=True, code=code)


def _error_event_detail(event: Mapping[str, Any]) -> str:
    """Detail of an ``error`` event: ``{"type":"error","code":..,"message":..}`` or nested."""
    if isinstance(event.get("error"), Mapping):
        return error_detail(event)
    return error_detail({k: v for k, v in event.items() if k not in ("type", "sequence_number")})
