"""JSON Lines framing: one native event per line (recorder dumps, NDJSON servers).

Theory of operation
-------------------
The pending partial line is a ``bytearray``: a chunk without a LF only extends it in place,
and a chunk with one is joined to it once and split. So a long line fed in small reads costs
time linear in its bytes, and the ``max_line_bytes`` bound is still checked on every feed.

Lines are handed over as they are found, in runs of at most ``RUN_EVENTS``
(:meth:`JSONLinesDecoder.feed_payloads`), so a read that holds a whole stream never holds a
list of its events; a line that is ``{...}`` exactly
(nearly all) goes over as its bytes, any other is decoded, stripped and encoded back.

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

from collections.abc import Callable
from typing import ClassVar, NoReturn

from ._errors import StreamDecodeError, UsageError
from ._events import Frame
from ._limits import Limits

Emit = Callable[[str, list[bytes]], None]
"""Takes a run of complete events: their type (always ``message``) and their lines,
undecoded."""
RUN_EVENTS = 256
"""Lines handed over in one run at most (see ``SSEDecoder.feed_payloads``)."""


class JSONLinesDecoder:
    """Bytes in, one :class:`Frame` per non-blank line out (``feed``/``finish``, bounded).

    Lines end with LF (a trailing CR is stripped); the last line needs no newline. Blank lines
    are skipped. A line over ``max_line_bytes`` raises :class:`StreamDecodeError` (see
    :meth:`feed` for when).
    """

    _BARE: ClassVar[int] = 0x7B
    """The first byte (``{``) of a line handed over as its bytes when its last is ``}``: such
    a line has no whitespace or BOM to strip. (Tests set another to take the general rule.)"""

    def __init__(self, *, limits: Limits | None = None) -> None:
        self._max = (limits or Limits()).max_line_bytes
        self._partial = bytearray()
        self._closed = False
        self._pending: StreamDecodeError | None = None  # raised by the next feed/finish

    def feed(self, data: bytes) -> list[Frame]:
        """Frames for every line completed by ``data``, in order.

        Raises:
            StreamDecodeError: a line went over ``max_line_bytes``; the decoder is then
                unusable. If lines of this chunk were complete before it, their frames are
                returned instead and the error is raised by the next ``feed`` or ``finish``.
            UsageError: the decoder was finished, or failed and raised its error, earlier.
        """
        frames: list[Frame] = []
        append = frames.append

        def collect(event: str, lines: list[bytes]) -> None:
            for line in lines:
                append(Frame(event, line.decode("utf-8", "surrogateescape")))

        self.feed_payloads(bytes(data) if data.__class__ is not bytes else data, collect)
        return frames

    def feed_payloads(self, data: bytes, emit: Emit) -> None:
        """:meth:`feed`, handing the non-blank lines to ``emit("message", lines)`` in runs
        of at most ``RUN_EVENTS`` as they are found, instead of returning frames (see
        :meth:`SSEDecoder.feed_payloads`): each line is the frame's data encoded back
        (``surrogateescape``), without its line end, the whitespace around it and a BOM.
        Raises as :meth:`feed` does. ``data`` must be exact ``bytes`` (``feed`` and
        StreamParser convert anything else once).
        """
        if self._closed:
            self._raise_closed("JSONLinesDecoder.feed() after finish() or an error")
        partial = self._partial
        end = data.rfind(b"\n") + 1  # data[:end] is complete lines; the rest stays pending
        if not end:
            # No line end: extend the pending line in place (no copy of what is pending).
            partial += data
            if len(partial) > self._max:
                self._fail()
            return
        if partial:
            data = b"".join((partial, data))  # the line's one join
            end += len(partial)
            partial.clear()
        pos = sent = 0
        find, limit, bare = data.find, self._max, self._BARE
        run: list[bytes] = []
        add = run.append
        try:
            while pos < end:
                stop = find(b"\n", pos)
                if stop - pos > limit:
                    self._fail()
                if data[pos] == bare and data[stop - 1] == 0x7D:  # "{...}": nothing to strip
                    add(data[pos:stop])
                else:
                    self._stripped(data[pos:stop], add)
                pos = stop + 1
                if len(run) == RUN_EVENTS:
                    sent += len(run)
                    emit("message", run)
                    run = []
                    add = run.append
            if len(data) - end > limit:
                self._fail()
        except StreamDecodeError as exc:
            if run:  # the lines before it first (see the module docstring)
                emit("message", run)
            elif not sent:
                raise
            self._pending = exc
            return
        if run:
            emit("message", run)
        partial += memoryview(data)[end:]

    def _stripped(self, line: bytes, add: Callable[[bytes], None]) -> None:
        """Add ``line`` as :meth:`_frame` reads it to the run, if it is not blank."""
        frame = self._frame(line)
        if frame is not None:
            add(frame.data.encode("utf-8", "surrogateescape"))

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
