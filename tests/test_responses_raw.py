"""OpenAI Responses' learned raw spelling, with its ``sequence_number`` counter, decides as
the stages do.

Every delta event of a Responses stream carries a counter that changes from event to event,
so the adapter learns a spelling with a *counter* (see ``RawContinuation``): the integer's
digits are checked in place, the rest of the event must be exactly the learned bytes. The
four spellings below are the wire's (fixtures openai_responses/two_function_calls.sse,
function_call_llm_cli.sse, compat_deepseek/responses_api_function_call.sse, and the
benchmark's); the near misses must all take the decoded route (which decides what they
are), and a test counts that the others really took the raw one.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus_dir
from test_pipeline import RAW_TAKEN, same_both_ways
from toollatch._adapters._spelling import learned_spelling, raw_continuation
from toollatch._events import CallKey
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
def test_each_wire_spelling_is_learned_and_taken_raw(form: str) -> None:
    """The spelling is learned from the first delta the decoded route finds, then every
    event spelled so (any string, padding and 3-digit counter) takes the raw route."""
    reads = [*HEAD, *taken(form), *END]
    for shape in (reads, [b"".join(reads)]):
        assert same_both_ways("openai_responses", "sse", shape) == len(taken(form))
        assert [len(taken(form)) - 1] == RAW_TAKEN


@pytest.mark.parametrize("form", sorted(SPELLINGS))
def test_near_misses_take_the_decoded_route(form: str) -> None:
    """After a learned spelling, no near miss is taken raw (each goes to the decoded route,
    which judges it as the stages do); the raw route takes the good events around them."""
    for miss in near(form):
        reads = [*HEAD, delta(form), miss, delta(form, n=b"456"), *END]
        assert same_both_ways("openai_responses", "sse", reads) >= 2
        # the miss is never raw; the event after it is, unless the miss cleared or changed
        # the spelling (a general event, or a fragment of another width or item)
        assert RAW_TAKEN[0] <= 1, miss


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


def test_counters_of_more_than_18_digits_are_never_learned() -> None:
    """A 20-digit counter makes no spelling (orjson reads a number past 2**64 as a float, and
    refuses one past 1e308): every event takes the decoded route, which decides, as the
    stages do, that a 310-digit counter is not JSON (a lost event)."""
    big, bigger = b"18446744073709551615", b"1" + b"0" * 310
    reads = [*HEAD, delta("prefix", n=big), delta("prefix", n=big[::-1]), *END]
    assert same_both_ways("openai_responses", "sse", reads) == 2
    assert RAW_TAKEN == [0]
    reads = [*HEAD, delta("prefix", n=big), delta("prefix", n=bigger), *END]
    assert same_both_ways("openai_responses", "sse", reads) == 1
    payload = delta("prefix", n=big).split(b"data: ")[1].strip()
    key, field = CallKey(0, 0, "fc_1"), b'"delta":'
    assert learned_spelling(payload, key, field, _put, "sequence_number") is None
    fits = delta("prefix", n=big[:18]).split(b"data: ")[1].strip()
    assert learned_spelling(fits, key, field, _put, "sequence_number") is not None


def _put(event: dict[str, Any], text: str) -> None:
    event["delta"] = text


def test_a_learned_spelling_is_proven_on_the_event_it_came_from() -> None:
    """Learning refuses what a probe decode does not confirm: the counter must be the
    top-level field's own digits (not a key that ends like it), in the prefix or last."""
    key = CallKey(0, 0, "fc_1")
    fake = b'{"type":"t","sequence_number":5,"a\\"sequence_number":5,"delta":"x"}'
    assert learned_spelling(fake, key, b'"delta":', _put, "sequence_number") is None
    middle = b'{"type":"t","delta":"x","sequence_number":5,"obfuscation":"ab"}'
    assert learned_spelling(middle, key, b'"delta":', _put, "sequence_number") is None
    good = b'{"type":"t","sequence_number":5,"delta":"x","obfuscation":"ab"}'
    raw = learned_spelling(good, key, b'"delta":', _put, "sequence_number")
    assert raw is not None
    assert raw[0] == b'{"type":"t","sequence_number":'
    assert orjson.loads(good)["sequence_number"] == 5


def test_raw_continuation_refuses_a_counter_outside_its_parts() -> None:
    key = CallKey(0, 0, "k")
    with pytest.raises(ValueError, match="counter lies"):
        raw_continuation(b'{"n":1,"d":', b"}", key, counter=(len(b'{"n":1,"d":'), 1))
    with pytest.raises(ValueError, match="counter lies"):
        raw_continuation(b'{"d":', b',"n":1}', key, counter=(-1, 1))  # it ends the event
    with pytest.raises(ValueError, match="1 to 18 digits"):
        raw_continuation(b'{"n":1,"d":', b"}", key, counter=(5, 19))
    with pytest.raises(ValueError, match="needs a suffix"):
        raw_continuation(b'{"d":', b"", key)


_MEMBERS = {"type", "delta", "item_id", "output_index", "sequence_number", "obfuscation"}


def test_the_fixture_spellings_are_the_wire_s() -> None:
    """The spellings above are byte for byte those of the recorded streams' deltas (up to
    the values), so the raw route is measured on what OpenAI sends."""
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
