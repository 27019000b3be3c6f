"""EventStreamDecoder: the recorded Bedrock body at every chunking, every header type,
corruption anywhere, truncation and malformed messages (StreamDecodeError, never a crash)."""

from __future__ import annotations

import contextlib
import itertools
import struct
import uuid
import zlib
from collections.abc import Iterable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import corpus_dir, decoded_until_error
from toollatch import (
    CallState,
    ConfigError,
    ErrorCode,
    Limits,
    StreamDecodeError,
    StreamParser,
    UsageError,
)
from toollatch.core._eventstream import decode_headers
from toollatch.stages import EventStreamDecoder, Frame

# -- a small encoder (test-only) ----------------------------------------------------------------


def header(name: str, kind: int, value: object = None) -> bytes:
    """One encoded header; ``value`` is already the Python value for ``kind``."""
    raw_name = name.encode()
    head = bytes([len(raw_name)]) + raw_name + bytes([kind])
    if kind in (0, 1):
        return head
    if kind in (6, 7):
        body = value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[arg-type]
        return head + struct.pack(">H", len(body)) + body
    if kind == 9:
        return head + value.bytes  # type: ignore[union-attr]
    fmt = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}[kind]
    return head + struct.pack(fmt, value)


def message(headers: bytes, payload: bytes = b"") -> bytes:
    total = 16 + len(headers) + len(payload)
    prelude = struct.pack(">II", total, len(headers))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(event_type: str, payload: bytes, *extra: bytes) -> bytes:
    headers = (
        header(":event-type", 7, event_type)
        + header(":content-type", 7, "application/json")
        + header(":message-type", 7, "event")
        + b"".join(extra)
    )
    return message(headers, payload)


def feed_all(decoder: EventStreamDecoder, chunks: Iterable[bytes]) -> list[Frame]:
    frames: list[Frame] = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    return frames + decoder.finish()


def decode(chunks: Iterable[bytes], **kwargs: int) -> list[Frame]:
    return feed_all(EventStreamDecoder(**kwargs), chunks)  # type: ignore[arg-type]


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


def expect_error(chunks: Iterable[bytes], match: str | None = None, **kwargs: int) -> None:
    decoder = EventStreamDecoder(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(StreamDecodeError, match=match):
        feed_all(decoder, chunks)
    with pytest.raises(UsageError):  # unusable afterwards
        decoder.feed(b"")


# -- the recorded Bedrock body -------------------------------------------------------------------


def _recording() -> tuple[bytes, list[bytes]]:
    root = corpus_dir() / "bedrock"
    raw = (root / "nova_text_then_tool_use.eventstream").read_bytes()
    lines = (root / "nova_text_then_tool_use.jsonl").read_bytes().splitlines()
    return raw, lines


def _assert_matches_twin(frames: list[Frame], lines: list[bytes]) -> None:
    """The twin holds ``{"<event-type>":<payload bytes verbatim>}`` per message."""
    assert len(frames) == len(lines)
    for frame, line in zip(frames, lines, strict=True):
        assert f'{{"{frame.event}":{frame.data}}}'.encode() == line
        assert orjson.loads(line) == {frame.event: orjson.loads(frame.data)}
        assert (frame.id, frame.retry) == (None, None)


@pytest.mark.corpus
def test_recording_whole_and_byte_by_byte() -> None:
    raw, lines = _recording()
    whole = decode([raw])
    _assert_matches_twin(whole, lines)
    assert decode(raw[i : i + 1] for i in range(len(raw))) == whole
    assert [f.event for f in whole][:2] == ["messageStart", "contentBlockDelta"]
    assert whole[-1].event == "metadata"


@pytest.mark.corpus
@settings(max_examples=100)
@given(data=st.data())
def test_recording_random_splits(data: st.DataObject) -> None:
    raw, lines = _recording()
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=60), label="cuts")
    _assert_matches_twin(decode(split_at(raw, cuts)), lines)


@pytest.mark.corpus
@settings(max_examples=100)
@given(data=st.data())
def test_recording_any_flipped_bit_is_a_decode_error(data: st.DataObject) -> None:
    raw, _ = _recording()
    bit = data.draw(st.integers(0, len(raw) * 8 - 1), label="bit")
    corrupt = bytearray(raw)
    corrupt[bit // 8] ^= 1 << (bit % 8)
    expect_error([bytes(corrupt)], match="CRC")


@pytest.mark.corpus
@settings(max_examples=100)
@given(data=st.data())
def test_recording_truncated_anywhere(data: st.DataObject) -> None:
    raw, lines = _recording()
    cut = data.draw(st.integers(1, len(raw) - 1), label="cut")
    decoder = EventStreamDecoder()
    frames = decoder.feed(raw[:cut])
    _assert_matches_twin(frames, lines[: len(frames)])  # every whole message came out
    if cut in _message_end_offsets(raw):
        assert decoder.finish() == []
    else:
        with pytest.raises(StreamDecodeError, match="ended inside a message"):
            decoder.finish()


def _message_end_offsets(raw: bytes) -> set[int]:
    ends, pos = set(), 0
    while pos < len(raw):
        pos += int.from_bytes(raw[pos : pos + 4], "big")
        ends.add(pos)
    return ends


@pytest.mark.corpus
def test_recording_truncated_at_every_boundary_kind() -> None:
    raw, _ = _recording()
    first_end = int.from_bytes(raw[:4], "big")
    assert decode([raw[:first_end]]) == decode([raw])[:1]
    for cut in (1, 11, 12, 13, first_end - 1, first_end + 5, len(raw) - 1):
        expect_error([raw[:cut]], match="ended inside a message")


# -- messages built here --------------------------------------------------------------------------

ALL_TYPES = (
    header("t", 0)
    + header("f", 1)
    + header("b", 2, -128)
    + header("s", 3, -32768)
    + header("i", 4, 2**31 - 1)
    + header("l", 5, -(2**63))
    + header("raw", 6, b"\x00\xff")
    + header("str", 7, "héllo")
    + header("ts", 8, 1_700_000_000_123)
    + header("u", 9, uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF))
    + header("", 7, "")
)


def test_every_header_type_decodes() -> None:
    assert decode_headers(ALL_TYPES) == {
        "t": True,
        "f": False,
        "b": -128,
        "s": -32768,
        "i": 2**31 - 1,
        "l": -(2**63),
        "raw": b"\x00\xff",
        "str": "héllo",
        "ts": 1_700_000_000_123,
        "u": uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF),
        "": "",
    }
    assert decode_headers(b"") == {}


def test_every_header_type_inside_a_message() -> None:
    stream = event("contentBlockDelta", b'{"x":1}', ALL_TYPES)
    assert decode([stream]) == [Frame("contentBlockDelta", '{"x":1}')]


def test_repeated_header_keeps_last_value() -> None:
    raw = header(":event-type", 7, "a") + header(":event-type", 7, "b")
    assert decode([message(raw, b"{}")]) == [Frame("b", "{}")]


def test_missing_message_type_is_an_event_and_empty_payload_is_empty_data() -> None:
    stream = message(header(":event-type", 7, "messageStop"))
    assert decode([stream]) == [Frame("messageStop", "")]


def test_payload_utf8_kept_and_invalid_bytes_escaped_not_replaced() -> None:
    """A payload whose JSON string holds b"\\xff" never becomes JSON text with U+FFFD: the
    frame is refused by the strict parse and spells the exact bytes, at every chunking."""
    good = event("contentBlockDelta", '{"text":"€𝄞"}'.encode())
    bad = event("contentBlockDelta", b'{"text":"\xff"}')
    expected = [
        Frame("contentBlockDelta", '{"text":"€𝄞"}'),
        Frame("contentBlockDelta", '{"text":"\udcff"}'),
    ]
    both = good + bad
    assert decode([good, bad]) == expected
    assert decode(both[i : i + 1] for i in range(len(both))) == expected
    assert "\ufffd" not in expected[1].data
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(expected[1].data)
    assert expected[1].data.encode("utf-8", "surrogateescape") == b'{"text":"\xff"}'


def test_invalid_utf8_in_a_tool_input_never_commits() -> None:
    """Through the pipeline: the call fails instead of committing altered arguments."""
    stream = (
        event("messageStart", b'{"role":"assistant"}')
        + event(
            "contentBlockStart",
            b'{"contentBlockIndex":0,"start":{"toolUse":{"name":"f","toolUseId":"t1"}}}',
        )
        + event("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"toolUse":{"input":"{}"}}}')
        + event("contentBlockStop", b'{"contentBlockIndex":0}')
        + event("messageStop", b'{"stopReason":"tool_use"}')
    )
    good_parser = StreamParser("bedrock", framing="eventstream")
    good_parser.feed(stream)
    assert [c.state for c in good_parser.finish().calls] == [CallState.COMMITTED]
    bad = stream.replace(
        event("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"toolUse":{"input":"{}"}}}'),
        event(
            "contentBlockDelta",
            b'{"contentBlockIndex":0,"delta":{"toolUse":{"input":"{\\"p\\":\\"\xff\\"}"}}}',
        ),
    )
    for reads in ([bad], [bad[i : i + 7] for i in range(0, len(bad), 7)]):
        parser = StreamParser("bedrock", framing="eventstream")
        for read in reads:
            parser.feed(read)
        round_ = parser.finish()
        assert round_.committed() == ()
        assert [c.state for c in round_.calls] == [CallState.FAILED]


def test_exception_message_uses_exception_type() -> None:
    payload = b'{"message":"Too many requests"}'
    stream = event("messageStart", b"{}") + message(
        header(":exception-type", 7, "throttlingException")
        + header(":content-type", 7, "application/json")
        + header(":message-type", 7, "exception"),
        payload,
    )
    assert decode([stream]) == [
        Frame("messageStart", "{}"),
        Frame("throttlingException", payload.decode()),
    ]


def test_exception_without_type_is_error() -> None:
    stream = message(header(":message-type", 7, "exception"), b'{"message":"x"}')
    assert decode([stream]) == [Frame("error", '{"message":"x"}')]


def test_error_message_carries_code_and_message_from_headers() -> None:
    stream = message(
        header(":message-type", 7, "error")
        + header(":error-code", 7, "InternalFailure")
        + header(":error-message", 7, "boom"),
    )
    (frame,) = decode([stream])
    assert frame.event == "error"
    assert orjson.loads(frame.data) == {"errorCode": "InternalFailure", "message": "boom"}


def test_error_message_keeps_its_payload_when_it_has_one() -> None:
    stream = message(
        header(":message-type", 7, "error") + header(":error-code", 7, "X"), b'{"message":"m"}'
    )
    assert decode([stream]) == [Frame("error", '{"message":"m"}')]


def test_empty_stream_and_empty_chunks() -> None:
    assert decode([]) == []
    stream = event("a", b"1") + event("b", b"2")
    assert decode([b"", stream[:5], b"", stream[5:], b""]) == [Frame("a", "1"), Frame("b", "2")]


@settings(max_examples=100)
@given(
    payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=5),
    data=st.data(),
)
def test_built_stream_random_splits(payloads: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(event(f"e{i}", p, ALL_TYPES) for i, p in enumerate(payloads))
    expected = [
        Frame(f"e{i}", p.decode("utf-8", "surrogateescape")) for i, p in enumerate(payloads)
    ]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30), label="cuts")
    assert decode(split_at(stream, cuts)) == expected


@settings(max_examples=200)
@given(data=st.data())
def test_built_stream_any_flipped_bit_is_a_decode_error(data: st.DataObject) -> None:
    stream = event("contentBlockDelta", b'{"delta":{"text":"hi"}}', ALL_TYPES)
    bit = data.draw(st.integers(0, len(stream) * 8 - 1), label="bit")
    corrupt = bytearray(stream)
    corrupt[bit // 8] ^= 1 << (bit % 8)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts")
    expect_error(split_at(bytes(corrupt), cuts), match="CRC")


# -- errors take effect at their place in the stream, whatever the reads ----------------------


def outcome(chunks: Iterable[bytes], **kwargs: int) -> tuple[list[Frame], str | None]:
    """Every frame until the decoder raises, and the error's message (None if none)."""
    decoder = EventStreamDecoder(**kwargs)  # type: ignore[arg-type]
    return decoded_until_error(decoder, chunks)


def _corrupt(kind: str, payload: bytes, bit: int) -> bytes:
    """One bad message: a flipped bit anywhere, a length over the limit, a bad type."""
    if kind == "bit":
        raw = bytearray(event("contentBlockDelta", payload))
        raw[bit % len(raw)] ^= 1 << (bit % 8)
        return bytes(raw)
    if kind == "too_long":
        return _with_prelude(10_000, 0)
    return message(header(":message-type", 7, "gossip"), payload)


@settings(max_examples=200)
@given(
    payloads=st.lists(st.binary(max_size=30), max_size=4),
    kind=st.sampled_from(["bit", "too_long", "message_type"]),
    bit=st.integers(0, 10_000),
    data=st.data(),
)
def test_messages_then_a_corrupt_one_same_at_every_chunking(
    payloads: list[bytes], kind: str, bit: int, data: st.DataObject
) -> None:
    """Valid messages, then a corrupt one, then a valid one: split anywhere (whole, byte by
    byte, random cuts), the same frames come out, then the same error."""
    good = b"".join(event(f"e{i}", p) for i, p in enumerate(payloads))
    stream = good + _corrupt(kind, b'{"a":1}', bit) + event("after", b"{}")
    expected = [
        Frame(f"e{i}", p.decode("utf-8", "surrogateescape")) for i, p in enumerate(payloads)
    ]
    whole = outcome([stream], max_message_bytes=4096)
    assert whole[0] == expected
    assert whole[1] is not None
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30), label="cuts")
    for chunks in ([stream[i : i + 1] for i in range(len(stream))], split_at(stream, cuts)):
        assert outcome(chunks, max_message_bytes=4096) == whole


def test_the_feed_that_completes_messages_returns_them_and_the_next_call_raises() -> None:
    corrupt = bytearray(event("b", b"{}"))
    corrupt[-1] ^= 1  # the message CRC
    stream = event("a", b"1") + event("a", b"2") + bytes(corrupt) + event("c", b"3")
    for after in ("feed", "finish"):
        decoder = EventStreamDecoder()
        assert decoder.feed(stream) == [Frame("a", "1"), Frame("a", "2")]
        with pytest.raises(StreamDecodeError, match="message CRC mismatch"):
            decoder.feed(b"") if after == "feed" else decoder.finish()
        with pytest.raises(UsageError, match="failed earlier"):
            decoder.feed(b"")
        with pytest.raises(UsageError):
            decoder.finish()


def test_a_stream_with_a_bad_crc_gives_the_same_round_at_every_chunking() -> None:
    """A call, then a message with a bad CRC: fed whole, the call used to vanish (no calls, no
    error results); now every chunking records it, failed as interrupted, with one detail."""
    corrupt = bytearray(event("contentBlockDelta", b'{"contentBlockIndex":0}'))
    corrupt[-1] ^= 1
    stream = (
        event("messageStart", b'{"role":"assistant"}')
        + event(
            "contentBlockStart",
            b'{"contentBlockIndex":0,"start":{"toolUse":{"name":"f","toolUseId":"t1"}}}',
        )
        + event("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"toolUse":{"input":"{}"}}}')
        + bytes(corrupt)
        + event("contentBlockStop", b'{"contentBlockIndex":0}')
        + event("messageStop", b'{"stopReason":"tool_use"}')
    )

    def summary(reads: list[bytes]) -> object:
        parser = StreamParser("bedrock", framing="eventstream")
        for read in reads:
            parser.feed(read)
        round_ = parser.finish()
        calls = [(c.call_id, c.state, c.error, c.detail) for c in round_.calls]
        return calls, [(a.kind.value, a.detail) for a in round_.anomalies]

    whole = summary([stream])
    assert whole[0] == [  # type: ignore[index]
        (
            "t1",
            CallState.FAILED,
            ErrorCode.STREAM_INTERRUPTED,
            "framing error: event-stream message CRC mismatch (corrupt message)",
        )
    ]
    for size in (1, 7, 64):
        assert summary([stream[i : i + size] for i in range(0, len(stream), size)]) == whole


# -- linear in the bytes --------------------------------------------------------------------------


class _CountingPreludes(EventStreamDecoder):
    def __init__(self) -> None:
        super().__init__()
        self.checks = 0

    def _check_prelude(self, buf: bytearray, start: int) -> int:
        self.checks += 1
        return super()._check_prelude(buf, start)


def test_a_large_message_in_small_reads_is_checked_once_into_one_buffer() -> None:
    """A message waiting for its bytes costs O(1) per read: its prelude is checked once and
    the reads extend one buffer in place (no copy of what is buffered per read)."""
    payload = b'{"t":"' + b"x" * 8000 + b'"}'
    stream = event("big", payload) + event("small", b"{}")
    decoder = _CountingPreludes()
    buffers, frames = [], []
    for i in range(len(stream)):
        frames += decoder.feed(stream[i : i + 1])
        if not frames:
            buffers.append(decoder._buf)
    assert frames == [Frame("big", payload.decode()), Frame("small", "{}")]
    assert decoder.checks == 2
    assert len(buffers) > 8000
    assert all(b is buffers[0] for b in buffers)


# -- malformed messages (valid CRCs, bad structure) -----------------------------------------------


def _with_prelude(total: int, headers_len: int, rest: bytes = b"") -> bytes:
    prelude = struct.pack(">II", total, headers_len)
    return prelude + struct.pack(">I", zlib.crc32(prelude)) + rest


MALFORMED = {
    "total_below_minimum": (_with_prelude(15, 0, b"\x00" * 8), "below the 16-byte minimum"),
    "total_zero": (_with_prelude(0, 0), "below the 16-byte minimum"),
    "headers_longer_than_message": (_with_prelude(20, 5, b"\x00" * 8), "headers length"),
    "header_name_past_block": (message(b"\x05ab"), "runs past"),
    "header_type_missing": (message(b"\x02ab"), "runs past"),
    "unknown_value_type": (message(b"\x01a\x0a"), "unknown value type 10"),
    "string_length_past_block": (message(b"\x01a\x07\x00\x09abc"), "runs past"),
    "string_length_truncated": (message(b"\x01a\x07\x00"), "runs past"),
    "fixed_value_truncated": (message(b"\x01a\x05\x00\x00"), "runs past"),
    "uuid_truncated": (message(b"\x01a\x09" + b"\x00" * 15), "runs past"),
    "name_not_utf8": (message(b"\x01\xff\x00"), "not valid UTF-8"),
    "string_not_utf8": (message(b"\x01a\x07\x00\x01\xff"), "not valid UTF-8"),
    "event_type_not_string": (message(header(":event-type", 4, 1)), "must be a string"),
    "message_type_not_string": (message(header(":message-type", 0)), "must be a string"),
    "event_without_event_type": (
        message(header(":message-type", 7, "event"), b"{}"),
        "no :event-type",
    ),
    "unknown_message_type": (
        message(header(":message-type", 7, "gossip"), b"{}"),
        "unknown :message-type",
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_message_raises(name: str) -> None:
    stream, match = MALFORMED[name]
    expect_error([stream], match=match)
    expect_error([stream[i : i + 1] for i in range(len(stream))], match=match)


def test_message_over_max_is_refused_from_its_prelude() -> None:
    big = event("contentBlockDelta", b"x" * 100)
    assert decode([big], max_message_bytes=len(big)) == [Frame("contentBlockDelta", "x" * 100)]
    decoder = EventStreamDecoder(max_message_bytes=len(big) - 1)
    with pytest.raises(StreamDecodeError, match="exceeds max_message_bytes"):
        decoder.feed(big[:12])  # refused before the body is buffered


def test_huge_declared_length_is_refused_without_waiting() -> None:
    decoder = EventStreamDecoder()
    with pytest.raises(StreamDecodeError, match="exceeds max_message_bytes"):
        decoder.feed(_with_prelude(2**32 - 1, 0))


@settings(max_examples=200)
@given(
    headers=st.binary(max_size=40),
    payload=st.binary(max_size=10),
    data=st.data(),
)
def test_arbitrary_header_bytes_never_crash(
    headers: bytes, payload: bytes, data: st.DataObject
) -> None:
    """Valid CRCs around random header bytes: frames or StreamDecodeError, nothing else."""
    stream = message(headers, payload)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="cuts")
    try:
        frames = decode(split_at(stream, cuts))
    except StreamDecodeError:
        return
    assert len(frames) == 1


@settings(max_examples=200)
@given(raw=st.binary(max_size=80))
def test_arbitrary_bytes_never_crash(raw: bytes) -> None:
    with contextlib.suppress(StreamDecodeError):
        decode([raw])


# -- lifecycle and configuration -------------------------------------------------------------------


def test_feed_and_finish_after_finish_raise_usage_error() -> None:
    decoder = EventStreamDecoder()
    assert decoder.finish() == []
    with pytest.raises(UsageError):
        decoder.feed(event("a", b"{}"))
    with pytest.raises(UsageError):
        decoder.finish()


def test_configuration() -> None:
    assert decode([event("a", b"1")], max_message_bytes=16 + 200) == [Frame("a", "1")]
    small = EventStreamDecoder(limits=Limits(max_event_bytes=20))
    with pytest.raises(StreamDecodeError, match="max_message_bytes=20"):
        small.feed(event("a", b"1"))
    with pytest.raises(ConfigError):
        EventStreamDecoder(max_message_bytes=15)
    with pytest.raises(ConfigError):
        EventStreamDecoder(max_message_bytes=100, limits=Limits())
