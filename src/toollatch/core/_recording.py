"""Masking a recorded stream so that it holds no credential yet stays replayable (pure).

Theory of operation. ``toollatch proxy --record DIR`` writes each upstream answer's bytes
through one :class:`StreamMasker`. It works line by line (a partial line waits for the next
read), and leaves every line that is not an SSE ``data:`` line as it was (``event:``,
``id:``, blank lines, ``[DONE]``) unless it holds a credential (then it is masked as raw
text, below). A ``data:`` line holding JSON is decoded, and in every
string of it (keys included) each span that holds a credential (the built-in formats,
:data:`._secrets.SECRET_TEXT`) or one of the ``known`` secrets (the request's own API key)
has its letters and digits replaced by ``x``: the string keeps its length and its quotes,
colons and other punctuation, so JSON inside it (a call's argument fragments) stays JSON and
the stream parses as before. A line that changed is re-encoded as compact JSON (``\\u``
escapes where it must, for lone surrogates); an unchanged line keeps its exact bytes. A line
that is not JSON gets the same masking over its raw text, and so does a line longer than
``max_line_bytes``, written out at once, so that memory stays bounded.

What it cannot see: a credential cut across two fragments (two lines) is masked only where
a part is still shaped like one; the known secrets are masked wherever they appear whole.

A Bedrock answer (AWS event stream, binary) goes through :class:`EventStreamMasker` instead:
it cuts the bytes into messages as :mod:`._eventstream` frames them (only the message being
received is buffered, up to ``max_message_bytes``), masks each message's JSON payload as
above and its string headers in place (masking keeps a string's UTF-8 length), and frames
the message again with :func:`._eventstream.encode_frame` (new lengths, both CRCs) only when
something changed: an unchanged message keeps its exact bytes. What the decoder would refuse
is kept as it came, masked as raw text where it keeps its length: a message whose CRC does
not match (its CRC stays wrong), a prelude that is corrupt or longer than the bound (the
framing is lost: the rest of the stream passes raw-masked, chunk by chunk), and a last
message cut short (``finish``): ``toollatch replay`` then fails on the recording where it
failed on the wire.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterable
from typing import Any

from ._errors import StreamDecodeError
from ._eventstream import encode_frame, header_values
from ._secrets import SECRET_TEXT

_ALNUM = re.compile(r"[A-Za-z0-9]")
_DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


def _masked_span(match: re.Match[str]) -> str:
    return _ALNUM.sub("x", match.group(0))


class StreamMasker:
    """Masks credentials in a stream's bytes, read by read (see the module's doc).

    ``known``: secrets to mask wherever they appear (at least 8 characters; shorter ones are
    ignored: masking every ``x`` of a stream would help nobody).
    """

    def __init__(
        self, known: Iterable[str] = (), *, max_line_bytes: int = _DEFAULT_MAX_LINE_BYTES
    ) -> None:
        secrets = sorted({k for k in known if isinstance(k, str) and len(k) >= 8}, key=len)
        parts = [re.escape(k) for k in reversed(secrets)]
        pattern = "|".join([*parts, f"(?:{SECRET_TEXT.pattern})"])
        self._pattern = re.compile(pattern, re.IGNORECASE)
        self._carry = b""
        self.max_line_bytes = max_line_bytes
        self.masked = 0
        """Spans masked so far."""

    def feed(self, data: bytes) -> bytes:
        """The masked bytes of every line ``data`` completes."""
        lines = (self._carry + data).split(b"\n")
        self._carry = lines.pop()
        out = b"".join(self._line(line) + b"\n" for line in lines)
        if len(self._carry) > self.max_line_bytes:
            out += self._raw(self._carry)
            self._carry = b""
        return out

    def finish(self) -> bytes:
        """The masked rest (a last line without its newline)."""
        rest, self._carry = self._carry, b""
        return self._line(rest) if rest else b""

    def mask_text(self, text: str) -> str:
        """``text`` with every credential span masked."""
        masked, n = self._pattern.subn(_masked_span, text)
        self.masked += n
        return masked

    def _line(self, line: bytes) -> bytes:
        cr = line.endswith(b"\r")
        body = line[:-1] if cr else line
        if body.startswith(b"{"):  # a JSON Lines recording
            masked = self._json(body)
            return line if masked is None else masked + (b"\r" if cr else b"")
        if not body.startswith(b"data:"):
            return self._raw(line)
        payload = body[5:]
        lead = b" " if payload.startswith(b" ") else b""
        masked = self._json(payload[len(lead) :])
        if masked is None:
            return line
        return b"data:" + lead + masked + (b"\r" if cr else b"")

    def _json(self, payload: bytes) -> bytes | None:
        """The masked payload, or None when nothing in it changed."""
        try:
            value = json.loads(payload)
        except (ValueError, RecursionError):
            masked = self._raw(payload)
            return None if masked == payload else masked
        before = self.masked
        value = self._walk(value)
        if self.masked == before:
            return None
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escaped, as it came
            return json.dumps(value, separators=(",", ":")).encode("ascii")

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.mask_text(value)
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        if isinstance(value, dict):
            return {self.mask_text(k): self._walk(v) for k, v in value.items()}
        return value

    def _raw(self, data: bytes) -> bytes:
        text = data.decode("utf-8", "surrogateescape")
        return self.mask_text(text).encode("utf-8", "surrogateescape")


_PRELUDE = struct.Struct(">III")
_CRC = struct.Struct(">I")
_OVERHEAD_BYTES = 16  # the prelude (12) and the message CRC (4)
_STRING = 7  # an event-stream header's value type for a string


class EventStreamMasker(StreamMasker):
    """Masks credentials in an AWS event stream, read by read, keeping every message framed
    and its CRCs right (see the module's doc). ``known`` as for :class:`StreamMasker`;
    ``max_message_bytes`` bounds the one message buffered."""

    def __init__(
        self, known: Iterable[str] = (), *, max_message_bytes: int = _DEFAULT_MAX_LINE_BYTES
    ) -> None:
        super().__init__(known, max_line_bytes=max_message_bytes)
        self.max_message_bytes = max_message_bytes
        self._buf = bytearray()
        self._lost = False  # the framing was lost: the rest passes raw-masked

    def feed(self, data: bytes) -> bytes:
        """The masked bytes of every message ``data`` completes."""
        if self._lost:
            return self._raw(data)
        buf = self._buf
        buf += data
        out: list[bytes] = []
        start = 0
        while len(buf) - start >= 12:
            total, headers_len, crc = _PRELUDE.unpack_from(buf, start)
            if (
                zlib.crc32(buf[start : start + 8]) != crc
                or not _OVERHEAD_BYTES <= total <= self.max_message_bytes
                or headers_len > total - _OVERHEAD_BYTES
            ):
                self._lost = True
                out.append(self._raw(bytes(buf[start:])))
                start = len(buf)
                break
            if len(buf) - start < total:
                break
            out.append(self._message(bytes(buf[start : start + total]), headers_len))
            start += total
        del buf[:start]
        return b"".join(out)

    def finish(self) -> bytes:
        """The rest: a message cut short, as it came (raw-masked)."""
        rest, self._buf = bytes(self._buf), bytearray()
        return self._raw(rest)

    def _message(self, message: bytes, headers_len: int) -> bytes:
        """One complete message, masked and framed again if anything in it changed."""
        (crc,) = _CRC.unpack_from(message, len(message) - 4)
        if zlib.crc32(message[:-4]) != crc:
            return self._raw(message)
        headers_end = 12 + headers_len
        block = bytearray(message[12:headers_end])
        try:
            headers = header_values(bytes(block))
        except StreamDecodeError:
            return self._raw(message)
        changed = False
        for _name, kind, at, value in headers:
            if kind == _STRING and isinstance(value, str):
                masked = self.mask_text(value)
                if masked != value:  # only ASCII letters and digits change: same length
                    raw = masked.encode()
                    block[at : at + len(raw)] = raw
                    changed = True
        payload = self._json(message[headers_end:-4])
        if payload is None and not changed:
            return message
        body = message[headers_end:-4] if payload is None else payload
        return encode_frame(bytes(block), body)
