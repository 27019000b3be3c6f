"""The gate's quick schema check (core/_quick_schema.py): it only ever answers "certainly
valid" where jsonschema finds no error, and it answers so for the flat schemas ``@tool``
writes, so that the common call skips jsonschema's walk."""

from __future__ import annotations

import itertools
import json
from typing import Any

import jsonschema
import pytest

from toollatch import ToolSpec, tool
from toollatch.core._events import CallKey
from toollatch.core._gate import CommittedCall
from toollatch.core._quick_schema import quick_check
from toollatch.core._specs import surely_valid
from toollatch.stages import Gate

FLAT: list[dict[str, Any]] = [
    {"type": "object"},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {
        "type": "object",
        "properties": {"q": {"type": "string"}, "n": {"type": "integer", "default": 5}},
        "required": ["q"],
    },
    {
        "type": "object",
        "title": "args",
        "properties": {
            "x": {"type": "number", "description": "a number"},
            "b": {"type": "boolean"},
            "z": {"type": "null"},
            "l": {"type": "array"},
            "o": {"type": "object"},
            "a": {},
        },
        "required": ["x", "b"],
        "additionalProperties": False,
    },
]
VALUES: list[Any] = ["s", "", 0, 1, -7, 2**70, 1.0, 1.5, True, False, None, [], [1], {}, {"k": 1}]
NAMES = ["q", "n", "x", "b", "z", "l", "o", "a", "other"]


def argument_sets() -> list[Any]:
    sets: list[Any] = [[], "x", 3, None]  # not objects
    for a, b in itertools.product(NAMES, NAMES):
        for va, vb in itertools.product(VALUES, VALUES[::4]):
            sets.append({a: va, b: vb})
    for name, value in itertools.product(NAMES, VALUES):
        sets.append({name: value})
    sets.append({})
    return sets


@pytest.mark.parametrize("schema", FLAT)
def test_quick_true_only_where_jsonschema_finds_no_error(schema: dict[str, Any]) -> None:
    quick = quick_check(schema)
    assert quick is not None, "a flat object schema gets a quick check"
    validator = jsonschema.Draft202012Validator(schema)
    said_yes = 0
    for args in argument_sets():
        if quick(args):
            said_yes += 1
            assert validator.is_valid(args), (schema, args)
    assert said_yes > 0  # (it does answer, not only "not sure")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"q": {"type": "string", "minLength": 2}}},
        {"type": "object", "properties": {"q": {"type": ["string", "null"]}}},
        {"type": "object", "properties": {"q": {"$ref": "#/$defs/q"}}, "$defs": {"q": {}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"q": {"enum": ["a"]}}},
        {"type": "array"},
        {"properties": {"q": {"type": "string"}}},
    ],
)
def test_other_schemas_are_left_to_jsonschema(schema: dict[str, Any]) -> None:
    assert quick_check(schema) is None


def test_tool_schema_takes_the_quick_check() -> None:
    async def lookup(query: str, limit: int = 5) -> str:
        """Look something up."""
        return query

    spec = tool(name="lookup")(lookup).spec
    assert surely_valid(spec, {"query": "a", "limit": 5})
    assert not surely_valid(spec, {"query": "a", "limit": 5.0})  # (jsonschema decides)
    assert not surely_valid(spec, {"limit": 5})
    # a $schema names another draft: jsonschema alone
    other = ToolSpec(
        name="t",
        parameters={"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
    )
    assert not surely_valid(other, {})


@pytest.mark.parametrize("schema", FLAT)
def test_gate_verdicts_unchanged(schema: dict[str, Any]) -> None:
    """Through the gate, every verdict and detail is what jsonschema alone gives: the same
    schema with a ``$comment`` (a keyword the quick check leaves to jsonschema) decides
    alike."""
    quick_gate = Gate([{"name": "t", "parameters": schema}])
    slow_gate = Gate([{"name": "t", "parameters": {**schema, "$comment": "no quick check"}}])
    assert quick_check({**schema, "$comment": "x"}) is None
    key = CallKey(attempt=0, choice=0, part=0)
    accepted = 0
    for args in argument_sets():
        text = json.dumps(args)
        verdicts = [
            gate.check(key=key, position=0, call_id="c", name="t", text=text)
            for gate in (quick_gate, slow_gate)
        ]
        if isinstance(verdicts[0], CommittedCall):
            assert isinstance(verdicts[1], CommittedCall), text
            assert verdicts[0].arguments == verdicts[1].arguments, text
        else:
            assert verdicts[0] == verdicts[1], text
        accepted += isinstance(verdicts[0], CommittedCall)
    assert accepted > 0
