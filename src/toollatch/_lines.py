"""JSON Lines framing: one native event per line (recorder dumps, NDJSON servers)."""

from __future__ import annotations

from ._errors import StreamDecodeError, UsageError
from ._events import Frame
from ._limits import Limits

_new_frame = tuple.__new__
"""``tuple.__new__(Frame, fields)`` builds a Frame without the Python-level ``Frame.__new__``."""


class JSONLinesDecoder:
    """Bytes in, one :class:`Frame` per non-blank line out (``feed``/``finish``, bounded).

    Lines end with LF (a trailing CR is stripped); the last line needs no newline. Blank lines
    are skipped. A line over ``max_line_bytes`` raises :class:`StreamDecodeError`.
    """

    def __init__(self, *, limits: Limits | None = None) -> None:
        self._max = (limits or Limits()).max_line_bytes
        self._partial = b""
        self._closed = False
        self.head_event = "message"
        """The event type of every line (see :meth:`single`)."""

    def feed(self, data: bytes) -> list[Frame]:
        """Frames for every line completed by ``data``."""
        line = self.single(data)
        if line is not None:
            try:
                text = line.decode()
            except UnicodeDecodeError:
                text = line.decode("utf-8", "replace")
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
        """The frame of a last line without a newline, if any."""
        if self._closed:
            raise UsageError("JSONLinesDecoder.finish() called twice or after an error")
        self._closed = True
        last = self._frame(self._partial)
        self._partial = b""
        return [last] if last is not None else []

    def _feed_lines(self, data: bytes) -> list[Frame]:
        """The general path of :meth:`feed`: any chunk, any decoder state."""
        if self._closed:
            raise UsageError("JSONLinesDecoder.feed() after finish() or an error")
        buf = self._partial + data if self._partial else data
        lines = buf.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self._max:
            self._fail()
        return [f for f in map(self._frame, lines) if f is not None]

    def _frame(self, line: bytes) -> Frame | None:
        if len(line) > self._max:
            self._fail()
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return None
        if text.startswith("\ufeff"):
            text = text[1:]
        return Frame(event="message", data=text)

    def _fail(self) -> None:
        self._closed = True
        raise StreamDecodeError(f"a JSON line exceeds {self._max} bytes")
