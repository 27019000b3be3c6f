"""The repeated-key check: its cheap test never rules out a repeat the strict re-read finds."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import CallState, StreamParser
from toollatch.core._adapters._base import has_duplicate_keys
from toollatch.stages import AnomalyKind

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


def _repeats(text: str) -> bool:
    """The strict read: does some object in ``text`` repeat a key?"""
    return has_duplicate_keys(text)


_ENVELOPES = st.sampled_from(
    [
        '{"candidates":[{"content":{"parts":[%s],"role":"model"},"finishReason":"STOP"}]}',
        '{"candidates":[{"content":{"parts":[%s]},"index":0,"index":0,"finishReason":"STOP"}]}',
        '{"candidates":[{"content":{"parts":[{"text":"hi"},%s]},"finishReason":"STOP"}],"v":"m"}',
        '{"candidates":[{"content":{"parts":[%s,{"text":"a","text":"b"}]},"finishReason":"STOP"}]}',
    ]
)


@settings(max_examples=300)
@given(args=_members(_VALUES), envelope=_ENVELOPES, spell=_SPELLINGS)
def test_a_gemini_whole_call_fails_exactly_when_its_chunk_repeats_a_key(
    args: str, envelope: str, spell: object
) -> None:
    """Gemini's check writes the chunk with the call's ``args`` already written (the text its
    close reuses) standing in as an ``orjson.Fragment``: the verdict must still be the strict
    read's, for a repeat in the arguments or anywhere else in the chunk."""
    text = spell(envelope % f'{{"functionCall":{{"name":"f","args":{args}}}}}')  # type: ignore[operator]
    parser = StreamParser("gemini")
    parser.feed(f"data: {text}\n\n".encode())
    round_ = parser.finish()
    failed = [c for c in round_.calls if c.state is CallState.FAILED]
    kinds = {a.kind for a in round_.anomalies}
    assert (AnomalyKind.DUPLICATE_KEY in kinds) is _repeats(text), text
    assert bool(failed) is _repeats(text), text
