"""The script format of the scripted model server: what the model answers, turn by turn.

A :class:`Script` is a list of :class:`Turn`; a turn is what the model answers for one request.
The turn a request gets is the number of assistant turns already in its history (so the server
is stateless: a retried request gets the same turn again). Past the last turn the model answers
:data:`DONE_TURN` (plain text ``"done"``, normal stop).

Scripts load from plain data (``Script.from_dict(json.loads(text))``); bad data raises
:class:`toollatch.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core._errors import ConfigError

Stop = Literal["normal", "max_tokens"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Text:
    """Assistant text, streamed in pieces of ``chunk_chars`` characters."""

    text: str
    """The whole text."""
    chunk_chars: int = 12
    """Characters per delta event (>= 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One tool call. ``arguments`` is JSON *text* sent as is: it may be deliberately invalid
    or oversized (Gemini, which sends arguments as an object, sends text that is not a JSON
    object as a JSON string instead)."""

    call_id: str
    """The provider's call id (``tool_use`` id, ``call_id``...); unique inside a script
    unless it sets ``reuse_ids``."""
    name: str
    """The tool name."""
    arguments: str
    """The argument text, exactly as streamed."""
    fragment_chars: int = 6
    """Characters per argument fragment (>= 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reasoning:
    """A reasoning block (Anthropic thinking with a signature, a Responses reasoning item with
    a summary, a chat ``reasoning_content`` delta, a Gemini thought part)."""

    text: str
    """The reasoning text (a summary for OpenAI Responses)."""


Item = Text | Call | Reasoning


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    """Deliberate misbehaviour for one turn; every field is off by default."""

    status: int | None = None
    """Answer this HTTP status (e.g. 429, 500) instead of a stream ..."""
    status_attempts: int = 1
    """... for the first ``status_attempts`` requests that get this turn (a server-side
    counter per script and turn)."""
    retry_after_s: int | None = None
    """``Retry-After`` seconds sent with the status (none when ``None``)."""
    drop_after_events: int | None = None
    """Close the connection after this many events, without a terminal event."""
    stall_ms: float = 0.0
    """Stop sending for this long (scaled by the server's ``delay_scale``) ..."""
    stall_after_events: int | None = None
    """... after this many events; ``None``: after the first argument fragment."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """What the model answers for one request: items in stream order, then a stop.

    ``stop="max_tokens"`` cuts the last call mid-arguments (half its text) and sends the
    provider's truncation stop reason (``length``, ``max_output_tokens``, ``max_tokens``,
    ``MAX_TOKENS``; Gemini, whose calls arrive whole, leaves the cut call out).
    """

    items: tuple[Item, ...]
    """Text, calls and reasoning, in stream order."""
    stop: Stop = "normal"
    """``normal``, or ``max_tokens`` truncation."""
    delay_ms: float = 3.0
    """Pause before the first byte and between events (scaled by ``delay_scale``)."""
    faults: Faults = field(default_factory=Faults)
    """Deliberate misbehaviour (off by default)."""

    @property
    def calls(self) -> tuple[Call, ...]:
        """The turn's calls in order."""
        return tuple(i for i in self.items if isinstance(i, Call))

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Turn:
        """A turn from plain data: ``{"items": [{"text": ...} | {"call_id", "name",
        "arguments"} | {"reasoning": ...}], "stop"?, "delay_ms"?, "faults"?: {...}}``;
        ``arguments`` may be an object (sent as its compact JSON). Raises ConfigError."""
        _keys(data, {"items", "stop", "delay_ms", "faults"}, "turn")
        items = tuple(_item(i) for i in _seq(data.get("items", []), "turn.items"))
        faults = _faults(_map(data.get("faults", {}), "turn.faults"))
        turn = Turn(
            items=items,
            stop=data.get("stop", "normal"),
            delay_ms=_num(data.get("delay_ms", 3.0), "turn.delay_ms"),
            faults=faults,
        )
        _check_turn(turn)
        return turn


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """A scripted conversation: the model's answer to the 1st, 2nd, ... request."""

    turns: tuple[Turn, ...]
    """The turns in order."""
    reuse_ids: bool = False
    """A deliberately buggy model: call ids may repeat, inside a turn (two calls of one
    response with one id) or across turns (servers that number ids per response)."""

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for turn in self.turns:
            _check_turn(turn)
            for call in turn.calls:
                if call.call_id in seen and not self.reuse_ids:
                    raise ConfigError(f"call id {call.call_id!r} is used twice in the script")
                seen.add(call.call_id)

    def turn(self, assistant_turns: int) -> Turn:
        """The turn for a request whose history holds ``assistant_turns`` assistant turns."""
        if 0 <= assistant_turns < len(self.turns):
            return self.turns[assistant_turns]
        return DONE_TURN

    @staticmethod
    def from_dict(data: Mapping[str, Any] | Sequence[Any]) -> Script:
        """A script from ``{"turns": [...], "reuse_ids"?: bool}`` or a bare list of turns
        (see :meth:`Turn.from_dict`). Raises ConfigError for anything else."""
        reuse = False
        if isinstance(data, Mapping):
            _keys(data, {"turns", "reuse_ids"}, "script")
            reuse = data.get("reuse_ids", False)
            if not isinstance(reuse, bool):
                raise ConfigError(f"script.reuse_ids must be true or false, not {reuse!r}")
            data = data.get("turns", [])
        turns = tuple(Turn.from_dict(_map(t, "turn")) for t in _seq(data, "turns"))
        return Script(turns=turns, reuse_ids=reuse)

    @staticmethod
    def from_json(text: str) -> Script:
        """A script from JSON text. Raises ConfigError for invalid JSON or a bad script."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"script is not valid JSON: {exc}") from None
        return Script.from_dict(data)


DONE_TURN = Turn(items=(Text(text="done"),), delay_ms=0.0)
"""What the model answers past the last turn of a script."""


def _check_turn(turn: Turn) -> None:
    if turn.stop not in ("normal", "max_tokens"):
        raise ConfigError(f"turn.stop must be 'normal' or 'max_tokens', not {turn.stop!r}")
    if turn.delay_ms < 0 or turn.faults.stall_ms < 0:
        raise ConfigError("turn.delay_ms and faults.stall_ms must be >= 0")
    if turn.stop == "max_tokens" and not turn.calls:
        raise ConfigError("a max_tokens turn needs a call to cut")
    f = turn.faults
    if f.status is not None and not 400 <= f.status <= 599:
        raise ConfigError(f"faults.status must be an HTTP error status, not {f.status}")
    if f.status_attempts < 1:
        raise ConfigError("faults.status_attempts must be >= 1")
    for name in ("drop_after_events", "stall_after_events", "retry_after_s"):
        value = getattr(f, name)
        if value is not None and value < 0:
            raise ConfigError(f"faults.{name} must be >= 0")
    for item in turn.items:
        size = item.chunk_chars if isinstance(item, Text) else getattr(item, "fragment_chars", 1)
        if size < 1:
            raise ConfigError("chunk_chars and fragment_chars must be >= 1")
        if isinstance(item, Call) and not (item.call_id and item.name):
            raise ConfigError("a call needs a non-empty call_id and name")


def _item(raw: Any) -> Item:
    data = _map(raw, "turn item")
    if "text" in data:
        _keys(data, {"text", "chunk_chars"}, "text item")
        return Text(text=_str(data["text"], "text"), chunk_chars=data.get("chunk_chars", 12))
    if "reasoning" in data:
        _keys(data, {"reasoning"}, "reasoning item")
        return Reasoning(text=_str(data["reasoning"], "reasoning"))
    _keys(data, {"call_id", "name", "arguments", "fragment_chars"}, "call item")
    args = data.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    return Call(
        call_id=_str(data.get("call_id"), "call_id"),
        name=_str(data.get("name"), "name"),
        arguments=args,
        fragment_chars=data.get("fragment_chars", 6),
    )


def _faults(data: Mapping[str, Any]) -> Faults:
    names = {"status", "status_attempts", "retry_after_s", "drop_after_events", "stall_ms"}
    _keys(data, names | {"stall_after_events"}, "faults")
    for key, value in data.items():
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise ConfigError(f"faults.{key} must be a number, not {value!r}")
    return Faults(**data)


def _keys(data: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"unknown key(s) in {what}: {sorted(unknown)}")


def _map(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what} must be an object, not {type(value).__name__}")
    return value


def _seq(value: Any, what: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{what} must be a list, not {type(value).__name__}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, not {type(value).__name__}")
    return value


def _num(value: Any, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{what} must be a number, not {value!r}")
    return float(value)


def demo_script() -> Script:
    """The default demo (model ``"scripted"``): text and two parallel ``get_weather`` calls;
    text and one ``write_file`` call; a final text with a normal stop."""
    report = (
        "# Weather\n\n- Oslo: see the get_weather result\n- Zürich: see the get_weather result\n"
    )
    return Script(
        turns=(
            Turn(
                items=(
                    Text(text="Let me check the weather in both cities.", chunk_chars=8),
                    Call(
                        call_id="call_demo_weather_oslo",
                        name="get_weather",
                        arguments='{"city": "Oslo"}',
                        fragment_chars=5,
                    ),
                    Call(
                        call_id="call_demo_weather_zurich",
                        name="get_weather",
                        arguments='{"city": "Zürich", "unit": "c"}',
                        fragment_chars=5,
                    ),
                ),
            ),
            Turn(
                items=(
                    Text(text="I'll write that down in notes/weather.md.", chunk_chars=8),
                    Call(
                        call_id="call_demo_write_notes",
                        name="write_file",
                        arguments=json.dumps(
                            {"path": "notes/weather.md", "content": report}, ensure_ascii=False
                        ),
                        fragment_chars=9,
                    ),
                ),
            ),
            Turn(
                items=(
                    Text(
                        text="Done: the weather for Oslo and Zürich is in notes/weather.md.",
                        chunk_chars=8,
                    ),
                ),
            ),
        )
    )
