"""The repeated-key check: its cheap test never rules out a repeat the strict re-read finds."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch.core._adapters._base import has_duplicate_keys

_KEYS = st.sampled_from(["a", "b", "a:b", ":", "\u00e9", ""])
_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["", ":", "x:y", '"', "\\"])
).map(json.dumps) | st.just('"\\u003a"')  # (an escaped colon)


def _members(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """An object's text from (key, value text) pairs: keys may repeat."""
    pair = st.tuples(_KEYS, children).map(lambda kv: f"{json.dumps(kv[0])}:{kv[1]}")
    return st.lists(pair, max_size=4).map(lambda items: "{" + ",".join(items) + "}")


_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        _members(inner), st.lists(inner, max_size=3).map(lambda x: "[" + ",".join(x) + "]")
    ),
    max_leaves=12,
)
_SPELLINGS = st.sampled_from([lambda t: t, lambda t: t.replace(":", " : ")])


@settings(max_examples=500)
@given(text=_members(_VALUES), spell=_SPELLINGS, as_bytes=st.booleans())
def test_the_cheap_test_agrees_with_the_strict_read(
    text: str, spell: object, as_bytes: bool
) -> None:
    data: str | bytes = spell(text)  # type: ignore[operator]
    if as_bytes:
        data = data.encode()  # type: ignore[union-attr]
    assert has_duplicate_keys(data, orjson.loads(data)) == has_duplicate_keys(data)


def test_a_repeat_hidden_behind_an_escaped_colon_is_found() -> None:
    """A kept string's escaped colon must not make up for a dropped member's colon."""
    data = '{"a":"x","a":"\\u003a"}'
    assert has_duplicate_keys(data, orjson.loads(data))


def test_a_repeat_nested_deeper_than_orjson_writes_is_found() -> None:
    data = "[" * 300 + '{"k":1,"k":2}' + "]" * 300
    assert has_duplicate_keys(data, orjson.loads(data))
    other = data.replace('"k":2', '"j":2')
    assert not has_duplicate_keys(other, orjson.loads(other))
