"""OpenAI Responses' delta events in the wire's spellings, with their ``sequence_number``
counter, and near misses of them, decide as the stages do.

The four spellings below are the wire's (fixtures openai_responses/two_function_calls.sse,
function_call_llm_cli.sse, compat_deepseek/responses_api_function_call.sse, and the
benchmark's).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus_dir
from test_pipeline import same_both_ways
from toollatch.testing import sse

_TYPE = b'"type":"response.function_call_arguments.delta"'
SPELLINGS = {
    # the counter in the prefix, no padding (the benchmark's, and the scripted server's order)
    "prefix": (
        b'{%(t)s,"sequence_number":%(n)s,"item_id":"%(i)s","output_index":%(o)s,"delta":%(d)s}'
    ),
    # the counter in the prefix, the padding last (two_function_calls.sse, compat_azure)
    "prefix padded": (
        b'{%(t)s,"sequence_number":%(n)s,"item_id":"%(i)s","output_index":%(o)s,"delta":%(d)s,'
        b'"obfuscation":"%(p)s"}'
    ),
    # the padding inside, the counter last (function_call_llm_cli.sse)
    "close": (
        b'{%(t)s,"delta":%(d)s,"item_id":"%(i)s","obfuscation":"%(p)s","output_index":%(o)s,'
        b'"sequence_number":%(n)s}'
    ),
    # the counter last, no padding (compat_deepseek)
    "suffix": (
        b'{%(t)s,"delta":%(d)s,"item_id":"%(i)s","output_index":%(o)s,"sequence_number":%(n)s}'
    ),
}


def delta(
    form: str,
    d: bytes = b'"ab"',
    n: bytes = b"123",
    i: bytes = b"fc_1",
    p: bytes = b"Z9",
    o: bytes = b"0",
) -> bytes:
    """One delta event in ``form``'s spelling (``d``: the delta's JSON, ``n``: the counter's,
    ``i``: the item id, ``p``: the padding, ``o``: the output index)."""
    values = {b"t": _TYPE, b"d": d, b"n": n, b"i": i, b"p": p, b"o": o}
    payload = SPELLINGS[form] % values
    return b"event: response.function_call_arguments.delta\ndata: " + payload + b"\n\n"


def _item(call: str) -> dict[str, Any]:
    return {"type": "function_call", "id": call, "call_id": f"call_{call}", "name": "write_file"}


def added(call: str, index: int) -> bytes:
    return sse(
        {"type": "response.output_item.added", "output_index": index, "item": _item(call)},
        named=True,
    )


HEAD = [added("fc_1", 0), added("fc_2", 1)]
END = [
    sse({"type": "response.function_call_arguments.done", "item_id": "fc_1", "arguments": "{}"}),
    sse({"type": "response.completed", "response": {"status": "completed"}}, named=True),
]


def taken(form: str) -> list[bytes]:
    """Events the raw route takes once ``form`` is learned from the first (3-digit counters)."""
    return [
        delta(form),
        delta(form, b'"c\\"d\\\\"', b"124"),  # an escaped quote and backslash at the end
        delta(form, b'"\\",\\"item_id\\":\\"fc_2\\""', b"999"),  # another id, inside the string
        delta(form, b'"\\u00e9 \xc3\xa9"', b"100", p=b""),
        delta(form, b'"x"', b"555", p=b"abcdefABCDEF0123456789"),
        delta(form, b' "y" ', b"556"),  # JSON spaces around the string: still one string
    ]


def near(form: str) -> list[bytes]:
    """Events spelled almost as ``form``: the decoded route decides each (3-digit counters)."""
    misses = [
        delta(form, b'"a","delta":"b"'),  # a repeated key: the last one counts
        delta(form, b'"a"', i=b"fc_2"),  # another call's (open) item
        delta(form, b'"a"', i=b"fc_3"),  # an item never announced
        delta(form, b'"a"', b"012"),  # a leading 0: not JSON
        delta(form, b'"a"', b"-12"),  # an integer, but not the counter's digits
        delta(form, b'"a"', b"1.5"),  # not an integer
        delta(form, b'"a"', b"1e2"),
        delta(form, b'"a"', b'"7"'),
        delta(form, b'"a"', b"[1]"),
        delta(form, b'"a"', b"nul"),
        delta(form, b'"a"', b"12,"),
        delta(form, b'"a"', b'1,"item_id":"fc_2"'),  # a second item id after the counter
        delta(form, b'"a"', b"1234"),  # a digit more: learned again
        delta(form, b"5"),  # a delta that is not a string
        delta(form, b'""'),  # empty: the general path
        delta(form, b'"\\ud800"'),  # a lone surrogate
        delta(form, b'"\xff"'),  # not UTF-8
    ]
    if form.startswith("prefix"):
        # The counter followed by the string and what follows it, not by the learned rest
        # of the prefix (invalid JSON: the string would otherwise be taken as a fragment).
        full = delta(form, b'"zz"')
        counter_end = full.index(b'"sequence_number":123') + len(b'"sequence_number":123')
        string_at = full.index(b'"delta":"zz"') + len(b'"delta":')
        misses.append(full[:counter_end] + full[string_at:])
    if "padded" in form or form == "close":
        misses.append(delta(form, p=b"a-b"))  # padding that is not letters and digits
        misses.append(delta(form, p=b'a","obfuscation":"b'))
    return misses


STRUCTURE = [
    added("fc_1", 0),  # announced again: clears the spelling
    sse({"type": "response.function_call_arguments.done", "item_id": "fc_2", "arguments": "{}"}),
    sse({"type": "response.completed", "response": {"status": "completed"}}, named=True),
    sse({"type": "error", "code": "server_error", "message": "busy"}),
    delta("prefix").replace(b"event: response.function_call_arguments.delta", b"event: error"),
]


@pytest.mark.parametrize("form", sorted(SPELLINGS))
def test_each_wire_spelling_is_a_fragment(form: str) -> None:
    """Every event spelled so (any string, padding and 3-digit counter) is a fragment."""
    reads = [*HEAD, *taken(form), *END]
    for shape in (reads, [b"".join(reads)]):
        assert same_both_ways("openai_responses", "sse", shape) == len(taken(form))


@pytest.mark.parametrize("form", sorted(SPELLINGS))
def test_near_misses_decide_as_the_stages_do(form: str) -> None:
    """Each near miss between two good events is judged as the stages judge it."""
    for miss in near(form):
        reads = [*HEAD, delta(form), miss, delta(form, n=b"456"), *END]
        assert same_both_ways("openai_responses", "sse", reads) >= 2


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(SPELLINGS)),
    st.lists(st.integers(0, 10**6), max_size=14),
)
def test_mixed_reads_decide_as_the_stages_do(form: str, picks: list[int]) -> None:
    """Spelled events, near misses and the structure around them in any order, one event
    per read and as one read."""
    pool = [*taken(form), *near(form), *STRUCTURE]
    reads = [*HEAD, *(pool[i % len(pool)] for i in picks), *END]
    same_both_ways("openai_responses", "sse", reads)
    same_both_ways("openai_responses", "sse", [b"".join(reads)])


def test_counters_of_more_than_18_digits_decide_as_the_stages_do() -> None:
    """orjson reads a number past 2**64 as a float, and refuses one past 1e308: a 310-digit
    counter is not JSON (a lost event), as the stages decide."""
    big, bigger = b"18446744073709551615", b"1" + b"0" * 310
    reads = [*HEAD, delta("prefix", n=big), delta("prefix", n=big[::-1]), *END]
    assert same_both_ways("openai_responses", "sse", reads) == 2
    reads = [*HEAD, delta("prefix", n=big), delta("prefix", n=bigger), *END]
    assert same_both_ways("openai_responses", "sse", reads) == 1


_MEMBERS = {"type", "delta", "item_id", "output_index", "sequence_number", "obfuscation"}


def test_the_fixture_spellings_are_the_wire_s() -> None:
    """The spellings above are byte for byte those of the recorded streams' deltas (up to
    the values), so the tests above use what OpenAI sends."""
    found = set()
    for path in corpus_dir().rglob("*.sse"):
        for line in path.read_bytes().split(b"\n"):
            if not line.startswith(b"data: {") or b"arguments.delta" not in line:
                continue
            event = orjson.loads(line[6:])
            if set(event) - _MEMBERS:
                continue
            for form in SPELLINGS:
                spelled = delta(
                    form,
                    orjson.dumps(event["delta"]),
                    str(event.get("sequence_number", "")).encode(),
                    event["item_id"].encode(),
                    str(event.get("obfuscation", "")).encode(),
                    str(event["output_index"]).encode(),
                )
                if spelled.split(b"data: ")[1].strip() == line[6:].strip():
                    found.add(form)
    assert found >= {"prefix padded", "close", "suffix"}
