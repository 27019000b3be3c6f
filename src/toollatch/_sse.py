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

The common chunk -- exactly one ``data: {...}\\n\\n`` event per network read, maybe after one
``event: <name>`` line (Anthropic, Responses), arriving while nothing is pending -- skips all
of that: ``feed`` compares its start with the head of the previous such chunk (most streams
repeat one), checks the rest with a few slices and builds the frame directly (``_fast``
records "nothing pending" and is recomputed at the end of every general feed). Both paths
must give the same frames; the tests check it.

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

from typing import NoReturn

from ._errors import ConfigError, StreamDecodeError, UsageError
from ._events import Frame
from ._limits import Limits

__all__ = ["SSEDecoder"]

_BOM = b"\xef\xbb\xbf"
_new_frame = tuple.__new__
"""``tuple.__new__(Frame, fields)`` builds a Frame without the Python-level ``Frame.__new__``
wrapper: half the cost on the hot path."""
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


_HEADS: dict[bytes, str] = {}
"""Fast-path ``event:`` heads seen by any SSEDecoder, with their event types: a stream has a
few, and every stream of a provider has the same ones (values only, so sharing is safe)."""
_HEADS_KEPT = 64


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
        "_event",
        "_event_budget",
        "_fast",
        "_fast_max_bytes",
        "_head",
        "_last_id",
        "_max_line",
        "_partial",
        "_pending",
        "_retry",
        "_skip_lf",
        "head_event",
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
        # A fast-path chunk is at least "data: " + value + "\n\n" (an "event:" line only
        # adds bytes): within this bound, its every line and its value fit.
        self._fast_max_bytes = min(max_line + 2, max_event + 8)
        self._fast = False  # True only between events with nothing pending (see _feed_lines)
        self._head = b"data: "
        self.head_event = "message"
        """The event type of the last chunk :meth:`single` accepted."""
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
        value = self.single(data) if self._fast or self._at_start else None
        if value is not None:
            try:
                text = value.decode()
            except UnicodeDecodeError:
                text = value.decode("utf-8", "surrogateescape")  # see the module docstring
            return [_new_frame(Frame, (self.head_event, text, self._last_id, self._retry))]
        return self._feed_lines(data)

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
        self._fast = False
        lines = [bytes(self._partial)] if self._partial else []
        self._partial = bytearray()
        frames: list[Frame] = []
        self._process(lines, frames)  # one line, not blank: it dispatches nothing itself
        if self._data:
            frames.append(self._dispatch())
        return frames

    # -- internals -------------------------------------------------------------------------

    def single(self, data: bytes) -> bytes | None:
        """The data of ``data`` (undecoded) if ``data`` is exactly one event that leaves the
        decoder as it is; else ``None``. ``head_event`` is then the event's type.

        True of a chunk fed with nothing pending that is a head (see :meth:`_fast_head`), a
        value without CR or LF and the blank line, within both limits (the bound on the
        length covers every line and the value: see ``__init__``): :meth:`feed` would apply
        those lines to empty buffers and dispatch at once, leaving nothing pending. So a
        caller that decodes the value itself may skip :meth:`feed` for such a chunk (the
        pipeline's fast path does); ``feed`` uses it for its own.
        """
        if not self._fast:
            return self._first(data) if self._at_start else None
        head = self._head
        if (
            (data.startswith(head) or self._fast_head(data))
            and len(data) <= self._fast_max_bytes
            and data[-1] == 10  # data[-2] exists: a head is 6 bytes or more
            and data[-2] == 10
        ):
            value = data[len(self._head) : -2]
            if 10 not in value and 13 not in value:
                return value
        return None

    def _first(self, data: bytes) -> bytes | None:
        """:meth:`single` for the stream's first chunk: one that starts with a head has no BOM
        to skip, so the decoder is past the start (as ``_strip_prefix`` would leave it)."""
        if self._closed is None and not self._partial and data[:5] in (b"data:", b"event"):
            self._at_start = False
            self._fast = True
            return self.single(data)
        return None

    def _fast_head(self, data: bytes) -> bool:
        """Whether ``data`` starts with a fast-path head; if so, it becomes ``_head``.

        A head is ``data: `` (event type ``message``), or one ``event: <name>`` line (name
        without CR) followed by ``data: ``. Streams repeat one head for most of their events
        (Anthropic ``content_block_delta``), so ``feed`` compares a prefix and reuses the
        decoded name; a chunk with another head comes here once. An ``error`` event's head
        is not a fast-path head.
        """
        if data[:6] == b"data: ":
            head, event = b"data: ", "message"
        elif data[:7] == b"event: ":
            end = data.find(b"\n")
            if end < 0:
                return False
            head = data[: end + 7]
            known = _HEADS.get(head)
            if known is None:
                if head[-6:] != b"data: " or 13 in head:
                    return False
                known = data[7:end].decode("utf-8", "surrogateescape") or "message"
                if known == "error":
                    return False  # an error frame is never single (see single): general path
                if len(_HEADS) < _HEADS_KEPT:
                    _HEADS[head] = known
            event = known
        else:
            return False
        self._head, self.head_event = head, event
        return True

    def _feed_lines(self, data: bytes) -> list[Frame]:
        """The general path of :meth:`feed`: any chunk, any decoder state."""
        if self._closed is not None:
            self._raise_closed()
        if self._at_start or self._skip_lf:
            data = self._strip_prefix(data)
        partial = self._partial
        if 10 not in data and 13 not in data:
            # No line end: extend the pending line in place (no copy of what is pending).
            partial += data
            if len(partial) > self._max_line:
                self._fail_line()
            self._fast = not (
                partial or self._data or self._event or self._skip_lf or self._at_start
            )
            return []
        if partial:
            data = b"".join((partial, data))  # the line's one join
            partial.clear()
        if 13 in data:
            # A CR at the very end may be the first half of a CRLF: remember to drop a LF
            # that starts the next chunk. Every other CR and CRLF becomes one LF here.
            self._skip_lf = data[-1] == 13
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        tail = lines.pop()
        frames: list[Frame] = []
        try:
            if len(data) > self._max_line:
                self._check_line_lengths(lines, frames)
            self._process(lines, frames)
            if len(tail) > self._max_line:
                self._fail_line()
        except StreamDecodeError as exc:
            return self._defer(exc, frames)
        partial += tail
        self._fast = not (partial or self._data or self._event or self._skip_lf or self._at_start)
        return frames

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

    def _process(self, lines: list[bytes], frames: list[Frame]) -> None:
        """Apply complete lines (without line ends) in order; append dispatched events to
        ``frames`` (so that the caller keeps them when a later line raises)."""
        for line in lines:
            if not line:
                if self._data:
                    frames.append(self._dispatch())
                else:
                    self._event = ""
            elif line[:5] == b"data:" or line == b"data":  # bare "data": an empty data line
                value = line[6:] if line[5:6] == b" " else line[5:]
                self._data.append(value)
                self._data_bytes += len(value) + 1
                if self._data_bytes > self._event_budget:
                    self._fail_event_size()
            elif line[:7] == b"event: ":  # the other common line, inlined for speed
                self._event = line[7:].decode("utf-8", "surrogateescape")
            elif line[0] != 0x3A:  # ":" starts a comment (heartbeats)
                self._field(line)

    def _fail_event_size(self) -> NoReturn:
        self._fail(
            f"SSE event data exceeds max_event_bytes={self._event_budget - 1} "
            f"({len(self._data)} data lines so far)"
        )

    def _field(self, line: bytes) -> None:
        """Apply a field line other than ``data`` and comments; unknown names are ignored."""
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"event":
            self._event = value.decode("utf-8", "surrogateescape")
        elif name == b"id":
            if b"\x00" not in value:
                self._last_id = value.decode("utf-8", "surrogateescape")
        elif name == b"retry" and value.isdigit() and len(value) <= _MAX_RETRY_DIGITS:
            self._retry = int(value)

    def _dispatch(self) -> Frame:
        """Build the frame for the current event and reset the per-event buffers."""
        data = self._data
        raw = data[0] if len(data) == 1 else b"\n".join(data)
        text = raw.decode("utf-8", "surrogateescape")  # never U+FFFD: see the module docstring
        frame = _new_frame(Frame, (self._event or "message", text, self._last_id, self._retry))
        self._data = []
        self._data_bytes = 0
        self._event = ""
        return frame

    def _check_line_lengths(self, lines: list[bytes], frames: list[Frame]) -> None:
        """Raise for the first line over the limit, after applying the lines before it."""
        for i, line in enumerate(lines):
            if len(line) > self._max_line:
                self._process(lines[:i], frames)
                self._fail_line()

    def _fail_line(self) -> NoReturn:
        # One message whether the line ended in the chunk or not: where the reads end must
        # not change what a failed stream reports.
        self._fail(f"SSE line exceeds max_line_bytes={self._max_line}")

    def _defer(self, exc: StreamDecodeError, frames: list[Frame]) -> list[Frame]:
        """Raise ``exc`` now if ``frames`` is empty; else keep it for the next call and return
        the events completed before it (so they never depend on where the reads end)."""
        if not frames:
            raise exc
        self._pending = exc
        return frames

    def _raise_closed(self) -> NoReturn:
        """Raise the kept decode error once; after that (or after finish) a UsageError."""
        exc, self._pending = self._pending, None
        if exc is not None:
            raise exc
        raise UsageError(self._closed)

    def _fail(self, message: str) -> NoReturn:
        """Make the decoder unusable, drop its buffers and raise ``StreamDecodeError``."""
        self._closed = f"SSEDecoder failed earlier: {message}"
        self._fast = False
        self._partial = bytearray()
        self._data = []
        raise StreamDecodeError(message)
