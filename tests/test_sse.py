"""SSEDecoder: every WHATWG parsing rule, each at every chunking, plus limits and the corpus.

Every case is decoded whole, byte by byte, one event per chunk (the decoder's fast path) and
at Hypothesis-chosen split points (which fall inside CRLF pairs, inside multi-byte UTF-8
characters and produce empty chunks); all must give the same frames.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CORPUS, corpus_dir, decoded_until_error
from toollatch import (
    CallState,
    ConfigError,
    ErrorCode,
    Limits,
    StreamDecodeError,
    StreamParser,
    UsageError,
)
from toollatch.stages import Frame, SSEDecoder
from toollatch.testing import summary

# -- helpers ----------------------------------------------------------------------------------


def feed_all(decoder: SSEDecoder, chunks: Iterable[bytes]) -> list[Frame]:
    frames: list[Frame] = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    return frames + decoder.finish()


def decode(chunks: Iterable[bytes], **kwargs: object) -> list[Frame]:
    return feed_all(SSEDecoder(**kwargs), chunks)  # type: ignore[arg-type]


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """Cut ``data`` at the given offsets; repeated offsets give empty chunks."""
    points = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def per_event(data: bytes) -> list[bytes]:
    """One chunk per event, as most servers write them: exercises the fast path."""
    parts = data.split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]] + [parts[-1]]


def fixed_size(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def cuts_for(data: bytes) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, len(data)), max_size=max(4, len(data) // 2))


def F(data: str, event: str = "message", id: str | None = None, retry: int | None = None) -> Frame:
    return Frame(event=event, data=data, id=id, retry=retry)


# -- the rules, as (stream, expected frames) -------------------------------------------------

CASES: dict[str, tuple[bytes, list[Frame]]] = {
    "lf": (b"data: a\n\ndata: b\n\n", [F("a"), F("b")]),
    "crlf": (b"data: a\r\n\r\ndata: b\r\n\r\n", [F("a"), F("b")]),
    "cr": (b"data: a\r\rdata: b\r\r", [F("a"), F("b")]),
    "mixed_line_ends": (b"data: a\rdata: b\r\ndata: c\n\r\ndata: d\r\r\n", [F("a\nb\nc"), F("d")]),
    "crlf_is_one_line_end": (b"data: a\r\ndata: b\r\n\r\n", [F("a\nb")]),
    "comments_ignored": (b": heartbeat\ndata: a\n:\n: data: no\n\n:ping\n\n", [F("a")]),
    "comment_only_block_no_event": (b": ping\n\n: ping\n\n", []),
    "data_without_space": (b"data:a\n\n", [F("a")]),
    "only_one_space_removed": (b"data:  a \n\n", [F(" a ")]),
    "tab_is_not_space": (b"data:\ta\n\n", [F("\ta")]),
    "multiple_data_lines_joined": (b"data: a\ndata:\ndata: b\n\n", [F("a\n\nb")]),
    "empty_data_dispatches_empty": (b"data:\n\ndata: \n\n", [F(""), F("")]),
    "event_type": (
        b"event: add\ndata: 1\n\nevent:remove\ndata: 2\n\ndata: 3\n\n",
        [F("1", "add"), F("2", "remove"), F("3")],
    ),
    "empty_event_type_is_message": (b"event:\ndata: x\n\n", [F("x")]),
    "last_event_field_wins": (b"event: a\nevent: b\ndata: x\n\n", [F("x", "b")]),
    "no_data_no_dispatch_and_type_reset": (b"event: foo\n\ndata: x\n\n", [F("x")]),
    "id_persists": (
        b"id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\nid\ndata: d\n\n",
        [F("a", id="1"), F("b", id="1"), F("c", id="2"), F("d", id="")],
    ),
    "id_set_by_block_without_data": (b"id: 7\n\ndata: x\n\n", [F("x", id="7")]),
    "id_with_nul_ignored": (
        b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n",
        [F("a", id="1"), F("b", id="1")],
    ),
    "retry_digits_only": (
        b"retry: 3000\ndata: a\n\nretry: 12x\ndata: b\n\nretry: -1\ndata: c\n\n"
        b"retry:\ndata: d\n\nretry: \xef\xbc\x95\ndata: e\n\nretry: 1 \ndata: f\n\n"
        b"retry: 99999999999999999999\ndata: g\n\nretry:007\ndata: h\n\n",
        [F(x, retry=3000) for x in "abcdefg"] + [F("h", retry=7)],
    ),
    "field_without_colon": (b"data\n\ndata\ndata\n\nevent\ndata: x\n\n", [F(""), F("\n"), F("x")]),
    "unknown_fields_ignored": (b"foo: bar\nDATA: x\nData: y\ndatum: q\ndata: z\n\n", [F("z")]),
    "field_named_with_leading_space_ignored": (b" data: x\n\ndata: y\n\n", [F("y")]),
    "space_only_line_is_not_blank": (b"data: a\n \ndata: b\n\n", [F("a\nb")]),
    "colon_in_value_kept": (b'data: {"a": "b:c"}\n\n', [F('{"a": "b:c"}')]),
    "bom_at_start_skipped": (b"\xef\xbb\xbfdata: a\n\n", [F("a")]),
    "bom_later_is_part_of_the_name": (b"data: a\n\n\xef\xbb\xbfdata: b\n\n", [F("a")]),
    "only_one_bom_skipped": (b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n", [F("b")]),
    "bom_only_stream": (b"\xef\xbb\xbf", []),
    "bom_prefix_then_eof": (b"\xef\xbb", []),
    "utf8_multibyte": (
        "event: ünïcode\nid: ïd\ndata: héllo € 𝄞 漢字\n\n".encode(),
        [F("héllo € 𝄞 漢字", "ünïcode", id="ïd")],
    ),
    "invalid_utf8_escaped_not_replaced": (
        b"data: a\xffb\ndata: \xe2\x82\ndata: \xf0\x9f\n\n",
        [F("a\udcffb\n\udce2\udc82\n\udcf0\udc9f")],
    ),
    "invalid_utf8_in_name_and_id_escaped": (
        b"event: a\xff\nid:\xc3\ndata: 1\n\nevent:\xed\xa0\x80\ndata: 2\n\n",
        [F("1", "a\udcff", id="\udcc3"), F("2", "\udced\udca0\udc80", id="\udcc3")],
    ),
    "invalid_utf8_in_comments_and_unknown_fields_ignored": (
        b": \xff heartbeat\nfoo: \xff\ndata: a\n\n",
        [F("a")],
    ),
    "finish_dispatches_unterminated_event": (b"data: a\n\ndata: b", [F("a"), F("b")]),
    "finish_dispatches_without_blank_line": (b"data: a\ndata: b\n", [F("a\nb")]),
    "finish_after_trailing_cr": (b"event: e\rdata: b\r", [F("b", "e")]),
    "finish_without_data_dispatches_nothing": (b"data: a\n\nevent: x\nid: 5", [F("a")]),
    "named_events_switch_heads": (
        b"event: a\ndata: 1\n\nevent: a\ndata: 2\n\nevent: b\ndata: 3\n\ndata: 4\n\n"
        b"event: ab\ndata: 5\n\nevent: a\ndata: 6\n\n",
        [F("1", "a"), F("2", "a"), F("3", "b"), F("4"), F("5", "ab"), F("6", "a")],
    ),
    "named_event_then_several_data_lines": (
        b"event: a\ndata: 1\n\nevent: a\ndata: 1\ndata: 2\n\nevent: a\ndata: 3\n\n",
        [F("1", "a"), F("1\n2", "a"), F("3", "a")],
    ),
    "named_event_then_id_line": (
        b"event: a\ndata: 1\n\nevent: a\nid: 5\ndata: 2\n\nevent: a\ndata: 3\n\n",
        [F("1", "a"), F("2", "a", id="5"), F("3", "a", id="5")],
    ),
    "named_event_cr_in_value": (
        b"event: a\ndata: 1\n\nevent: a\ndata: x\ry\n\nevent: a\ndata: 3\n\n",
        [F("1", "a"), F("x", "a"), F("3", "a")],
    ),
    "named_event_cr_in_name": (b"event: a\rdata: 1\n\n", [F("1", "a")]),
    "named_event_empty_name": (b"event: \ndata: 1\n\nevent: \ndata: 2\n\n", [F("1"), F("2")]),
    "named_event_without_data": (b"event: a\n\nevent: a\ndata: 1\n\n", [F("1", "a")]),
    "named_event_data_without_space": (b"event: a\ndata:1\n\n", [F("1", "a")]),
    "named_event_then_comment": (b"event: a\n: hi\ndata: 1\n\n", [F("1", "a")]),
    "named_event_unterminated": (
        b"event: a\ndata: 1\n\nevent: a\ndata: 2\n",
        [F("1", "a"), F("2", "a")],
    ),
    "empty_stream": (b"", []),
    "blank_lines_only": (b"\n\n\r\n\r\r", []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fixed_chunkings(name: str) -> None:
    data, expected = CASES[name]
    assert decode([data]) == expected
    assert decode(bytewise(data)) == expected
    assert decode(per_event(data)) == expected
    assert decode([b"", *[c for part in bytewise(data) for c in (part, b"")]]) == expected


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=40)
@given(data=st.data())
def test_rule_random_chunkings(name: str, data: st.DataObject) -> None:
    stream, expected = CASES[name]
    cuts = data.draw(cuts_for(stream), label="cuts")
    assert decode(split_at(stream, cuts)) == expected


def test_utf8_split_inside_every_character() -> None:
    text = "€𝄞é漢"
    stream = f"data: {text}\n\n".encode()
    for cut in range(len(stream) + 1):
        assert decode([stream[:cut], stream[cut:]]) == [F(text)], cut


def test_cr_at_end_of_feed_then_lf_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"") == []  # an empty chunk between the halves changes nothing
    assert decoder.feed(b"\ndata: b\r") == []
    assert decoder.feed(b"\n\r") == [F("a\nb")]
    assert decoder.feed(b"\n") == []  # LF completing the CR that ended the blank line
    assert decoder.feed(b"data: c\n\n") == [F("c")]
    assert decoder.finish() == []


def test_fast_path_matches_general_path_state() -> None:
    """One-event chunks (the fast path) still see id, retry, a pending type and CRs."""
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 9\nretry: 5\ndata: a\n\n") == [F("a", id="9", retry=5)]
    assert decoder.feed(b"data: b\n\n") == [F("b", id="9", retry=5)]
    assert decoder.feed(b"event: t\n") == []
    assert decoder.feed(b"data: c\n\n") == [F("c", "t", id="9", retry=5)]
    assert decoder.feed(b"data: d\r\n\r\n") == [F("d", id="9", retry=5)]
    two = decoder.feed(b"data: e\n\ndata: f\n\n")
    assert two == [F("e", id="9", retry=5), F("f", id="9", retry=5)]
    assert decoder.feed(b"data: g\n\n") == [F("g", id="9", retry=5)]
    assert decoder.feed(b"data: h\n") == []
    assert decoder.feed(b"\n") == [F("h", id="9", retry=5)]
    assert decoder.finish() == []


def _outcomes(decoder: SSEDecoder, chunks: list[bytes]) -> list[object]:
    """Per-chunk results, then finish(); an error (type and message) ends the list."""
    out: list[object] = []
    for chunk in [*chunks, None]:
        try:
            out.append(decoder.feed(chunk) if chunk is not None else decoder.finish())
        except (StreamDecodeError, UsageError) as exc:
            out.append((type(exc), str(exc)))
            break
    return out


_NAMES = st.sampled_from([b"a", b"ab", b"content_block_delta", b"", b"\xc3\xa9", b"a\xff", b"a\r"])
_VALUES = st.one_of(
    st.sampled_from([b"", b"1", b'{"a": "b:c"}', b"x\ny", b"x\ry", b"\xe2\x82", b"\xff"]),
    st.binary(max_size=12),
)
_PREFIXES = st.one_of(
    st.just(b""),
    _NAMES.map(lambda name: b"event: " + name + b"\n"),
    _NAMES.map(lambda name: b"event:" + name + b"\n"),
    st.sampled_from([b"id: 7\n", b"retry: 5\n", b": hi\n", b"event: a\nevent: b\n", b"\n"]),
    st.sampled_from([b"\xef\xbb\xbf", b"\xef\xbb\xbfevent: a\n", b"\xef\xbb"]),  # a BOM (start)
)
_ENDINGS = st.one_of(
    st.just(b"\n\n"),
    st.sampled_from([b"\n", b"", b"\r\n\r\n", b"\n\n\n", b"\ndata: z\n\n", b"\r"]),
)
_FIELDS = st.one_of(st.just(b"data: "), st.sampled_from([b"data:", b"dat"]))
_CHUNKS = st.lists(st.tuples(_PREFIXES, _FIELDS, _VALUES, _ENDINGS).map(b"".join), max_size=8)


@settings(max_examples=400)
@given(
    chunks=_CHUNKS,
    limits=st.sampled_from([{}, {}, {"max_line_bytes": 12}, {"max_event_bytes": 3}]),
)
def test_read_boundaries_never_change_frames_or_errors(
    chunks: list[bytes], limits: dict[str, int]
) -> None:
    """The frames (and the error, if any) of chunks fed as they are, joined into one read,
    or byte by byte, are the same: for one-line events and every near miss (CR, extra
    lines, other fields, missing blank line, invalid UTF-8, over a limit, a BOM at the start
    or later)."""
    body = b"".join(chunks)
    shapes = [chunks, [body], [body[i : i + 1] for i in range(len(body))]]
    seen = [_flat(_outcomes(SSEDecoder(**limits), shape)) for shape in shapes]  # type: ignore[arg-type]
    assert seen[0] == seen[1] == seen[2]


def _flat(outcomes: list[object]) -> tuple[list[object], object]:
    """The frames of per-chunk outcomes in one list, and the error that ended them."""
    frames: list[object] = []
    for outcome in outcomes:
        if isinstance(outcome, list):
            frames += outcome
        else:
            return frames, outcome
    return frames, None


def test_dispatched_frames_are_plain_frames() -> None:
    (frame,) = decode([b"data: x\n\n", b"data: y\n\n"])[1:]
    assert type(frame) is Frame
    assert frame == Frame("message", "y")
    assert frame._replace(data="z").data == "z"


# -- lifecycle and configuration ---------------------------------------------------------------


def test_feed_after_finish_raises_usage_error() -> None:
    decoder = SSEDecoder()
    decoder.finish()
    with pytest.raises(UsageError):
        decoder.feed(b"data: x\n\n")
    with pytest.raises(UsageError):
        decoder.finish()


def test_a_one_line_event_after_finish_is_refused() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a\n\n")
    decoder.finish()
    with pytest.raises(UsageError):
        decoder.feed(b"data: b\n\n")


def test_limits_from_limits_object_and_conflicts() -> None:
    decoder = SSEDecoder(limits=Limits(max_line_bytes=10))
    with pytest.raises(StreamDecodeError):
        decoder.feed(b"data: 12345\n")
    with pytest.raises(ConfigError):
        SSEDecoder(limits=Limits(), max_line_bytes=10)
    with pytest.raises(ConfigError):
        SSEDecoder(max_event_bytes=0)
    with pytest.raises(ConfigError):
        SSEDecoder(max_line_bytes=True)


# -- limits -------------------------------------------------------------------------------------

OK_AT_LIMIT = {
    "line_exactly_max": (b"data: 1234\n\n", {"max_line_bytes": 10}, [F("1234")]),
    "event_exactly_max": (b"data: 12\ndata: 12\n\n", {"max_event_bytes": 5}, [F("12\n12")]),
    "single_line_event_max": (
        b"data: a\n\ndata: 12345\n\n",
        {"max_event_bytes": 5},
        [F("a"), F("12345")],
    ),
}
OVER_LIMIT = {
    "line_over_max": (b"data: 12345\n\n", {"max_line_bytes": 10}, "max_line_bytes"),
    "crlf_line_over_max": (
        b"data: 1\r\ndata: 12345\r\n\r\n",
        {"max_line_bytes": 10},
        "max_line_bytes",
    ),
    "comment_over_max": (b": 12345678901\n\n", {"max_line_bytes": 10}, "max_line_bytes"),
    "unterminated_over_max": (b"data: 12345", {"max_line_bytes": 10}, "max_line_bytes"),
    "event_over_max": (b"data: 12\ndata: 123\n\n", {"max_event_bytes": 5}, "max_event_bytes"),
    "fast_path_event_over_max": (
        b"data: a\n\ndata: 123456\n\n",
        {"max_event_bytes": 5},
        "max_event_bytes",
    ),
    "fast_path_line_over_max": (
        b"data: a\n\ndata: 12345\n\n",
        {"max_line_bytes": 10},
        "max_line_bytes",
    ),
    "unterminated_event_over_max": (b"data: 123456", {"max_event_bytes": 5}, "max_event_bytes"),
}


@pytest.mark.parametrize("name", sorted(OK_AT_LIMIT))
def test_at_limit_is_accepted(name: str) -> None:
    data, limits, expected = OK_AT_LIMIT[name]
    for chunks in ([data], bytewise(data), per_event(data)):
        assert decode(chunks, **limits) == expected


def _decode_expecting_error(chunks: list[bytes], limits: dict[str, int], word: str) -> None:
    decoder = SSEDecoder(**limits)  # type: ignore[arg-type]
    with pytest.raises(StreamDecodeError, match=word):
        feed_all(decoder, chunks)
    with pytest.raises(UsageError):  # unusable after the error
        decoder.feed(b"data: x\n\n")
    with pytest.raises(UsageError):
        decoder.finish()


@pytest.mark.parametrize("name", sorted(OVER_LIMIT))
def test_over_limit_raises_at_fixed_chunkings(name: str) -> None:
    data, limits, word = OVER_LIMIT[name]
    for chunks in ([data], bytewise(data), per_event(data)):
        _decode_expecting_error(chunks, limits, word)


@pytest.mark.parametrize("name", sorted(OVER_LIMIT))
@settings(max_examples=30)
@given(data=st.data())
def test_over_limit_raises_at_random_chunkings(name: str, data: st.DataObject) -> None:
    stream, limits, word = OVER_LIMIT[name]
    _decode_expecting_error(split_at(stream, data.draw(cuts_for(stream))), limits, word)


def test_partial_line_is_bounded_without_any_line_end() -> None:
    """Memory stays bounded: the error comes on the feed that crosses the limit, not at EOF."""
    decoder = SSEDecoder(max_line_bytes=100)
    for _ in range(100):
        assert decoder.feed(b"x") == []
    with pytest.raises(StreamDecodeError, match="max_line_bytes"):
        decoder.feed(b"x")


def test_error_state_drops_buffers() -> None:
    decoder = SSEDecoder(max_line_bytes=4)
    with pytest.raises(StreamDecodeError):
        decoder.feed(b"data: 1234567")
    with pytest.raises(UsageError, match="failed earlier"):
        decoder.feed(b"\n\n")


# -- errors take effect at their place in the stream, whatever the reads ----------------------

FAILING: dict[str, tuple[bytes, dict[str, int], list[Frame], str]] = {
    # name: (stream, limits, the events before the error, a word of the error)
    "line_over_max_after_events": (
        b"data: a\n\nevent: e\ndata: b\n\ndata: " + b"x" * 20 + b"\n\ndata: c\n\n",
        {"max_line_bytes": 16},
        [F("a"), F("b", "e")],
        "max_line_bytes",
    ),
    "crlf_line_over_max_after_events": (
        b"data: a\r\n\r\ndata: " + b"x" * 20 + b"\r\n\r\n",
        {"max_line_bytes": 16},
        [F("a")],
        "max_line_bytes",
    ),
    "unterminated_line_over_max_after_events": (
        b"data: a\n\ndata: b\n\n" + b"y" * 40,
        {"max_line_bytes": 16},
        [F("a"), F("b")],
        "max_line_bytes",
    ),
    "event_over_max_after_events": (
        b"data: a\n\ndata: 123\ndata: 456\n\ndata: c\n\n",
        {"max_event_bytes": 5},
        [F("a")],
        "max_event_bytes",
    ),
    "comment_over_max_after_events": (
        b"data: a\n\n: " + b"c" * 30 + b"\ndata: b\n\n",
        {"max_line_bytes": 16},
        [F("a")],
        "max_line_bytes",
    ),
    "unterminated_event_over_max_after_events": (
        b"data: a\n\ndata: 123456",
        {"max_event_bytes": 5},
        [F("a")],
        "max_event_bytes",
    ),
}


def outcome(chunks: Iterable[bytes], limits: dict[str, int]) -> tuple[list[Frame], str | None]:
    """Every frame until the decoder raises, and the error's message (None if none)."""
    decoder = SSEDecoder(**limits)  # type: ignore[arg-type]
    return decoded_until_error(decoder, chunks)


def _assert_frames_then_error(chunks: list[bytes], name: str) -> None:
    _, limits, before, word = FAILING[name]
    frames, error = outcome(chunks, limits)
    assert frames == before
    assert error is not None
    assert word in error


@pytest.mark.parametrize("name", sorted(FAILING))
def test_events_before_an_error_at_fixed_chunkings(name: str) -> None:
    data = FAILING[name][0]
    for chunks in ([data], bytewise(data), per_event(data), fixed_size(data, 5)):
        _assert_frames_then_error(chunks, name)
    _assert_frames_then_error([b"", *[c for part in bytewise(data) for c in (part, b"")]], name)


@pytest.mark.parametrize("name", sorted(FAILING))
@settings(max_examples=40)
@given(data=st.data())
def test_events_before_an_error_at_random_chunkings(name: str, data: st.DataObject) -> None:
    stream = FAILING[name][0]
    _assert_frames_then_error(split_at(stream, data.draw(cuts_for(stream), label="cuts")), name)


_BAD = [
    b"data: " + b"z" * 30 + b"\n\n",  # a line over max_line_bytes
    b": " + b"c" * 30 + b"\n",  # a comment over it
    b"z" * 30,  # an unterminated line over it
    b"data: 1234567890\ndata: 1234567890\n\n",  # an event over max_event_bytes
]


@settings(max_examples=200)
@given(
    good=st.lists(
        st.text(st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]), max_size=4),
        max_size=4,
    ),
    bad=st.sampled_from(_BAD),
    data=st.data(),
)
def test_valid_events_then_a_bad_one_same_at_every_chunking(
    good: list[str], bad: bytes, data: st.DataObject
) -> None:
    """Any valid events, then a bad one: split anywhere, the same frames, then the error."""
    stream = b"".join(b"data: " + v.encode() + b"\n\n" for v in good) + bad
    limits = {"max_line_bytes": 24, "max_event_bytes": 20}  # 4 characters: <= 16 bytes
    expected = [F(v) for v in good]
    whole = outcome([stream], limits)
    assert whole[0] == expected
    assert whole[1] is not None
    cuts = data.draw(cuts_for(stream), label="cuts")
    assert outcome(split_at(stream, cuts), limits)[0] == expected
    assert outcome(bytewise(stream), limits)[0] == expected


def test_the_feed_that_completes_events_returns_them_and_the_next_call_raises() -> None:
    """Deferred error: the chunk's events come out of its feed; the error comes next."""
    stream = b"data: a\n\ndata: b\n\ndata: 12345\n\ndata: c\n\n"
    decoder = SSEDecoder(max_event_bytes=4)
    assert decoder.feed(stream) == [F("a"), F("b")]
    with pytest.raises(StreamDecodeError, match="max_event_bytes"):
        decoder.feed(b"data: d\n\n")
    with pytest.raises(UsageError, match="failed earlier"):
        decoder.feed(b"data: d\n\n")
    with pytest.raises(UsageError):
        decoder.finish()
    finished = SSEDecoder(max_event_bytes=4)
    assert finished.feed(stream) == [F("a"), F("b")]
    with pytest.raises(StreamDecodeError, match="max_event_bytes"):
        finished.finish()


# -- invalid UTF-8 is refused, never replaced ------------------------------------------------------


def test_invalid_utf8_never_yields_replaced_text() -> None:
    """A data line whose JSON string holds b"\\xff" never becomes JSON text with U+FFFD: the
    frame's data is refused by the strict parse and still spells the exact bytes, at every
    chunking, on the fast path as on the general path."""
    raw = b'{"choices":[{"delta":{"content":"a\xffb"}}]}'
    line = b"data: " + raw + b"\n\n"
    for chunks in ([line], [b"data: x\n\n", line], bytewise(line), per_event(line * 2)):
        frames, error = outcome(chunks, {})
        assert error is None
        mine = [f for f in frames if f.data != "x"]
        assert mine
        for frame in mine:
            assert "\ufffd" not in frame.data
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(frame.data)
            assert frame.data.encode("utf-8", "surrogateescape") == raw


def test_invalid_utf8_in_an_argument_fragment_never_commits() -> None:
    """Through the pipeline: the call fails instead of committing altered arguments."""
    opened = (
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1",'
        b'"function":{"name":"f","arguments":"{\\"p\\": \\"/safe"}}]}}]}\n\n'
    )
    bad = (
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"\xff\\"}"}}]},"finish_reason":"tool_calls"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    for reads in ([opened + bad], [opened, bad], bytewise(opened + bad)):
        parser = StreamParser("openai_chat")
        for read in reads:
            parser.feed(read)
        round_ = parser.finish()
        assert round_.committed() == ()
        assert [c.state for c in round_.calls] == [CallState.FAILED]


# -- linear in the bytes --------------------------------------------------------------------------


def test_a_long_line_in_small_reads_extends_one_buffer() -> None:
    """The pending line grows in place: no read copies what is already pending (which made an
    8 MiB line in 1 KiB reads quadratic), and the limit is still exact on every read."""
    decoder = SSEDecoder(max_line_bytes=4096 + 6)
    assert decoder.feed(b"data: ") == []
    buffers = []
    for _ in range(4096):
        assert decoder.feed(b"x") == []
        buffers.append(decoder._partial)
    assert all(b is buffers[0] for b in buffers)
    assert decoder.feed(b"\n\n") == [F("x" * 4096)]
    over = SSEDecoder(max_line_bytes=100)
    assert over.feed(b"d" * 60) == []
    assert over.feed(b"d" * 40) == []
    with pytest.raises(StreamDecodeError, match="max_line_bytes=100"):
        over.feed(b"d")


# -- the recorded corpus -------------------------------------------------------------------------

SSE_FILES = sorted(CORPUS.rglob("*.sse")) if CORPUS.is_dir() else []


def _corpus_file(path: Path | None) -> bytes:
    corpus_dir()  # skips (or fails under CI) when the corpus is missing
    if path is None:
        pytest.fail(f"no .sse files under {CORPUS}")
    return path.read_bytes()


@pytest.mark.corpus
@pytest.mark.parametrize(
    "path",
    SSE_FILES or [None],
    ids=[str(p.relative_to(CORPUS)) for p in SSE_FILES] or ["missing"],
)
def test_corpus_file_same_frames_at_every_chunking(path: Path | None) -> None:
    raw = _corpus_file(path)
    whole = decode([raw])
    assert whole, "every recorded stream carries events"
    assert decode(fixed_size(raw, 1)) == whole
    assert decode(fixed_size(raw, 7)) == whole
    assert decode(per_event(raw)) == whole
    # Line-end style does not matter: the same body with LF, CRLF or CR line ends.
    lf = raw.replace(b"\r\n", b"\n")
    assert decode([lf]) == whole
    assert decode([lf.replace(b"\n", b"\r\n")]) == whole
    assert decode(fixed_size(lf.replace(b"\n", b"\r"), 3)) == whole
    for frame in whole:
        if frame.data != "[DONE]":
            orjson.loads(frame.data)  # every payload is one complete JSON document


@pytest.mark.corpus
def test_corpus_leading_space_data_line_is_ignored() -> None:
    root = corpus_dir()
    raw = (root / "compat_openrouter" / "kimi_k2_no_arguments_key.sse").read_bytes()
    assert raw.startswith(b" data: ")
    frames = decode([raw])
    data_lines = [line for line in raw.splitlines() if line.startswith(b"data:")]
    assert len(frames) == len(data_lines)  # the " data:" line produced no event
    first_ignored = orjson.loads(raw.splitlines()[0][len(b" data: ") :])
    assert orjson.loads(frames[0].data) != first_ignored
    assert first_ignored["choices"][0]["delta"]["role"] == "assistant"
    assert "tool_calls" in frames[0].data


@pytest.mark.corpus
def test_corpus_crlf_file_really_uses_crlf() -> None:
    """Guards the CRLF corpus case above: the Gemini recording must keep its CRLF ends."""
    raw = (corpus_dir() / "gemini" / "single_function_call_crlf.sse").read_bytes()
    assert b"\r\n\r\n" in raw
    frames = decode(fixed_size(raw, 1))
    assert frames
    assert all("\r" not in f.data for f in frames)


@pytest.mark.corpus
def test_corpus_unterminated_last_event_is_dispatched() -> None:
    raw = (corpus_dir() / "anthropic" / "text_then_tool_use.sse").read_bytes()
    assert not raw.endswith(b"\n")  # recorded without the final blank line
    frames = decode([raw])
    assert frames[-1].event == "message_stop"
    assert orjson.loads(frames[-1].data) == {"type": "message_stop"}


# -- through the pipeline: a failing stream gives one result whatever the reads ---------------


def _round_summary(reads: list[bytes], limits: Limits) -> object:
    parser = StreamParser("openai_chat", limits=limits)
    for read in reads:
        parser.feed(read)
    round_ = parser.finish()
    calls = [(c.call_id, c.state, c.error, c.arguments_text) for c in round_.calls]
    return calls, [a.kind.value for a in round_.anomalies], round_.choices[0].content


def test_a_stream_that_fails_gives_the_same_round_at_every_chunking() -> None:
    """Text and a call, then a line over the limit: fed whole, the text and the call used
    to vanish (the events before the error in the same read were dropped); now every
    chunking records both, and the call fails as interrupted."""
    stream = (
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1",'
        b'"function":{"name":"f","arguments":"{}"}}]}}]}\n\n'
        b"data: " + b"x" * 300 + b"\n\n"
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    )
    limits = Limits(max_line_bytes=200)
    whole = _round_summary([stream], limits)
    calls, anomalies, content = whole  # type: ignore[misc]
    assert calls == [("c1", CallState.FAILED, ErrorCode.STREAM_INTERRUPTED, "{}")]
    assert "framing_error" in anomalies
    assert content
    for reads in (per_event(stream), bytewise(stream), fixed_size(stream, 13)):
        assert _round_summary(reads, limits) == whole


_NAMED = (
    Path(__file__).resolve().parents[1] / "examples" / "anthropic_truncated_at_max_tokens.sse"
).read_bytes()


def test_every_read_boundary_of_a_named_event_stream_gives_the_frames_of_one_read():
    # A read that started at a line end and stopped inside the "data: " line after an
    # "event:" line looped forever (the value's start lay in the pending line): every read
    # that starts at a LF and ends within the next 300 bytes is tried, between two others.
    whole = SSEDecoder()
    expected = whole.feed(_NAMED) + whole.finish()
    assert len(expected) > 5
    starts = [i for i, byte in enumerate(_NAMED) if byte == 10]
    for a in starts:
        for b in range(a + 1, min(a + 300, len(_NAMED)) + 1):
            decoder = SSEDecoder()
            frames = [*decoder.feed(_NAMED[:a]), *decoder.feed(_NAMED[a:b])]
            frames += decoder.feed(_NAMED[b:]) + decoder.finish()
            assert frames == expected, (a, b)
    one = StreamParser("anthropic")
    one.feed(_NAMED)
    reference = summary(one.finish())
    for a in starts:
        for b in range(a + 1, min(a + 120, len(_NAMED)) + 1, 7):
            parser = StreamParser("anthropic")
            for piece in (_NAMED[:a], _NAMED[a:b], _NAMED[b:]):
                parser.feed(piece)
            assert summary(parser.finish()) == reference, (a, b)


_LONG_LINE = st.builds(
    lambda n, c: c * n, st.integers(0, 9000), st.sampled_from(["a", "é", ":", " "])
)


@settings(max_examples=60)
@given(
    events=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["data", "event", ": c", "id"]), _LONG_LINE), max_size=12
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
)
def test_long_events_of_any_lines_give_their_frames(
    events: list[list[tuple[str, str]]], cuts: list[int]
) -> None:
    """Events longer than a few KiB (a whole call's one ``data`` line, or many lines) are cut
    at their blank lines and lines as ``bytes.find``/``split`` would: the frames are the
    spec's, whole or in pieces (the decoder searches them from ``memchr``)."""
    body, expected = b"", []
    for fields in events:
        lines = [f"{name}:{value}" if name != ": c" else f": {value}" for name, value in fields]
        body += "".join(line + "\n" for line in lines).encode() + b"\n"
        values = [(name, v[1:] if v.startswith(" ") else v) for name, v in fields]  # one space
        data = [value for name, value in values if name == "data"]
        if data:
            kind = [value for name, value in values if name == "event"]
            expected.append(("\n".join(data), kind[-1] if kind and kind[-1] else "message"))
    chunks = split_at(body, [c % (len(body) + 1) for c in cuts])
    for shape in (chunks, [body]):
        frames = decode(shape)
        assert [(f.data, f.event) for f in frames] == expected


@pytest.mark.parametrize("blank", [4093, 4094, 4095, 4096, 4097, 4110, 4150])
def test_a_blank_line_near_the_edge_of_the_short_search_is_found(blank: int) -> None:
    # an event of a long line and four short ones whose blank line sits just before, across
    # or past 4 KiB (where an earlier walk switched from a two-byte search to one that goes on
    # from the next LF, which need not start the blank line) ends there, in whole reads and
    # one-byte reads alike; the walk now finds every line end by memchr
    short = b"data: " + b"y" * 9 + b"\n"  # 16 bytes
    long = b"data: " + b"x" * (blank - 4 * len(short) - 7) + b"\n"
    stream = long + short * 4 + b"\n" + short + b"\n"
    assert stream.index(b"\n\n") == blank - 1
    body = "\n".join(["x" * (blank - 4 * len(short) - 7)] + ["y" * 9] * 4)
    expected = [F(body), F("y" * 9)]
    for reads in ([stream], [stream[i : i + 1] for i in range(len(stream))]):
        decoder = SSEDecoder()
        frames = [f for read in reads for f in decoder.feed(read)]
        assert frames == expected, blank
