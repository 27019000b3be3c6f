"""The adapters' length proof against dropped duplicate keys, and the gate's refusal of them.

Both rest on one fact about orjson (pinned here for every code point): it writes every value
at its shortest JSON spelling, so for a float-free tree ``len(dumps(loads(t))) <= len(t)``,
and a member dropped for a repeated key makes it strictly shorter.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import orjson
import pytest

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
