"""JSONLinesDecoder: its rules at every chunking, its limit, and the fast path against the
general path (one ``{...}\\n`` line per chunk, the common read, takes the fast path)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import decoded_until_error
from toollatch import Limits, StreamDecodeError, UsageError
from toollatch.stages import Frame, JSONLinesDecoder


class _GeneralOnly(JSONLinesDecoder):
    """The decoder with its fast path switched off: every line is decoded and stripped."""

    _BARE = -1


def decode(chunks: Iterable[bytes], decoder: JSONLinesDecoder | None = None) -> list[Frame]:
    decoder = decoder or JSONLinesDecoder()
    frames = [f for chunk in chunks for f in decoder.feed(chunk)]
    return frames + decoder.finish()


def per_line(data: bytes) -> list[bytes]:
    """One chunk per line, as a recorder or an NDJSON server writes them: the fast path."""
    return data.splitlines(keepends=True)


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def F(data: str) -> Frame:
    return Frame(event="message", data=data)


CASES: dict[str, tuple[bytes, list[Frame]]] = {
    "lines": (b'{"a":1}\n{"b":2}\n', [F('{"a":1}'), F('{"b":2}')]),
    "crlf": (b'{"a":1}\r\n{"b":2}\r\n', [F('{"a":1}'), F('{"b":2}')]),
    "blank_lines_skipped": (b'\n\n \r\n{"a":1}\n\n', [F('{"a":1}')]),
    "last_line_without_newline": (b'{"a":1}\n{"b":2}', [F('{"a":1}'), F('{"b":2}')]),
    "whitespace_around_stripped": (b' \t{"a":1} \n\xc2\xa0{}\x1c\n', [F('{"a":1}'), F("{}")]),
    "bom_on_any_line_skipped": (
        b'\xef\xbb\xbf{"a":1}\n \xef\xbb\xbf{"b":2}\n',
        [F('{"a":1}'), F('{"b":2}')],
    ),
    "invalid_utf8_escaped_not_replaced": (
        b'{"a":"\xff"}\n{"b":"\xe2\x82"}\n',
        [F('{"a":"\udcff"}'), F('{"b":"\udce2\udc82"}')],
    ),
    "utf8_kept": ('{"a":"é東🙂"}\n'.encode(), [F('{"a":"é東🙂"}')]),
    "other_json_passed_on": (b"[1]\nnull\n{\n", [F("[1]"), F("null"), F("{")]),
    "braces_inside_one_line_are_one_event": (b"{}{}\n", [F("{}{}")]),
    "empty": (b"", []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fixed_chunkings(name: str) -> None:
    data, expected = CASES[name]
    assert decode([data]) == expected
    assert decode(per_line(data)) == expected
    assert decode(bytewise(data)) == expected
    assert decode([b"", *[c for part in bytewise(data) for c in (part, b"")]]) == expected


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=30)
@given(data=st.data())
def test_rule_random_chunkings(name: str, data: st.DataObject) -> None:
    stream, expected = CASES[name]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=len(stream))))
    points = [0, *cuts, len(stream)]
    assert decode([stream[a:b] for a, b in itertools.pairwise(points)]) == expected


def _outcomes(decoder: JSONLinesDecoder, chunks: list[bytes]) -> list[object]:
    """Per-chunk results, then finish(); an error (type and message) ends the list."""
    out: list[object] = []
    for chunk in [*chunks, None]:
        try:
            out.append(decoder.feed(chunk) if chunk is not None else decoder.finish())
        except (StreamDecodeError, UsageError) as exc:
            out.append((type(exc), str(exc)))
            break
    return out


_PIECES = st.sampled_from(
    [b"{", b"}", b'"a"', b":", b"1", b"\n", b"\r", b" ", b"\xef\xbb\xbf", b"\xff", b"\xc2\xa0"]
)
_CHUNKS = st.lists(
    st.one_of(
        st.lists(_PIECES, max_size=6).map(lambda p: b"{" + b"".join(p) + b"}\n"),  # near-fast
        st.lists(_PIECES, max_size=6).map(b"".join),
    ),
    max_size=8,
)


@settings(max_examples=300)
@given(chunks=_CHUNKS, max_line=st.sampled_from([None, 4, 8]))
def test_fast_path_agrees_with_general_path(chunks: list[bytes], max_line: int | None) -> None:
    """Chunk by chunk, the decoder gives what the general path alone gives (frames, errors)."""
    limits = Limits() if max_line is None else Limits(max_line_bytes=max_line)
    fast = _outcomes(JSONLinesDecoder(limits=limits), chunks)
    assert fast == _outcomes(_GeneralOnly(limits=limits), chunks)


def test_line_over_the_limit_raises_and_the_decoder_is_unusable() -> None:
    limits = Limits(max_line_bytes=7)
    assert decode([b'{"a":1}\n'], JSONLinesDecoder(limits=limits)) == [F('{"a":1}')]
    for chunks in ([b'{"a":12}\n'], [b'{"a":', b"12}\n"], [b'{"a":12}']):
        decoder = JSONLinesDecoder(limits=limits)
        with pytest.raises(StreamDecodeError, match="exceeds 7 bytes"):
            decode(chunks, decoder)
        with pytest.raises(UsageError):
            decoder.feed(b"{}\n")


def test_feed_after_finish_raises_on_both_paths() -> None:
    decoder = JSONLinesDecoder()
    assert decoder.feed(b"{}\n") == [F("{}")]
    assert decoder.finish() == []
    with pytest.raises(UsageError):
        decoder.feed(b"{}\n")  # fast-path shape
    with pytest.raises(UsageError):
        decoder.feed(b"{")
    with pytest.raises(UsageError):
        decoder.finish()


def test_frames_are_plain_frames() -> None:
    (frame,) = JSONLinesDecoder().feed(b"{}\n")
    assert type(frame) is Frame
    assert frame == Frame("message", "{}", None, None)


# -- errors take effect at their place in the stream, whatever the reads ----------------------


def outcome(chunks: Iterable[bytes], max_line: int) -> tuple[list[Frame], str | None]:
    """Every frame until the decoder raises, and the error's message (None if none)."""
    decoder = JSONLinesDecoder(limits=Limits(max_line_bytes=max_line))
    return decoded_until_error(decoder, chunks)


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


_BAD = [b'{"x":"' + b"z" * 30 + b'"}\n', b"z" * 40, b" " * 33 + b"\n"]  # each over 32 bytes


@settings(max_examples=300)
@given(
    good=st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(0, 99), max_size=2)),
    bad=st.sampled_from(_BAD),
    data=st.data(),
)
def test_lines_then_an_over_long_one_same_at_every_chunking(
    good: list[dict[str, int]], bad: bytes, data: st.DataObject
) -> None:
    """Valid lines, then one over the limit: split anywhere (whole, per line, byte by byte,
    random cuts), the same frames come out, then the error."""
    lines = [orjson.dumps(g) for g in good]
    stream = b"".join(line + b"\n" for line in lines) + bad + b'{"after":1}\n'
    expected = [F(line.decode()) for line in lines]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20), label="cuts")
    for chunks in ([stream], per_line(stream), bytewise(stream), split_at(stream, cuts)):
        frames, error = outcome(chunks, 32)
        assert frames == expected
        assert error == "a JSON line exceeds 32 bytes"


def test_the_feed_that_completes_lines_returns_them_and_the_next_call_raises() -> None:
    stream = b'{"a":1}\n{"b":2}\n{"long":"xxxxxxxx"}\n{"c":3}\n'
    for after in ("feed", "finish"):
        decoder = JSONLinesDecoder(limits=Limits(max_line_bytes=12))
        assert decoder.feed(stream) == [F('{"a":1}'), F('{"b":2}')]
        with pytest.raises(StreamDecodeError, match="exceeds 12 bytes"):
            decoder.feed(b"{}\n") if after == "feed" else decoder.finish()
        with pytest.raises(UsageError):
            decoder.feed(b"{}\n")
        with pytest.raises(UsageError):
            decoder.finish()


# -- invalid UTF-8 is escaped, never replaced ------------------------------------------------


def test_invalid_utf8_never_yields_replaced_text() -> None:
    """A line whose JSON string holds b"\\xff" never becomes JSON text with U+FFFD: the frame
    is refused by the strict parse and spells the exact bytes, on both paths."""
    raw = b'{"delta":{"text":"a\xffb"}}'
    for chunks in ([raw + b"\n"], bytewise(raw + b"\n"), [raw]):
        (frame,) = decode(chunks)
        assert "\ufffd" not in frame.data
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(frame.data)
        assert frame.data.encode("utf-8", "surrogateescape") == raw


# -- linear in the bytes --------------------------------------------------------------------------


def test_a_long_line_in_small_reads_extends_one_buffer() -> None:
    """The pending line grows in place: no read copies what is already pending (which made a
    long line in small reads quadratic), and the limit is still exact on every read."""
    decoder = JSONLinesDecoder(limits=Limits(max_line_bytes=4098))
    assert decoder.feed(b'"') == []
    buffers = []
    for _ in range(4096):
        assert decoder.feed(b"x") == []
        buffers.append(decoder._partial)
    assert all(b is buffers[0] for b in buffers)
    assert decoder.feed(b'"\n') == [F('"' + "x" * 4096 + '"')]
    over = JSONLinesDecoder(limits=Limits(max_line_bytes=100))
    assert over.feed(b"d" * 60) == []
    assert over.feed(b"d" * 40) == []
    with pytest.raises(StreamDecodeError, match="exceeds 100 bytes"):
        over.feed(b"d")
