"""Server-sent events decoder: bytes in, :class:`Frame` values out (sans-IO).

Theory of operation
-------------------
The WHATWG "event stream" grammar is line-based, and its line ends (LF, CRLF, CR) are ASCII
bytes that never occur inside a multi-byte UTF-8 sequence. So the decoder splits *bytes* into
lines and decodes each complete field value on its own: a character split across two
``feed()`` calls is simply still in the pending partial line when the first call returns.

State between calls is small: the pending partial line (``_partial``, a ``bytearray`` bounded
by ``max_line_bytes`` and checked on every feed), whether the previous chunk ended in a CR (so a
LF at the start of the next chunk completes that CRLF instead of ending an empty line), the
event being built (type and data lines, bounded by ``max_event_bytes``) and the connection
state the spec keeps across events (last event id, reconnection time).

A chunk without any line end only extends the partial line in place, so a long line fed in
small reads costs time linear in its bytes (each byte is copied once on arrival and once when
its line ends), not a copy of everything pending per read. A chunk with a line end is joined
to the partial line once, CR and CRLF become LF only when the chunk contains a CR (rare:
Gemini), and it is split on LF; the last piece becomes the new partial line.

Events are handed over as they complete: :meth:`SSEDecoder.feed_payloads` calls a function
with runs of consecutive events of one type (the type and each one's undecoded data, at most
``RUN_EVENTS`` of them), in stream order, while it walks the chunk, so a read that holds a
whole stream never holds a list of its events, and the consumer pays its per-call cost once
per run, not per event. ``feed`` is that walk, collecting :class:`Frame` values: there is one
route. The walk goes from line end to line end, each found by a one-byte search for LF
(``memchr``), and applies each line where it lies, by the rules below, without a list of lines
or events: CPython's search for a two-byte needle (``\n\n``) and its split on one byte step
through every byte in a loop (about 2 and 0.7 ns a byte), which a whole call's 256 KiB ``data``
line (Gemini) paid on every event, and a short event paid a search, a split and three calls
more than its two lines need (see :meth:`SSEDecoder._walk`).

Field rules (WHATWG HTML, "Interpreting an event stream"): a line starting with ``:`` is a
comment (heartbeats); ``name: value`` loses at most one space after the colon; a line without
a colon is a field name with an empty value; ``data`` lines are joined with ``\\n``; ``event``
sets the type (default ``"message"``); ``id`` sets the last event id unless it contains NUL,
and it persists across events; ``retry`` is taken only when it is all ASCII digits; unknown
fields are ignored; a UTF-8 BOM is skipped only at the very start of the stream; a blank line
dispatches the event unless no ``data`` line arrived, in which case only the type is reset.

One deliberate deviation: :meth:`SSEDecoder.finish` dispatches a last event that has data but
no terminating blank line, where the spec discards it. Recorded bodies and files routinely end
right after the last ``data:`` line (e.g. Anthropic's ``message_stop`` with no trailing
newline); dropping it would turn a completed round into an interrupted one. The risk is
small and bounded: a body cut inside a line yields a payload that fails to parse (an anomaly,
not an event), and no call commits without the provider's own end-of-round signal, which a
body cut earlier does not contain.

Errors do not depend on read boundaries. Lines are applied in stream order, and an error (a
line or an event over its limit) takes effect at its place in the stream: when the chunk that
holds it completed events before it, ``feed`` returns those events and keeps the error, which
the next ``feed`` or ``finish`` raises. So the events before an error are delivered, whole or
byte by byte, and nothing after it is.

Invalid UTF-8 is never replaced (a second deliberate deviation: the spec decodes with
U+FFFD, which would hand the adapter valid, silently altered text, e.g. argument fragments
that then commit). ``data``, ``event`` and ``id`` values are decoded with
``errors="surrogateescape"``: valid UTF-8 decodes as usual, and each byte that is not part of
a valid sequence becomes one lone surrogate (U+DC80..U+DCFF). Such a string cannot be encoded
as UTF-8, and orjson, the parser every adapter uses, refuses it: the adapter records the event
as lost and fails the calls it may have belonged to (the standard library's ``json.loads``
would accept it, so a consumer of frames must parse strictly); encoding it back with
``errors="surrogateescape"`` gives the exact bytes. The stream itself goes on: an unreadable
event is the adapter's to judge, like any other payload it cannot parse. Comments and unknown
fields are not decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from ._errors import ConfigError, StreamDecodeError, UsageError
from ._events import Frame
from ._limits import Limits

__all__ = ["SSEDecoder"]

_BOM = b"\xef\xbb\xbf"
Emit = Callable[[str, list[bytes]], None]
"""Takes a run of complete events of one type: the type and their data, undecoded (see
``feed_payloads``)."""
RUN_EVENTS = 256
"""Events handed over in one run at most: few enough that a read holding a whole stream
holds few of them at a time."""
_MAX_RETRY_DIGITS = 15
"""Longer ``retry`` values (over ~31,000 years) are ignored rather than fed to ``int()``,
which refuses strings over 4300 digits."""


def _resolve_limit(name: str, explicit: int | None, limits: Limits | None) -> int:
    """Pick one limit from an explicit keyword or a :class:`Limits`; never both."""
    if explicit is not None and limits is not None:
        raise ConfigError(f"pass either limits= or {name}=, not both")
    if explicit is None:
        return int(getattr(limits if limits is not None else Limits(), name))
    if not isinstance(explicit, int) or isinstance(explicit, bool) or explicit < 1:
        raise ConfigError(f"{name} must be a positive integer, got {explicit!r}")
    return explicit


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder with the ``feed``/``finish`` shape.

    Construct with ``max_line_bytes``/``max_event_bytes`` (defaults from :class:`Limits`) or
    with ``limits=``, not both. Line lengths are counted in bytes without the line end; the
    event size is the byte length of the joined ``data`` text.

    ``Frame.id`` is the last event id in force when the event was dispatched (``None`` until
    the stream sends one); ``Frame.retry`` likewise is the current reconnection time: both
    are connection state in the spec, not per-event fields.
    """

    __slots__ = (
        "_at_start",
        "_closed",
        "_data",
        "_data_bytes",
        "_dispatched",
        "_event",
        "_event_budget",
        "_last_id",
        "_max_line",
        "_partial",
        "_pending",
        "_retry",
        "_run",
        "_run_type",
        "_skip_lf",
    )

    def __init__(
        self,
        *,
        max_line_bytes: int | None = None,
        max_event_bytes: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        max_line = _resolve_limit("max_line_bytes", max_line_bytes, limits)
        max_event = _resolve_limit("max_event_bytes", max_event_bytes, limits)
        self._max_line = max_line
        # The running count includes one LF per data line (the spec's buffer), so the joined
        # text is one byte shorter than the count: allow one extra byte.
        self._event_budget = max_event + 1
        self._dispatched = 0  # events the walk handed over (tells errors that follow some)
        self._run: list[bytes] = []  # dispatched events of ``_run_type`` not handed over yet
        self._run_type = ""
        self._partial = bytearray()
        self._pending: StreamDecodeError | None = None  # raised by the next feed/finish
        self._at_start = True
        self._skip_lf = False
        self._closed: str | None = None
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._event = ""
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, data: bytes) -> list[Frame]:
        """Consume the next chunk of the body; return the events it completed, in order.

        Raises:
            StreamDecodeError: a line or an event went over its limit; the decoder is then
                unusable. If events of this chunk were complete before the error, they are
                returned instead and the error is raised by the next ``feed`` or ``finish``.
            UsageError: the decoder was finished, or failed and raised its error, earlier.
        """
        frames: list[Frame] = []
        append = frames.append

        def collect(event: str, values: list[bytes]) -> None:
            for value in values:
                text = value.decode("utf-8", "surrogateescape")  # see the module docstring
                append(Frame(event, text, self._last_id, self._retry))

        self.feed_payloads(bytes(data) if data.__class__ is not bytes else data, collect)
        return frames

    def feed_payloads(self, data: bytes, emit: Emit) -> None:
        """:meth:`feed`, handing the completed events to ``emit(type, datas)`` in runs as
        it walks the chunk, instead of returning frames: consecutive events of one type, at
        most ``RUN_EVENTS`` of them, each one's data undecoded (UTF-8, maybe invalid: decode
        it with ``surrogateescape``), in stream order. A run is handed over before anything
        after it in the chunk is applied, so no list of the chunk's events is built, whatever
        its size (StreamParser uses this), and the id and retry in force are :attr:`last_id`
        and :attr:`retry` when ``emit`` is called. Raises as :meth:`feed` does, at the same
        places; an exception from ``emit`` propagates, and the rest of the chunk is lost (the
        decoder is then not to be used again). ``data`` must be exact ``bytes`` (``feed``
        and StreamParser convert anything else once).
        """
        if self._closed is not None:
            self._raise_closed()
        if self._at_start or self._skip_lf:
            data = self._strip_prefix(data)
        if 13 in data:
            # A CR at the very end may be the first half of a CRLF: remember to drop a LF
            # that starts the next chunk. Every other CR and CRLF becomes one LF here.
            self._skip_lf = data[-1] == 13
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        # data[:end] is complete lines; the rest stays pending
        end = len(data) if data.endswith(b"\n") else data.rfind(b"\n") + 1
        partial = self._partial
        if not end:
            # No line end: extend the pending line in place (no copy of what is pending).
            partial += data
            if len(partial) > self._max_line:
                self._fail_line()
            return
        if partial:
            data = b"".join((partial, data))  # the line's one join
            end += len(partial)
            partial.clear()
        before = self._dispatched
        try:
            self._walk(data, end, emit)
            if len(data) - end > self._max_line:
                self._fail_line()
        except StreamDecodeError as exc:
            if self._dispatched == before:
                raise
            self._pending = exc  # the events before it first (see the module docstring)
            return
        if end < len(data):
            partial += memoryview(data)[end:]

    def _walk(self, data: bytes, end: int, emit: Emit) -> None:
        """Apply the complete lines ``data[:end]`` in order, each found by a one-byte search
        (``memchr``) for its LF and applied where it lies, by the rules of the module
        docstring, without a list of lines. A blank line adds the event to the run (the run is
        handed over first when the type changes or it is full); the last run is handed over
        before this returns or raises. A line over ``max_line_bytes`` raises after the lines
        before it were applied."""
        pos, find, max_line = 0, data.find, self._max_line
        try:
            while pos < end:
                stop = find(b"\n", pos, end)  # (found: data[:end] ends with a LF)
                if stop - pos > max_line:
                    self._fail_line()
                if stop == pos:  # a blank line: the event is dispatched
                    lines, event = self._data, self._event or "message"
                    self._event = ""
                    if lines:
                        self._data = []
                        self._data_bytes = 0
                        run = self._run
                        if run and (event != self._run_type or len(run) == RUN_EVENTS):
                            self._hand_over(emit)
                        self._run_type = event
                        self._dispatched += 1
                        self._run.append(lines[0] if len(lines) == 1 else b"\n".join(lines))
                elif data.startswith(b"data:", pos, stop):  # the common lines, inlined
                    start = pos + 6 if data.startswith(b" ", pos + 5, stop) else pos + 5
                    self._data.append(data[start:stop])
                    self._data_bytes += stop - start + 1
                    if self._data_bytes > self._event_budget:
                        self._fail_event_size()
                elif data.startswith(b"event: ", pos, stop):
                    self._event = data[pos + 7 : stop].decode("utf-8", "surrogateescape")
                elif data[pos] != 0x3A:  # ":" starts a comment (heartbeats)
                    self._field(data[pos:stop], emit)
                pos = stop + 1
        finally:
            if self._run:
                run, self._run = self._run, []
                emit(self._run_type, run)

    def _hand_over(self, emit: Emit) -> None:
        """Hand the run of dispatched events over."""
        run, self._run = self._run, []
        emit(self._run_type, run)

    def finish(self) -> list[Frame]:
        """Signal the end of the body; return the last event if it lacked its blank line.

        The unterminated last line is processed like a complete one, then an event with data
        is dispatched (see the module docstring for why this departs from the spec). Any later
        ``feed`` or ``finish`` raises :class:`UsageError`.

        Raises:
            StreamDecodeError: the error kept by the last ``feed`` (see :meth:`feed`), or one
                in the last line or event.
            UsageError: called twice, or after the decoder raised its error.
        """
        if self._closed is not None:
            self._raise_closed()
        self._closed = "SSEDecoder.finish() was already called"
        # the unterminated last line, then a blank line: the event is dispatched if it has data
        tail = bytes(self._partial) + b"\n\n"
        self._partial = bytearray()
        frames: list[Frame] = []

        def collect(event: str, values: list[bytes]) -> None:
            for value in values:
                text = value.decode("utf-8", "surrogateescape")  # see the module docstring
                frames.append(Frame(event, text, self._last_id, self._retry))

        self._walk(tail, len(tail), collect)
        return frames

    @property
    def last_id(self) -> str | None:
        """The last event id in force (``Frame.id`` of an event dispatched now)."""
        return self._last_id

    @property
    def retry(self) -> int | None:
        """The reconnection time in force, in milliseconds (``Frame.retry``)."""
        return self._retry

    # -- internals -------------------------------------------------------------------------

    def _strip_prefix(self, data: bytes) -> bytes:
        """Drop a stream-initial BOM (possibly split over feeds) or the LF of a split CRLF."""
        if self._skip_lf and data:
            self._skip_lf = False
            return data[1:] if data[0] == 0x0A else data
        if not self._at_start:
            return data
        if self._partial:
            data = bytes(self._partial) + data  # at most two bytes (below)
            self._partial = bytearray()
        if len(data) < len(_BOM) and _BOM.startswith(data):
            self._partial = bytearray(data)  # not enough bytes yet to tell; at most two kept
            return b""
        self._at_start = False
        return data[len(_BOM) :] if data.startswith(_BOM) else data

    def _fail_event_size(self) -> NoReturn:
        self._fail(
            f"SSE event data exceeds max_event_bytes={self._event_budget - 1} "
            f"({len(self._data)} data lines so far)"
        )

    def _field(self, line: bytes, emit: Emit) -> None:
        """Apply a field line other than comments and those the walk applies itself (``data:``,
        ``event: ``); unknown names are ignored.
        The run so far is handed over before the id or retry in force changes (``emit``
        reads them: see :meth:`feed_payloads`)."""
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":  # (a bare "data" line: "data:" lines are applied by the walk)
            self._data.append(value)
            self._data_bytes += len(value) + 1
            if self._data_bytes > self._event_budget:
                self._fail_event_size()
        elif name == b"event":
            self._event = value.decode("utf-8", "surrogateescape")
        elif name == b"id":
            if b"\x00" not in value:
                if self._run:
                    self._hand_over(emit)
                self._last_id = value.decode("utf-8", "surrogateescape")
        elif name == b"retry" and value.isdigit() and len(value) <= _MAX_RETRY_DIGITS:
            if self._run:
                self._hand_over(emit)
            self._retry = int(value)

    def _fail_line(self) -> NoReturn:
        # One message whether the line ended in the chunk or not: where the reads end must
        # not change what a failed stream reports.
        self._fail(f"SSE line exceeds max_line_bytes={self._max_line}")

    def _raise_closed(self) -> NoReturn:
        """Raise the kept decode error once; after that (or after finish) a UsageError."""
        exc, self._pending = self._pending, None
        if exc is not None:
            raise exc
        raise UsageError(self._closed)

    def _fail(self, message: str) -> NoReturn:
        """Make the decoder unusable, drop its buffers and raise ``StreamDecodeError``."""
        self._closed = f"SSEDecoder failed earlier: {message}"
        self._partial = bytearray()
        self._data = []
        raise StreamDecodeError(message)
