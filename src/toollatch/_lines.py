"""JSON Lines framing: one native event per line (recorder dumps, NDJSON servers)."""

from __future__ import annotations

from ._errors import StreamDecodeError, UsageError
from ._events import Frame
from ._limits import Limits


class JSONLinesDecoder:
    """Bytes in, one :class:`Frame` per non-blank line out (``feed``/``finish``, bounded).

    Lines end with LF (a trailing CR is stripped); the last line needs no newline. Blank lines
    are skipped. A line over ``max_line_bytes`` raises :class:`StreamDecodeError`.
    """

    def __init__(self, *, limits: Limits | None = None) -> None:
        self._max = (limits or Limits()).max_line_bytes
        self._partial = b""
        self._closed = False

    def feed(self, data: bytes) -> list[Frame]:
        """Frames for every line completed by ``data``."""
        if self._closed:
            raise UsageError("JSONLinesDecoder.feed() after finish() or an error")
        buf = self._partial + data if self._partial else data
        lines = buf.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self._max:
            self._fail()
        return [f for f in map(self._frame, lines) if f is not None]

    def finish(self) -> list[Frame]:
        """The frame of a last line without a newline, if any."""
        if self._closed:
            raise UsageError("JSONLinesDecoder.finish() called twice or after an error")
        self._closed = True
        last = self._frame(self._partial)
        self._partial = b""
        return [last] if last is not None else []

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
