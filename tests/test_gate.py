"""The commit gate: strict parsing, registration, schema, policy, budget, the CommittedCall type."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toollatch import (
    Allow,
    CommittedCall,
    ConfigError,
    Deny,
    ErrorCode,
    Limits,
    RunBudget,
    ToolSpec,
    UsageError,
    load_tools,
)
from toollatch.core._gate import _Reject, strict_loads
from toollatch.stages import CallKey, Gate, Rejection

KEY = CallKey(0, 0, 0)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "pattern": "^[a-z]+\\.md$"},
                    "lines": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    },
    {"name": "noop", "input_schema": {"type": "object"}},
]


def check(text, gate=None, name="write_file", call_id="c1"):
    gate = gate or Gate(TOOLS)
    return gate.check(key=KEY, position=0, call_id=call_id, name=name, text=text)


def code(verdict):
    return verdict.code if isinstance(verdict, Rejection) else None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"path": "notes.md"}', None),
        ('  {"path": "notes.md"}\n', None),
        ('{"path": "notes.md"}{"path": "notes.md"}', ErrorCode.INVALID_JSON),  # vllm#51697
        ('{{"path": "notes.md"}', ErrorCode.INVALID_JSON),
        ('{"path": "notes.md"', ErrorCode.INVALID_JSON),  # truncated: never closed for us
        ('{"path": NaN}', ErrorCode.INVALID_JSON),
        ('{"path": Infinity}', ErrorCode.INVALID_JSON),
        ('{"path": -Infinity}', ErrorCode.INVALID_JSON),
        ('{"path": "a.md", "path": "b.md"}', ErrorCode.INVALID_JSON),
        ('{"path": "\\ud800.md"}', ErrorCode.INVALID_JSON),
        ('{"path": "\\udc00"}', ErrorCode.INVALID_JSON),
        ('{"path": "\ud800"}', ErrorCode.INVALID_JSON),  # a raw lone surrogate
        ('{"\\ud800": "a"}', ErrorCode.INVALID_JSON),  # in a key
        ('{"path": "a.md", "lines": [1, ["é", {"k": "\\udc00"}]]}', ErrorCode.INVALID_JSON),
        ('{"path": "a.md", "lines": [1, 2]}   ', None),
        ('{"path": "a.md"} x', ErrorCode.INVALID_JSON),
        ("   ", ErrorCode.SCHEMA_VIOLATION),  # blank means {}
        ('{"path": "a\tb.md"}', ErrorCode.INVALID_JSON),  # raw control character
        ("{'path': 'a.md'}", ErrorCode.INVALID_JSON),
        ('{"path": "a.md",}', ErrorCode.INVALID_JSON),
        ('{"path": 01}', ErrorCode.INVALID_JSON),
        ('["notes.md"]', ErrorCode.ARGUMENTS_NOT_OBJECT),
        ('"notes.md"', ErrorCode.ARGUMENTS_NOT_OBJECT),
        ("null", ErrorCode.ARGUMENTS_NOT_OBJECT),
        ("", ErrorCode.SCHEMA_VIOLATION),  # empty means {} -> "path" is required
        ('{"path": "Notes.MD"}', ErrorCode.SCHEMA_VIOLATION),
        ('{"path": "a.md", "mode": "w"}', ErrorCode.SCHEMA_VIOLATION),
        ('{"path": "a.md", "lines": [1, "2"]}', ErrorCode.SCHEMA_VIOLATION),
        ('{"path": "a.md", "lines": [1, 2]}', None),
    ],
)
def test_strict_parse_object_and_schema(text, expected):
    assert code(check(text)) is expected


@pytest.mark.parametrize(
    ("text", "ok"), [('"\\ud800"', False), ('"\ud800"', False), ('"é"', True), ("[[1]]", True)]
)
def test_strict_loads_checks_a_top_level_scalar_as_any_value(text, ok):
    # The strict parse also serves history rebuilding and wrapper expansion, where the text
    # need not be an object: a top-level string gets the same lone-surrogate check.
    if ok:
        assert strict_loads(text, max_depth=2) == json.loads(text)
    else:
        with pytest.raises(_Reject, match="lone surrogate"):
            strict_loads(text, max_depth=2)


def test_surrogate_pairs_are_fine():
    verdict = check('{"path": "\\ud83d\\ude00"}', name="noop")
    assert isinstance(verdict, CommittedCall) and verdict.arguments == {"path": "😀"}


def test_big_integer_over_the_digit_limit_is_invalid_not_a_crash():
    assert code(check('{"n": ' + "9" * 5000 + "}", name="noop")) is ErrorCode.INVALID_JSON


def test_depth_limit_and_pathological_depth():
    gate = Gate(TOOLS, limits=Limits(max_json_depth=3))
    assert code(check('{"a": [[1]]}', gate, name="noop")) is None
    assert code(check('{"a": [[[1]]]}', gate, name="noop")) is ErrorCode.DEPTH_EXCEEDED
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert code(check(deep, gate, name="noop")) is ErrorCode.DEPTH_EXCEEDED


def test_schema_detail_names_the_pointer_and_never_the_value():
    verdict = check('{"path": "SECRET-TOKEN-123.txt"}')
    assert isinstance(verdict, Rejection) and verdict.code is ErrorCode.SCHEMA_VIOLATION
    assert verdict.detail.startswith("/path: ") and "SECRET" not in verdict.detail
    verdict = check('{"path": "a.md", "lines": [1, "SECRET"]}')
    assert verdict.detail.startswith("/lines/1: ") and "SECRET" not in verdict.detail


def test_invalid_json_detail_never_quotes_the_text():
    verdict = check('{"path": "SECRET", oops}')
    assert "SECRET" not in verdict.detail and "offset" in verdict.detail


def test_identity_and_registration():
    assert code(check("{}", name=None)) is ErrorCode.MISSING_ID_OR_NAME
    assert code(check("{}", call_id="")) is ErrorCode.MISSING_ID_OR_NAME
    assert code(check("{}", name="rm_rf")) is ErrorCode.UNKNOWN_TOOL
    assert code(check("{}", gate=Gate(None), name="rm_rf")) is None  # no tools: no check


def test_policy_hook_allow_deny_and_fail_closed():
    def policy(name, args):
        if args.get("path") == "secret.md":
            return Deny("secrets are off limits")
        if args.get("path") == "boom.md":
            raise RuntimeError("bug in policy")
        return False if args.get("path") == "no.md" else Allow()

    gate = Gate(TOOLS, policy=policy)
    assert code(check('{"path": "ok.md"}', gate)) is None
    denied = check('{"path": "secret.md"}', gate)
    assert denied.code is ErrorCode.POLICY_DENIED and denied.detail == "secrets are off limits"
    assert check('{"path": "boom.md"}', gate).code is ErrorCode.POLICY_DENIED
    assert check('{"path": "no.md"}', gate).code is ErrorCode.POLICY_DENIED


def test_policy_sees_only_schema_valid_arguments():
    seen = []
    gate = Gate(TOOLS, policy=lambda name, args: seen.append(args))
    check('{"path": "BAD"}', gate)
    check('{"path": "ok.md"}', gate)
    assert seen == [{"path": "ok.md"}]


def test_run_budget_is_shared_and_spent_only_by_commits():
    budget = RunBudget(2)
    gate = Gate(TOOLS, budget=budget)
    assert code(check("{oops", gate)) is ErrorCode.INVALID_JSON
    assert [code(check('{"path": "a.md"}', gate)) for _ in range(3)] == [
        None,
        None,
        ErrorCode.BUDGET_EXCEEDED,
    ]
    assert budget.used == 2
    with pytest.raises(ConfigError):
        RunBudget(-1)


def test_committed_call_cannot_be_built_outside_the_gate():
    with pytest.raises(UsageError):
        CommittedCall(
            call_id="x", name="y", arguments={}, arguments_text="{}", key=KEY, position=0, spec=None
        )


def test_the_gate_sets_every_field_of_a_committed_call():
    """The gate writes CommittedCall's slots directly: a new field must be set there too."""
    gate = Gate(TOOLS)
    call = gate.check(key=KEY, position=3, call_id="c1", name="write_file", text='{"path": "a.md"}')
    assert isinstance(call, CommittedCall)
    got = {f.name: getattr(call, f.name) for f in dataclasses.fields(CommittedCall)}
    assert got == {
        "call_id": "c1",
        "name": "write_file",
        "arguments": {"path": "a.md"},
        "arguments_text": '{"path": "a.md"}',
        "key": KEY,
        "position": 3,
        "spec": gate.tools["write_file"],
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.name = "other"  # type: ignore[misc]


def test_tool_definitions_in_every_shape_and_bad_ones():
    specs = load_tools([*TOOLS, {"name": "bare", "parameters": {"type": "object"}}])
    assert [s.name for s in specs] == ["write_file", "noop", "bare"]
    with pytest.raises(ConfigError):
        load_tools([{"name": "x"}, {"name": "x"}])
    with pytest.raises(ConfigError):
        load_tools([{"parameters": {}}])
    with pytest.raises(ConfigError):
        ToolSpec(name="x", parameters={"type": "no-such-type"})
    with pytest.raises(ConfigError):
        ToolSpec(name="x", timeout_s=0)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), st.booleans())
def test_strict_parse_agrees_with_the_standard_parser_on_valid_json(obj, ascii_only):
    text = json.dumps(obj, ensure_ascii=ascii_only)
    verdict = check(text, gate=Gate(None, limits=Limits(max_json_depth=1000)), name="noop")
    assert isinstance(verdict, CommittedCall) and verdict.arguments == json.loads(text)


def test_a_schema_whose_dialect_is_not_a_string_is_a_config_error():
    for dialect in (5, {"a": 1}, ["x"]):
        with pytest.raises(ConfigError, match=r"\$schema"):
            ToolSpec(name="f", parameters={"$schema": dialect})


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/nope"},
        {"$ref": "https://example.invalid/s"},
        {"properties": {"a": {"$ref": "#/$defs/missing"}}},
    ],
)
def test_a_schema_reference_that_cannot_be_resolved_fails_the_call_not_the_stream(schema):
    gate = Gate([ToolSpec(name="f", parameters=schema)])
    verdict = gate.check(key=CallKey(0, 0, 0), position=0, call_id="a", name="f", text='{"a": 1}')
    assert isinstance(verdict, Rejection) and verdict.code is ErrorCode.SCHEMA_VIOLATION
    assert "could not be applied" in verdict.detail


def test_each_distinct_schema_is_checked_once_per_process(monkeypatch):
    import jsonschema

    checked = []
    real = jsonschema.Draft202012Validator.check_schema
    monkeypatch.setattr(
        jsonschema.Draft202012Validator,
        "check_schema",
        classmethod(lambda cls, schema: (checked.append(1), real(schema))[1]),
    )
    schema = {"type": "object", "properties": {"q": {"type": "string", "minLength": 7919}}}
    for _ in range(50):  # a gateway building its tools anew for every request
        tools = [
            {"name": "a", "parameters": json.loads(json.dumps(schema))},
            {"name": "b", "parameters": dict(reversed(list(schema.items())))},
        ]
        gate = Gate(tools)
        ok = gate.check(key=CallKey(0, 0, 0), position=0, call_id="c", name="b", text='{"q": 1}')
        assert isinstance(ok, Rejection) and ok.code is ErrorCode.SCHEMA_VIOLATION
    assert len(checked) == 1  # key order does not make a schema distinct
    for _ in range(3):  # a bad schema is refused every time, never cached as good
        with pytest.raises(ConfigError):
            Gate([{"name": "a", "parameters": {"type": "object", "minLength": -7919}}])
