"""OpenAI Chat Completions (and every OpenAI-compatible server) -> stream events.

Theory of operation: a chunk carries ``choices[i].delta.tool_calls[j]`` entries whose identity
is spread over ``index``, ``id`` and ``function.name``, each of which real servers omit, repeat
or blank. A per-choice *resolver* maps every entry to one call slot:

* an ``id`` seen before -> that call (Q3: DeepSeek/Qwen/TGI repeat the id on every chunk),
  unless the chunk names another ``index`` than that call's: a present index wins, so it is a
  new call, which the assembler fails as a duplicate id while the first keeps its text;
* a new ``id`` on an index whose open call has no id yet -> that call gets the id (Kimi);
* any other new ``id`` -> a new call, even on an index already used (Q2: all parallel calls on
  ``index: 0`` with distinct ids — litellm#5231, bifrost#1961; camel#3662 index reuse);
* no ``id``: the call open at that ``index`` (Q4/Q5/Q6 continuations), else a new call (Q7:
  arguments before the name); no ``index`` either (Q1, ollama#7881): the latest call, unless a
  different name arrives (a new, id-less call).

Repeated identical ids and names are dropped here; a *different* name on an existing call is
passed on so the assembler fails that call. Arguments are opaque text; an object sent instead
of a string (Q9: llama.cpp#20198, TGI#2136) is serialized once, canonically, with an anomaly.
End of round: a ``finish_reason`` per choice (``tool_calls`` and ``stop`` are both normal —
vllm#25054 shows OpenAI itself sends ``stop`` for a forced tool_choice); ``[DONE]`` alone also
ends it, with an anomaly; neither means the stream was interrupted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)
from ._base import Adapter, error_detail, lost_event, round_end

_ENDINGS: dict[str, RoundEnd] = {
    "tool_calls": RoundEnd.NORMAL,
    "stop": RoundEnd.NORMAL,  # also for forced tool_choice (vllm#25054, Q12)
    "function_call": RoundEnd.NORMAL,  # the legacy functions API
    "eos": RoundEnd.NORMAL,  # llama.cpp / TGI style servers
    "eos_token": RoundEnd.NORMAL,
    "length": RoundEnd.TRUNCATED,
    "max_tokens": RoundEnd.TRUNCATED,  # some compatible gateways pass Anthropic's reason on
    "content_filter": RoundEnd.INTERRUPTED,
}
"""``finish_reason`` -> ending; anything else is untrusted (see ``round_end``)."""


class _Slot:
    __slots__ = ("call_id", "index", "key", "name", "position", "settled")

    def __init__(self, key: CallKey, index: int | None, position: int) -> None:
        self.key = key
        self.index = index  # the tool-call index it was first seen at, if any
        self.position = position  # its order in the choice (CallSettled events keep it)
        self.call_id: str | None = None
        self.name: str | None = None
        # True once a CallSettled went out for it and nothing reached it since (see _open)
        self.settled = False


def _position(slot: _Slot) -> int:
    return slot.position


class _ChoiceCalls:
    """The resolver for one choice (see the module docstring)."""

    __slots__ = (
        "by_id",
        "by_index",
        "count",
        "last",
        "parts",
        "reasoning",
        "slots",
        "unsettled",
    )

    def __init__(self) -> None:
        self.by_index: dict[int, _Slot] = {}
        self.by_id: dict[str, _Slot] = {}
        self.last: _Slot | None = None
        self.count = 0
        self.parts: set[int | str] = set()
        self.slots: list[_Slot] = []
        # the slots not settled since they last changed (opened, or reached by a chunk)
        self.unsettled: list[_Slot] = []
        self.reasoning: list[str] = []


class OpenAIChatAdapter(Adapter):
    """Adapter for ``POST /v1/chat/completions`` with ``stream: true``."""

    provider = "openai_chat"

    def __init__(self, *, attempt: int = 0) -> None:
        super().__init__(attempt=attempt)
        self._choices: dict[int, _ChoiceCalls] = {}
        self._ended: set[int] = set()
        self._saw_done = False
        self._object_args: set[CallKey] = set()
        self._extras: set[CallKey] = set()

    # -- chunks -------------------------------------------------------------------------------

    def _feed(self, event: Mapping[str, Any], sse_event: str | None = None) -> list[StreamEvent]:
        if self._saw_done:
            # Nothing after [DONE] is trusted; a tool-call delta in it still reaches its call,
            # which it fails (a fragment for a call that can no longer grow: see _after_end).
            late: list[StreamEvent] = [
                Anomaly(kind=AnomalyKind.EVENT_AFTER_END, detail="chunk after [DONE]")
            ]
            self._choices_events(event.get("choices"), late)
            return late
        if "error" in event and not event.get("choices"):
            return [StreamFailed(detail=error_detail(event))]
        out: list[StreamEvent] = []
        # Q21: Azure content-filter results (empty "object") and usage-only chunks have no
        # choices; openai-python's _is_valid_chat_completion_chunk_weak skips them too.
        self._choices_events(event.get("choices"), out)
        usage = event.get("usage")
        if isinstance(usage, dict) and usage:
            out.append(UsageReported(usage=usage))
        elif "choices" in event and event["choices"] is None:
            out.append(lost_event("choices is null"))
        return out

    def _continuation(
        self, event: dict[str, Any], sse_event: str | None
    ) -> tuple[CallKey, str] | None:
        """The bulk of every stream: one argument fragment of a call already open at its
        index, with nothing else in the chunk (see :meth:`Adapter._continuation`)."""
        choices = event.get("choices")
        if type(choices) is not list or len(choices) != 1 or event.get("usage"):
            return None
        choice = choices[0]
        delta = choice.get("delta") if type(choice) is dict else None
        if type(delta) is not dict or "tool_calls" not in delta:
            return None  # (text, the other bulk of a stream: no exception raised for it)
        try:
            (entry,) = delta["tool_calls"]
            function = entry["function"]
            args = function["arguments"]
            index = entry["index"]
            calls = self._choices[choice["index"]]
            slot = calls.by_index[index]
        except (KeyError, TypeError, ValueError):
            return None
        if (
            type(args) is not str
            or not args
            or type(index) is not int
            or choice.get("finish_reason")
            or self._saw_done
            or (self._ended and slot.key.choice in self._ended)
        ):
            return None
        # OpenAI's own continuation is exactly {"tool_calls": [{"index", "function":
        # {"arguments"}}]}: three sizes rule out every optional field below at once.
        if (len(delta) != 1 or len(entry) != 2 or len(function) != 1) and (
            entry.get("id")
            or function.get("name")
            or "extra_content" in entry
            or delta.get("content")
            or delta.get("reasoning_content")
            or delta.get("reasoning")
        ):
            return None
        calls.last = slot
        if slot.settled:
            slot.settled = False
            calls.unsettled.append(slot)
        return slot.key, args

    def _choices_events(self, choices: object, out: list[StreamEvent]) -> None:
        """Rule "unreadable_is_lost": a member the chunk has but that cannot be read (a
        ``choices`` that is not a list, a choice or tool-call entry that is not an object, an
        index, ``delta``, ``tool_calls`` or ``function`` of the wrong type) may have carried a
        fragment of any call: a lost event. ``null`` is read as "not sent" where the official
        SDK's objects dump an unset member as ``None`` (``tool_calls``, ``function``); the
        chunk's ``choices`` and a choice's ``delta`` are required members, so their ``null``
        is unreadable (except ``choices`` beside a usage report: a usage-only chunk)."""
        if choices is None:
            return
        if not isinstance(choices, list):
            out.append(lost_event(f"choices is {type(choices).__name__}, not a list"))
            return
        for choice in choices:
            if isinstance(choice, dict):
                self._choice_events(choice, out)
            else:
                out.append(lost_event(f"a choice is {type(choice).__name__}, not an object"))

    def _choice_events(self, choice: Mapping[str, Any], out: list[StreamEvent]) -> None:
        index = choice.get("index", 0)
        delta = choice.get("delta")
        if type(index) is not int or not (
            isinstance(delta, dict) or (delta is None and "delta" not in choice)
        ):
            out.append(lost_event("a choice's index or delta cannot be read"))
            return
        calls = self._choices.get(index)
        if calls is None:
            calls = self._choices[index] = _ChoiceCalls()
        if isinstance(delta, dict):
            if index in self._ended or self._saw_done:
                self._after_end(index, calls, delta, out)
            else:
                self._delta_events(index, calls, delta, out)
        reason = choice.get("finish_reason")
        if reason and index not in self._ended:
            self._end_choice(index, calls, str(reason), out)

    def _after_end(
        self, index: int, calls: _ChoiceCalls, delta: Mapping[str, Any], out: list[StreamEvent]
    ) -> None:
        """A delta after its choice ended: text and reasoning are dropped; a tool-call entry
        still goes to its call, which is closed, so the assembler fails it (a fragment after
        the end, ``fragment_after_close``), or opens a call that is never closed (it fails at
        the round end). Either way no call commits with the text before the late fragment."""
        tool_calls = delta.get("tool_calls")
        if not tool_calls:
            return
        out.append(
            Anomaly(
                kind=AnomalyKind.EVENT_AFTER_END,
                detail="tool-call delta after the choice's finish_reason",
            )
        )
        self._tool_calls_events(index, calls, tool_calls, out)

    def _tool_calls_events(
        self, index: int, calls: _ChoiceCalls, tool_calls: object, out: list[StreamEvent]
    ) -> None:
        if not isinstance(tool_calls, list):
            out.append(lost_event("tool_calls is not a list"))
            return
        for entry in tool_calls:
            if isinstance(entry, dict):
                self._tool_call_events(index, calls, entry, out)
            else:
                out.append(lost_event("a tool_calls entry is not an object"))

    def _delta_events(
        self, index: int, calls: _ChoiceCalls, delta: Mapping[str, Any], out: list[StreamEvent]
    ) -> None:
        content = delta.get("content")
        if content and isinstance(content, str):
            out.append(TextDelta(choice=index, text=content))
        # DeepSeek/xAI/Groq reasoning text: kept for history, never executed.
        for field in ("reasoning_content", "reasoning"):
            thought = delta.get(field)
            if thought and isinstance(thought, str):
                calls.reasoning.append(thought)
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None and tool_calls != []:
            self._tool_calls_events(index, calls, tool_calls, out)

    def _tool_call_events(
        self, index: int, calls: _ChoiceCalls, entry: Mapping[str, Any], out: list[StreamEvent]
    ) -> None:
        function = entry.get("function")
        tc_index = entry.get("index")
        if function is None:
            function = {}
        elif not isinstance(function, dict) or (
            tc_index is not None and _index_of(tc_index) is None
        ):
            out.append(lost_event("a tool call's function or index cannot be read"))
            return
        call_id = entry.get("id") or None  # Q3/Q4: "" on continuations means "not sent"
        name = function.get("name") or None  # Q6: SGLang sends name "" on continuations
        if call_id is not None and not isinstance(call_id, str):
            call_id = str(call_id)
        if name is not None and not isinstance(name, str):
            name = None
        if call_id is None and name is None and function.get("arguments") is None:
            # An entry that carries nothing (its function or arguments null or missing) is
            # where a fragment was: a lost event (an SDK dump keeps a real continuation's
            # arguments string).
            out.append(lost_event("a tool-call entry carries no id, name or arguments"))
            return
        slot = self._resolve(index, calls, _index_of(tc_index), call_id, name, out)
        if slot.settled:  # its text or identity may change: the next opening settles it again
            slot.settled = False
            calls.unsettled.append(slot)
        extra = entry.get("extra_content")
        if extra and isinstance(extra, dict) and slot.key not in self._extras:
            # Q20 (open-webui/computer#224): Gemini's OpenAI-compatible endpoint puts the
            # thought signature in tool_calls[].extra_content; it must go back in history.
            self._extras.add(slot.key)
            out.append(
                ReasoningBlock(
                    choice=index,
                    block=extra_block(slot.key),
                    data={"extra_content": extra},
                    call=slot.key,
                )
            )
        args = function.get("arguments")
        if isinstance(args, str):
            if args:
                out.append(ArgsDelta(key=slot.key, fragment=args))
        elif args is not None:
            out.extend(self._object_arguments(slot.key, args))

    def _resolve(
        self,
        index: int,
        calls: _ChoiceCalls,
        tc_index: int | None,
        call_id: str | None,
        name: str | None,
        out: list[StreamEvent],
    ) -> _Slot:
        slot: _Slot | None = None
        if call_id is not None:
            slot = calls.by_id.get(call_id)
            if slot is not None and tc_index is not None and slot.index not in (None, tc_index):
                slot = None  # a present index wins: a known id at another index is a new call
            if slot is None:
                at = calls.by_index.get(tc_index) if tc_index is not None else calls.last
                if at is not None and at.call_id is None:
                    slot = at  # the open call learns its id (ids after arguments, Kimi)
        elif tc_index is not None:
            slot = calls.by_index.get(tc_index)
            if slot is None and calls.last is not None and calls.last.index is None:
                slot = calls.last  # the call opened without an index learns it (as ids do)
        else:
            slot = calls.last  # Q1: no index and no id: "the open call"
            if slot is not None and name and slot.name and name != slot.name:
                slot = None  # an id-less call with a different name is a new call
        if slot is None:
            return self._open(index, calls, tc_index, call_id, name, out)
        calls.last = slot
        if tc_index is not None:
            calls.by_index[tc_index] = slot
            if slot.index is None:
                slot.index = tc_index
        new_id = call_id if call_id is not None and slot.call_id is None else None
        new_name = name if name is not None and name != slot.name else None
        if new_id is not None or new_name is not None:
            if new_id is not None:
                slot.call_id = new_id
                calls.by_id.setdefault(new_id, slot)
            if new_name is not None and slot.name is None:
                slot.name = new_name
            out.append(CallIdentified(key=slot.key, call_id=new_id, name=new_name))
        return slot

    def _open(
        self,
        index: int,
        calls: _ChoiceCalls,
        tc_index: int | None,
        call_id: str | None,
        name: str | None,
        out: list[StreamEvent],
    ) -> _Slot:
        part: int | str = tc_index if tc_index is not None else calls.count
        if part in calls.parts:
            part = f"#{calls.count}"  # Q2: a second call on a reused index gets its own key
        calls.parts.add(part)
        slot = _Slot(CallKey(self.attempt, index, part), tc_index, calls.count)
        slot.call_id, slot.name = call_id, name
        # Rule "later_index_settles": chat has no per-call close; a call opening is the
        # provider moving on from the earlier ones (the assembler settles one only if its
        # text is already one complete strict object; see CallSettled). An earlier call
        # that was settled by an opening before and that no chunk reached since would be
        # settled again with the same text and identity, which decides nothing new: only
        # the calls changed since go out, in call order, so that N calls cost O(N) events
        # (every earlier call at every opening was N**2 / 2 events: issue 28, R8).
        earlier = calls.unsettled
        if earlier:
            if len(earlier) > 1:
                earlier.sort(key=_position)
            for done in earlier:
                done.settled = True
                out.append(CallSettled(key=done.key))
        calls.unsettled = [slot]
        calls.count += 1
        calls.slots.append(slot)
        calls.last = slot
        if tc_index is not None:
            calls.by_index[tc_index] = slot
        if call_id is not None:
            calls.by_id.setdefault(call_id, slot)  # (a second call with it fails in the assembler)
        out.append(CallOpened(key=slot.key, call_id=call_id, name=name))
        return slot

    def _object_arguments(self, key: CallKey, args: object) -> list[StreamEvent]:
        """Rule "object_arguments": arguments sent as a JSON object are the call's whole
        text, serialized once; any other JSON value (a list, a number) cannot be arguments."""
        if not isinstance(args, dict):
            return [
                Anomaly(
                    kind=AnomalyKind.INVALID_PAYLOAD,
                    key=key,
                    detail=f"arguments arrived as a {type(args).__name__}, not a string",
                    fails_call=True,
                )
            ]
        try:
            text = json.dumps(args, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (ValueError, RecursionError):
            # (orjson decoded the event, so NaN/inf cannot be in it; a dict fed directly can)
            return [
                Anomaly(
                    kind=AnomalyKind.OBJECT_ARGUMENTS,
                    key=key,
                    detail="arguments arrived as a JSON value that cannot be written as JSON",
                    fails_call=True,
                )
            ]
        events: list[StreamEvent] = [
            *self._duplicate_key_anomaly(key),
            ArgsDelta(key=key, fragment=text, whole=True),
        ]
        if key not in self._object_args:
            self._object_args.add(key)
            events.insert(
                0,
                Anomaly(
                    kind=AnomalyKind.OBJECT_ARGUMENTS,
                    key=key,
                    detail="arguments arrived as a JSON value, not a string; serialized once",
                ),
            )
        return events

    # -- ends -----------------------------------------------------------------------------------

    def _end_choice(
        self, index: int, calls: _ChoiceCalls, reason: str | None, out: list[StreamEvent]
    ) -> None:
        self._ended.add(index)
        for slot in calls.slots:
            if slot.call_id is None:
                out.extend(self._synthesize_id(slot))
            # Chat has no per-call close: the choice's end closes every call of it.
            out.append(CallClosed(key=slot.key))
        if calls.reasoning:
            out.append(
                ReasoningBlock(
                    choice=index,
                    block="reasoning",
                    data={"reasoning_content": "".join(calls.reasoning)},
                )
            )
            calls.reasoning = []
        if reason is None:  # [DONE] alone: a normal end, recorded as an anomaly by _done
            out.append(RoundEnded(choice=index, ending=RoundEnd.NORMAL, stop_reason=None))
            return
        out.extend(round_end(reason, _ENDINGS, "finish_reason", choice=index))

    def _synthesize_id(self, slot: _Slot) -> list[StreamEvent]:
        # Ollama and Gemini's OpenAI-compatible endpoint send no (or "") ids; dropping such
        # calls silently is litellm#11262. The made-up id is stable: attempt, choice, order.
        key = slot.key
        slot.call_id = f"toollatch_{key.attempt}_{key.choice}_{key.part}"
        return [
            Anomaly(
                kind=AnomalyKind.SYNTHESIZED_ID,
                key=key,
                detail=f"the provider sent no call id; using {slot.call_id!r}",
            ),
            CallIdentified(key=key, call_id=slot.call_id),
        ]

    def _done(self) -> list[StreamEvent]:
        if self._saw_done:
            return [Anomaly(kind=AnomalyKind.EVENT_AFTER_END, detail="a second [DONE]")]
        self._saw_done = True
        out: list[StreamEvent] = []
        for index in sorted(set(self._choices) | {0}):
            if index not in self._ended:
                out.append(
                    Anomaly(
                        kind=AnomalyKind.DONE_WITHOUT_FINISH_REASON,
                        detail="[DONE] arrived without a finish_reason; ended normally",
                    )
                )
                self._end_choice(index, self._choices.get(index) or _ChoiceCalls(), None, out)
        return out

    def _finish(self) -> list[StreamEvent]:
        if self._saw_done or (self._choices and set(self._choices) <= self._ended):
            return []
        return [StreamFailed(detail="the stream ended without a finish_reason or [DONE]")]


def extra_block(key: CallKey) -> str:
    """Block name of the ``extra_content`` kept for the call at ``key`` (see Q20)."""
    return f"extra_content:{key.part}"


def _index_of(value: object) -> int | None:
    """A tool-call ``index`` as an int; ``"0"`` counts (langchain#38456), junk does not."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
