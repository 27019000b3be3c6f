"""The preview channel through the assembler: modes, redaction, throttling, finality, type wall."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat_chunks import chunk, fragments, tc
from toollatch import (
    CommittedCall,
    ConfigError,
    PreviewPolicy,
    PreviewUpdated,
    StreamParser,
    ToolPreview,
    UsageError,
)
from toollatch.stages import CallKey, Gate, PathDelta
from toollatch.testing import split_at, sse

ROOT = Path(__file__).resolve().parents[1]

ARGS = {
    "path": "notes/today.md",
    "content": "line one\nsk-SECRETKEY1234 and more é😀",
    "meta": {"tags": ["a", "b"], "size": 12},
}
TEXT = json.dumps(ARGS, ensure_ascii=False)
STREAM = sse(
    chunk(tc(0, "c1", "write_file", "")),
    *fragments(0, TEXT, 3),
    chunk(tc(1, "c2", "get_time", "{}")),
    chunk(finish="tool_calls"),
    done=True,
)


def previews(data: bytes | list[bytes], policy: PreviewPolicy) -> list[PreviewUpdated]:
    parser = StreamParser("openai_chat", previews=policy)
    notices = []
    for piece in [data] if isinstance(data, bytes) else data:
        notices += parser.feed(piece)
    parser.finish()
    notices += parser.finish_notices
    return [n for n in notices if isinstance(n, PreviewUpdated)]


def tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def fold(updates: list[PreviewUpdated], call_id: str) -> Any:
    """What a UI rebuilds from the deltas alone."""
    root: list[Any] = [None]
    for update in updates:
        if update.call_id != call_id:
            continue
        for d in update.deltas:
            node: Any = root
            slot: Any = 0
            for token in tokens(d.path):
                node = node[slot]
                slot = int(token) if isinstance(node, list) else token
            if d.op == "set":
                value = json.loads(json.dumps(d.value))
                if isinstance(node, list) and node is not root and slot == len(node):
                    node.append(value)
                else:
                    node[slot] = value
            elif d.op == "append":
                node[slot] += d.value
    return root[0]


def test_default_policy_shows_name_and_byte_count_only():
    updates = previews(STREAM, PreviewPolicy(every_bytes=20))
    mine = [u for u in updates if u.call_id == "c1"]
    assert all(u.deltas == () and u.name == "write_file" for u in mine)
    assert [u.bytes_so_far for u in mine] == sorted(u.bytes_so_far for u in mine)
    assert mine[-1].final
    assert mine[-1].bytes_so_far == len(TEXT.encode())
    assert "SECRET" not in repr(updates)


def test_full_mode_folds_to_the_arguments():
    updates = previews(STREAM, PreviewPolicy(default=ToolPreview(mode="full")))
    assert fold(updates, "c1") == ARGS
    assert fold(updates, "c2") == {}
    assert [u.final for u in updates if u.call_id == "c1"][-1] is True


def test_fields_mode_shows_only_allowed_pointers():
    policy = PreviewPolicy(
        tools={"write_file": ToolPreview(mode="fields", fields=("/path", "/meta/tags"))}
    )
    updates = previews(STREAM, policy)
    # Masked members are left out whole: neither their values nor their key names show.
    assert fold(updates, "c1") == {"path": "notes/today.md", "meta": {"tags": ["a", "b"]}}
    assert "SECRET" not in repr(updates)
    assert "line one" not in repr(updates)
    assert "content" not in repr(updates)
    assert "size" not in repr(updates)
    assert fold(updates, "c2") is None  # get_time falls back to the default: none


def test_redactor_sees_whole_strings_even_when_a_secret_is_split():
    def redactor(pointer: str, text: str) -> str:
        return text.replace("sk-SECRETKEY1234", "sk-***")

    policy = PreviewPolicy(default=ToolPreview(mode="full"), redactor=redactor, every_bytes=1)
    updates = previews(STREAM, policy)
    assert "SECRET" not in repr(updates)
    assert fold(updates, "c1")["content"] == "line one\nsk-*** and more é😀"


def test_throttle_every_bytes_and_on_structure():
    full = ToolPreview(mode="full")
    dense = previews(STREAM, PreviewPolicy(default=full, every_bytes=1))
    sparse = previews(STREAM, PreviewPolicy(default=full, every_bytes=10_000, on_structure=False))
    assert len([u for u in sparse if u.call_id == "c1"]) == 2  # the first and the final one
    assert len(dense) > len(sparse)
    assert fold(dense, "c1") == fold(sparse, "c1") == ARGS


def test_provisional_marks_the_growing_edge():
    updates = previews(STREAM, PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=1))
    growing = [u for u in updates if "/content" in u.provisional]
    assert growing
    assert all("" in u.provisional for u in growing)
    assert updates[-1].provisional == frozenset()


def test_numbers_and_literals_are_never_shown_unfinished():
    text = '{"size": 123456, "ok": true}'
    data = sse(chunk(tc(0, "c", "f", "")), *fragments(0, text, 1), chunk(finish="stop"))
    updates = previews(data, PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=1))
    sets = [d.value for u in updates for d in u.deltas if d.op == "set" and d.path != ""]
    assert sets == [123456, True]


def test_final_preview_on_failure_and_truncation_and_malformed_text():
    big = '{"content": "' + "x" * 3000 + '"}'
    policy = PreviewPolicy(default=ToolPreview(mode="full"))
    parser = StreamParser(
        "openai_chat",
        previews=policy,
        limits=__import__("toollatch").Limits(max_argument_bytes=1000),
    )
    notices = parser.feed(sse(chunk(tc(0, "c", "f", "")), *fragments(0, big, 100)))
    kinds = [type(n).__name__ for n in notices]
    # the oversized call was the round's only one: the round is over (limited) after it
    assert kinds[-3:] == ["PreviewUpdated", "CallFailed", "RoundOver"]
    assert notices[-3].final
    truncated = previews(sse(chunk(tc(0, "c", "f", '{"a": "b')), chunk(finish="length")), policy)
    assert truncated[-1].final
    assert truncated[-1].call_id == "c"
    bad = previews(sse(chunk(tc(0, "c", "f", '{"a": tru}')), chunk(finish="stop")), policy)
    assert bad[-1].error
    assert "invalid literal" in bad[-1].error
    assert "tru" not in bad[-1].error.replace("literal", "")


@given(st.lists(st.integers(0, len(STREAM)), max_size=30))
def test_folded_preview_is_the_same_at_any_chunking(cuts):
    policy = PreviewPolicy(default=ToolPreview(mode="full"), every_bytes=7)
    assert fold(previews(split_at(STREAM, cuts), policy), "c1") == ARGS


def test_previews_can_never_be_executed():
    update = previews(STREAM, PreviewPolicy(default=ToolPreview(mode="full")))[0]
    assert not isinstance(update, CommittedCall)
    assert not set(type(update).__mro__) & set(CommittedCall.__mro__[:-1])
    gate = Gate(None)
    with pytest.raises(UsageError):
        gate.check(key=CallKey(0, 0, 0), position=0, call_id="c", name="f", text=update)


def test_previews_are_refused_by_type(tmp_path: Path, mypy_lock):
    # mypy --strict with warn_unused_ignores: if the ignore were unnecessary, mypy would fail.
    # From the project root, on the cache the project's own mypy check (test_project) writes.
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from toollatch import CommittedCall, PreviewUpdated\n"
        "def run(call: CommittedCall) -> None: ...\n"
        "def ui(update: PreviewUpdated) -> None:\n"
        "    run(update)  # type: ignore[arg-type]\n"
    )
    with mypy_lock():
        result = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", str(snippet)],
            cwd=ROOT,
            check=False,
            capture_output=True,
            text=True,
        )
    assert result.returncode == 0, result.stdout


def test_bad_policies_are_config_errors():
    with pytest.raises(ConfigError):
        ToolPreview(mode="some")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ToolPreview(mode="fields", fields=("path",))
    with pytest.raises(ConfigError):
        PreviewPolicy(every_bytes=0)


def test_previews_off_by_default_cost_nothing():
    parser = StreamParser("openai_chat")
    assert parser.feed(STREAM) == []
    assert parser.assembler._trackers == {}


# --------------------------------------------------------------------------- masked data (#11)

MARK = "SECRET"


def call_stream(text: str, cuts: list[int] | None = None, name: str = "f") -> bytes:
    """One chat call carrying ``text`` cut at ``cuts`` (fixed 3-character fragments if None)."""
    if cuts is None:
        cuts = list(range(0, len(text), 3))
    points = sorted({min(max(c, 0), len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)]
    return sse(
        chunk(tc(0, "c", name, "")),
        *(chunk(tc(0, args=piece)) for piece in pieces),
        chunk(finish="tool_calls"),
    )


def fields(*pointers: str, **options: Any) -> PreviewPolicy:
    return PreviewPolicy(default=ToolPreview(mode="fields", fields=pointers), **options)


def test_fields_mode_does_not_name_count_or_size_masked_members():
    text = json.dumps(
        {
            "path": "a.md",
            "SECRET_key": "v",
            "env": {"SECRET_TOKEN": "x", "n": 1},
            "list": [1, 2, 3],
            "meta": {"SECRET_inner": [1, 2], "tags": ["t"], "other": True},
        }
    )
    updates = previews(call_stream(text), fields("/path", "/meta/tags", every_bytes=1))
    assert MARK not in repr(updates)
    paths = {d.path for u in updates for d in u.deltas}
    assert paths == {"", "/path", "/meta", "/meta/tags", "/meta/tags/0"}
    assert fold(updates, "c") == {"path": "a.md", "meta": {"tags": ["t"]}}


def test_update_cadence_does_not_count_masked_members():
    # Each masked member used to be a structural delta, so releasing an update per member
    # told how many there were.
    def run(masked: int) -> list[tuple[Any, ...]]:
        doc = {"path": "a.md", **{f"k{i}": i for i in range(masked)}}
        updates = previews(call_stream(json.dumps(doc)), fields("/path", every_bytes=10**6))
        return [u.deltas for u in updates]

    assert run(1) == run(40)


def test_leading_array_shows_placeholders_only_before_a_shown_element():
    text = json.dumps(
        {
            "items": [
                {"name": "SECRET0"},
                "SECRET1",
                {"name": "b", "x": "SECRET2"},
                {"name": "SECRET3"},
                "SECRET4",
            ]
        }
    )
    updates = previews(call_stream(text), fields("/items/2/name", every_bytes=1))
    assert MARK not in repr(updates)
    assert fold(updates, "c") == {"items": ["[redacted]", "[redacted]", {"name": "b"}]}


def test_a_scalar_where_a_leading_container_was_expected_is_left_out():
    for text in ('{"meta": "SECRET", "path": "p"}', '"SECRET"', '[{"a": 1}, "SECRET"]'):
        updates = previews(call_stream(text), fields("/path", "/meta/tags", every_bytes=1))
        assert MARK not in repr(updates)
        assert "/meta" not in repr(updates)


def test_provisional_names_no_masked_member():
    text = '{"SECRET_a": {"b": "growing' + "x" * 50 + '"}, "path": {"q": "z' + "y" * 50 + '"}}'
    masked = previews(call_stream(text), fields("/path", every_bytes=1))
    assert {p for u in masked for p in u.provisional} == {"", "/path", "/path/q"}
    assert MARK not in repr(masked)


def test_provisional_shows_keys_as_redacted():
    text = '{"SECRET_a": {"b": "growing' + "x" * 50 + '"}, "path": "z' + "y" * 50 + '"}'

    def redactor(pointer: str, text: str) -> str:
        return text.replace(MARK, "***")

    policy = PreviewPolicy(default=ToolPreview(mode="full"), redactor=redactor, every_bytes=1)
    redacted = previews(call_stream(text), policy)
    growing = {p for u in redacted for p in u.provisional}
    assert MARK not in repr(growing)
    assert growing == {"", "/***_a"}  # (strings are held until complete)
    assert MARK not in repr(redacted)


def test_redactor_sees_keys_with_the_pointer_of_their_object():
    seen: list[tuple[str, str]] = []

    def redactor(pointer: str, text: str) -> str:
        seen.append((pointer, text))
        return text.replace(MARK, "***")

    text = json.dumps({"SECRET_top": "v SECRET", "a/b": {"x~SECRET": [{"k": "w"}]}})
    updates = previews(
        call_stream(text), PreviewPolicy(default=ToolPreview(mode="full"), redactor=redactor)
    )
    assert MARK not in repr(updates)
    assert fold(updates, "c") == {"***_top": "v ***", "a/b": {"x~***": [{"k": "w"}]}}
    assert sorted(seen) == sorted(
        [
            ("", "SECRET_top"),
            ("/SECRET_top", "v SECRET"),
            ("", "a/b"),
            ("/a~1b", "x~SECRET"),
            ("/a~1b/x~0SECRET/0", "k"),
            ("/a~1b/x~0SECRET/0/k", "w"),
        ]
    )


def test_redactor_applies_to_keys_below_an_allowed_field():
    text = json.dumps({"env": {"SECRET_TOKEN": "x"}, "SECRET_other": 1})
    policy = fields("/env", redactor=lambda pointer, text: text.replace(MARK, "***"))
    updates = previews(call_stream(text), policy)
    assert MARK not in repr(updates)
    assert fold(updates, "c") == {"env": {"***_TOKEN": "x"}}


def test_fields_mode_work_is_linear_in_masked_members():
    # Counted, not timed (benchmarks/bench_preview.py --masked times it): the Python calls and
    # generator steps run in the preview module grow like the members, not like their square.
    def steps(members: int) -> int:
        doc = {"path": "p", **{f"k{i}": "v" for i in range(members)}}
        data = call_stream(json.dumps(doc))
        count = 0

        def profile(frame: Any, event: str, arg: object) -> None:
            nonlocal count
            if event == "call" and frame.f_code.co_filename.endswith("core/_preview.py"):
                count += 1

        sys.setprofile(profile)
        try:
            previews(data, fields("/path", every_bytes=64))
        finally:
            sys.setprofile(None)
        return count

    assert steps(800) <= 4.5 * steps(200)


# Marker-bearing JSON: the marker in keys and in string values at any depth.
_safe_text = st.text(max_size=6).filter(lambda s: MARK not in s)
_marked_text = st.builds("{}{}{}".format, _safe_text, st.just(MARK), _safe_text)
_any_text = _safe_text | _marked_text
_scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _any_text
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.lists(st.tuples(_any_text, inner), max_size=4).map(dict)
    ),
    max_leaves=12,
)
_safe_values = st.recursive(
    st.none() | st.integers(0, 99) | _safe_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_safe_text, inner, max_size=3),
    max_leaves=6,
)


def _member(key: str, value: Any) -> str:
    return f"{json.dumps(key)}: {json.dumps(value)}"


@st.composite
def _masked_arguments(draw: st.DrawFn) -> str:
    """An object with allowed fields /path, /meta/tags and /list/1 (safe) and masked members
    (marked keys and any values) around them, in a random order."""
    members = [_member("path", draw(_safe_text))]
    meta = [_member("tags", draw(_safe_values))]
    meta += [_member(draw(_marked_text), draw(_values)) for _ in range(draw(st.integers(0, 3)))]
    members.append('"meta": {' + ", ".join(draw(st.permutations(meta))) + "}")
    if draw(st.booleans()):
        head = draw(_values)
        tail = draw(st.lists(_values, max_size=3))
        members.append(f'"list": {json.dumps([head, draw(_safe_values), *tail])}')
    members += [_member(draw(_marked_text), draw(_values)) for _ in range(draw(st.integers(0, 4)))]
    return "{" + ", ".join(draw(st.permutations(members))) + "}"


@given(
    text=_masked_arguments(),
    cuts=st.lists(st.integers(0, 400), max_size=40),
    end=st.none() | st.integers(0, 400),
    every=st.integers(1, 64),
    redact=st.booleans(),
)
def test_no_preview_ever_shows_a_masked_secret(text, cuts, end, every, redact):
    policy = fields(
        "/path",
        "/meta/tags",
        "/list/1",
        every_bytes=every,
        redactor=(lambda pointer, text: text) if redact else None,
    )
    updates = previews(call_stream(text[:end], cuts), policy)
    for update in updates:
        assert MARK not in repr(update)


@given(
    value=_values,
    cuts=st.lists(st.integers(0, 400), max_size=40),
    end=st.none() | st.integers(0, 400),
    mode=st.sampled_from(["fields", "full"]),
)
def test_no_preview_ever_shows_what_the_redactor_hides(value, cuts, end, mode):
    text = json.dumps({"path": value, "other": value})
    policy = PreviewPolicy(
        default=ToolPreview(mode=mode, fields=("/path",)),
        every_bytes=1,
        redactor=lambda pointer, text: text.replace(MARK, "***"),
    )
    updates = previews(call_stream(text[:end], cuts), policy)
    for update in updates:
        assert MARK not in repr(update)


def test_positional_constructors_build_what_the_keyword_constructors_build() -> None:
    # PreviewUpdated.of and PathDelta.of take the fields positionally, in declaration order.
    _Key, _Delta, _Updated = CallKey, PathDelta, PreviewUpdated
    fields = tuple(f.name for f in dataclasses.fields(_Updated))
    assert tuple(f.name for f in dataclasses.fields(_Delta)) == ("path", "op", "value")
    delta = _Delta.of("/a", "append", "xy")
    assert type(delta) is _Delta
    assert delta == _Delta(path="/a", op="append", value="xy")
    assert hash(delta) == hash(_Delta(path="/a", op="append", value="xy"))
    args = (_Key(0, 0, 1), "id", "tool", 7, (delta,), frozenset({"/a"}), True, "bad")
    made = _Updated.of(*args)
    assert type(made) is _Updated
    assert made == _Updated(**dict(zip(fields, args, strict=True)))
    assert hash(made) == hash(_Updated(**dict(zip(fields, args, strict=True))))
    assert tuple(getattr(made, n) for n in fields) == args
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.bytes_so_far = 8  # type: ignore[misc]
