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
was streamed (LM Studio, ``compat_lmstudio/responses_no_argument_deltas.jsonl``). Reasoning
and hosted-tool items are emitted whole from ``output_item.done``, as opaque blocks for
history. The round ends only on ``response.completed`` / ``incomplete`` / ``failed`` or an
``error`` event; anything after it is an anomaly, and a stream without it failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from toollatch._adapters._base import Adapter, error_detail, short
from toollatch._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallClosed,
    CallIdentified,
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
    args_delta,
)

__all__ = ["OpenAIResponsesAdapter"]

_TERMINAL_RESPONSE_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed"}
)

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


def _canonical(value: object) -> str | None:
    """Object-typed arguments, serialized once (compact, key order kept); None if not JSON."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None


class OpenAIResponsesAdapter(Adapter):
    """Adapter for ``POST /v1/responses`` with ``stream: true`` (and compatible servers).

    Emits ``CallOpened``/``ArgsDelta``/``CallClosed`` keyed ``CallKey(attempt, 0, item_id)``,
    ``TextDelta`` per output text delta, ``ReasoningBlock``/``ServerToolBlock`` for whole
    reasoning and hosted-tool items, and one terminal ``RoundEnded`` or ``StreamFailed``.
    Never raises for provider misbehaviour (see :class:`~toollatch._adapters._base.Adapter`).
    """

    provider: ClassVar[str] = "openai_responses"

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self._parts_by_index: dict[int, int | str] = {}
        """``output_index`` -> call key part, for events that omit ``item_id``."""
        self._keys: dict[str, CallKey] = {}
        """Key of every call announced under an item id (built once, not per delta)."""
        self._opened: set[int | str] = set()
        self._closed: set[int | str] = set()
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
        """An SSE ``event: error`` frame ends the round (recorded only, after the end)."""
        if self._ended:
            return [self._after_end("error")]
        self._ended = True
        return super()._stream_error(detail)

    def _feed(self, event: Mapping[str, Any], sse_event: str | None = None) -> list[StreamEvent]:
        # The payload's own "type" wins over the SSE event name (they agree in every recording).
        etype = event.get("type")
        if not isinstance(etype, str):
            etype = sse_event if sse_event and sse_event != "message" else None
        if etype is None:
            return [Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail="event without a type")]
        if self._ended:
            return [self._after_end(etype)]
        match etype:
            case "response.output_item.added":
                return self._item_added(event)
            case "response.output_item.done":
                return self._item_done(event)
            case "response.function_call_arguments.delta":
                return self._args_delta(event)
            case "response.function_call_arguments.done":
                return self._close(self._key(event), event.get("arguments"))
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
            return [_invalid("output_item.added without an item")]
        if item.get("type") != "function_call":
            return []  # reasoning/message/hosted items are emitted whole at output_item.done
        part = self._register(item, event.get("output_index"))
        key = self._call_key(part)
        if part in self._opened:
            # A repeated announcement: identical id/name is a no-op for the assembler,
            # a different one is its ID_CHANGED / NAME_CHANGED anomaly.
            return [CallIdentified(key=key, call_id=item.get("call_id"), name=item.get("name"))]
        self._opened.add(part)
        events: list[StreamEvent] = [
            CallOpened(key=key, call_id=item.get("call_id"), name=item.get("name"))
        ]
        # Rule "arguments_in_added_item": a server may put (the start of) the arguments in
        # the added item itself; OpenAI and every recording send "" here.
        text, anomalies = _argument_text(item.get("arguments"), key)
        if text:
            events.append(ArgsDelta(key=key, fragment=text))
        return events + anomalies

    def _item_done(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        item = event.get("item")
        if not isinstance(item, Mapping):
            return [_invalid("output_item.done without an item")]
        itype = item.get("type")
        index = event.get("output_index")
        block: int | str = index if isinstance(index, int) else str(item.get("id", "?"))
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
        key = self._call_key(part)
        events: list[StreamEvent] = []
        if part not in self._opened:
            # Rule "call_only_at_item_done": a server that skips output_item.added still
            # announces the whole call here, with its end; open it first.
            self._opened.add(part)
            events.append(CallOpened(key=key, call_id=item.get("call_id"), name=item.get("name")))
        if item.get("status") == "incomplete":
            # Rule "incomplete_item_stays_open": the provider itself says the call was cut
            # (max_output_tokens); leave it open so the round's end fails it ``truncated``.
            return events
        return events + self._close(key, item.get("arguments"))

    # -- argument and text deltas -----------------------------------------------------------

    def _args_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        delta = event.get("delta")
        if not isinstance(delta, str):
            return [_invalid("function_call_arguments.delta without a string delta")]
        # Keyed by the event's own item id: parallel calls' fragments may interleave
        # (microsoft/agent-framework#8337, bifrost#1829). An unknown key reaches the
        # assembler as is, which records it as UNKNOWN_KEY.
        return [args_delta(self._key(event), delta)] if delta else []

    def _close(self, key: CallKey, arguments: object) -> list[StreamEvent]:
        if key.part in self._closed:
            return []  # output_item.done after function_call_arguments.done: already closed
        self._closed.add(key.part)
        text, anomalies = _argument_text(arguments, key)
        return [CallClosed(key=key, arguments=text), *anomalies]

    def _text_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        delta = event.get("delta")
        if not isinstance(delta, str):
            return [_invalid("text delta without a string delta")]
        index = event.get("output_index")
        block = index if isinstance(index, int) else None
        return [TextDelta(text=delta, block=block)] if delta else []

    # -- round end and the rest -------------------------------------------------------------

    def _terminal(self, etype: str, event: Mapping[str, Any]) -> list[StreamEvent]:
        self._ended = True
        response = event.get("response")
        response = response if isinstance(response, Mapping) else {}
        events: list[StreamEvent] = []
        usage = response.get("usage")
        if isinstance(usage, Mapping):
            events.append(UsageReported(usage=usage))
        if etype == "response.completed":
            events.append(RoundEnded(ending=Ending.NORMAL, stop_reason="completed"))
        elif etype == "response.incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, Mapping) else None
            reason = reason if isinstance(reason, str) and reason else "incomplete"
            filtered = reason in _FILTERED_REASONS
            ending = Ending.INTERRUPTED if filtered else Ending.TRUNCATED
            events.append(RoundEnded(ending=ending, stop_reason=reason))
        else:
            error = response.get("error")
            detail = error_detail({"error": error}) if error else "response.failed"
            events.append(StreamFailed(detail=detail))
        return events

    def _unhandled(self, etype: str) -> list[StreamEvent]:
        if etype in _HARMLESS_EVENTS or _HOSTED_TOOL_PROGRESS.match(etype):
            return []
        if etype in self._unknown_types:
            return []
        self._unknown_types.add(etype)
        return [Anomaly(kind=AnomalyKind.UNKNOWN_EVENT, detail=f"unknown event type {etype!r}")]

    def _after_end(self, etype: str) -> Anomaly:
        return Anomaly(
            kind=AnomalyKind.EVENT_AFTER_END,
            detail=f"{short(etype, 80)} after the terminal event; ignored",
        )

    # -- keys -------------------------------------------------------------------------------

    def _register(self, item: Mapping[str, Any], index: object) -> int | str:
        """The key part of a function_call item (its id, else its output index), remembered."""
        item_id = item.get("id")
        part: int | str
        if isinstance(item_id, str) and item_id:
            part = item_id
        elif isinstance(index, int) and index in self._parts_by_index:
            part = self._parts_by_index[index]
        else:
            part = index if isinstance(index, int) else -1
        if isinstance(index, int):
            self._parts_by_index.setdefault(index, part)
        return part

    def _key(self, event: Mapping[str, Any]) -> CallKey:
        """The key of an argument event: its ``item_id``, else what its index was added as."""
        item_id = event.get("item_id")
        index = event.get("output_index")
        part: int | str
        if isinstance(item_id, str) and item_id:
            part = item_id
        elif isinstance(index, int):
            part = self._parts_by_index.get(index, index)
        else:
            part = -1
        return CallKey(self.attempt, 0, part)

    def _call_key(self, part: int | str) -> CallKey:
        """The key of an announced call; one with an item id is kept for the fast path."""
        key = CallKey(self.attempt, 0, part)
        if type(part) is str:
            self._keys[part] = key
        return key


def _argument_text(value: object, key: CallKey) -> tuple[str | None, list[StreamEvent]]:
    """The provider's argument text: strings as they are, objects serialized with an anomaly."""
    if value is None or isinstance(value, str):
        return value, []
    # Rule "object_arguments": some compatible servers send the arguments as a JSON object
    # (the chat-completions analogue is llama.cpp#20198); serialize once and say so.
    text = _canonical(value)
    if text is None:
        detail = "arguments are neither text nor serializable JSON"
        return None, [
            Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail, key=key, fails_call=True)
        ]
    detail = "arguments arrived as JSON, not text; serialized canonically"
    return text, [Anomaly(kind=AnomalyKind.OBJECT_ARGUMENTS, detail=detail, key=key)]


def _error_event_detail(event: Mapping[str, Any]) -> str:
    """Detail of an ``error`` event: ``{"type":"error","code":..,"message":..}`` or nested."""
    if isinstance(event.get("error"), Mapping):
        return error_detail(event)
    return error_detail({k: v for k, v in event.items() if k not in ("type", "sequence_number")})


def _invalid(detail: str) -> Anomaly:
    return Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail)
