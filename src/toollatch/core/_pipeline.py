"""The standard composition for one attempt: bytes -> frames -> stream events -> Round.

Pure like the stages it composes: the rim (an HTTP client, the CLI) reads bytes and calls
``feed``; nothing here blocks, sleeps or reads a clock. Framing errors (an over-long line, a
corrupt binary frame) are translated here, at the one boundary, into a failed stream: the
round ends ``interrupted`` and every call gets a paired error result.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from ._adapters._base import Adapter
from ._assembler import Assembler, CallUpdate
from ._errors import ErrorCode, StreamDecodeError, UsageError
from ._events import Anomaly, AnomalyKind, Frame, StreamEvent, StreamFailed
from ._eventstream import EventStreamDecoder
from ._gate import Gate, Policy, RunBudget
from ._limits import Limits
from ._lines import JSONLinesDecoder
from ._preview import PreviewPolicy
from ._registry import Framing, adapter_class
from ._round import Round
from ._specs import ToolSpec
from ._sse import SSEDecoder


class _Decoder(Protocol):
    """What the pipeline needs of a frame decoder (all three have it)."""

    def feed(self, data: bytes) -> list[Frame]: ...
    def feed_payloads(self, data: bytes, emit: Callable[[str, list[bytes]], None]) -> None: ...
    def finish(self) -> list[Frame]: ...


def make_decoder(framing: Framing, limits: Limits) -> _Decoder:
    """The frame decoder for ``framing``."""
    if framing == "sse":
        return SSEDecoder(limits=limits)
    if framing == "jsonl":
        return JSONLinesDecoder(limits=limits)
    if framing == "eventstream":
        return EventStreamDecoder(max_message_bytes=limits.max_event_bytes)
    raise UsageError(f"unknown framing {framing!r}")


class StreamParser:
    """One attempt's stream, from raw bytes (or native events) to a :class:`Round`.

    ``feed(bytes)`` and ``feed_event(native)`` return the assembler's notices (calls that
    failed early); ``finish()`` ends the input and returns the Round; ``cancel()`` cancels it.
    Set ``keep_events=True`` to record every stream event in ``events`` (for tooling),
    ``previews`` to get :class:`PreviewUpdated` notices for calls still streaming, and
    ``observe=True`` for text, call-opened and call-closed notices (``TextReceived``,
    ``CallAnnounced``, ``CallComplete``), and ``observe_arguments=True`` for ``ArgsReceived``:
    each piece of argument text as its call's buffer appends it (they concatenate to exactly
    the buffer's text; see the assembler). Calls of eager tools (``ToolSpec.eager``, or named
    in ``eager``) are committed as soon as the provider has moved on from them, and returned
    as ``CallReady`` notices: they may start before the round ends. Notices
    produced while finishing (e.g. final previews of a stream that just stopped) are kept in
    ``finish_notices``. ``reserved_ids`` are the call ids earlier rounds of the conversation
    already used (the agent passes those of the history it sends): a call
    reusing one (servers that number ids per response send ``call_0`` each time) is a new call
    under a derived id ``<id>_r<n>``, with a ``call_id_reused`` anomaly.

    Misuse raises :class:`UsageError`: any ``feed``, ``feed_frames`` or ``feed_event`` after
    ``finish()`` or ``cancel()``. ``finish()`` again returns the same Round, as does
    ``cancel()`` after either. A framing error (an over-long line, a corrupt binary frame)
    is not misuse: the round fails there, and later input is ignored until ``finish()``.

    The per-event step, the one route from bytes to a call's buffer: ``feed`` hands each read
    to the decoder's ``feed_payloads``, which calls back with runs of complete events of one
    type (their undecoded data) as it finds them (no list of a read's frames is built, whatever
    the read's size). The adapter's ``translate`` decodes each event once and walks the run,
    returning each stretch of it: the bare argument fragments of one open call, then the
    stream events of the event that ended the stretch, if any. Each stretch's fragments go to
    the assembler in one ``feed_fragments`` (it counts and appends them at once), its events
    after them, before the next stretch is translated: the assembler sees the same sequence
    as from the stages in turn (``decoder.feed`` -> ``adapter.feed_frame`` ->
    ``assembler.feed``, which :meth:`feed_frames` takes), without building the frame and the
    ``ArgsDelta`` for the bulk of a stream; tests feed every stream both ways and compare.
    With ``keep_events`` every read takes the stages in turn, so that every event is recorded.
    """

    def __init__(
        self,
        provider: str | Adapter,
        *,
        framing: Framing = "sse",
        tools: Iterable[Mapping[str, Any] | ToolSpec] | None = None,
        limits: Limits | None = None,
        policy: Policy | None = None,
        budget: RunBudget | None = None,
        gate: Gate | None = None,
        attempt: int = 0,
        keep_events: bool = False,
        previews: PreviewPolicy | None = None,
        eager: Iterable[str] = (),
        observe: bool = False,
        reserved_ids: Collection[str] = (),
        observe_arguments: bool = False,
    ) -> None:
        self.limits = limits or (gate.limits if gate else Limits())
        self.adapter = (
            adapter_class(provider)(attempt=attempt) if isinstance(provider, str) else provider
        )
        self.assembler = Assembler(
            provider=self.adapter.provider,
            attempt=attempt,
            tools=tools,
            limits=self.limits,
            policy=policy,
            budget=budget,
            gate=gate,
            previews=previews,
            eager=eager,
            observe=observe,
            reserved_ids=reserved_ids,
            observe_arguments=observe_arguments,
        )
        self._decoder = make_decoder(framing, self.limits)
        # Bound once: they run once per run of events, often once per read. (Not _on_run: a
        # bound method of its own kept on self is a cycle, left to the cyclic collector.)
        self._feed_payloads = self._decoder.feed_payloads
        self._translate = self.adapter.translate
        self._feed_fragments = self.assembler.feed_fragments
        self._notices: list[CallUpdate] = []  # found while the decoder walks one read
        self._broken = False  # a framing error or a sealed round: input ignored until finish
        self._closed: str | None = None  # why feeding is misuse now (finish or cancel)
        self.finish_notices: list[CallUpdate] = []
        self.events: list[StreamEvent] | None = [] if keep_events else None

    def feed(self, data: bytes) -> list[CallUpdate]:
        """Feed raw transport bytes (any split); returns notices of early call failures.

        Raises:
            UsageError: after ``finish()`` or ``cancel()``.
        """
        if self._closed is not None or self._broken:
            return self._ignored("feed")
        try:
            if self.events is not None:  # (the stages in turn: every event recorded)
                return self._sealing(self._frames(self._decoder.feed(data)))
            self._feed_payloads(bytes(data) if data.__class__ is not bytes else data, self._on_run)
        except StreamDecodeError as exc:
            self._notices += self._framing_failed(exc)
        found = self._notices
        if not found:
            return []
        self._notices = []
        if self.assembler.over:  # (it seals only with notices)
            self._broken = True
        return found

    def _on_run(self, event: str, payloads: list[bytes]) -> None:
        """A run of complete events of one type from the read being fed (see the class
        docstring): each stretch the adapter finds goes to the assembler, its fragments in
        one ``feed_fragments``, then the events of the payload that ended it."""
        stop, key, texts, events = self._translate(event, payloads, 0)
        while True:
            if key is not None and (found := self._feed_fragments(key, texts)):
                self._notices += found
            if events and (found := self._apply(events)):
                self._notices += found
            if stop == len(payloads):
                return
            stop, key, texts, events = self._translate(event, payloads, stop)

    def feed_frames(self, frames: Iterable[Frame]) -> list[CallUpdate]:
        """Feed already-decoded frames (the same rules as :meth:`feed`)."""
        if self._closed is not None or self._broken:
            return self._ignored("feed_frames")
        return self._sealing(self._frames(frames))

    def feed_event(self, native: object) -> list[CallUpdate]:
        """Feed one native event (a dict, or an official SDK's event object); the same rules
        as :meth:`feed`."""
        if self._closed is not None or self._broken:
            return self._ignored("feed_event")
        return self._sealing(self._apply(self.adapter.feed(native)))

    def finish(self) -> Round:
        """End of input: flush the decoder and the adapter, decide every call. Returns the
        same Round when called again (or after :meth:`cancel`)."""
        if self._closed is None:
            self._closed = "finish()"
            if not self._broken:  # (a framing error in the last line still ends the adapter)
                try:
                    self.finish_notices += self._frames(self._decoder.finish())
                except StreamDecodeError as exc:
                    self.finish_notices += self._framing_failed(exc)
                self.finish_notices += self._apply(self.adapter.finish())
        return self.assembler.finish()

    @property
    def over(self) -> bool:
        """True once input is ignored until :meth:`finish`: a framing error, a bound on the
        round's size passed (the stream failed), or the round ended at a limit
        (:class:`~toollatch.assembly.RoundOver`). Nothing read from now on can change the
        Round, so a reader should stop reading, close the stream and call ``finish()``."""
        return self._broken

    def open_argument_bytes(self) -> int | None:
        """The argument bytes of the calls still streaming, or None when none is open (see
        ``Assembler.open_argument_bytes``)."""
        return self.assembler.open_argument_bytes()

    def fail(self, code: ErrorCode, detail: str) -> Round:
        """The rim saw the stream fail (a timeout, a dropped connection): every call not
        decided yet fails with ``code`` (``idle_timeout``, ``stream_interrupted``), and the
        Round is returned. After :meth:`finish` or :meth:`cancel`, a no-op returning the same
        Round.

        Raises:
            UsageError: for a ``code`` that is not a stream failure's.
        """
        if code not in (ErrorCode.IDLE_TIMEOUT, ErrorCode.STREAM_INTERRUPTED):
            raise UsageError(
                f"StreamParser.fail() takes idle_timeout or stream_interrupted, not {code}"
            )
        if self._closed is None:
            self._closed = "fail()"
            self.finish_notices += self._apply([StreamFailed(code=code, detail=detail)])
        return self.assembler.finish()

    def cancel(self, reason: str = "cancelled by the caller") -> Round:
        """Cancel the attempt: every call not committed yet becomes CANCELLED. After
        :meth:`finish` (or a first cancel) a no-op returning the same Round."""
        if self._closed is None:
            self._closed = "cancel()"
        return self.assembler.cancel(reason)

    def _sealing(self, found: list[CallUpdate]) -> list[CallUpdate]:
        """``found``; once the assembler is sealed (a bound on the round's size was passed:
        the stream failed and nothing more is kept), input is ignored until finish, so the
        adapter's state stops growing too. (It seals only on a feed that returns notices.)"""
        if found:
            self._broken = self._broken or self.assembler.over
        return found

    def _ignored(self, method: str) -> list[CallUpdate]:
        """``[]`` for input after a framing error; the UsageError for input after the end."""
        if self._closed is not None:
            raise UsageError(f"StreamParser.{method}() called after {self._closed}")
        return []

    def _frames(self, frames: Iterable[Frame]) -> list[CallUpdate]:
        """The stages in turn for each frame (every event recorded with ``keep_events``)."""
        notices: list[CallUpdate] = []
        adapter_feed, asm_feed, log = self.adapter.feed_frame, self.assembler.feed, self.events
        for frame in frames:
            for event in adapter_feed(frame):
                if log is not None:
                    log.append(event)
                found = asm_feed(event)
                if found:
                    notices.extend(found)
        return notices

    def _apply(self, events: list[StreamEvent]) -> list[CallUpdate]:
        notices: list[CallUpdate] = []
        for event in events:
            if self.events is not None:
                self.events.append(event)
            notices.extend(self.assembler.feed(event))
        return notices

    def _framing_failed(self, exc: StreamDecodeError) -> list[CallUpdate]:
        """The one boundary for framing errors: the stream failed; later input is ignored."""
        self._broken = True
        return self._apply(
            [
                Anomaly(kind=AnomalyKind.FRAMING_ERROR, detail=str(exc)),
                StreamFailed(detail=f"framing error: {exc}"),
            ]
        )
