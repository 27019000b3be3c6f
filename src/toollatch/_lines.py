"""JSON Lines framing: one native event per line (recorder dumps, NDJSON servers).

Theory of operation
-------------------
The pending partial line is a ``bytearray``: a chunk without a LF only extends it in place,
and a chunk with one is joined to it once and split. So a long line fed in small reads costs
time linear in its bytes, and the ``max_line_bytes`` bound is still checked on every feed.

Errors do not depend on read boundaries. Lines are taken in order, and a line over the limit
takes effect at its place in the stream: when the chunk that holds it completed lines before
it, ``feed`` returns their frames and keeps the error, which the next ``feed`` or ``finish``
raises.

Invalid UTF-8 is never replaced with U+FFFD (which would hand the adapter valid, silently
altered text, e.g. an argument fragment that then commits). A line is decoded with
``errors="surrogateescape"``: each byte that is not part of a valid UTF-8 sequence becomes
one lone surrogate (U+DC80..U+DCFF), which cannot be encoded as UTF-8 and which orjson, the
parser every adapter uses, refuses. The adapter records the event as lost; the stream goes on.
"""

from __future__ import annotations

from typing import NoReturn

from ._errors import StreamDecodeError, UsageError
from ._events import Frame
from ._limits import Limits

_new_frame = tuple.__new__
"""``tuple.__new__(Frame, fields)`` builds a Frame without the Python-level ``Frame.__new__``."""


class JSONLinesDecoder:
    """Bytes in, one :class:`Frame` per non-blank line out (``feed``/``finish``, bounded).

    Lines end with LF (a trailing CR is stripped); the last line needs no newline. Blank lines
    are skipped. A line over ``max_line_bytes`` raises :class:`StreamDecodeError` (see
    :meth:`feed` for when).
    """

    def __init__(self, *, limits: Limits | None = None) -> None:
        self._max = (limits or Limits()).max_line_bytes
        self._partial = bytearray()
        self._closed = False
        self._pending: StreamDecodeError | None = None  # raised by the next feed/finish
        self.head_event = "message"
        """The event type of every line (see :meth:`single`)."""

    def feed(self, data: bytes) -> list[Frame]:
        """Frames for every line completed by ``data``, in order.

        Raises:
            StreamDecodeError: a line went over ``max_line_bytes``; the decoder is then
                unusable. If lines of this chunk were complete before it, their frames are
                returned instead and the error is raised by the next ``feed`` or ``finish``.
            UsageError: the decoder was finished, or failed and raised its error, earlier.
        """
        line = self.single(data)
        if line is not None:
            try:
                text = line.decode()
            except UnicodeDecodeError:
                text = line.decode("utf-8", "surrogateescape")  # see the module docstring
            return [_new_frame(Frame, ("message", text, None, None))]
        return self._feed_lines(data)

    def single(self, data: bytes) -> bytes | None:
        """The line of ``data`` (undecoded) if ``data`` is exactly one event that leaves the
        decoder as it is; else ``None`` (see :meth:`SSEDecoder.single`).

        True of a chunk fed with nothing pending that is exactly one line ``{...}`` and its
        LF, within the limit: a line that starts with ``{`` and ends with ``}`` has no
        whitespace around it to strip and no BOM, so its frame is the one ``_frame`` builds.
        """
        if (
            not self._partial
            and not self._closed
            and data[-1:] == b"\n"
            and data[0] == 0x7B  # "{"; so data is at least "{\n" and data[-2] exists
            and data[-2] == 0x7D  # "}"
            and len(data) <= self._max + 1
        ):
            line = data[:-1]
            if 10 not in line:
                return line
        return None

    def finish(self) -> list[Frame]:
        """The frame of a last line without a newline, if any.

        Raises:
            StreamDecodeError: the error kept by the last ``feed`` (see :meth:`feed`).
            UsageError: called twice, or after the decoder raised its error.
        """
        if self._closed:
            self._raise_closed("JSONLinesDecoder.finish() called twice or after an error")
        self._closed = True
        last = self._frame(bytes(self._partial))
        self._partial = bytearray()
        return [last] if last is not None else []

    def _feed_lines(self, data: bytes) -> list[Frame]:
        """The general path of :meth:`feed`: any chunk, any decoder state."""
        if self._closed:
            self._raise_closed("JSONLinesDecoder.feed() after finish() or an error")
        partial = self._partial
        if 10 not in data:
            # No line end: extend the pending line in place (no copy of what is pending).
            partial += data
            if len(partial) > self._max:
                self._fail()
            return []
        buf = b"".join((partial, data)) if partial else data  # the line's one join
        partial.clear()
        lines = buf.split(b"\n")
        tail = lines.pop()
        frames: list[Frame] = []
        try:
            for line in lines:
                frame = self._frame(line)
                if frame is not None:
                    frames.append(frame)
            if len(tail) > self._max:
                self._fail()
        except StreamDecodeError as exc:
            if not frames:
                raise
            self._pending = exc  # the frames before it first (see the module docstring)
            return frames
        partial += tail
        return frames

    def _frame(self, line: bytes) -> Frame | None:
        if len(line) > self._max:
            self._fail()
        text = line.decode("utf-8", "surrogateescape").strip()
        if not text:
            return None
        if text.startswith("\ufeff"):
            text = text[1:]
        return Frame(event="message", data=text)

    def _raise_closed(self, usage: str) -> NoReturn:
        """Raise the kept decode error once; after that a :class:`UsageError`."""
        exc, self._pending = self._pending, None
        if exc is not None:
            raise exc
        raise UsageError(usage)

    def _fail(self) -> NoReturn:
        self._closed = True
        self._partial = bytearray()
        raise StreamDecodeError(f"a JSON line exceeds {self._max} bytes")
