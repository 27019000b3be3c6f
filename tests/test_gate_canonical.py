"""The gate's one-decode route for canonical text, and the adapters' length proof.

Both rest on one fact about orjson (pinned here for every code point): it writes every value
at its shortest JSON spelling, so for a float-free tree ``len(dumps(loads(t))) <= len(t)``,
and a member dropped for a repeated key makes it strictly shorter.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch.core import _gate
from toollatch.core._adapters._base import has_duplicate_keys
from toollatch.core._gate import _Reject, strict_loads


def _shortest(char: str) -> int:
    """Bytes of the shortest JSON string literal holding ``char``."""
    if char in '"\\':
        return 4
    if ord(char) < 0x20:
        return len(json.dumps(char))  # \n and the like, else \u00XX: json's are shortest
    return 2 + len(char.encode())


def test_orjson_writes_every_code_point_at_its_shortest_spelling() -> None:
    longer = [
        hex(cp)
        for cp in range(0x110000)
        if not 0xD800 <= cp < 0xE000 and len(orjson.dumps(chr(cp))) != _shortest(chr(cp))
    ]
    assert longer == []


def _outcome(parse: Callable[[], object]) -> object:
    try:
        return ("ok", parse())
    except _Reject as rej:
        return ("rejected", rej.code)


def _strict_only(text: str, max_depth: int, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as patch:
        patch.setattr(_gate, "_canonical_loads", lambda text, depth: _gate._UNDECIDED)
        return _outcome(lambda: strict_loads(text, max_depth=max_depth))


_KEYS = st.sampled_from(["a", "b", ":", "\u00e9", ""])
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "x", '"', "\\", "\n", "\x7f", "\u2028", "🙂"]),
).map(lambda v: json.dumps(v, ensure_ascii=False)) | st.sampled_from(
    ["1e2", "1E+2", "-0", "0.5e1", '"\\u0041"', '"\\/"', '"\\ud83d\\ude42"', "1e999", '"\\ud800"']
)


def _members(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pair = st.tuples(_KEYS, children).map(lambda kv: f"{json.dumps(kv[0])}:{kv[1]}")
    return st.lists(pair, max_size=4).map(lambda items: "{" + ",".join(items) + "}")


_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        _members(inner), st.lists(inner, max_size=3).map(lambda x: "[" + ",".join(x) + "]")
    ),
    max_leaves=10,
)


@settings(max_examples=600, deadline=None)
@given(text=_VALUES, spaced=st.booleans(), max_depth=st.integers(0, 4))
def test_the_one_decode_route_decides_as_the_strict_parse(
    text: str, spaced: bool, max_depth: int
) -> None:
    """Same value or same rejection, with or without the orjson route (repeats, floats,
    big integers, escapes, lone surrogates, overflow and depth included)."""
    if spaced:
        text = text.replace(",", ", ")
    with pytest.MonkeyPatch.context() as patch:
        expected = _strict_only(text, max_depth, patch)
    got = _outcome(lambda: strict_loads(text, max_depth=max_depth))
    assert got == expected
    if got[0] == "ok":  # same types too (an integer over 64 bits stays an int)
        assert orjson.dumps(got[1]) == orjson.dumps(expected[1])  # type: ignore[index]


def _float_hides_a_repeat() -> str:
    """A text whose dropped member is exactly as long as what orjson's float adds."""
    for exponent in range(2, 12):
        for pad in range(6):
            text = f'{{"f":1e{exponent},"k":"{"x" * pad}","k":1}}'
            if len(orjson.dumps(orjson.loads(text))) == len(text):
                return text
    raise AssertionError("no such text")


def test_a_repeat_hidden_by_a_longer_float_is_refused_by_the_gate() -> None:
    text = _float_hides_a_repeat()
    with pytest.raises(_Reject, match="duplicate key"):
        strict_loads(text, max_depth=8)


def test_a_repeat_hidden_by_a_longer_float_is_found_by_the_adapters() -> None:
    data = _float_hides_a_repeat().encode()
    assert has_duplicate_keys(data, orjson.loads(data))


@pytest.mark.parametrize(
    "text",
    [
        '{"cmd":"ls","cmd":"rm -rf /"}',
        '{"a":{"b":1,"b":1}}',
        '[{"":0,"":0}]',
        '{"a": "x:y", "a": "z"}',
    ],
)
def test_canonical_repeats_are_refused(text: str) -> None:
    with pytest.raises(_Reject, match="duplicate key"):
        strict_loads(text, max_depth=8)
    assert has_duplicate_keys(text.encode(), orjson.loads(text))


def test_the_gemini_spelling_takes_the_colon_count() -> None:
    """Gemini writes ``": "`` (fixture gemini/parallel_function_calls.sse): the lengths
    differ, the colons decide, an escaped colon sends the event to the strict read."""
    fine = b'{"args": {"path": "a:b", "n": 1}, "name": "w"}'
    assert not has_duplicate_keys(fine, orjson.loads(fine))
    repeated = b'{"args": {"path": "a:b", "path": "x"}, "name": "w"}'
    assert has_duplicate_keys(repeated, orjson.loads(repeated))
    hidden = b'{"args": {"p": "\\u003a", "p": "x"}, "name": "w"}'
    assert has_duplicate_keys(hidden, orjson.loads(hidden))
