"""The size budget of tool results: UTF-8 bytes, exact, never a split character, surrogate
pair or JSON escape, and a marker stating both sizes."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toollatch import ConfigError, ResultLimits
from toollatch.runtime import DEFAULT_MAX_RESULT_BYTES, MIN_RESULT_BYTES, truncate_result
from toollatch.tools._results import marker

MARKER = re.compile(r"\n\[toollatch: result truncated: the first (\d+) of (\d+) bytes are shown\]$")


def size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def split(out: str) -> tuple[str, int, int]:
    """(head, kept, original) of a truncated result; fails when it has no marker."""
    found = MARKER.search(out)
    assert found is not None, out[-120:]
    return out[: found.start()], int(found.group(1)), int(found.group(2))


def test_a_result_within_the_budget_is_returned_as_it_is():
    text = "ü" * (1000 // 2)  # exactly 1000 bytes
    out, original = truncate_result(text, 1000)
    assert out is text and original is None


@pytest.mark.parametrize("char", ["a", "é", "€", "😀"])  # 1, 2, 3 and 4 bytes in UTF-8
@pytest.mark.parametrize("budget", [256, 257, 258, 259, 300, 1001, 1100, 1500])
def test_a_long_result_is_cut_on_a_character_at_the_budget_with_the_marker(char, budget):
    text = char * 2000
    out, original = truncate_result(text, budget)
    head, kept, stated = split(out)
    assert original == stated == size(text)
    assert kept == size(head) and head == text[: len(head)]
    assert size(out) <= budget
    # the longest head that fits: one more character would not
    assert size(head + char + marker(kept + size(char), original)) > budget


def test_the_marker_counts_are_the_bytes_kept_and_the_bytes_the_tool_returned():
    out, original = truncate_result("x" * 100_000, 1000)
    head, kept, stated = split(out)
    assert (kept, stated, original) == (len(head), 100_000, 100_000)
    assert out.endswith("the first 929 of 100000 bytes are shown]")
    assert size(out) == 1000


def test_a_surrogate_pair_held_as_two_code_points_is_never_split():
    pair = "\ud83d\ude00"  # what surrogatepass decoding leaves in a str: two code points
    text = "a" + pair * 500
    for budget in range(256, 270):
        head, kept, _ = split(truncate_result(text, budget)[0])
        assert head.endswith(pair) and kept == size(head)


def test_a_json_text_is_never_cut_inside_an_escape_or_between_escaped_halves_of_a_pair():
    pieces = ["\\ud83d\\ude00", "\\u00e9", "\\n", '\\"', "\\\\", "ab"]
    text = '{"k":"' + "".join(pieces * 40) + '"}'
    for budget in range(256, 256 + 40):
        head, _, _ = split(truncate_result(text, budget)[0])
        body = head[len('{"k":"') :]
        # the head is whole pieces: parsing it as a JSON string's content never fails,
        # and never yields a lone surrogate
        decoded = json.loads('"' + body + '"')
        assert not any("\ud800" <= c <= "\udfff" for c in decoded), body[-14:]


def test_a_run_of_backslashes_is_cut_between_escapes():
    text = '"' + "\\\\" * 300 + '"'  # a JSON string of 300 escaped backslashes
    for budget in range(256, 262):
        head, _, _ = split(truncate_result(text, budget)[0])
        assert (len(head) - 1) % 2 == 0  # whole "\\" escapes after the quote


def test_a_budget_too_small_for_the_marker_is_a_config_error():
    with pytest.raises(ConfigError, match="max_bytes must be an integer >= 256"):
        truncate_result("x", MIN_RESULT_BYTES - 1)
    with pytest.raises(ConfigError):
        truncate_result("x", True)  # type: ignore[arg-type]


def test_result_limits_pick_the_deployer_then_the_tool_then_the_default():
    limits = ResultLimits(max_bytes=4096, tools={"big": 100_000})
    assert limits.budget("big", declared=512) == 100_000
    assert limits.budget("small", declared=512) == 512
    assert limits.budget("other") == 4096
    assert ResultLimits().max_bytes == DEFAULT_MAX_RESULT_BYTES == 65536
    for bad in ({"max_bytes": 10}, {"tools": {"x": 0}}, {"tools": {"x": 1.5e6}}, {"tools": [1]}):
        with pytest.raises(ConfigError):
            ResultLimits(**bad)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        st.characters(codec="utf-8")
        | st.characters(categories=["Cs"])
        | st.sampled_from(["\\", "u", "d", "8", "3", "c", "0", '"']),
        max_size=400,
    ),
    st.integers(MIN_RESULT_BYTES, 600),
)
def test_any_text_fits_its_budget_and_keeps_a_prefix(text, budget):
    out, original = truncate_result(text, budget)
    assert size(out) <= budget
    if original is None:
        assert out == text and size(text) <= budget
        return
    head, kept, stated = split(out)
    assert text.startswith(head) and kept == size(head) and stated == original == size(text)
    # backing off for an escape or a pair costs at most 11 characters
    assert size(head) >= budget - len(marker(original, original)) - 11 * 4
