"""Tools from Python functions: schema from hints and docstrings, refusals at decoration time,
coercion and error outcomes on invoke, and the built-in example tools."""

from __future__ import annotations

import asyncio
import datetime
import enum
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest

from toollatch import (
    CallState,
    ConfigError,
    ErrorCode,
    StreamParser,
    Tool,
    ToolOutcome,
    ToolSpec,
    UsageError,
    tool,
)
from toollatch.runtime import example_tools
from toollatch.tools._tools import parse_docstring


def committed_via_parser(spec: ToolSpec, arguments: str) -> CallState:
    """The state the real gate gives one call of ``spec`` with ``arguments``."""
    parser = StreamParser("openai_chat", tools=[spec])
    call = {"index": 0, "id": "c1", "function": {"name": spec.name, "arguments": arguments}}
    parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return parser.finish().calls[0].state


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(pydantic.BaseModel):
    x: int
    y: int = 0


@tool(eager=True, timeout=5, side_effects="read", group="geo", idempotent=True)
def locate(
    city: str,
    when: datetime.datetime,
    color: Color,
    at: Point,
    unit: Literal["c", "f"] = "c",
    json: int = 3,
) -> dict[str, Any]:
    """Locate a city.

    It is a test tool.

    Args:
        city: The city
            name, in full.
        when (datetime): The moment.
        color: A color.
        unit: The unit.

    Returns:
        Everything it was given.
    """
    return {"city": city, "when": when, "color": color, "at": at, "unit": unit, "json": json}


# -- the spec --------------------------------------------------------------------------------


def test_schema_from_hints_and_google_docstring():
    schema = locate.spec.parameters
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["city", "when", "color", "at"]
    props = schema["properties"]
    assert list(props) == ["city", "when", "color", "at", "unit", "json"]
    assert props["city"] == {"type": "string", "description": "The city name, in full."}
    assert props["when"]["format"] == "date-time"
    assert props["unit"] == {
        "enum": ["c", "f"],
        "type": "string",
        "default": "c",
        "description": "The unit.",
    }
    assert props["json"] == {"type": "integer", "default": 3}
    assert "title" not in schema
    assert locate.spec.description == "Locate a city.\n\nIt is a test tool."


def test_options_reach_the_tool_and_its_spec():
    assert isinstance(locate, Tool)
    assert (locate.name, locate.spec.name) == ("locate", "locate")
    assert locate.eager is True
    assert locate.spec.eager is True
    assert locate.timeout_s == 5.0
    assert locate.spec.timeout_s == 5.0
    assert (locate.side_effects, locate.group, locate.idempotent) == ("read", "geo", True)


def test_bare_decorator_defaults_are_the_safe_ones():
    @tool
    def touch(path: str) -> None:
        """Touch a file."""

    assert touch.side_effects == "write"
    assert (touch.eager, touch.timeout_s, touch.group, touch.idempotent) == (
        False,
        None,
        None,
        False,
    )
    assert touch.spec.description == "Touch a file."


def test_name_and_description_options_override():
    @tool(name="renamed", description="Custom.")
    def f(a: int) -> int:
        """Ignored."""
        return a

    assert (f.name, f.spec.name, f.spec.description) == ("renamed", "renamed", "Custom.")


def test_sphinx_param_docstring():
    @tool
    async def g(a: int, b: str = "x") -> None:
        """Do g.

        :param a: the a,
            continued.
        :param str b: the b.
        :returns: nothing.
        """

    props = g.spec.parameters["properties"]
    assert props["a"]["description"] == "the a, continued."
    assert props["b"]["description"] == "the b."
    assert g.spec.description == "Do g."


def test_parse_docstring_sections_do_not_leak_into_params():
    summary, params = parse_docstring(
        """Summary line.

        Args:
            a: first.
            b (int): second
                and more.

        Raises:
            ValueError: when bad.
        """
    )
    assert summary == "Summary line."
    assert params == {"a": "first.", "b": "second and more."}


def test_the_gate_accepts_the_schema_and_checks_calls_with_it():
    good = '{"city": "Oslo", "when": "2024-05-01T12:00:00Z", "color": "red", "at": {"x": 1}}'
    assert committed_via_parser(locate.spec, good) is CallState.COMMITTED
    extra = good[:-1] + ', "bogus": 1}'
    assert committed_via_parser(locate.spec, extra) is CallState.FAILED
    assert committed_via_parser(locate.spec, '{"city": "Oslo"}') is CallState.FAILED


def test_tool_is_callable_like_the_function():
    out = locate("Oslo", datetime.datetime(2024, 1, 1), Color.RED, Point(x=1))
    assert out["city"] == "Oslo"
    assert out["json"] == 3


# -- refused at decoration time --------------------------------------------------------------


class NotSchemable:
    pass


def _star_args(*args: int) -> None: ...
def _star_kwargs(**kwargs: int) -> None: ...
def _positional_only(a: int, /) -> None: ...
def _no_hint(a, b: int) -> None: ...  # type: ignore[no-untyped-def]
def _bad_hint(a: int, b: NotSchemable) -> None: ...
def _callable_hint(a: Callable[[int], int]) -> None: ...


@pytest.mark.parametrize(
    ("fn", "param"),
    [
        (_star_args, "args"),
        (_star_kwargs, "kwargs"),
        (_positional_only, "a"),
        (_no_hint, "a"),
        (_bad_hint, "b"),
        (_callable_hint, "a"),
    ],
)
def test_unusable_parameters_are_config_errors_naming_function_and_parameter(fn, param):
    with pytest.raises(ConfigError) as info:
        tool(fn)
    assert fn.__name__ in str(info.value)
    assert repr(param) in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"name": "has space"},
        {"name": ""},
        {"name": "x" * 65},
        {"side_effects": "maybe"},
        {"timeout": 0},
        {"timeout": -1},
        {"timeout": float("inf")},
        {"group": ""},
    ],
)
def test_bad_options_are_config_errors(options):
    def f(a: int) -> int:
        return a

    with pytest.raises(ConfigError, match="f"):
        tool(**options)(f)


def test_lambda_needs_a_name():
    with pytest.raises(ConfigError, match="<lambda>"):
        tool(lambda: None)
    assert tool(name="noop")(lambda: None).name == "noop"


# -- invoke ----------------------------------------------------------------------------------


async def test_invoke_coerces_into_the_parameter_types():
    seen: dict[str, Any] = {}

    @tool
    def f(when: datetime.datetime, color: Color, at: Point, n: float) -> str:
        seen.update(when=when, color=color, at=at, n=n)
        return "ok"

    outcome = await f.invoke(
        {"when": "2024-05-01T12:00:00Z", "color": "blue", "at": {"x": 2}, "n": 1}
    )
    assert outcome == ToolOutcome(content="ok")
    assert seen["when"] == datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC)
    assert seen["color"] is Color.BLUE
    assert seen["at"] == Point(x=2, y=0)
    assert seen["n"] == 1.0
    assert isinstance(seen["n"], float)


async def test_invoke_with_bad_arguments_is_a_schema_violation_without_the_values():
    outcome = await locate.invoke(
        {"city": "Oslo", "when": "SECRET-VALUE", "color": "green", "at": {"x": 1}}
    )
    assert outcome.is_error
    assert outcome.code is ErrorCode.SCHEMA_VIOLATION
    assert outcome.content.startswith("schema_violation: when: ")
    assert "color" in outcome.content
    assert "SECRET-VALUE" not in outcome.content
    assert "green" not in outcome.content
    assert "Traceback" not in outcome.content


async def test_hints_naming_classes_local_to_a_function_resolve():
    class Size(enum.Enum):  # local: a string annotation only the decorating frame can resolve
        S = "s"
        L = "l"

    @tool(side_effects="read")
    def pick(size: Size) -> str:
        return size.name

    @tool
    def pick_bare(size: Size) -> str:
        return size.name

    for t in (pick, pick_bare):
        assert t.spec.parameters["properties"]["size"] == {"$ref": "#/$defs/Size"}
        assert (await t.invoke({"size": "l"})).content == "L"


async def test_invoke_needs_a_mapping():
    with pytest.raises(UsageError, match="mapping"):
        await locate.invoke(["Oslo"])  # type: ignore[arg-type]


async def test_a_validator_of_the_tools_own_type_that_crashes_is_a_tool_error():
    class Picky(pydantic.BaseModel):
        v: int

        @pydantic.field_validator("v")
        @classmethod
        def crash(cls, v: int) -> int:
            raise KeyError("validator bug")

    @tool
    def f(p: Picky) -> None: ...

    outcome = await f.invoke({"p": {"v": 1}})
    assert outcome.code is ErrorCode.TOOL_ERROR
    assert outcome.content == "tool_error: KeyError: 'validator bug'"


async def test_invoke_turns_an_exception_into_tool_error():
    @tool
    async def boom(a: int) -> None:
        raise ValueError(f"bad a={a}")

    outcome = await boom.invoke({"a": 7})
    assert outcome == ToolOutcome(
        content="tool_error: ValueError: bad a=7", is_error=True, code=ErrorCode.TOOL_ERROR
    )


async def test_a_huge_exception_message_is_cut():
    @tool
    def boom() -> None:
        raise RuntimeError("x" * 100_000)

    outcome = await boom.invoke({})
    assert outcome.code is ErrorCode.TOOL_ERROR
    assert 1000 < len(outcome.content) < 1100


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        ("plain text", "plain text"),
        ({"b": [1, 2], "a": "é"}, '{"b":[1,2],"a":"é"}'),
        (3.5, "3.5"),
        (Point(x=1), '{"x":1,"y":0}'),
    ],
)
async def test_return_values_become_text(value, text):
    @tool
    def f() -> Any:
        return value

    assert await f.invoke({}) == ToolOutcome(content=text)


async def test_a_returned_outcome_keeps_ui_and_error_flag():
    @tool
    async def f() -> ToolOutcome:
        return ToolOutcome(content={"n": 1}, ui={"chart": [1]}, is_error=True)

    assert await f.invoke({}) == ToolOutcome(content='{"n":1}', ui={"chart": [1]}, is_error=True)


async def test_an_unserializable_result_is_a_tool_error():
    @tool
    def f() -> object:
        return NotSchemable()

    outcome = await f.invoke({})
    assert outcome.is_error
    assert outcome.code is ErrorCode.TOOL_ERROR
    assert "not JSON-serializable" in outcome.content


async def test_a_sync_tool_runs_in_a_worker_thread_and_does_not_block_the_loop():
    release = threading.Event()
    threads: list[int] = []

    @tool
    def blocking() -> str:
        threads.append(threading.get_ident())
        assert release.wait(timeout=10)
        return "done"

    task = asyncio.create_task(blocking.invoke({}))
    while not threads:  # the loop keeps running while the tool blocks its thread
        await asyncio.sleep(0.001)
    assert not task.done()
    release.set()
    assert (await task).content == "done"
    assert threads[0] != threading.get_ident()


async def test_parameters_named_like_pydantic_attributes_work():
    @tool
    def f(json: str, copy: int, model_config: bool) -> list[Any]:
        return [json, copy, model_config]

    assert set(f.spec.parameters["properties"]) == {"json", "copy", "model_config"}
    assert (await f.invoke({"json": "j", "copy": 2, "model_config": True})).content == (
        '["j",2,true]'
    )


# -- the example tools -----------------------------------------------------------------------


def _by_name(tmp_path: Path) -> dict[str, Tool[..., Any]]:
    return {t.name: t for t in example_tools(tmp_path / "ws")}


async def test_get_weather_is_deterministic_fake_data(tmp_path):
    tools = _by_name(tmp_path)
    weather = tools["get_weather"]
    assert (weather.side_effects, weather.eager) == ("read", True)
    c1 = json.loads((await weather.invoke({"city": "Oslo"})).content)
    c2 = json.loads((await weather.invoke({"city": "Oslo", "unit": "c"})).content)
    f = json.loads((await weather.invoke({"city": "Oslo", "unit": "f"})).content)
    assert c1 == c2
    assert c1["unit"] == "c"
    assert f["unit"] == "f"
    assert f["temperature"] == round(c1["temperature"] * 9 / 5 + 32)
    others = {
        json.loads((await weather.invoke({"city": c})).content)["temperature"] for c in "ABCDEFG"
    }
    assert len(others) > 1  # computed from the name, not a constant


async def test_add(tmp_path):
    assert (await _by_name(tmp_path)["add"].invoke({"a": 1.5, "b": 2})).content == "3.5"


async def test_write_file_writes_inside_the_workspace(tmp_path):
    write = _by_name(tmp_path)["write_file"]
    assert (write.side_effects, write.eager, write.group) == ("write", False, "fs")
    outcome = await write.invoke({"path": "notes/today.md", "content": "# Today ☕"})
    assert not outcome.is_error
    assert json.loads(outcome.content) == {"path": "notes/today.md", "bytes": 11}
    assert (tmp_path / "ws" / "notes" / "today.md").read_text() == "# Today ☕"
    assert outcome.ui["kind"] == "file_written"


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "../escape.txt",
        "notes/../../escape.txt",
        "notes/../inside.txt",
        "",
        ".",
        "a/\x00b",
    ],
)
async def test_write_file_refuses_paths_that_leave_the_workspace(tmp_path, path):
    write = _by_name(tmp_path)["write_file"]
    outcome = await write.invoke({"path": path, "content": "x"})
    assert outcome.is_error
    assert outcome.code is ErrorCode.TOOL_ERROR
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "ws" / "inside.txt").exists()


async def test_write_file_refuses_a_symlink_out_of_the_workspace(tmp_path):
    write = _by_name(tmp_path)["write_file"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "ws" / "link").symlink_to(outside)
    outcome = await write.invoke({"path": "link/x.txt", "content": "x"})
    assert outcome.is_error
    assert "leaves the workspace" in outcome.content
    assert not (outside / "x.txt").exists()


async def test_write_file_refuses_a_hard_link(tmp_path):
    write = _by_name(tmp_path)["write_file"]
    outside = tmp_path / "outside.txt"
    outside.write_text("theirs")
    os.link(outside, tmp_path / "ws" / "notes.txt")  # a name inside, the file outside
    outcome = await write.invoke({"path": "notes.txt", "content": "mine"})
    assert outcome.is_error
    assert "2 hard links" in outcome.content
    assert outside.read_text() == "theirs"  # not even truncated


async def test_write_file_follows_no_symbolic_link_even_one_inside(tmp_path):
    write = _by_name(tmp_path)["write_file"]
    ws = tmp_path / "ws"
    (ws / "real").mkdir()
    (ws / "alias").symlink_to(ws / "real")
    (ws / "file.txt").write_text("old")
    (ws / "file-link.txt").symlink_to(ws / "file.txt")
    for path in ("alias/x.txt", "file-link.txt"):
        outcome = await write.invoke({"path": path, "content": "x"})
        assert outcome.is_error, path
        assert "symbolic link" in outcome.content, path
    assert not (ws / "real" / "x.txt").exists()
    assert (ws / "file.txt").read_text() == "old"


async def test_write_file_a_directory_swapped_for_a_link_after_the_check_is_refused(
    tmp_path, monkeypatch
):
    # The race: the path is checked, then (here: at the first mkdir on the way, the moment
    # a resolve-then-write implementation has checked and not yet opened) another process
    # swaps a directory on the path for a symbolic link to outside the workspace.
    write = _by_name(tmp_path)["write_file"]
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "real").mkdir()
    outside.mkdir()
    real_mkdir = os.mkdir
    swapped: list[bool] = []

    def mkdir_after_a_swap(*args: Any, **kwargs: Any) -> None:
        if not swapped:
            swapped.append(True)
            (ws / "real").rename(tmp_path / "saved")
            (ws / "real").symlink_to(outside)
        real_mkdir(*args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir_after_a_swap)
    outcome = await write.invoke({"path": "real/x.txt", "content": "x"})
    monkeypatch.undo()
    assert swapped
    assert outcome.is_error
    assert "symbolic link" in outcome.content
    assert list(outside.iterdir()) == []


async def test_write_file_replaces_a_plain_file_and_accepts_dot_steps(tmp_path):
    write = _by_name(tmp_path)["write_file"]
    target = tmp_path / "ws" / "a" / "b.txt"
    for content in ("a longer first text", "short"):
        outcome = await write.invoke({"path": "./a/./b.txt", "content": content})
        assert not outcome.is_error
        assert json.loads(outcome.content)["path"] == "a/b.txt"
    assert target.read_text() == "short"  # cut before written
    outcome = await write.invoke({"path": "a", "content": "x"})  # a directory
    assert outcome.is_error


async def test_write_file_size_limit(tmp_path):
    tools = {t.name: t for t in example_tools(tmp_path, max_write_bytes=4)}
    outcome = await tools["write_file"].invoke({"path": "a.txt", "content": "12345"})
    assert outcome.is_error
    assert "over the 4 limit" in outcome.content


def test_example_tools_config_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError):
        example_tools(tmp_path / "file")
    with pytest.raises(ConfigError):
        example_tools(tmp_path, max_write_bytes=0)
