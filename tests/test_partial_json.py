"""Tests of the incremental lenient JSON parser behind previews (toollatch.core._partial_json).

The oracle is :func:`reference`: a small recursive-descent reading of a *prefix* of a valid
JSON text, written for obviousness rather than speed (it re-reads the prefix from the start and
decodes strings with :func:`json.loads`). The properties, for JSON texts drawn by Hypothesis and
serialized with and without whitespace and ``ensure_ascii``:

* after every character, the incremental snapshot, ``provisional``, ``pending`` and
  ``complete`` equal the reference's reading of that prefix;
* after ``finish()``, the snapshot equals ``json.loads`` of the whole text;
* fragmentation: for any split into fragments (empty ones included), the snapshot, ``failed``
  and the deltas are the same, where "the same deltas" means exactly this rule: the two delta
  lists are equal after merging each run of adjacent ``append`` deltas on the same path into one
  (``coalesce``). Appends are coalesced per ``feed`` call, nothing else may differ;
* folding the deltas into an empty document reproduces the snapshot at every fragment
  boundary, and the paths set and not yet ended are exactly ``provisional``;
* arbitrary (mostly malformed) text never raises, and fails at the same offset with the same
  deltas whatever the fragmentation.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toollatch import UsageError
from toollatch.core._partial_json import _COMPACT_BYTES
from toollatch.stages import PartialJSON, PathDelta

# --------------------------------------------------------------------------- reference


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""A value the reference does not show yet (an unfinished number or literal, nothing yet)."""

_WS = " \t\n\r"
_NUMBER_CHARS = re.compile(r"[-+.eE0-9]*")
_LITERALS = {"true": True, "false": False, "null": None}


class _Reading:
    def __init__(self) -> None:
        self.provisional: set[str] = set()
        self.pending: str | None = None


def _skip_ws(t: str, i: int) -> int:
    while i < len(t) and t[i] in _WS:
        i += 1
    return i


def _ref_string(t: str, i: int) -> tuple[str, bool, int]:
    """Read a string whose opening quote is at ``i - 1``: (text so far, closed?, next index)."""
    j = i
    last_was_high_escape = False
    while j < len(t):
        if t[j] == '"':
            return json.loads(t[i - 1 : j + 1]), True, j + 1
        if t[j] == "\\":
            if j + 1 == len(t):
                break  # an escape cut in half is not shown
            if t[j + 1] == "u":
                if j + 6 > len(t):
                    break
                last_was_high_escape = 0xD800 <= int(t[j + 2 : j + 6], 16) <= 0xDBFF
                j += 6
                continue
            j += 2
        else:
            j += 1
        last_was_high_escape = False
    text = json.loads('"' + t[i:j] + '"')
    if last_was_high_escape:  # its low half may still come: not shown yet
        text = text[:-1]
    return text, False, len(t)


def _ref_value(t: str, i: int, ptr: str, out: _Reading) -> tuple[Any, bool, int]:
    i = _skip_ws(t, i)
    if i == len(t):
        return MISSING, False, i
    c = t[i]
    value: Any
    if c == '"':
        value, done, i = _ref_string(t, i + 1)
    elif c == "{":
        value, done, i = _ref_object(t, i + 1, ptr, out)
    elif c == "[":
        value, done, i = _ref_array(t, i + 1, ptr, out)
    elif c in "tfn":
        word = next(w for w in _LITERALS if w[0] == c)
        if not t.startswith(word, i):
            out.pending = ptr
            return MISSING, False, len(t)
        value, done, i = _LITERALS[word], True, i + len(word)
    else:
        end = _NUMBER_CHARS.match(t, i).end()  # type: ignore[union-attr]
        if end == len(t):  # more digits may follow
            out.pending = ptr
            return MISSING, False, end
        value, done, i = json.loads(t[i:end]), True, end
    if not done:
        out.provisional.add(ptr)
    return value, done, i


def _ref_object(t: str, i: int, ptr: str, out: _Reading) -> tuple[Any, bool, int]:
    obj: dict[str, Any] = {}
    i = _skip_ws(t, i)
    if i < len(t) and t[i] == "}":
        return obj, True, i + 1
    while True:
        i = _skip_ws(t, i)
        if i == len(t):
            return obj, False, i
        key, done, i = _ref_string(t, i + 1)
        i = _skip_ws(t, i)
        if not done or i == len(t):
            return obj, False, i
        child = ptr + "/" + key.replace("~", "~0").replace("/", "~1")
        value, done, i = _ref_value(t, i + 1, child, out)
        if value is not MISSING:
            obj[key] = value
        i = _skip_ws(t, i)
        if not done or i == len(t):
            return obj, False, i
        if t[i] == "}":
            return obj, True, i + 1
        i += 1  # ","


def _ref_array(t: str, i: int, ptr: str, out: _Reading) -> tuple[Any, bool, int]:
    arr: list[Any] = []
    i = _skip_ws(t, i)
    if i < len(t) and t[i] == "]":
        return arr, True, i + 1
    while True:
        value, done, i = _ref_value(t, i, f"{ptr}/{len(arr)}", out)
        if value is not MISSING:
            arr.append(value)
        i = _skip_ws(t, i)
        if not done or i == len(t):
            return arr, False, i
        if t[i] == "]":
            return arr, True, i + 1
        i += 1  # ","


def reference(prefix: str) -> tuple[Any, frozenset[str], str | None, bool]:
    """Lenient reading of a prefix of a valid JSON text: (value, provisional, pending, done).

    ``value`` is MISSING when nothing is visible; ``provisional`` holds the pointers of the
    visible values not yet closed; ``pending`` the pointer of an unfinished number or literal.
    """
    out = _Reading()
    value, done, _ = _ref_value(prefix, 0, "", out)
    return value, frozenset(out.provisional), out.pending, done


# --------------------------------------------------------------------------- helpers


def canon(value: Any) -> Any:
    """A type-exact, order-exact form for comparison (``1 == 1.0 == True`` otherwise)."""
    if isinstance(value, dict):
        return ("dict", tuple((k, canon(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(canon(v) for v in value))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def coalesce(deltas: list[PathDelta]) -> list[PathDelta]:
    """Merge each run of adjacent appends on one path (the fragmentation-equivalence rule)."""
    out: list[PathDelta] = []
    for d in deltas:
        last = out[-1] if out else None
        if last and d.op == "append" and last.op == "append" and last.path == d.path:
            assert isinstance(last.value, str)
            assert isinstance(d.value, str)
            out[-1] = PathDelta(path=d.path, op="append", value=last.value + d.value)
        else:
            out.append(d)
    return out


def _tokens(path: str) -> list[str]:
    assert path == "" or path.startswith("/")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


class Folded:
    """A receiver that knows nothing but the deltas (as a UI would)."""

    def __init__(self) -> None:
        self.holder: list[Any] = [MISSING]
        self.open: set[str] = set()

    @property
    def value(self) -> Any:
        return None if self.holder[0] is MISSING else self.holder[0]

    def _parent(self, path: str) -> tuple[Any, Any]:
        tokens = _tokens(path)
        node: Any = self.holder
        slot: Any = 0
        for token in tokens:
            node = node[slot]
            slot = int(token) if isinstance(node, list) else token
        return node, slot

    def apply(self, d: PathDelta) -> None:
        parent, slot = self._parent(d.path)
        if d.op == "set":
            if isinstance(d.value, str | dict | list):
                assert not d.value, "strings and containers start empty"
                self.open.add(d.path)
            if isinstance(parent, list) and parent is not self.holder:
                assert slot == len(parent), "array elements are set in order"
                parent.append(copy.deepcopy(d.value))
            else:
                parent[slot] = copy.deepcopy(d.value)
        elif d.op == "append":
            assert d.path in self.open
            assert isinstance(d.value, str)
            assert d.value
            parent[slot] += d.value
        else:
            assert d.op == "end"
            assert d.value is None
            self.open.remove(d.path)


def run(
    fragments: list[str], *, finish: bool = False, **kwargs: Any
) -> tuple[PartialJSON, list[PathDelta]]:
    parser = PartialJSON(**kwargs)
    deltas: list[PathDelta] = []
    for fragment in fragments:
        deltas += parser.feed(fragment)
    if finish:
        deltas += parser.finish()
    return parser, deltas


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


# --------------------------------------------------------------------------- strategies

_keys = st.text(st.characters(codec="utf-8"), max_size=5) | st.sampled_from(["a/b", "~0", ""])
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.text(st.characters(exclude_categories=()), max_size=4)  # lone surrogates too
    | st.sampled_from(['"', "\\", "\u00e9\U0001f600", "\ud83d", "\ud83d\ude00", "\x00\n"])
)
json_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_keys, kids, max_size=4),
    max_leaves=12,
)


@st.composite
def documents(draw: st.DrawFn, values: st.SearchStrategy[Any] = json_values) -> str:
    value = draw(values)
    indent = draw(st.sampled_from([None, None, 0, 2]))
    separators = draw(st.sampled_from([None, (",", ":"), (" ,\t", " :\r\n")]))
    text = json.dumps(value, indent=indent, separators=separators, ensure_ascii=draw(st.booleans()))
    pad = st.sampled_from(["", " ", "\n\t "])
    return draw(pad) + text + draw(pad)


@st.composite
def malformed(draw: st.DrawFn) -> str:
    """Mostly-valid JSON with a few random edits (far more interesting than random text)."""
    text = draw(documents())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        junk = draw(st.sampled_from(list('{}[]:,"\\ute0-.x \x01\n')) | st.text(max_size=2))
        cut = draw(st.integers(0, 2))
        text = text[:at] + junk + text[at + cut :]
    return text


_string_tokens = st.one_of(
    st.characters(exclude_categories=["Cc"]).filter(lambda c: c not in '"\\'),
    st.characters(categories=["Cs"]),  # raw lone surrogates: json never pairs them
    st.sampled_from(['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"]),
    st.integers(0, 0xFFFF).map(lambda unit: f"\\u{unit:04x}"),
    st.integers(0xD800, 0xDFFF).map(lambda unit: f"\\u{unit:04X}"),
)
string_literals = st.lists(_string_tokens, max_size=10).map(lambda ts: '"' + "".join(ts) + '"')


@st.composite
def string_documents(draw: st.DrawFn) -> str:
    """Strings json.dumps never writes: escapes and raw characters (surrogates too) mixed."""
    literals = draw(st.lists(string_literals, min_size=1, max_size=4))
    members = ", ".join(f'"k{i}": {literal}' for i, literal in enumerate(literals))
    return draw(st.sampled_from([literals[0], f'{{{members}, "a": [{", ".join(literals)}]}}']))


any_documents = documents() | string_documents()

_settings = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- properties


def assert_matches_reference(parser: PartialJSON, prefix: str) -> None:
    value, provisional, pending, done = reference(prefix)
    assert canon(parser.snapshot()) == canon(None if value is MISSING else value), prefix
    assert parser.provisional == provisional, prefix
    assert parser.pending == pending, prefix
    assert parser.complete == done, prefix
    assert parser.failed is None


@_settings
@given(any_documents)
def test_every_prefix_matches_the_reference(text: str) -> None:
    parser = PartialJSON()
    for k in range(len(text) + 1):
        if k:
            parser.feed(text[k - 1])
        assert_matches_reference(parser, text[:k])
    parser.finish()
    assert parser.failed is None
    assert parser.complete
    assert canon(parser.snapshot()) == canon(json.loads(text))
    assert parser.provisional == frozenset()
    assert parser.pending is None


@_settings
@given(any_documents, st.lists(st.integers(0, 10_000), max_size=12), st.booleans())
def test_any_fragmentation_gives_the_same_deltas_and_folds_to_the_snapshot(
    text: str, cuts: list[int], empty_between: bool
) -> None:
    fragments = split(text, cuts)
    if empty_between:
        fragments = [f for fragment in fragments for f in (fragment, "")]
    parser = PartialJSON()
    folded = Folded()
    deltas: list[PathDelta] = []
    fed = 0
    for fragment in [*fragments, None]:
        if fragment is None:
            new = parser.finish()
        else:
            new = parser.feed(fragment)
            fed += len(fragment)
            assert_matches_reference(parser, text[:fed])
        for d in new:
            folded.apply(d)
        deltas += new
        assert canon(folded.value) == canon(parser.snapshot())
        assert folded.open == parser.provisional
    assert canon(parser.snapshot()) == canon(json.loads(text))
    _, by_char = run(list(text), finish=True)
    _, whole = run([text], finish=True)
    assert coalesce(deltas) == coalesce(by_char) == coalesce(whole)
    assert coalesce(whole) == whole  # one feed: appends already coalesced
    assert all(d.op != "append" or d.value for d in deltas)


@_settings
@given(malformed() | st.text(max_size=40), st.lists(st.integers(0, 10_000), max_size=8))
def test_arbitrary_text_never_raises_and_fails_the_same_way_in_any_fragmentation(
    text: str, cuts: list[int]
) -> None:
    results = []
    for fragments in (split(text, cuts), list(text), [text]):
        parser, deltas = run(fragments)
        if parser.failed is not None:
            assert parser.feed("{}") == []
        deltas += parser.finish()
        results.append((parser.failed, coalesce(deltas), canon(parser.snapshot())))
        folded = Folded()
        for d in deltas:
            folded.apply(d)
        assert canon(folded.value) == canon(parser.snapshot())
    assert results[0] == results[1] == results[2]
    try:
        expected: Any = json.loads(text)
    except ValueError:
        assert results[0][0] is not None
    else:
        if "NaN" not in text and "Infinity" not in text:  # json.loads accepts those; RFC no
            assert results[0][0] is None
            assert results[0][2] == canon(expected)


@st.composite
def long_string_documents(draw: st.DrawFn) -> str:
    """A member whose string value passes the compaction size (escapes, surrogates and raw
    characters mixed, as ``string_literals``), between two short ones."""
    tokens = draw(st.lists(_string_tokens, min_size=1, max_size=12))
    body = "".join(tokens) * (_COMPACT_BYTES // max(1, len("".join(tokens))) + 2)
    return f'{{"a": "x", "content": "{body}", "b": [1, "y"]}}'


@_settings
@given(
    any_documents | malformed() | long_string_documents(),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_a_parser_that_keeps_no_values_reports_the_same(text: str, cuts: list[int]) -> None:
    """``keep_values=False`` (what a preview tracker uses): after every fragment, the same
    deltas and the same state as a parser that keeps the value; and no snapshot."""
    keeping, lean = PartialJSON(), PartialJSON(keep_values=False)
    for fragment in [*split(text, cuts), None]:
        if fragment is None:
            assert lean.finish() == keeping.finish()
        else:
            assert lean.feed(fragment) == keeping.feed(fragment)
        state = (lean.failed, lean.provisional, lean.pending, lean.complete, lean.in_string)
        assert state == (
            keeping.failed,
            keeping.provisional,
            keeping.pending,
            keeping.complete,
            keeping.in_string,
        )
        assert lean.bytes_fed == keeping.bytes_fed
    with pytest.raises(UsageError, match="keep_values=False"):
        lean.snapshot()


# --------------------------------------------------------------------------- examples


def test_delta_vocabulary_on_a_tool_call() -> None:
    text = '{"path": "notes.md", "content": "a\\nb", "items": [1, {"x": true}], "n": null}'
    _, deltas = run([text], finish=True)
    assert [(d.path, d.op, d.value) for d in deltas] == [
        ("", "set", {}),
        ("/path", "set", ""),
        ("/path", "append", "notes.md"),
        ("/path", "end", None),
        ("/content", "set", ""),
        ("/content", "append", "a\nb"),
        ("/content", "end", None),
        ("/items", "set", []),
        ("/items/0", "set", 1),
        ("/items/1", "set", {}),
        ("/items/1/x", "set", True),
        ("/items/1", "end", None),
        ("/items", "end", None),
        ("/n", "set", None),
        ("", "end", None),
    ]


def test_string_growth_is_reported_per_feed() -> None:
    parser = PartialJSON()
    assert parser.feed('{"content": "ab') == [
        PathDelta(path="", op="set", value={}),
        PathDelta(path="/content", op="set", value=""),
        PathDelta(path="/content", op="append", value="ab"),
    ]
    assert parser.snapshot() == {"content": "ab"}
    assert parser.provisional == {"", "/content"}
    assert parser.feed("c") == [PathDelta(path="/content", op="append", value="c")]
    assert parser.feed('d"') == [
        PathDelta(path="/content", op="append", value="d"),
        PathDelta(path="/content", op="end", value=None),
    ]
    assert parser.provisional == {""}


@pytest.mark.parametrize("fragments", [["tr"], ["t", "r"], ["[tr"], ['{"a": tr'], ['{"a": t', "r"]])
def test_an_incomplete_literal_is_never_reported(fragments: list[str]) -> None:
    parser, deltas = run(fragments)
    assert parser.pending in {"", "/0", "/a"}
    assert all(d.path != parser.pending for d in deltas)
    assert parser.snapshot() in (None, [], {})
    parser.feed("ue")
    assert parser.pending is None
    assert parser.snapshot() in (True, [True], {"a": True})


def test_a_number_is_reported_only_when_a_delimiter_ends_it() -> None:
    parser = PartialJSON()
    assert parser.feed('{"a": 12') == [PathDelta(path="", op="set", value={})]
    assert parser.snapshot() == {}
    assert parser.pending == "/a"
    assert parser.feed("3") == []
    assert parser.feed(".5") == []
    assert parser.feed(" ") == [PathDelta(path="/a", op="set", value=123.5)]
    assert parser.pending is None
    assert parser.feed("}") == [PathDelta(path="", op="end", value=None)]


def test_a_top_level_number_ends_with_the_text() -> None:
    parser, deltas = run(["1", "2"])
    assert deltas == []
    assert parser.snapshot() is None
    assert parser.pending == ""
    assert parser.finish() == [PathDelta(path="", op="set", value=12)]
    assert parser.complete
    assert parser.failed is None


def test_a_key_is_invisible_until_its_value_starts() -> None:
    parser = PartialJSON()
    for fragment in ['{"ke', 'y"', " : "]:
        assert parser.feed(fragment) in ([], [PathDelta(path="", op="set", value={})])
        assert parser.snapshot() == {}
    assert parser.feed('"') == [PathDelta(path="/key", op="set", value="")]


ESCAPED = (
    '{"s": "a\\u00e9b\\ud83d\\ude00c\\\\\\"\\/\\b\\f\\n\\r\\t'
    '\\ud83d x\\udc00\\ud83d\\ud83d\\ude00"}'
)


def test_escapes_split_at_every_pair_of_positions() -> None:
    expected = json.loads(ESCAPED)
    _, whole = run([ESCAPED], finish=True)
    for a in range(len(ESCAPED) + 1):
        for b in range(a, len(ESCAPED) + 1):
            parts = [ESCAPED[:a], ESCAPED[a:b], ESCAPED[b:]]
            parser, deltas = run(parts, finish=True)
            assert parser.snapshot() == expected, (a, b)
            assert coalesce(deltas) == whole, (a, b)


def test_a_surrogate_pair_split_between_its_halves() -> None:
    parser = PartialJSON()
    parser.feed('"\\ud83d')
    assert parser.snapshot() == ""  # the high half waits for its pair
    parser.feed("\\ude00")
    assert parser.snapshot() == "\U0001f600"
    parser.feed('"')
    assert parser.snapshot() == "\U0001f600"
    assert parser.complete


@pytest.mark.parametrize(
    "text", ['"\\ud83d"', '"\\ud83dx"', '"\\ude00"', '"\\ud83d\\n"', '"\\ud83d\\u0041"', '"\ud83d"']
)
def test_lone_surrogates_read_as_json_loads_reads_them(text: str) -> None:
    for fragments in ([text], list(text)):
        parser, _ = run(fragments, finish=True)
        assert parser.snapshot() == json.loads(text)
        assert parser.failed is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("x", "expected a value at byte 0"),
        ("{1", "expected a key at byte 1"),
        ('{"a" 1', "expected ':' at byte 5"),
        ("[1 2", "expected ',' or a closing bracket at byte 3"),
        ('{"a":1]', "expected ',' or a closing bracket at byte 6"),
        ("[1,]", "expected a value at byte 3"),
        ('{"a":1,}', "expected a key at byte 7"),
        ('"a\\x"', "invalid escape at byte 3"),
        ('"\\u12G4"', "invalid \\u escape at byte 5"),
        ('"a\nb"', "control character in string at byte 2"),
        ("[01]", "invalid number ending at byte 3"),
        ("[-]", "invalid number ending at byte 2"),
        ("[1.]", "invalid number ending at byte 3"),
        ("[1e]", "invalid number ending at byte 3"),
        ("[.5]", "expected a value at byte 1"),
        ("[+1]", "expected a value at byte 1"),
        ("[NaN]", "expected a value at byte 1"),
        ("[-Infinity]", "invalid number ending at byte 2"),
        ('["\u00e9", x]', "expected a value at byte 7"),  # bytes, not characters
        ('["\u00e9", trUe]', "invalid literal at byte 9"),
        ("[tru]", "invalid literal at byte 4"),
        ("[nulL]", "invalid literal at byte 4"),
        ("{} x", "trailing data after the value at byte 3"),
        ("{}{}", "trailing data after the value at byte 2"),
        ("[1" + "0" * 5000 + "]", "number with too many digits ending at byte 5002"),
        ('"abc', "input ended before the value was complete"),
        ('{"a": [1, 2', "input ended before the value was complete"),
        ("tr", "input ended before the value was complete"),
        ("", "input ended before any value"),
        (" \n", "input ended before any value"),
        ("0" * 10, "invalid number ending at byte 10"),
    ],
)
def test_malformed_text_stops_with_a_reason(text: str, reason: str) -> None:
    for fragments in ([text], list(text)):
        parser, _ = run(fragments, finish=True)
        assert parser.failed == reason
        with pytest.raises(UsageError):
            parser.feed("{}")


def test_the_value_stays_as_it_was_at_the_failure_point() -> None:
    parser = PartialJSON()
    deltas = parser.feed('{"a": [1, "xy\x01z", 3]}')
    assert parser.failed == "control character in string at byte 13"
    assert deltas[-1] == PathDelta(path="/a/1", op="append", value="xy")
    assert parser.snapshot() == {"a": [1, "xy"]}
    assert parser.provisional == {"", "/a", "/a/1"}
    assert parser.feed("more") == []
    assert parser.finish() == []
    assert parser.failed == "control character in string at byte 13"


@pytest.mark.parametrize(
    ("fragments", "reason"),
    [
        (['{"a": "', "b\x01c", '"}'], "control character in string at byte 8"),
        (['["x', 'y\tz"]'], "control character in string at byte 4"),
        (['"\\', "n\u00e9\n"], "control character in string at byte 5"),
    ],
)
def test_a_fragment_of_string_content_is_checked_whole(fragments: list[str], reason: str) -> None:
    for pieces in (fragments, list("".join(fragments))):
        parser, _ = run(pieces)
        assert parser.failed == reason


@pytest.mark.parametrize("text", ['{"a": [1, x', '{"a": "b\x01', '{"a": tx', "[1] 2"])
def test_a_failed_parser_takes_nothing_more(text: str) -> None:
    parser, _ = run(list(text))
    failed, fed, value = parser.failed, parser.bytes_fed, copy.deepcopy(parser.snapshot())
    assert failed is not None
    for fragment in ["1", '"', "\\", " ", "}", "ab", ""]:
        assert parser.feed(fragment) == []
    assert (parser.failed, parser.bytes_fed, parser.snapshot()) == (failed, fed, value)
    assert parser.finish() == []
    with pytest.raises(UsageError):
        parser.feed("1")


def test_depth_limit() -> None:
    parser, _ = run(["[" * 64 + "]" * 64], finish=True)
    assert parser.failed is None
    parser, _ = run(["[" * 65])
    assert parser.failed == "nesting deeper than 64 at byte 64"
    parser, _ = run(['{"a": {"b": {'], max_depth=2)
    assert parser.failed == "nesting deeper than 2 at byte 12"
    assert parser.snapshot() == {"a": {}}


@pytest.mark.parametrize(
    "text",
    [
        '[[1, [2]], {"a": [3]}] ',
        "[" * 65 + "]" * 65,
        '{"a": [[1]], "b": [[[2]]]}',
        '{"a": 1, "a": {"x": [1]}, "b": 2, "a": "s"}',
        '{"a": [1, NaN], "b": 2}',
        '{"a": [1, 2], "b": -Infinity}',
        '{"a": [1, 2, ], "b": 3}',
        '{"a": {"x": 1, }, "b": 3}',
        '[{"a": 1}, {"b": 2.5e3}, [true, false, null], "\\u00e9\\"", 10]',
        '{"k": "v", "n": 12, "m": 1.5e, "z": 0}',
        '{"k": 01}',
        '{"a": [1, 2], "b": {"c": [3, 4]}, "d": 5} x',
    ],
)
@pytest.mark.parametrize("size", [1, 3, 7, 11, 1000])
def test_values_read_in_one_step_match_the_step_by_step_reading(text: str, size: int) -> None:
    """Whole values, members and container rests that end inside a fragment take the C scanner;
    depth, duplicate keys, NaN, invalid numbers and trailing commas must come out the same."""
    fragments = [text[i : i + size] for i in range(0, len(text), size)]
    results = []
    for pieces in (fragments, list(text)):
        parser, deltas = run(pieces, max_depth=3 if "[[[" in text else 64)
        deltas += parser.finish()
        results.append((parser.failed, coalesce(deltas), canon(parser.snapshot())))
    assert results[0] == results[1]


def test_size_limit_and_byte_count() -> None:
    parser = PartialJSON(max_bytes=10)
    assert parser.feed('{"a": "') != []
    assert parser.feed("\u00e9") == [PathDelta(path="/a", op="append", value="\u00e9")]
    assert parser.bytes_fed == 9
    assert parser.feed("\u00e9") == []
    assert parser.failed == "size over 10 bytes"
    assert parser.bytes_fed == 11
    assert parser.snapshot() == {"a": "\u00e9"}
    lone = PartialJSON()
    lone.feed('"\ud800')
    assert lone.bytes_fed == 4


LONG = json.dumps(
    {"k\u00e9": 'ab\u00e9\u65e5\U0001f600\n"' * 200, "n": [12, 3.5, True, None], "s": "t"},
    ensure_ascii=False,
)


@pytest.mark.parametrize("size", [1, 5])
@pytest.mark.parametrize(
    "max_bytes", [0, 1, 1023, 1024, 1025, 2047, 2048, 2049, 3000, len(LONG.encode()), None]
)
def test_the_size_limit_is_exact_at_every_fragment(size: int, max_bytes: int | None) -> None:
    """The byte count is also the internal compaction clock (every 1024 bytes): max_bytes
    still stops the parser at exactly the fragment that passes it, wherever that falls."""
    fragments = [LONG[i : i + size] for i in range(0, len(LONG), size)]
    fed = list(itertools.accumulate(len(f.encode()) for f in fragments))
    over = next(
        (k for k, total in enumerate(fed) if max_bytes is not None and total > max_bytes), None
    )
    parser, deltas = run(fragments, max_bytes=max_bytes)
    if over is None:
        assert parser.failed is None
        assert parser.bytes_fed == fed[-1]
        assert parser.complete
        return
    unlimited, before = run(fragments[:over])
    assert parser.failed == f"size over {max_bytes} bytes"
    assert parser.bytes_fed == fed[over]
    assert deltas == before
    assert canon(parser.snapshot()) == canon(unlimited.snapshot())
    assert parser.provisional == unlimited.provisional


def test_a_string_fed_by_the_character_is_joined_as_it_grows() -> None:
    """One piece per character only briefly: memory stays a small multiple of the text."""
    text = '"' + "x\u00e9\\n\u65e5\\u00e9\U0001f600" * 1500
    parser = PartialJSON()
    longest = 0
    for char in text:
        parser.feed(char)
        longest = max(longest, len(parser._pieces))
    assert longest <= _COMPACT_BYTES
    assert parser.snapshot() == json.loads(text + '"')


def test_pointers_escape_keys() -> None:
    _parser, deltas = run(['{"a/b~c": {"": [true]}}'])
    assert [d.path for d in deltas if d.op == "set"] == ["", "/a~1b~0c", "/a~1b~0c/", "/a~1b~0c//0"]


def test_provisional_is_the_path_to_the_growing_edge() -> None:
    parser, _ = run(['{"a": {"b": "x'])
    assert parser.provisional == {"", "/a", "/a/b"}
    parser.feed('", "c": [1, 2')
    assert parser.provisional == {"", "/a", "/a/c"}
    assert parser.pending == "/a/c/1"


def test_the_snapshot_is_live_and_set_values_belong_to_the_receiver() -> None:
    parser = PartialJSON()
    opened = parser.feed('{"a": [')
    value = parser.snapshot()
    for d in opened:
        assert isinstance(d.value, dict | list)
        d.value.clear()  # a receiver may fill its own copy; the parser's value is untouched
    assert value == {"a": []}
    parser.feed('1, "b')
    assert parser.snapshot() is value
    assert value == {"a": [1, "b"]}


def test_finished_parser_refuses_use() -> None:
    parser, _ = run(["{}"], finish=True)
    with pytest.raises(UsageError):
        parser.feed("")
    with pytest.raises(UsageError):
        parser.finish()
    with pytest.raises(UsageError):
        PartialJSON(max_depth=0)


def test_deltas_are_ordinary_frozen_values() -> None:
    """The deltas of every path (cached one-character appends, content, structure) are
    PathDelta values built through its __init__: equal, hashed and shown as one, and frozen."""
    parser = PartialJSON()
    made = [
        *parser.feed('{"a": "'),
        *parser.feed("x"),
        *parser.feed("yz"),
        *parser.feed('", "b": 1}'),
    ]
    expected = [
        PathDelta(path="", op="set", value={}),
        PathDelta(path="/a", op="set", value=""),
        PathDelta(path="/a", op="append", value="x"),
        PathDelta(path="/a", op="append", value="yz"),
        PathDelta(path="/a", op="end", value=None),
        PathDelta(path="/b", op="set", value=1),
        PathDelta(path="", op="end", value=None),
    ]
    assert made == expected
    assert [hash(d) for d in made[2:]] == [hash(d) for d in expected[2:]]  # ({} is unhashable)
    assert [repr(d) for d in made] == [repr(d) for d in expected]
    for delta in made:
        assert type(delta) is PathDelta
        with pytest.raises(FrozenInstanceError):
            delta.path = "/b"  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    [
        '"\\u00e9"',  # the quote closes a string the handlers grew (a \\u escape)
        '{"a\\u00e9b": "x\\u00e9", "k": "\\ud83d\\ude00", "": ""}',
        "[1, -2.5e3,7 ,0]",
        '{"n": 12}',
        '[true, false, null, [], {}, [[{"a": [true]}]]]',
        ' "x\\\\y" ',
        "12",
    ],
)
def test_one_character_fragments_give_the_deltas_of_the_whole_text(text: str) -> None:
    """Each character through its state's one-character step, pinned on texts where the
    step and the handlers meet (the handlers' appends are not repeated by a later step)."""
    parser, by_char = run(list(text), finish=True)
    _, whole = run([text], finish=True)
    assert coalesce(by_char) == whole
    assert canon(parser.snapshot()) == canon(json.loads(text))


def test_one_character_deltas_are_values_not_identities() -> None:
    """A reused delta (plain character, escape) always names the string it is fed into."""
    parser = PartialJSON()
    steps = [
        ('["', "x", "/0", "x"),
        ('", "', "x", "/1", "x"),
        ("\\", "n", "/1", "\n"),
        ('", "\\', "n", "/2", "\n"),
    ]
    for before, char, path, value in steps:
        parser.feed(before)
        assert parser.feed(char) == [PathDelta(path=path, op="append", value=value)]


# --------------------------------------------------------------------------- jiter


@_settings
@given(documents())
def test_agrees_with_jiter_partial_mode_where_their_semantics_agree(text: str) -> None:
    """Compare with ``jiter.from_json(prefix, partial_mode="trailing-strings")``.

    Skipped prefixes, where the two differ on purpose (and why ours is the right preview):

    * a number still being read (``pending``): jiter reports ``{"a": 12}`` for ``{"a": 12``,
      but ``123`` may follow; we report a number only once a delimiter ends it;
    * nothing visible yet (empty, whitespace, a top-level ``tr``): jiter raises, we say ``None``;
    * lone surrogate escapes (``"\\ud83d"`` not followed by a low half): jiter rejects the text,
      json.loads (and so the final snapshot) keeps the lone code unit;
    * ``NaN`` / ``Infinity``: jiter accepts them by default, RFC 8259 does not (we fail);
      never generated here.
    """
    jiter = pytest.importorskip("jiter")
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return  # holds a lone surrogate
    parser = PartialJSON()
    for k in range(len(text) + 1):
        if k:
            parser.feed(text[k - 1])
        visible = parser.snapshot() is not None or parser.complete or parser.provisional
        if parser.pending is not None or not visible:
            continue
        prefix = text[:k].encode("utf-8")
        theirs = jiter.from_json(prefix, partial_mode="trailing-strings")
        assert canon(theirs) == canon(parser.snapshot()), text[:k]
