"""The standard composition for one attempt: bytes -> frames -> stream events -> Round.

Pure like the stages it composes: the rim (an HTTP client, the CLI) reads bytes and calls
``feed``; nothing here blocks, sleeps or reads a clock. Framing errors (an over-long line, a
corrupt binary frame) are translated here, at the one boundary, into a failed stream: the
round ends ``interrupted`` and every call gets a paired error result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from orjson import JSONDecodeError as _JSONDecodeError
from orjson import loads as _loads

from ._adapters._base import Adapter
from ._assembler import Assembler, CallUpdate
from ._errors import StreamDecodeError, UsageError
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
    def feed(self, data: bytes) -> list[Frame]: ...
    def finish(self) -> list[Frame]: ...


class _SingleDecoder(_Decoder, Protocol):
    """A text framing that can tell a chunk that is exactly one event (SSE, JSON Lines)."""

    head_event: str

    def single(self, data: bytes) -> bytes | None: ...


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
    Set ``keep_events=True`` to record every stream event in ``events`` (for tooling), and
    ``previews`` to get :class:`PreviewUpdated` notices for calls still streaming. Notices
    produced while finishing (e.g. final previews of a stream that just stopped) are kept in
    ``finish_notices``.

    Fast path: most network reads are one whole event carrying one argument fragment of an
    open call. For such a read ``feed`` asks the decoder whether the chunk is exactly one
    event that leaves it unchanged (``single``), parses the event's data from the bytes,
    asks the adapter whether it is a bare fragment of an open call (``_continuation``) and
    hands the fragment to the assembler (``_append``): the same decisions the stages make
    in turn, without building the frame and the stream event in between. When the data is
    spelled as the adapter's ``_raw`` says (see ``RawContinuation``), only the fragment's
    JSON string is parsed. Anything else takes the stage-by-stage path. With
    ``keep_events`` every read takes that path.
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
        )
        self._decoder = decoder = make_decoder(framing, self.limits)
        # Bound once: feed() runs once per network read, tens of thousands of times a call.
        self._decode = decoder.feed
        self._translate = self.adapter.feed_frame
        self._assemble = self.assembler.feed
        self._single: _SingleDecoder | None = None
        if not keep_events and isinstance(decoder, (SSEDecoder, JSONLinesDecoder)):
            self._single = decoder
        self._continuation = self.adapter._continuation
        self._feed_other = self.adapter._feed_other
        self._append = self.assembler._append
        self._broken = False
        self.finish_notices: list[CallUpdate] = []
        self.events: list[StreamEvent] | None = [] if keep_events else None

    def feed(self, data: bytes) -> list[CallUpdate]:
        """Feed raw transport bytes (any split); returns notices of early call failures."""
        decoder = self._single
        if decoder is not None:
            payload = decoder.single(data)
            if payload is not None:  # one whole event, not an error frame (see the class doc)
                raw = self.adapter._raw
                if raw is not None and payload.startswith(raw[0]):
                    # The suffix has no quote, so the fragment's string ends at the last one;
                    # a JSON value that ends with a quote is a string.
                    end = payload.rfind(b'"') + 1
                    tail = payload[end:]
                    if tail == raw[1] or tail.replace(b" ", b"") == raw[1]:
                        try:
                            fragment = _loads(payload[len(raw[0]) : end])
                        except _JSONDecodeError:
                            pass  # (not one string: the decoded path says what it is)
                        else:
                            return self._append(raw[2], fragment)
                try:
                    native = _loads(payload)
                except _JSONDecodeError:
                    native = None  # not UTF-8, or not JSON: the stages say what it is
                if type(native) is dict:
                    hit = self._continuation(native, decoder.head_event)
                    if hit is not None:
                        return self._append(hit[0], hit[1])
                    return self._apply(self._feed_other(native, decoder.head_event, payload))
        if self._broken:
            return []
        try:
            frames = self._decode(data)
        except StreamDecodeError as exc:
            return self._framing_failed(exc)
        if len(frames) == 1 and self.events is None:
            # One event per network read is the common case: skip the loops and the list.
            events = self._translate(frames[0])
            if len(events) == 1:
                return self._assemble(events[0])
            return self._apply(events)
        return self.feed_frames(frames)

    def feed_frames(self, frames: Iterable[Frame]) -> list[CallUpdate]:
        """Feed already-decoded frames."""
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

    def feed_event(self, native: object) -> list[CallUpdate]:
        """Feed one native event (a dict, or an official SDK's event object)."""
        return self._apply(self.adapter.feed(native))

    def finish(self) -> Round:
        """End of input: flush the decoder and the adapter, decide every call."""
        if not self._broken:
            self._stop()
            try:
                self.finish_notices += self.feed_frames(self._decoder.finish())
            except StreamDecodeError as exc:
                self.finish_notices += self._framing_failed(exc)
            self.finish_notices += self._apply(self.adapter.finish())
        return self.assembler.finish()

    def cancel(self, reason: str = "cancelled by the caller") -> Round:
        """Cancel the attempt: every call not committed yet becomes CANCELLED."""
        self._stop()
        return self.assembler.cancel(reason)

    def _apply(self, events: list[StreamEvent]) -> list[CallUpdate]:
        notices: list[CallUpdate] = []
        for event in events:
            if self.events is not None:
                self.events.append(event)
            notices.extend(self.assembler.feed(event))
        return notices

    def _stop(self) -> None:
        """No more input: ``feed`` and ``feed_frames`` return nothing from now on."""
        self._broken = True
        self._single = None

    def _framing_failed(self, exc: StreamDecodeError) -> list[CallUpdate]:
        self._stop()
        return self._apply(
            [
                Anomaly(kind=AnomalyKind.FRAMING_ERROR, detail=str(exc)),
                StreamFailed(detail=f"framing error: {exc}"),
            ]
        )
