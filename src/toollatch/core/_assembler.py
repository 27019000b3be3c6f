"""The assembler: stream events in, bounded per-call buffers, a :class:`Round` out.

Theory of operation
-------------------
The assembler is the state machine of one attempt, driven by the adapter's stream events. It
owns one :class:`CallBuffer` per :class:`CallKey`, created by ``CallOpened`` and never shared,
so fragments of parallel or interleaved calls cannot mix. Every call moves through the table in
``core/_state.py`` (OPEN -> ARGS_COMPLETE -> COMMITTED | FAILED | CANCELLED) and only the buffer
assigns its state.

While the round streams, argument text is opaque: appended in order, counted in UTF-8 bytes on
every append, never parsed here. Every fragment, whichever entry point brings it (``feed`` with
an ``ArgsDelta``, ``feed_fragment``, or ``feed_fragments`` for a run of one call's fragments
from one read), takes one general route, ``_on_args``, except where one fast path decides the
same with less work: a fragment that keeps its OPEN call within the bounds its buffer holds
(``CallBuffer.bound``, and ``CallBuffer.quiet`` for text the preview tracker would only hold)
is counted and appended (and held) in place. A run takes that fast path in stretches
(``_run``), and there a quiet fragment may hold a ``"`` too when the run's own text shows it
escaped (``quotes_escaped``, the rule by which the tracker holds text: it would only hold
that fragment); without previews a run is one fragment, since where a fragment ends decides
nothing inside an OPEN call under its limit. With ``observe_arguments`` both fast paths stay closed
and ``_on_args`` announces each append (:class:`ArgsReceived`): the only place text enters a
buffer while the round streams, so what is announced is exactly what is held. Whatever
makes a call untrustworthy fails it at once and returns a :class:`CallFailed` notice:

* a limit passed (argument bytes, calls per round, choices: past twice the call limit or the
  choice limit the whole stream fails and nothing new is kept);
* a protocol violation on the call (a fragment after its close, another id or name);
* a *lost event*: an ``Anomaly`` with ``fails_pending`` (an event the adapter could not read
  or match to a call) or a fragment for a key that never opened. Either may have carried a
  fragment of any call, so every call not yet decided fails.

A call's end is what its protocol announced: ``CallClosed`` (chat's adapter closes its calls
when their choice ends). The first non-normal ``RoundEnded`` of a choice sticks: a later normal
reason never overrides a truncation or a failure.

``finish()`` decides every call exactly once. If the round ended normally, a call still OPEN
fails (``never_closed``), ``multi_tool_use.parallel`` wrappers are expanded, and every closed
call goes through the :class:`Gate`; otherwise every undecided call fails with the ending's
code (``truncated``, ``stream_interrupted``, ``cancelled``) — a parsable prefix is never an end.
Provider misbehaviour never raises; misuse by the caller (feeding after ``finish()``) raises
``UsageError``; ``finish()`` again returns the same Round.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, assert_never

from ._buffer import CallBuffer
from ._errors import ErrorCode, UsageError
from ._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    ArgsMeasured,
    CallClosed,
    CallIdentified,
    CallKey,
    CallOpened,
    CallSettled,
    DecodedArguments,
    ReasoningBlock,
    RoundEnd,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)
from ._gate import CommittedCall, Gate, Policy, Rejection, RunBudget, complete_object
from ._limits import Limits
from ._preview import PreviewPolicy, PreviewTracker, PreviewUpdated, quotes_escaped
from ._round import (
    NO_EXTRAS,
    CallRecord,
    Choice,
    ContentItem,
    Round,
    TextRun,
    derived_id,
    made_up_call_id,
)
from ._specs import ToolSpec
from ._state import CallState
from ._wrapper import PARALLEL_WRAPPER, inner_calls


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFailed:
    """A call failed while the round was still streaming (limit, protocol violation)."""

    key: CallKey
    """The failed call."""
    call_id: str | None
    """Its id, if known."""
    name: str | None
    """Its tool name, if known."""
    code: ErrorCode
    """Why."""
    detail: str
    """Short explanation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallReady:
    """An eager call committed before its round ended: it may start now.

    The gate ran in full (strict parse, schema, policy, budget). The final ``Round`` keeps
    the call COMMITTED, with ``CallRecord.early`` set, whatever happens after.
    """

    call: CommittedCall
    """The executable call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TextReceived:
    """Assistant text as it streamed (only with ``observe=True``)."""

    choice: int
    """The choice the text belongs to."""
    text: str
    """The new text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAnnounced:
    """A call began streaming, or learnt its id or name (only with ``observe=True``)."""

    key: CallKey
    """The call."""
    call_id: str | None
    """Its id, if known yet."""
    name: str | None
    """Its tool name, if known yet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgsReceived:
    """Argument text just appended to a call's buffer (only with ``observe_arguments=True``).

    In order, a call's notices concatenate to exactly the text its buffer holds, whatever the
    provider sent: an object sent whole is its one serialized text, a fragment refused (after
    the call's close, over its byte limit, after the call failed) is in no notice. A call may
    still fail after some of its text was announced (the gate decides at its end); a call
    that failed over ``max_argument_bytes`` had its text dropped from the buffer."""

    key: CallKey
    """The call."""
    text: str
    """The text appended (one or more of the provider's fragments, joined)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallComplete:
    """The provider closed a call's arguments (only with ``observe=True``): nothing more
    will be appended, but the call is decided only at round end (or by :class:`CallReady`)."""

    key: CallKey
    """The call."""
    call_id: str | None
    """Its id, if known."""
    name: str | None
    """Its tool name, if known."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundOver:
    """The round can produce nothing more of use, so it ended here, ``limited``: a size
    limit dropped output (a call failed ``arguments_exceed_max_bytes``, or the assistant text
    passed ``max_text_bytes``) and no call of the round can still commit (none is open, none
    closed and waiting for the round's end). Every choice not ended yet ends
    ``RoundEnd.LIMITED``; :class:`toollatch.StreamParser` ignores its input from here on (see
    ``StreamParser.over``), so a reader stops reading, closes the stream and calls
    ``finish()``: every call already has its outcome, paired with an error result."""

    detail: str
    """Which limit, e.g. ``arguments exceed 262144 bytes``."""


CallUpdate = (
    CallFailed
    | PreviewUpdated
    | CallReady
    | TextReceived
    | CallAnnounced
    | CallComplete
    | ArgsReceived
    | RoundOver
)
"""What ``Assembler.feed`` can return, in stream order: early failures, eager calls ready
to start and the round's end at a limit (always), previews (when enabled), text and call
announcements and closes (with ``observe=True``), argument text as appended (with
``observe_arguments=True``)."""

_OPEN = CallState.OPEN
"""(A module global for the per-fragment path: ``CallState.OPEN``, an attribute of an enum
class, costs about 1,000 instructions per use in CPython 3.11, a global about 140.)"""

_ENDING_CODE = {
    RoundEnd.TRUNCATED: ErrorCode.TRUNCATED,
    RoundEnd.LIMITED: ErrorCode.TRUNCATED,  # (only a call fed after the end can get it)
    RoundEnd.INTERRUPTED: ErrorCode.STREAM_INTERRUPTED,
    RoundEnd.CANCELLED: ErrorCode.CANCELLED,
}


def _utf8_len(text: str) -> int:
    """UTF-8 size of ``text``; lone surrogates (from dict input) count as 3 bytes each."""
    return len(text.encode("utf-8", "surrogatepass"))


class _ChoiceState:
    """Mutable per-choice bookkeeping while the round streams."""

    __slots__ = ("calls", "content", "ended", "ids", "stop_reason", "text_bytes", "unsettled")

    def __init__(self) -> None:
        self.calls: list[CallBuffer] = []
        self.content: list[
            tuple[str, Any]
        ] = []  # ("text", [block, parts]) | ("block", ev) | ("call", buf)
        self.ended: RoundEnd | None = None
        self.stop_reason: str | None = None
        self.ids: dict[str, CallKey] = {}
        self.text_bytes = 0
        self.unsettled: list[CallBuffer] = []  # closed eager calls the provider may not be past


class Assembler:
    """Pure state machine for one attempt: ``feed(event) -> notices``, ``finish() -> Round``."""

    def __init__(
        self,
        *,
        provider: str = "",
        attempt: int = 0,
        tools: Iterable[Mapping[str, Any] | ToolSpec] | None = None,
        limits: Limits | None = None,
        policy: Policy | None = None,
        budget: RunBudget | None = None,
        gate: Gate | None = None,
        previews: PreviewPolicy | None = None,
        eager: Iterable[str] = (),
        observe: bool = False,
        reserved_ids: Collection[str] = (),
        observe_arguments: bool = False,
    ) -> None:
        """Give either ``gate`` or the pieces to build one (``tools``, ``policy``, ``budget``).

        ``tools=None`` skips the registration and schema checks. ``previews`` turns on
        :class:`PreviewUpdated` notices for calls still streaming (off by default). Calls of
        the tools named in ``eager``, or whose ``ToolSpec.eager`` is set, are committed as
        soon as the provider has moved on from them (:class:`CallReady`). ``observe`` adds
        :class:`TextReceived`, :class:`CallAnnounced` and :class:`CallComplete` notices.
        ``observe_arguments`` adds an :class:`ArgsReceived` notice for every append to a
        call's buffer (every fragment then takes the general route: no fast path).
        ``reserved_ids``: call ids earlier rounds of the conversation already used; a call
        reusing one is a new call and gets a derived id, ``<id>_r<n>`` (see
        :meth:`_reserved`).
        """
        self.provider = provider
        self.attempt = attempt
        self.limits = limits or (gate.limits if gate else Limits())
        self.gate = gate or Gate(tools, limits=self.limits, policy=policy, budget=budget)
        self._buffers: dict[CallKey, CallBuffer] = {}
        self._choices: dict[int, _ChoiceState] = {}
        self._anomalies: list[Anomaly] = []
        self._usage: Mapping[str, Any] | None = None
        self._failure: StreamFailed | None = None
        self._cancelled: str | None = None
        self._round: Round | None = None
        self._max_argument_bytes = self.limits.max_argument_bytes
        self._previews = previews
        self._trackers: dict[CallKey, PreviewTracker] = {}
        self._made_up_ids: set[CallKey] = set()  # keys of calls whose id an adapter made up
        self._extras: dict[CallKey, dict[str, Any]] = {}  # history fields of a call
        self._overflow = False  # a bound on the round's size was passed (see _overflowed)
        self._dropped: str | None = None  # the first size limit that dropped output
        self._limited: str | None = None  # the round ended there (see RoundOver)
        self._finishing = False  # (finish() fails calls too: no RoundOver then)
        self._observe = observe
        self._arguments = observe_arguments
        self._reserved = frozenset(reserved_ids)
        self._sent_ids: dict[CallKey, str] = {}  # a renamed call's key -> the provider's id
        self._renamed: dict[tuple[int, str], str] = {}  # (choice, provider's id) -> derived
        specs = self.gate.tools or {}
        self._eager = frozenset(eager) | {n for n, spec in specs.items() if spec.eager}

    # -- feeding ------------------------------------------------------------------------------

    def feed(self, event: StreamEvent) -> list[CallUpdate]:
        """Apply one stream event; returns notices of calls that failed because of it.
        After a :class:`RoundOver`, events are ignored (the round ended ``limited``)."""
        if self._round is not None:
            raise UsageError("Assembler.feed() called after finish()")
        if self._limited is not None:
            return []  # the round ended at a limit (RoundOver): nothing after it is kept
        try:
            return self._dispatch(event)
        except _Overflow as overflow:
            return self._overflowed(overflow.kind, str(overflow))

    def _dispatch(self, event: StreamEvent) -> list[CallUpdate]:
        match event:  # (the commonest first: a case is an isinstance check)
            case TextDelta():
                return self._on_text(event)
            case ArgsDelta(decoded=DecodedArguments() as decoded):
                return self._on_decoded(event, decoded)
            case ArgsDelta(whole=True):
                return self._on_whole(event.key, event.fragment)
            case ArgsDelta():
                return self.feed_fragment(event.key, event.fragment)
            case CallOpened():
                return self._on_open(event)
            case CallIdentified():
                return self._on_identified(event.key, event.call_id, event.name)
            case CallClosed():
                return self._on_close(event)
            case CallSettled():
                return self._on_settled(event.key)
            case ArgsMeasured():
                return self._on_measured(event)
            case ReasoningBlock(call=CallKey() as key) if key in self._buffers:
                extras = self._extras.setdefault(key, {})
                for field, value in event.data.items():
                    extras.setdefault(field, value)  # the first one recorded sticks
            case ReasoningBlock() | ServerToolBlock():
                choice = self._choice(event.choice)
                choice.content.append(("block", event))
                if choice.unsettled:
                    return self._settle(choice)
            case UsageReported():
                self._usage = event.usage
            case RoundEnded():
                return self._on_round_ended(event) + self._previews_done(event.choice)
            case StreamFailed():
                if self._failure is None:
                    self._failure = event
                return self._previews_done(None)
            case Anomaly():
                return self._on_anomaly(event)
            case _:
                assert_never(event)
        return []

    def feed_fragment(self, key: CallKey, fragment: str) -> list[CallUpdate]:
        """``feed(ArgsDelta(key=key, fragment=fragment))``, without building the event: the
        same notices, text and byte count.

        Raises:
            UsageError: after :meth:`finish`.
        """
        if self._round is not None:
            raise UsageError("Assembler.feed() called after finish()")
        # The fast path (see CallBuffer.bound and .quiet), inlined: a fragment that only
        # needs counting and appending (and, previews on, holding for the tracker) takes no
        # call. Anything else takes the general route, _on_args.
        try:
            buf = self._buffers[key]
        except KeyError:
            return self._on_args(key, fragment)
        size = len(fragment) if fragment.isascii() else _utf8_len(fragment)
        nbytes = buf.nbytes + size
        if nbytes <= buf.bound:
            buf.nbytes = nbytes
            buf.fragments.append(fragment)
            return []
        if nbytes <= buf.quiet and '"' not in fragment:  # (quiet >= 0 implies a tracker)
            buf.nbytes = nbytes
            buf.fragments.append(fragment)
            buf.held.append(fragment)  # (the same state as tracker.feed: no call)
            return []
        return self._on_args(key, fragment, size)

    def feed_fragments(self, key: CallKey, fragments: list[str]) -> list[CallUpdate]:
        """:meth:`feed_fragment` for each of ``fragments`` in turn (a run of one call's
        fragments, as StreamParser collects them from one read): the same notices, the same
        previews after the same fragments, the same text and byte count.

        Raises:
            UsageError: after :meth:`finish`.
        """
        if self._round is not None:
            raise UsageError("Assembler.feed() called after finish()")
        buf = self._buffers.get(key)
        if buf is None:
            return self._each(key, fragments)
        # The fast path of feed_fragment for the whole run at once (most runs are one
        # fragment: a read is one event): one count and one append (and hold).
        text = "".join(fragments)  # (returns a lone fragment itself)
        size = len(text) if text.isascii() else _utf8_len(text)
        nbytes = buf.nbytes + size
        if nbytes <= buf.bound or (nbytes <= buf.quiet and '"' not in text):
            buf.nbytes = nbytes
            buf.fragments.append(text)
            if buf.quiet >= 0:
                buf.held.append(text)
            return []
        if len(fragments) == 1:
            return self._on_args(key, text, size)
        if self._previews is not None:
            return self._run(buf, fragments, text)
        # Without previews, where a fragment ends inside an OPEN call under its byte limit
        # decides nothing: the run is one fragment.
        if buf.state is _OPEN and not buf.whole and nbytes <= self._max_argument_bytes:
            return self._on_args(key, text, size)
        return self._each(key, fragments)

    def _each(self, key: CallKey, fragments: list[str]) -> list[CallUpdate]:
        found: list[CallUpdate] = []
        for fragment in fragments:
            if notices := self.feed_fragment(key, fragment):
                found += notices
        return found

    def _run(self, buf: CallBuffer, fragments: list[str], text: str) -> list[CallUpdate]:
        """A run of fragments (``text`` joined) of a call with previews on: each stretch of
        fragments that takes the fast path (see :meth:`feed_fragment`) is counted, appended
        and held in one piece; every other fragment takes :meth:`_on_args` on its own. A
        fragment below ``quiet`` whose quotes are all escaped, judged with the run's text
        before it (:func:`quotes_escaped`), is one the tracker would only hold: it stays in
        the stretch."""
        found: list[CallUpdate] = []
        first = chars = 0  # where the stretch not appended yet starts; characters walked
        nbytes = buf.nbytes  # bytes after the fragment walked
        bound, quiet = buf.bound, buf.quiet
        ascii_ = text.isascii()  # (then a fragment's bytes are its characters)
        quote = text.find('"')  # the first quote at or after the fragment walked
        quote = quote if quote >= 0 else len(text)
        for fragment in fragments:
            size = len(fragment)
            chars += size
            if not ascii_ and not fragment.isascii():
                size = _utf8_len(fragment)
            nbytes += size
            if nbytes <= bound:
                continue
            if nbytes <= quiet:
                if quote >= chars:
                    continue
                if quotes_escaped(text, chars - len(fragment), chars):
                    quote = text.find('"', chars)
                    quote = quote if quote >= 0 else len(text)
                    continue
            if first < chars - len(fragment):
                self._append_run(buf, text[first : chars - len(fragment)], nbytes - size)
            if notices := self._on_args(buf.key, fragment, size):
                found += notices
            first, nbytes, bound, quiet = chars, buf.nbytes, buf.bound, buf.quiet
            if quote < chars:
                quote = text.find('"', chars)
                quote = quote if quote >= 0 else len(text)
        if first < chars:
            self._append_run(buf, text[first:], nbytes)
        return found

    @staticmethod
    def _append_run(buf: CallBuffer, text: str, nbytes: int) -> None:
        """Count and append a stretch that takes the fast path (held too, when quiet)."""
        buf.nbytes = nbytes
        buf.fragments.append(text)
        if buf.quiet >= 0:
            buf.held.append(text)

    def _quiet_bound(self, buf: CallBuffer, tracker: PreviewTracker) -> None:
        """Set ``buf.quiet`` after ``tracker`` took a fragment or released an update."""
        below = tracker.quiet_below  # (the call is OPEN and not whole here: see the callers)
        if below >= 0 and not self._arguments:
            # (the least of three, compared here: min() costs a call per update)
            quiet, most, join_at = below - 1, self._max_argument_bytes, buf.join_at
            quiet = quiet if quiet < most else most
            quiet = quiet if quiet < join_at else join_at
            held = tracker.held
            if held is None:  # (nothing held: any fragment below it only counts)
                buf.bound, buf.quiet = quiet, -1
            else:
                buf.bound, buf.quiet, buf.held = -1, quiet, held
        else:
            buf.bound = buf.quiet = -1

    def _on_args(self, key: CallKey, fragment: str, size: int = -1) -> list[CallUpdate]:
        buf = self._buffers.get(key)
        if buf is None and (self._overflow or self._limited is not None):
            return []  # a call not kept (see _overflowed, RoundOver): the round is over
        if buf is None:  # it may belong to any call still pending: a lost fragment
            return self._on_anomaly(
                Anomaly(
                    kind=AnomalyKind.UNKNOWN_KEY,
                    detail="argument fragment for an unknown call",
                    key=key,
                    fails_pending=True,
                )
            )
        if buf.state is not _OPEN:
            if buf.state is CallState.ARGS_COMPLETE:
                return self._violate(
                    buf,
                    AnomalyKind.FRAGMENT_AFTER_CLOSE,
                    "argument fragment after the call was closed",
                )
            if buf.state is CallState.COMMITTED:  # an eager call, which may be running
                self._record(
                    AnomalyKind.FRAGMENT_AFTER_CLOSE,
                    "argument fragment after the call was committed early; ignored",
                    key,
                )
            return []  # already failed (e.g. over the size limit): drop quietly
        if buf.whole:
            return self._violate(
                buf, AnomalyKind.OBJECT_ARGUMENTS, "a fragment after the whole arguments object"
            )
        if size < 0:
            size = len(fragment) if fragment.isascii() else _utf8_len(fragment)
        buf.nbytes += size
        if buf.nbytes > self._max_argument_bytes:
            return self._too_large(buf)
        buf.fragments.append(fragment)
        if buf.nbytes >= buf.join_at:
            buf.compact()
        found: list[CallUpdate] = []
        if self._arguments:  # (the fast paths stay closed: every append comes here)
            found.append(ArgsReceived(key=key, text=fragment))
        if self._previews is None:
            if not self._arguments:
                buf.open_bound(self._max_argument_bytes)
            return found
        tracker = buf.tracker or self._tracker(buf)
        if tracker.feed(fragment, buf.nbytes):
            found.append(tracker.release(buf.key, buf.call_id, buf.name))
        self._quiet_bound(buf, tracker)
        return found

    def _tracker(self, buf: CallBuffer) -> PreviewTracker:
        """The preview tracker of an OPEN call with previews on (made at its first text)."""
        tracker = self._trackers.get(buf.key)
        if tracker is None:
            assert self._previews is not None  # (only called with previews on)
            tracker = PreviewTracker(self._previews, buf.name, max_depth=self.limits.max_json_depth)
            self._trackers[buf.key] = buf.tracker = tracker
        return tracker

    def _on_whole(self, key: CallKey, text: str, size: int = -1) -> list[CallUpdate]:
        """A call's whole argument text in one piece (``ArgsDelta.whole``)."""
        buf = self._buffers.get(key)
        if buf is not None and buf.state is CallState.OPEN and (buf.nbytes or buf.whole):
            return self._violate(
                buf, AnomalyKind.OBJECT_ARGUMENTS, "an arguments object after other argument text"
            )
        notices = self._on_args(key, text, size)
        if buf is not None and buf.state is CallState.OPEN:
            buf.whole, buf.bound, buf.quiet = True, -1, -1  # (every later fragment: _on_args)
        return notices

    def _on_decoded(self, event: ArgsDelta, decoded: DecodedArguments) -> list[CallUpdate]:
        """A fragment given with its decoded value: appended as any other (``whole`` too),
        measured by the value's ``nbytes``, and the value kept for the gate when it is the
        call's first text (see :meth:`_decide`)."""
        buf = self._buffers.get(event.key)
        first = buf is not None and buf.state is CallState.OPEN and not buf.nbytes
        size, chars = decoded.nbytes, len(event.fragment)
        if not chars <= size <= 4 * chars:  # (no UTF-8 size of that text: measured here)
            size = -1
        if event.whole:
            notices = self._on_whole(event.key, event.fragment, size)
        else:
            notices = self._on_args(event.key, event.fragment, size)
        if first and buf is not None and buf.state is CallState.OPEN:
            buf.decoded = (decoded, event.fragment)
        return notices

    def _on_measured(self, event: ArgsMeasured) -> list[CallUpdate]:
        buf = self._buffers.get(event.key)
        limit = self.limits.max_argument_bytes
        if buf is None or buf.state is not CallState.OPEN or event.nbytes <= limit:
            return []
        return self._too_large(buf)

    def _too_large(self, buf: CallBuffer) -> list[CallUpdate]:
        """``buf`` (OPEN) passed ``max_argument_bytes``: it fails, its text is dropped, and
        the round may be over (see :meth:`_over`)."""
        buf.fragments.clear()
        detail = f"arguments exceed {self.limits.max_argument_bytes} bytes"
        self._dropped = self._dropped or detail
        return self._fail(
            buf, ErrorCode.ARGUMENTS_EXCEED_MAX_BYTES, detail, AnomalyKind.ARGUMENTS_TOO_LARGE
        )

    def _preview_final(self, buf: CallBuffer) -> list[CallUpdate]:
        """The last preview of a call that will get no more fragments (if it had previews)."""
        tracker = self._trackers.pop(buf.key, None)
        buf.tracker, buf.bound, buf.quiet = None, -1, -1
        if tracker is None:
            return []
        tracker.nbytes = buf.nbytes  # (fragments below its quiet bound were not shown to it)
        return [tracker.release(buf.key, buf.call_id, buf.name, final=True)]

    def _on_open(self, event: CallOpened) -> list[CallUpdate]:
        if event.key in self._buffers:  # a repeated header for the same key: identity only
            return self._on_identified(event.key, event.call_id, event.name)
        choice = self._choice(event.key.choice)
        if self._overflow:
            return []
        if len(choice.calls) >= 2 * self.limits.max_calls_per_round:
            raise _Overflow(
                AnomalyKind.TOO_MANY_CALLS,
                f"more than {2 * self.limits.max_calls_per_round} calls in one round "
                f"(twice max_calls_per_round); the rest of the stream is not kept",
            )
        notices = self._settle(choice) if choice.unsettled else []
        buf = CallBuffer(event.key, len(choice.calls), None, None)
        if self._previews is None and not self._arguments:
            buf.open_bound(self._max_argument_bytes)
        self._buffers[event.key] = buf
        choice.calls.append(buf)
        choice.content.append(("call", buf))
        if len(choice.calls) > self.limits.max_calls_per_round:
            buf.call_id, buf.name = event.call_id or None, event.name or None
            return notices + self._fail(
                buf,
                ErrorCode.TOO_MANY_TOOL_CALLS,
                f"more than {self.limits.max_calls_per_round} calls in one round",
                AnomalyKind.TOO_MANY_CALLS,
            )
        return notices + self._on_identified(event.key, event.call_id, event.name, opening=True)

    def _on_identified(
        self, key: CallKey, call_id: str | None, name: str | None, *, opening: bool = False
    ) -> list[CallUpdate]:
        buf = self._buffers.get(key)
        if buf is None:
            if not self._overflow:
                self._record(AnomalyKind.UNKNOWN_KEY, "identity for an unknown call", key)
            return []
        notices: list[CallUpdate] = []
        known = (buf.call_id, buf.name)
        if name:  # "" is "not sent" (SGLang, vLLM continuations)
            if buf.name is None:
                buf.name = name
            elif buf.name != name:
                notices += self._violate(
                    buf, AnomalyKind.NAME_CHANGED, "a different tool name arrived for an open call"
                )
        if call_id:
            if buf.call_id is None:
                buf.call_id = self._reserved_id(buf, call_id)
                notices += self._claim_id(buf, buf.call_id)
            elif buf.call_id != call_id and self._sent_ids.get(key) != call_id:
                notices += self._violate(
                    buf, AnomalyKind.ID_CHANGED, "a different call id arrived for an open call"
                )
        if self._observe and (opening or (buf.call_id, buf.name) != known):
            notices.insert(0, CallAnnounced(key=key, call_id=buf.call_id, name=buf.name))
        return notices

    def _reserved_id(self, buf: CallBuffer, call_id: str) -> str:
        """``call_id``, or, when an earlier round of the conversation already used it
        (``reserved_ids``), the derived id this round gives it: ``<id>_r<n>``, the smallest
        ``n >= 2`` neither reserved nor taken in the round. Servers that number ids per
        response (vLLM, Ollama, llama.cpp: ``call_0`` in every response) reuse ids across
        rounds; the derived id is that call's id everywhere (gate, dispatch and its ledger
        key, events, history), so no provider sees one id twice in a history and the
        earlier round's result never answers it. Every call of the round sending the same
        id gets the same derived id (so a repeat inside the round stays a
        ``duplicate_call_id``), and the same history gives the same id again (a round
        asked again on resume keys its calls as before)."""
        if call_id not in self._reserved:
            return call_id
        self._sent_ids[buf.key] = call_id
        renamed = self._renamed.get((buf.key.choice, call_id))
        if renamed is None:
            taken = self._reserved | self._choice(buf.key.choice).ids.keys()
            renamed = derived_id(call_id, taken, tag="r")
            self._renamed[buf.key.choice, call_id] = renamed
        self._record(
            AnomalyKind.CALL_ID_REUSED,
            f"call id {call_id!r} was already used by an earlier round of the conversation; "
            f"this new call is {renamed!r}",
            buf.key,
        )
        return renamed

    def _claim_id(self, buf: CallBuffer, call_id: str) -> list[CallUpdate]:
        ids = self._choice(buf.key.choice).ids
        if call_id in ids and ids[call_id] != buf.key:
            return self._fail(
                buf,
                ErrorCode.DUPLICATE_CALL_ID,
                "another call of this round already uses this call id",
                AnomalyKind.DUPLICATE_CALL_ID,
            )
        ids[call_id] = buf.key
        return []

    def _on_close(self, event: CallClosed) -> list[CallUpdate]:
        buf = self._buffers.get(event.key)
        if buf is None:
            if not self._overflow:
                self._record(AnomalyKind.UNKNOWN_KEY, "close for an unknown call", event.key)
            return []
        if buf.state is not CallState.OPEN:
            return []  # a second end marker (e.g. Responses .done then output_item.done)
        final = event.arguments
        notices: list[CallUpdate] = []
        if final is not None:
            if not buf.fragments:
                notices = self._on_args(buf.key, final)  # (ArgsReceived, or a failure)
                if buf.state is not CallState.OPEN:
                    return notices
            elif buf.text() != final:
                return self._violate(
                    buf,
                    AnomalyKind.ARGUMENTS_MISMATCH,
                    "the final argument text differs from the streamed fragments",
                )
        buf.close()
        notices += self._preview_final(buf)
        if self._observe:
            notices.append(CallComplete(key=buf.key, call_id=buf.call_id, name=buf.name))
        if buf.name in self._eager:
            self._choice(buf.key.choice).unsettled.append(buf)
        return notices

    def _on_settled(self, key: CallKey) -> list[CallUpdate]:
        """The provider's own proof that it moved on from the call (see ``CallSettled``)."""
        buf = self._buffers.get(key)
        if buf is None or buf.name not in self._eager:
            return []
        if buf.state is CallState.OPEN:
            # OpenAI chat: no per-call close. A complete strict JSON object cannot be the
            # prefix of a longer valid one, so such a text is final; anything else waits.
            if not complete_object(buf.text(), max_depth=self.limits.max_json_depth):
                return []
            buf.close()
            notices = self._preview_final(buf)
            if self._observe:
                notices.append(CallComplete(key=buf.key, call_id=buf.call_id, name=buf.name))
            return notices + self._commit_early(buf)
        choice = self._choice(key.choice)
        if buf in choice.unsettled:
            choice.unsettled.remove(buf)
        return self._commit_early(buf)

    def _settle(self, choice: _ChoiceState) -> list[CallUpdate]:
        """Something later than the closed eager calls of ``choice`` started, or the choice
        stopped normally: the provider has moved on from each of them."""
        bufs, choice.unsettled = choice.unsettled, []
        return [n for buf in bufs for n in self._commit_early(buf)]

    def _commit_early(self, buf: CallBuffer) -> list[CallUpdate]:
        """Run the gate now on a closed eager call the provider has moved on from."""
        if (
            buf.state is not CallState.ARGS_COMPLETE
            or self._failure
            or self._cancelled
            or self._limited
        ):
            return []
        verdict = self._decide(buf)
        if isinstance(verdict, Rejection):
            failed = CallFailed(
                key=buf.key,
                call_id=buf.call_id,
                name=buf.name,
                code=verdict.code,
                detail=verdict.detail,
            )
            return [failed]
        buf.early = True
        ready: list[CallUpdate] = [CallReady(call=verdict)]
        return ready + self._over() if self._dropped is not None else ready

    def _on_text(self, event: TextDelta) -> list[CallUpdate]:
        choice = self._choice(event.choice)
        size = len(event.text) if event.text.isascii() else _utf8_len(event.text)
        if choice.text_bytes + size > self.limits.max_text_bytes:
            if choice.text_bytes <= self.limits.max_text_bytes:
                detail = f"assistant text exceeds {self.limits.max_text_bytes} bytes"
                self._record(AnomalyKind.TEXT_TOO_LARGE, f"{detail}; rest dropped")
                choice.text_bytes = self.limits.max_text_bytes + 1
                self._dropped = self._dropped or detail
                return self._over()
            return []
        choice.text_bytes += size
        last = choice.content[-1] if choice.content else None
        if last is not None and last[0] == "text" and last[1][0] == event.block:
            last[1][1].append(event.text)
        else:
            choice.content.append(("text", [event.block, [event.text]]))
        notices = self._settle(choice) if choice.unsettled else []
        if self._observe:
            notices.append(TextReceived(choice=event.choice, text=event.text))
        return notices

    def _on_round_ended(self, event: RoundEnded) -> list[CallUpdate]:
        choice = self._choice(event.choice)
        if choice.ended is None:
            choice.ended, choice.stop_reason = event.ending, event.stop_reason
            if event.ending is RoundEnd.NORMAL and choice.unsettled:
                return self._settle(choice)  # a known, non-truncating stop reason
        elif choice.ended is RoundEnd.NORMAL and event.ending is not RoundEnd.NORMAL:
            # A truncating or failing reason always wins over a normal one, whatever the order.
            self._record(
                AnomalyKind.EVENT_AFTER_END,
                f"a {event.ending} reason ({event.stop_reason}) after a normal end",
            )
            choice.ended, choice.stop_reason = event.ending, event.stop_reason
        elif event.ending is RoundEnd.NORMAL and choice.ended is not RoundEnd.NORMAL:
            self._record(
                AnomalyKind.REASON_OVERRIDDEN,
                f"a normal reason ({event.stop_reason}) after {choice.ended} "
                f"({choice.stop_reason}); the first one sticks",
            )
        else:
            self._record(AnomalyKind.EVENT_AFTER_END, "a second terminal reason for one choice")
        return []

    def _previews_done(self, choice: int | None) -> list[CallUpdate]:
        """Final previews of the calls of ``choice`` (every choice when None)."""
        if not self._trackers:
            return []
        bufs = [self._buffers[k] for k in list(self._trackers) if choice in (None, k.choice)]
        return [n for buf in bufs for n in self._preview_final(buf)]

    def _on_anomaly(self, event: Anomaly) -> list[CallUpdate]:
        self._anomalies.append(event)
        if event.kind is AnomalyKind.SYNTHESIZED_ID and event.key is not None:
            self._made_up_ids.add(event.key)
        if event.fails_pending:
            detail = f"an event of the stream was lost while the call was pending: {event.detail}"
            pending = (CallState.OPEN, CallState.ARGS_COMPLETE)
            bufs = [b for b in self._buffers.values() if b.state in pending]
            return [n for buf in bufs for n in self._fail(buf, event.code, detail)]
        buf = self._buffers.get(event.key) if event.key is not None else None
        if event.fails_call and buf is not None:
            return self._fail(buf, event.code, event.detail)
        return []

    # -- helpers ----------------------------------------------------------------------------

    def _choice(self, index: int) -> _ChoiceState:
        choice = self._choices.get(index)
        if choice is None:
            if len(self._choices) >= self.limits.max_choices or self._overflow:
                raise _Overflow(
                    AnomalyKind.TOO_MANY_CHOICES,
                    f"more than {self.limits.max_choices} choices in one round",
                )
            choice = self._choices[index] = _ChoiceState()
        return choice

    def open_argument_bytes(self) -> int | None:
        """The argument bytes streamed so far into the calls still OPEN, or None when no
        call is open (a runtime watches it to time out a call whose arguments stall while
        the stream itself keeps sending, e.g. pings)."""
        total = None  # (read per chunk by a runtime: no list made)
        for buf in self._buffers.values():
            if buf.state is CallState.OPEN:
                total = buf.nbytes if total is None else total + buf.nbytes
        return total

    @property
    def sealed(self) -> bool:
        """True once a bound on the round's size was passed: the stream failed, every call
        not decided before failed with it, and nothing fed from now on is kept, so a reader
        may stop reading (the pipeline does)."""
        return self._overflow

    @property
    def over(self) -> bool:
        """True once nothing fed from now on can change the round: :attr:`sealed`, or the
        round ended at a limit (:class:`RoundOver`). A reader may stop reading."""
        return self._overflow or self._limited is not None

    def _overflowed(self, kind: AnomalyKind, detail: str) -> list[CallUpdate]:
        """A bound on what one round may hold was passed: the stream fails now, with every
        undecided call (``stream_interrupted``, as at the end), and nothing new is kept from
        here on: no choice, no call, no fragment (see :attr:`sealed`)."""
        if self._overflow:
            return []
        self._overflow = True
        self._record(kind, detail)
        failure = StreamFailed(detail=detail)
        notices = self._dispatch(failure)
        detail = f"the stream failed: {detail}"
        for buf in self._buffers.values():
            if buf.state in (CallState.OPEN, CallState.ARGS_COMPLETE):
                notices += self._fail(buf, failure.code, detail)
        return notices

    def _record(self, kind: AnomalyKind, detail: str, key: CallKey | None = None) -> None:
        self._anomalies.append(Anomaly(kind=kind, detail=detail, key=key))

    def _violate(self, buf: CallBuffer, kind: AnomalyKind, detail: str) -> list[CallUpdate]:
        return self._fail(buf, ErrorCode.PROTOCOL_VIOLATION, detail, kind)

    def _fail(
        self, buf: CallBuffer, code: ErrorCode, detail: str, kind: AnomalyKind | None = None
    ) -> list[CallUpdate]:
        if kind is not None:
            self._record(kind, detail, buf.key)
        if not buf.fail(code, detail):
            return []  # (it was decided before: it keeps its first outcome)
        failed = CallFailed(
            key=buf.key, call_id=buf.call_id, name=buf.name, code=code, detail=detail
        )
        notices: list[CallUpdate] = [*self._preview_final(buf), failed]
        if self._dropped is not None:  # (a call no longer pending may leave nothing to wait for)
            notices += self._over()
        return notices

    def _over(self) -> list[CallUpdate]:
        """``[RoundOver]`` when the round ends now at a limit (see :class:`RoundOver`): a size
        limit dropped output, the stream has not failed or been sealed, and no call can still
        commit. Every choice not ended yet ends ``LIMITED`` (the first ending sticks).
        Checked when a limit drops output and when a call stops pending after that, so the
        scan of the calls runs a few times a round at most."""
        if (
            self._dropped is None
            or self._limited is not None
            or self._overflow
            or self._failure is not None
            or self._cancelled is not None
            or self._finishing
        ):
            return []
        pending = (CallState.OPEN, CallState.ARGS_COMPLETE)
        if any(b.state in pending for b in self._buffers.values()):
            return []
        ended = [c for c in self._choices.values() if c.ended is None]
        if not ended:
            return []  # every choice had its end already: nothing is left to stop
        self._limited = self._dropped
        for choice in ended:
            choice.ended = RoundEnd.LIMITED
        return [RoundOver(detail=self._limited)]

    # -- ending -----------------------------------------------------------------------------

    def cancel(self, reason: str = "cancelled by the caller") -> Round:
        """Cancel the round: every call not yet failed becomes CANCELLED; returns the Round.

        After ``finish()`` this is a no-op returning the same Round (committed calls stay
        committed: cancelling their execution is the dispatcher's job).
        """
        if self._round is None:
            self._cancelled = reason
        return self.finish()

    def finish(self) -> Round:
        """Decide every call exactly once and return the :class:`Round` (idempotent)."""
        if self._round is None:
            self._finishing = True
            choices = tuple(self._finish_choice(i, c) for i, c in sorted(self._choices.items()))
            if not choices:
                choices = (self._finish_choice(0, self._choice(0)),)
            self._round = Round(
                provider=self.provider,
                attempt=self.attempt,
                choices=choices,
                usage=self._usage,
                anomalies=tuple(self._anomalies),
                error=self._failure.detail if self._failure else None,
            )
        return self._round

    def _ending(self, choice: _ChoiceState) -> tuple[RoundEnd, ErrorCode | None, str]:
        if self._cancelled is not None:
            return RoundEnd.CANCELLED, ErrorCode.CANCELLED, self._cancelled
        if self._failure is not None:
            return RoundEnd.INTERRUPTED, self._failure.code, self._failure.detail
        ending = choice.ended or RoundEnd.INTERRUPTED
        if ending is RoundEnd.NORMAL:
            return ending, None, ""
        if ending is RoundEnd.LIMITED:
            detail = f"the round was ended at a size limit ({self._limited}); the rest unread"
            return ending, _ENDING_CODE[ending], detail
        reason = choice.stop_reason
        detail = (
            f"the provider stopped the response ({reason})"
            if reason
            else "the stream ended without a terminal signal"
        )
        return ending, _ENDING_CODE[ending], detail

    def _finish_choice(self, index: int, choice: _ChoiceState) -> Choice:
        ending, code, detail = self._ending(choice)
        if ending is RoundEnd.NORMAL:
            self._expand_wrappers(choice)
        for buf in choice.calls:
            if buf.state in (CallState.FAILED, CallState.CANCELLED, CallState.COMMITTED):
                continue  # (COMMITTED: an eager call, committed before the round ended)
            if ending is RoundEnd.CANCELLED:
                buf.cancel(detail)
            elif code is not None:
                buf.fail(code, detail)
            elif buf.state is CallState.OPEN:
                self._fail(
                    buf,
                    ErrorCode.PROTOCOL_VIOLATION,
                    "the round ended but the provider never closed this call",
                    AnomalyKind.NEVER_CLOSED,
                )
            else:
                self._decide(buf)
        records = {
            id(b): _record_of(b, b.key in self._made_up_ids, self._extras.get(b.key))
            for b in choice.calls
        }
        content: list[ContentItem] = []
        for kind, item in choice.content:
            if kind == "call":
                content.append(records[id(item)])
            elif kind == "text":
                content.append(TextRun(block=item[0], text="".join(item[1])))
            else:
                content.append(item)
        return Choice(
            index=index,
            ended=ending,
            stop_reason=choice.stop_reason,
            calls=tuple(records[id(b)] for b in choice.calls),
            content=tuple(content),
        )

    def _expand_wrappers(self, choice: _ChoiceState) -> None:
        """Replace each complete ``multi_tool_use.parallel`` call by its inner calls (Q19)."""
        if all(buf.name != PARALLEL_WRAPPER for buf in choice.calls):
            return
        tools = self.gate.tools
        if tools is not None and PARALLEL_WRAPPER in tools:
            return  # the user really defined a tool of that name
        taken = {buf.call_id for buf in choice.calls if buf.call_id} | self._reserved
        content: list[tuple[str, Any]] = []
        expanded = False
        for kind, item in choice.content:
            inner = None
            if (
                kind == "call"
                and item.name == PARALLEL_WRAPPER
                and item.state is CallState.ARGS_COMPLETE
            ):
                inner = inner_calls(item.text(), max_depth=self.limits.max_json_depth)
            if inner is None:
                content.append((kind, item))
                continue
            expanded = True
            self._record(
                AnomalyKind.WRAPPER_EXPANDED,
                f"{PARALLEL_WRAPPER} expanded into {len(inner)} calls",
                item.key,
            )
            for i, (name, text) in enumerate(inner):
                buf = CallBuffer(
                    CallKey(item.key.attempt, item.key.choice, f"{item.key.part}/{i}"),
                    0,
                    _unique_id(f"{item.call_id or 'call'}_{i}", taken),
                    name,
                )
                buf.fragments.append(text)
                buf.close()
                content.append(("call", buf))
        if not expanded:
            return
        calls = [item for kind, item in content if kind == "call"]
        choice.content, choice.calls = content, calls
        for position, buf in enumerate(calls):
            buf.position = position
            if position >= self.limits.max_calls_per_round:
                self._fail(
                    buf,
                    ErrorCode.TOO_MANY_TOOL_CALLS,
                    f"more than {self.limits.max_calls_per_round} calls in one round",
                )

    def _decide(self, buf: CallBuffer) -> CommittedCall | Rejection:
        text, given = buf.text(), buf.decoded
        verdict: CommittedCall | Rejection = self.gate.check(
            key=buf.key,
            position=buf.position,
            call_id=buf.call_id,
            name=buf.name,
            text=text,
            # (the value stands for the text only while nothing else was appended to it)
            decoded=given[0] if given is not None and given[1] == text else None,
        )
        if isinstance(verdict, Rejection):
            buf.fail(verdict.code, verdict.detail)
        else:
            buf.commit(verdict)
        return verdict


class _Overflow(Exception):
    """Raised where a round would grow past a bound; ``Assembler.feed`` turns it into a
    failed stream (see ``Assembler._overflowed``)."""

    def __init__(self, kind: AnomalyKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def _unique_id(wanted: str, taken: set[str]) -> str:
    """``wanted``, or ``wanted`` with the first free ``~n`` suffix, so that a made-up call id
    never equals one the round already has (a real call may be named ``<id>_0``); the id is
    added to ``taken``."""
    found, n = wanted, 1
    while found in taken:
        found, n = f"{wanted}~{n}", n + 1
    taken.add(found)
    return found


def _record_of(buf: CallBuffer, id_made_up: bool, extras: Mapping[str, Any] | None) -> CallRecord:
    """The finalized record of a decided call; a call the stream gave no id gets one."""
    committed = buf.committed
    return CallRecord(
        key=buf.key,
        position=buf.position,
        call_id=buf.call_id or made_up_call_id(buf.key, buf.position),
        id_made_up=id_made_up or buf.call_id is None,
        name=buf.name,
        state=buf.state,
        arguments_text=buf.text(),
        arguments=committed.arguments if committed else None,
        error=buf.error,
        detail=buf.detail,
        committed=committed,
        early=buf.early,
        # (an expanded multi_tool_use call's text was never counted as it streamed)
        argument_bytes=buf.nbytes or (_utf8_len(text) if (text := buf.text()) else 0),
        extras=NO_EXTRAS if extras is None else MappingProxyType(dict(extras)),
    )
