"""Scripted server script format: loading from plain data / JSON, typed errors, turn choice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toollatch import ConfigError
from toollatch.scripted import DONE_TURN, Call, Faults, Reasoning, Script, Text, Turn, demo_script

SCRIPT = {
    "turns": [
        {
            "items": [
                {"reasoning": "think"},
                {"text": "Hi", "chunk_chars": 1},
                {"call_id": "c1", "name": "f", "arguments": {"a": "ü"}, "fragment_chars": 2},
                {"call_id": "c2", "name": "g", "arguments": '{"broken'},
            ],
            "stop": "max_tokens",
            "delay_ms": 0,
            "faults": {"status": 429, "status_attempts": 2, "retry_after_s": 1},
        },
    ]
}


def test_a_script_loads_from_plain_data_and_json() -> None:
    data: dict[str, Any] = {"turns": [SCRIPT["turns"][0], {"items": []}]}
    script = Script.from_dict(data)
    assert script == Script.from_json(json.dumps(data))
    first = script.turns[0]
    assert first.items == (
        Reasoning(text="think"),
        Text(text="Hi", chunk_chars=1),
        Call(call_id="c1", name="f", arguments='{"a":"ü"}', fragment_chars=2),
        Call(call_id="c2", name="g", arguments='{"broken'),
    )
    assert first.stop == "max_tokens" and first.delay_ms == 0
    assert first.faults == Faults(status=429, status_attempts=2, retry_after_s=1)
    assert Script.from_dict([{"items": [{"text": "x"}]}]).turns[0].items == (Text(text="x"),)


def test_the_turn_is_the_number_of_assistant_turns_and_done_past_the_end() -> None:
    script = demo_script()
    assert [script.turn(n) for n in range(3)] == list(script.turns)
    assert script.turn(3) is DONE_TURN and script.turn(99) is DONE_TURN
    assert DONE_TURN.items == (Text(text="done"),) and DONE_TURN.stop == "normal"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"turns": "x"}, "turns must be a list"),
        ({"turns": [], "extra": 1}, "unknown key"),
        ({"turns": [{"items": [{"text": 3}]}]}, "text must be a string"),
        ({"turns": [{"items": [{"text": "x", "chunk_chars": 0}]}]}, "must be >= 1"),
        ({"turns": [{"items": [{"name": "f"}]}]}, "call_id must be a string"),
        ({"turns": [{"items": [{"call_id": "", "name": "f"}]}]}, "non-empty call_id"),
        ({"turns": [{"items": [], "stop": "maybe"}]}, "turn.stop"),
        ({"turns": [{"items": [{"text": "x"}], "stop": "max_tokens"}]}, "needs a call"),
        ({"turns": [{"items": [], "delay_ms": -1}]}, ">= 0"),
        ({"turns": [{"items": [], "delay_ms": "fast"}]}, "must be a number"),
        ({"turns": [{"items": [], "faults": {"status": 200}}]}, "HTTP error status"),
        ({"turns": [{"items": [], "faults": {"status": "429"}}]}, "must be a number"),
        ({"turns": [{"items": [], "faults": {"drop": 1}}]}, "unknown key"),
        ({"turns": [{"items": [], "faults": {"drop_after_events": -1}}]}, ">= 0"),
        ({"turns": [{"items": [], "faults": {"status_attempts": 0}}]}, ">= 1"),
        ({"turns": [{"items": ["x"]}]}, "must be an object"),
        (
            {
                "turns": [
                    {"items": [{"call_id": "a", "name": "f"}]},
                    {"items": [{"call_id": "a", "name": "g"}]},
                ]
            },
            "used twice",
        ),
    ],
)
def test_bad_scripts_raise_config_error(data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Script.from_dict(data)


def test_invalid_json_text_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        Script.from_json("{turns: ")


def test_dataclasses_are_frozen() -> None:
    turn = Turn(items=())
    with pytest.raises(AttributeError):
        turn.stop = "max_tokens"  # type: ignore[misc]
