"""AWS ``application/vnd.amazon.eventstream`` decoder (Bedrock ConverseStream), sans-IO.

Theory of operation
-------------------
The body is a sequence of self-delimiting binary messages (all integers big-endian)::

    total length (4) | headers length (4) | prelude CRC32 (4)    <- the 12-byte prelude
    headers (headers length bytes) | payload | message CRC32 (4)

The prelude CRC covers the first 8 bytes; the message CRC covers everything before it.
A header is ``name length (1) | name (UTF-8) | value type (1) | value``; the value types are
0 true, 1 false (no bytes), 2 byte, 3 short, 4 int, 5 long, 8 timestamp (signed, in
milliseconds since the epoch), 9 UUID (16 bytes), 6 byte array and 7 string (both a 2-byte
length, then the bytes).

:func:`encode_message` is the inverse for string headers (the scripted server's Bedrock wire
and the recorder's masking both frame with it): it computes the lengths and both CRCs.

``feed()`` appends to one buffer and cuts every complete message off its front. As soon as a
prelude is buffered it is checked (its CRC, then ``16 <= total length <= max_message_bytes``
and the headers fitting inside), so a corrupt length can neither make the decoder wait for
gigabytes nor read past a message; the buffer never holds more than one message plus one
chunk. The buffer grows in place and a message waiting for its bytes costs O(1) per feed, so
a large message fed in small reads costs time linear in its bytes. Every structural problem
raises :class:`StreamDecodeError` (never ``IndexError`` or ``struct.error``), after which the
decoder is unusable.

Errors do not depend on read boundaries: messages are cut in order, and when the chunk holding
a corrupt message also completed messages before it, ``feed`` returns their frames and keeps
the error, which the next ``feed`` or ``finish`` raises.

Each message becomes one :class:`Frame`, chosen by its ``:message-type`` header so that the
Bedrock adapter can tell failures from events by ``Frame.event`` alone:

* ``event`` (also assumed when the header is absent): ``event`` = ``:event-type``, which an
  event message must carry; ``data`` = the payload decoded as UTF-8.
* ``exception`` (a modeled error such as ``throttlingException``): ``event`` =
  ``:exception-type`` (``"error"`` if missing); ``data`` = the payload, a JSON object whose
  ``message`` explains it.
* ``error`` (an unmodeled service error, which carries its details in headers and usually an
  empty payload): ``event`` = ``"error"``; ``data`` = the payload if there is one, else the
  JSON object ``{"errorCode": <:error-code>, "message": <:error-message>}`` so the details
  are not lost (``Frame`` has no room for headers).
* any other message type raises :class:`StreamDecodeError`: nothing we could safely act on.

Invalid UTF-8 is never replaced with U+FFFD (which would hand the adapter valid, silently
altered text). Header names and string values must be UTF-8 (they frame the message:
:class:`StreamDecodeError`). The payload is decoded with ``errors="surrogateescape"``: each
byte outside a valid UTF-8 sequence becomes one lone surrogate (U+DC80..U+DCFF), which cannot
be encoded as UTF-8 and which orjson, the parser every adapter uses, refuses; the adapter
records the event as lost and the stream goes on, as for any payload that is not JSON.
"""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import NoReturn

from ._errors import ConfigError, StreamDecodeError, UsageError
from ._events import Frame
from ._limits import Limits

__all__ = [
    "EventStreamDecoder",
    "HeaderValue",
    "decode_headers",
    "encode_frame",
    "encode_message",
    "header_values",
]

HeaderValue = bool | int | bytes | str | uuid.UUID
"""A decoded header value; timestamps are ``int`` milliseconds since the epoch."""

_PRELUDE = struct.Struct(">III")
_PRELUDE_HEAD = struct.Struct(">II")
_CRC = struct.Struct(">I")
_PRELUDE_BYTES = 12
_OVERHEAD_BYTES = 16  # prelude + message CRC: the size of an empty message

_FIXED: dict[int, tuple[int, struct.Struct | None]] = {
    2: (1, struct.Struct(">b")),
    3: (2, struct.Struct(">h")),
    4: (4, struct.Struct(">i")),
    5: (8, struct.Struct(">q")),
    8: (8, struct.Struct(">q")),
    9: (16, None),
}
"""Value type -> (byte size, how to unpack it; None for a UUID)."""


def decode_headers(raw: bytes) -> dict[str, HeaderValue]:
    """Decode a message's header block; a repeated name keeps its last value.

    Raises:
        StreamDecodeError: a header runs past the block, has an unknown value type, or has a
            name or string value that is not UTF-8.
    """
    return {name: value for name, _kind, _start, value in header_values(raw)}


def header_values(raw: bytes) -> list[tuple[str, int, int, HeaderValue]]:
    """Each header of a block in order: its name, value type, the offset of its value's
    bytes in ``raw`` (after a string's or byte array's length) and the decoded value.
    Raises as :func:`decode_headers` does."""
    out: list[tuple[str, int, int, HeaderValue]] = []
    pos, end = 0, len(raw)
    while pos < end:
        name_end = pos + 1 + raw[pos]
        if name_end >= end:  # the name and at least the type byte must fit
            raise StreamDecodeError(f"event-stream header at offset {pos} runs past its block")
        name = _utf8(raw[pos + 1 : name_end], "header name")
        kind = raw[name_end]
        value, pos = _decode_value(raw, name_end, name)
        start = name_end + (3 if kind in (6, 7) else 1)
        out.append((name, kind, start, value))
    return out


def _string_header_bytes(name: str, value: str) -> bytes:
    """One string-valued header (type 7)."""
    raw_name, raw_value = name.encode(), value.encode()
    return (
        bytes([len(raw_name)]) + raw_name + b"\x07" + len(raw_value).to_bytes(2, "big") + raw_value
    )


def encode_frame(header_block: bytes, payload: bytes) -> bytes:
    """One event-stream message around an encoded header block and a payload: the prelude
    (total and headers lengths) with its CRC, then the message CRC over all before it."""
    total = _OVERHEAD_BYTES + len(header_block) + len(payload)
    prelude = _PRELUDE_HEAD.pack(total, len(header_block))
    head = prelude + _CRC.pack(zlib.crc32(prelude)) + header_block + payload
    return head + _CRC.pack(zlib.crc32(head))


def encode_message(headers: Sequence[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message with string headers (in their order) and ``payload``."""
    return encode_frame(b"".join(_string_header_bytes(n, v) for n, v in headers), payload)


def _decode_value(raw: bytes, pos: int, name: str) -> tuple[HeaderValue, int]:
    """Decode the typed value starting at ``raw[pos]`` (its type byte); return it and its end."""
    kind = raw[pos]
    pos += 1
    if kind in (0, 1):
        return kind == 0, pos
    if kind in (6, 7):
        # A cut-off length field reads short, but then the value end still passes the block.
        size = int.from_bytes(raw[pos : pos + 2], "big")
        pos += 2
    elif kind in _FIXED:
        size = _FIXED[kind][0]
    else:
        raise StreamDecodeError(f"event-stream header {name!r} has unknown value type {kind}")
    end = pos + size
    if end > len(raw):
        raise StreamDecodeError(f"event-stream header {name!r}: value runs past its block")
    chunk = raw[pos:end]
    if kind == 6:
        return chunk, end
    if kind == 7:
        return _utf8(chunk, f"header {name!r}"), end
    unpacker = _FIXED[kind][1]
    return (uuid.UUID(bytes=chunk) if unpacker is None else unpacker.unpack(chunk)[0]), end


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StreamDecodeError(f"event-stream {what} is not valid UTF-8") from None


def _string_header(headers: dict[str, HeaderValue], name: str) -> str | None:
    value = headers.get(name)
    if value is None or isinstance(value, str):
        return value
    raise StreamDecodeError(f"event-stream header {name!r} must be a string")


Emit = Callable[[str, list[bytes]], None]
"""Takes a run of complete messages of one event type: the type and their payloads."""
RUN_EVENTS = 256
"""Messages handed over in one run at most (see ``SSEDecoder.feed_payloads``)."""


def _to_event(headers: dict[str, HeaderValue], payload: bytes) -> tuple[str, bytes]:
    """Map one decoded message onto a frame's event and data, the data still undecoded
    (see the module docstring)."""
    message_type = _string_header(headers, ":message-type") or "event"
    if message_type == "event":
        event = _string_header(headers, ":event-type")
        if event is None:
            raise StreamDecodeError("event-stream event message has no :event-type header")
        return event, payload
    if message_type == "exception":
        return _string_header(headers, ":exception-type") or "error", payload
    if message_type == "error":
        if not payload:
            details = {
                "errorCode": _string_header(headers, ":error-code"),
                "message": _string_header(headers, ":error-message"),
            }
            payload = json.dumps({k: v for k, v in details.items() if v is not None}).encode()
        return "error", payload
    raise StreamDecodeError(f"event-stream message has unknown :message-type {message_type!r}")


class EventStreamDecoder:
    """Incremental AWS event-stream decoder with the ``feed``/``finish`` shape.

    ``max_message_bytes`` (default ``Limits().max_event_bytes``, or taken from ``limits=``)
    bounds one message's total length, and so the decoder's memory.
    """

    __slots__ = ("_buf", "_checked", "_closed", "_max", "_pending")

    def __init__(
        self, *, max_message_bytes: int | None = None, limits: Limits | None = None
    ) -> None:
        if max_message_bytes is not None and limits is not None:
            raise ConfigError("pass either limits= or max_message_bytes=, not both")
        if max_message_bytes is None:
            max_message_bytes = (limits or Limits()).max_event_bytes
        elif (
            not isinstance(max_message_bytes, int)
            or isinstance(max_message_bytes, bool)
            or max_message_bytes < _OVERHEAD_BYTES
        ):
            raise ConfigError(f"max_message_bytes must be an int >= 16, got {max_message_bytes!r}")
        self._max = max_message_bytes
        self._buf = bytearray()
        self._checked = 0  # total length of the buffered message whose prelude was checked
        self._closed: str | None = None
        self._pending: StreamDecodeError | None = None  # raised by the next feed/finish

    def feed(self, data: bytes) -> list[Frame]:
        """Consume the next chunk of the body; return one frame per message it completed.

        Raises:
            StreamDecodeError: a corrupt or oversized message; the decoder is then unusable.
                If messages of this chunk were complete before it, their frames are returned
                instead and the error is raised by the next ``feed`` or ``finish``.
            UsageError: the decoder was finished, or failed and raised its error, earlier.
        """
        frames: list[Frame] = []
        append = frames.append

        def collect(event: str, payloads: list[bytes]) -> None:
            for payload in payloads:
                # never U+FFFD: see the module docstring
                append(Frame(event, payload.decode("utf-8", "surrogateescape")))

        self.feed_payloads(data, collect)
        return frames

    def feed_payloads(self, data: bytes, emit: Emit) -> None:
        """:meth:`feed`, handing the completed messages to ``emit(event, payloads)`` as they
        are cut, in runs of one event type of at most ``RUN_EVENTS``, instead of returning
        frames (each payload: the frame's data undecoded; see
        :meth:`SSEDecoder.feed_payloads`). Raises as :meth:`feed` does.
        """
        if self._closed is not None:
            self._raise_closed()
        buf = self._buf
        buf += data  # in place: amortized O(len(data))
        start = sent = 0
        name, run = "", list[bytes]()  # messages of type ``name`` not handed over yet
        try:
            while len(buf) - start >= _PRELUDE_BYTES:
                total = self._checked or self._check_prelude(buf, start)
                if len(buf) - start < total:
                    self._checked = total
                    break
                event, payload = self._decode_message(bytes(buf[start : start + total]))
                self._checked = 0
                start += total
                sent += 1
                if event != name or len(run) == RUN_EVENTS:
                    if run:
                        emit(name, run)
                    name, run = event, []
                run.append(payload)
        except StreamDecodeError as exc:
            if not sent:
                raise
            self._pending = exc  # the frames before it first (see the module docstring)
        if run:
            emit(name, run)
        del buf[:start]

    def finish(self) -> list[Frame]:
        """Signal the end of the body. Any later ``feed`` or ``finish`` raises UsageError.

        Raises:
            StreamDecodeError: the error kept by the last ``feed`` (see :meth:`feed`), or the
                body ended inside a message.
            UsageError: called twice, or after the decoder raised its error.
        """
        if self._closed is not None:
            self._raise_closed()
        self._closed = "EventStreamDecoder.finish() was already called"
        if self._buf:
            self._fail(f"event stream ended inside a message ({len(self._buf)} bytes left over)")
        return []

    def _check_prelude(self, buf: bytearray, start: int) -> int:
        """Validate the prelude at ``buf[start:]``; return the message's total length."""
        total, headers_len, crc = _PRELUDE.unpack_from(buf, start)
        if zlib.crc32(buf[start : start + 8]) != crc:
            self._fail("event-stream prelude CRC mismatch (corrupt or misaligned stream)")
        if total < _OVERHEAD_BYTES:
            self._fail(f"event-stream message length {total} is below the 16-byte minimum")
        if total > self._max:
            self._fail(
                f"event-stream message of {total} bytes exceeds max_message_bytes={self._max}"
            )
        if headers_len > total - _OVERHEAD_BYTES:
            self._fail(f"event-stream headers length {headers_len} exceeds its message ({total})")
        return int(total)

    def _decode_message(self, message: bytes) -> tuple[str, bytes]:
        """Check a complete message's CRC and turn it into a frame's event and data."""
        (crc,) = _CRC.unpack_from(message, len(message) - 4)
        if zlib.crc32(message[:-4]) != crc:
            self._fail("event-stream message CRC mismatch (corrupt message)")
        headers_end = _PRELUDE_BYTES + int.from_bytes(message[4:8], "big")
        try:
            headers = decode_headers(message[_PRELUDE_BYTES:headers_end])
            return _to_event(headers, message[headers_end:-4])
        except StreamDecodeError as exc:
            self._fail(str(exc))

    def _raise_closed(self) -> NoReturn:
        """Raise the kept decode error once; after that (or after finish) a UsageError."""
        exc, self._pending = self._pending, None
        if exc is not None:
            raise exc
        raise UsageError(self._closed)

    def _fail(self, message: str) -> NoReturn:
        """Make the decoder unusable, drop its buffer and raise ``StreamDecodeError``."""
        self._closed = f"EventStreamDecoder failed earlier: {message}"
        self._buf = bytearray()
        raise StreamDecodeError(message)
