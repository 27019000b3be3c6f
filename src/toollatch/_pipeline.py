"""The standard composition for one attempt: bytes -> frames -> stream events -> Round.

Pure like the stages it composes: the rim (an HTTP client, the CLI) reads bytes and calls
``feed``; nothing here blocks, sleeps or reads a clock. Framing errors (an over-long line, a
corrupt binary frame) are translated here, at the one boundary, into a failed stream: the
round ends ``interrupted`` and every call gets a paired error result.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from ._adapters._base import Adapter, Fragment
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

_RUN_FRAGMENTS = 256
"""Fragments of one call collected from a read before they go to the assembler together: few
enough that a read holding a whole stream holds few of them at a time."""


class _Decoder(Protocol):
    """What the pipeline needs of a frame decoder (all three have it)."""

    def feed(self, data: bytes) -> list[Frame]: ...
    def feed_payloads(
        self,
        data: bytes,
        emit: Callable[[str, bytes], None],
        lone: Callable[[str, bytes], None] | None = None,
    ) -> None: ...
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
    ``CallAnnounced``, ``CallComplete``). Calls of eager tools (``ToolSpec.eager``, or named
    in ``eager``) are committed as soon as the provider has moved on from them, and returned
    as ``CallReady`` notices: they may start before the round ends. Notices
    produced while finishing (e.g. final previews of a stream that just stopped) are kept in
    ``finish_notices``.

    Misuse raises :class:`UsageError`: any ``feed``, ``feed_frames`` or ``feed_event`` after
    ``finish()`` or ``cancel()``. ``finish()`` again returns the same Round, as does
    ``cancel()`` after either. A framing error (an over-long line, a corrupt binary frame)
    is not misuse: the round fails there, and later input is ignored until ``finish()``.

    The per-event step: ``feed`` hands the bytes to the decoder's ``feed_payloads``, which
    calls back with each complete event's type and undecoded data as it finds it (no list
    of frames is built, whatever the read's size); the adapter's ``translate`` returns
    either a bare argument fragment of an open call, or the stream events the event
    implies. Consecutive fragments (up to ``_RUN_FRAGMENTS``) are collected and handed to
    the assembler before any other event of the read reaches it and before ``feed``
    returns, each call's stretch of them in one ``feed_fragments``: the assembler sees the
    same sequence, and counts and appends a stretch at once. The same
    decisions as the stages in turn (``decoder.feed`` -> ``adapter.feed_frame`` ->
    ``assembler.feed``), without building the frame and the ``ArgsDelta`` for the bulk of
    a stream; tests feed every stream both ways and compare. With ``keep_events`` every
    read takes the stages in turn, so that every event can be recorded.
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
        )
        self._decoder = make_decoder(framing, self.limits)
        # Bound once: they run once per event, tens of thousands of times a call.
        self._feed_payloads = self._decoder.feed_payloads
        self._translate = self.adapter.translate
        self._feed_fragment = self.assembler.feed_fragment
        self._feed_fragments = self.assembler.feed_fragments
        self._emit = self._on_event
        self._emit_lone = self._on_lone_event
        self._run: list[Fragment] = []  # fragments found in this read, not handed over yet
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
            if self.events is not None:
                return self._frames(self._decoder.feed(data))
            self._feed_payloads(data, self._emit, self._emit_lone)
        except StreamDecodeError as exc:
            self._flush()
            self._notices += self._framing_failed(exc)
        run = self._run
        if run:  # (inlined _flush, once per read: one fragment is the likeliest run)
            found = self._feed_fragment(*run[0]) if len(run) == 1 else self._hand_over(run)
            run.clear()
            if found:
                self._notices += found
        found = self._notices
        if not found:
            return []
        self._notices = []
        return self._sealing(found)

    def _on_event(self, event: str, payload: bytes) -> None:
        """One complete event of the read being fed (see the class docstring): a fragment
        joins the run of fragments found in this read (handed over by ``_flush`` before
        anything else reaches the assembler), the events go to the assembler."""
        out = self._translate(event, payload)
        # (A fragment is a tuple, the events a list: the class test is the cheapest.)
        if out.__class__ is tuple:
            run = self._run
            run.append(out)
            if len(run) >= _RUN_FRAGMENTS:
                self._flush()
            return
        if self._run:
            self._flush()
        found = self._apply(out)  # type: ignore[arg-type]
        if found:
            self._notices += found

    def _on_lone_event(self, event: str, payload: bytes) -> None:
        """The one event of a read that holds nothing else: no run to collect."""
        out = self._translate(event, payload)
        found = (
            self._feed_fragment(*out) if out.__class__ is tuple else self._apply(out)  # type: ignore[arg-type]
        )
        if found:
            self._notices += found

    def _flush(self) -> None:
        """Hand the run of fragments over to the assembler (see :meth:`_on_event`)."""
        run = self._run
        if run:
            found = self._hand_over(run)
            run.clear()
            if found:
                self._notices += found

    def _hand_over(self, run: list[Fragment]) -> list[CallUpdate]:
        """The assembler's notices for ``run``: each stretch of one call's fragments in one
        ``feed_fragments`` (the whole run, as a rule: calls stream one after another)."""
        key = run[0][0]
        texts = [text for part, text in run if part is key]
        if len(texts) == len(run):
            return self._feed_fragments(key, texts)
        found: list[CallUpdate] = []
        for key, stretch in itertools.groupby(run, key=operator.itemgetter(0)):
            found += self._feed_fragments(key, [text for _, text in stretch])
        return found

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
            self._broken = self._broken or self.assembler.sealed
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
