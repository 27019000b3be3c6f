"""What every adapter shares: frame decoding, SDK-object duck typing and the feed contract.

An adapter is a small state machine owned by one attempt. ``feed(native)`` takes one native
event (a dict decoded from a frame, or an official SDK's event object) and returns the stream
events it implies; ``feed_frame(frame)`` does the same from a transport frame; ``finish()`` is
called once when the transport ended and returns the events that the *absence* of further
input implies (e.g. an interrupted stream). Adapters never raise for provider misbehaviour:
they emit ``Anomaly`` / ``StreamFailed``. Feeding after ``finish()`` raises ``UsageError``.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeAlias

import orjson

from .._errors import UsageError
from .._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    CallKey,
    Frame,
    RoundEnd,
    RoundEnded,
    StreamEvent,
    StreamFailed,
)
from ._sdk_helpers import HELPERS, SKIP

_DETAIL_CHARS = 300


def short(text: object, limit: int = _DETAIL_CHARS) -> str:
    """``text`` as a one-line string of at most ``limit`` characters (for details); a value
    nested too deep to print (a provider's error ``message`` 100k levels deep) is named by
    its type."""
    try:
        s = " ".join(str(text).split())
    except RecursionError:
        s = f"<{type(text).__name__} nested too deep to show>"
    return s if len(s) <= limit else s[: limit - 1] + "…"


def to_native(event: object) -> object:
    """A native event as plain data: dicts pass through; SDK objects are dumped (duck-typed).

    The official SDKs' pydantic models expose ``to_dict()`` (which keeps "absent" distinct
    from ``null``) or ``model_dump()``; anything else is returned unchanged for the adapter to
    reject as an anomaly.
    """
    if isinstance(event, dict):
        return event
    if isinstance(event, Mapping):
        return dict(event)
    to_dict = getattr(event, "to_dict", None)
    if callable(to_dict):
        try:
            return to_dict(mode="json", exclude_unset=True)
        except TypeError:
            return to_dict()
    model_dump = getattr(event, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json", exclude_unset=True, by_alias=True)
    return event


def error_detail(payload: object) -> str:
    """A short description of a provider error payload (``{"error": {...}}`` or similar)."""
    if isinstance(payload, Mapping):
        err = payload.get("error", payload)
        if isinstance(err, Mapping):
            parts = [short(err[k]) for k in ("type", "code", "message") if err.get(k)]
            if parts:
                return short(": ".join(parts))
        elif err:
            return short(err)
    return short(payload)


def frame_error_detail(data: str) -> str:
    """The short description of an ``event: error`` frame's data (JSON or plain text)."""
    try:
        payload: object = orjson.loads(data)
    except orjson.JSONDecodeError:
        payload = data
    return error_detail(payload)


def canonical_json(value: object) -> str | None:
    """Arguments a provider sent as a JSON value, written once as text (compact, key order
    kept); None when they are not JSON (NaN, infinity, a non-JSON type, nesting too deep)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_RAW_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> object:
    raise ValueError(name)  # NaN, Infinity: orjson refuses them, so does this route


def _valid_text(value: object) -> object:
    """``value`` with each lone surrogate in a string (keys included) replaced by U+FFFD."""
    if isinstance(value, str):
        return _RAW_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_RAW_SURROGATE.sub("\ufffd", k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_text(v) for v in value]
    return value


def with_lone_surrogates(data: str | bytes) -> object | None:
    """The JSON ``data`` that orjson refused for an escaped lone surrogate (``"\ud800"``:
    valid JSON syntax, but no Unicode text), decoded with each one replaced by U+FFFD, as a
    UTF-8 decoder does with a broken byte; None when that is not why (the caller's own
    error then stands). Stream text stays readable and writable (``--json``, the terminal
    view), and a tool name or call id holding one is an ordinary one (an unknown tool). Data
    that holds a raw surrogate (bytes that were not UTF-8) is left to the caller."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        return None
    if not _ESCAPED_SURROGATE.search(text) or _RAW_SURROGATE.search(text):
        return None
    try:
        return _valid_text(json.loads(text, parse_constant=_refuse_constant))
    except (ValueError, RecursionError):
        return None


def lost_event(detail: str) -> Anomaly:
    """An event that could not be read or matched to a call (a *lost event*): it may have
    carried a fragment of any call still pending, so the assembler fails every one of them
    (``protocol_violation``) and the anomaly says which event."""
    return Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail, fails_pending=True)


def invalid(detail: str) -> Anomaly:
    """A payload that could be read but not used, and that carried no call's text: recorded
    (``invalid_payload``), failing nothing."""
    return Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail)


class _DuplicateKey(Exception):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _DuplicateKey
    return result


def has_duplicate_keys(
    data: str | bytes, decoded: object = None, written: bytes | None = None
) -> bool:
    """Whether some JSON object in ``data`` (one event's text) repeats a key.

    A JSON decoder keeps one of the values (orjson and the stdlib the last), so arguments
    sent as an object (``{"cmd":"ls","cmd":"rm -rf /"}``) lose what the model wrote before
    anything else can see it. Only events that carry arguments as an object are re-read so.

    ``decoded``, when given, is what orjson made of ``data``: a cheap test then rules
    repeats out for nearly every event (:func:`_keys_all_kept`), and only the others are
    re-read strictly. ``written``, when given, must be exactly ``orjson.dumps(decoded)``
    (a caller that has most of it written already, see the Gemini adapter): it is not
    written again.
    """
    if decoded is not None and _keys_all_kept(data, decoded, written):
        return False
    try:
        json.loads(data, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey:
        return True
    except (ValueError, RecursionError):
        return False  # (not readable at all: the first decode already said so)
    return False


def _keys_all_kept(data: str | bytes, decoded: object, written: bytes | None = None) -> bool:
    """True when ``decoded`` (``data`` decoded by orjson) provably kept every member of
    every object; False (read it strictly) when it cannot be told so cheaply.

    Two proofs, both from ``written``, orjson's compact text of ``decoded`` (one C call):

    - *Lengths*: orjson writes every code point, integer and literal at its shortest JSON
      spelling and no whitespace, so for a float-free tree ``len(written) <= len(data)``, and
      a member dropped for a repeated key makes it strictly shorter: equal lengths prove
      nothing was dropped (the proof the commit gate uses, see ``_gate._canonical_loads``).
    - *Colons*: JSON text has a colon after each member's key and nowhere else outside its
      strings, and orjson never escapes one. So, when ``data`` holds no ``\\u003a`` escape
      (the only other spelling of a colon), its colons number its members plus its strings'
      colons; ``written``'s number the members and string colons ``decoded`` kept, and a
      repeated key drops a member (its colon at least). Equal counts prove nothing dropped.

    Counting a byte as ``len(b) - len(b.replace(c, b""))`` runs on ``memchr`` (about ten
    times ``bytes.count``'s per-byte loop on CPython 3.11).
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if written is None:
        try:
            written = orjson.dumps(decoded)
        except orjson.JSONEncodeError:  # e.g. nesting over orjson's 255 levels of writing
            return False
    if len(written) == len(data) and _float_free(decoded):
        return True
    if b"\\" in data and b"u003" in data and (b"u003a" in data or b"u003A" in data):
        return False
    kept = len(written) - len(written.replace(b":", b""))
    return kept == len(data) - len(data.replace(b":", b""))


def _float_free(decoded: object) -> bool:
    """Whether the tree ``decoded`` holds no float (one walk over its containers)."""
    stack = [decoded]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            stack += node.values()  # type: ignore[attr-defined]
        elif kind is list:
            stack += node  # type: ignore[arg-type]
        elif kind is float:
            return False
    return True


def round_end(
    reason: str | None, endings: Mapping[str, RoundEnd], field: str, *, choice: int = 0
) -> list[StreamEvent]:
    """``RoundEnded`` for a provider stop ``reason`` looked up in ``endings``.

    A missing reason, or one this adapter does not know, is an anomaly and ends the round
    ``INTERRUPTED``: nothing may commit on a signal whose meaning is unknown (conservative
    default; a new benign reason costs one retry, a new "truncated" could cost a bad write).
    """
    if reason is None:
        return [
            Anomaly(
                kind=AnomalyKind.INVALID_PAYLOAD, detail=f"the message ended without a {field}"
            ),
            RoundEnded(choice=choice, ending=RoundEnd.INTERRUPTED),
        ]
    ending = endings.get(reason)
    if ending is not None:
        return [RoundEnded(choice=choice, ending=ending, stop_reason=reason)]
    return [
        Anomaly(
            kind=AnomalyKind.UNKNOWN_EVENT,
            detail=f"unknown {field} {short(reason, 60)!r}; not trusted, nothing commits",
        ),
        RoundEnded(choice=choice, ending=RoundEnd.INTERRUPTED, stop_reason=reason),
    ]


Translated: TypeAlias = tuple[int, CallKey | None, list[str], list[StreamEvent] | None]
"""``(stop, key, texts, events)``: what :meth:`Adapter.translate` found in a stretch of a run."""

_loads = orjson.loads


class Adapter(ABC):
    """Base class of the provider adapters (see the module docstring for the contract)."""

    provider: ClassVar[str]
    """Stable provider name, as used by ``toollatch replay --provider``."""

    _follows_source = False
    """Whether the last event :meth:`feed` took may be followed by an SDK stream helper's
    derived event (see ``_sdk_helpers``); set on the instance by ``feed``."""

    def __init__(self, *, attempt: int = 0) -> None:
        self.attempt = attempt
        self._finished = False
        self._data: str | bytes | None = None  # the text of the event being translated
        self._native: object = None  # what it was decoded to
        self._owned = False  # _native is the adapter's own decode (no caller holds it)

    def _duplicate_keys(self, written: bytes | None = None) -> bool:
        """Whether the event being translated repeats a key in some object, as far as can be
        known: only when it came with its text (see :meth:`feed_decoded`). For an adapter
        whose provider sends arguments as an object (call it only for such events).
        ``written``: the event's ``orjson.dumps``, when the adapter made it (see
        :func:`has_duplicate_keys`)."""
        return self._data is not None and has_duplicate_keys(self._data, self._native, written)

    def _arguments_object(self, key: CallKey, given: object, where: str) -> list[StreamEvent]:
        """Arguments sent as a JSON object where the provider streams text (``where`` says
        where, e.g. "tool_use start"): ``[]`` for none or ``{}``; else the text written once
        (``canonical_json``), with an ``object_arguments`` anomaly and the repeated-key check;
        a value that is not an object, or not JSON, fails the call."""
        if given is None or given == {}:
            return []
        text = canonical_json(given) if isinstance(given, dict) else None
        if text is None:
            detail = f"{where} input is a {type(given).__name__}, not a JSON object"
            return [
                Anomaly(kind=AnomalyKind.INVALID_PAYLOAD, detail=detail, key=key, fails_call=True)
            ]
        return [
            Anomaly(
                kind=AnomalyKind.OBJECT_ARGUMENTS,
                detail=f"{where} carries its input as an object; serialized once",
                key=key,
            ),
            *self._duplicate_key_anomaly(key),
            ArgsDelta(key=key, fragment=text, whole=True),
        ]

    def _duplicate_key_anomaly(self, key: CallKey) -> list[StreamEvent]:
        """``[]``, or the anomaly that fails ``key``'s call when the event being translated
        repeats a key (see :meth:`_duplicate_keys`)."""
        if not self._duplicate_keys():
            return []
        return [
            Anomaly(
                kind=AnomalyKind.DUPLICATE_KEY,
                detail="the event repeats a key in an object: which value was meant is unknown",
                key=key,
                fails_call=True,
            )
        ]

    # -- public contract --------------------------------------------------------------------

    def feed(self, native: object) -> list[StreamEvent]:
        """Translate one native event into stream events.

        ``native`` is the provider's event as a dict (or any ``Mapping``), or an object for
        one: what an official SDK's ``stream=True`` iterator yields (see :func:`to_native`),
        or what its stream helper yields (``client.chat.completions.stream()``,
        ``client.messages.stream()``): the provider's event a helper event carries is taken,
        and an event the helper derived from the one it yielded before is skipped (see
        ``_sdk_helpers``). Anything else, and a dict the provider would not send, is an
        anomaly, never an exception.

        Raises UsageError after :meth:`finish`, and for a helper's derived event that does
        not follow the event it was derived from (its data would be lost); the adapter is
        left as it was.
        """
        if self._finished:
            raise self._after_finish("feed")
        helper = HELPERS.get(self.provider)
        if helper is not None:
            native, self._follows_source = helper.take(native, self._follows_source, to_native)
            if native is SKIP:
                return []
        event = to_native(native)
        if not isinstance(event, dict):
            return [lost_event(f"expected a JSON object, got {type(event).__name__}")]
        return self.feed_decoded(event)

    def feed_frame(self, frame: Frame) -> list[StreamEvent]:
        """Translate one transport frame: decodes its JSON data, handles ``[DONE]``/errors."""
        if self._finished:
            raise self._after_finish("feed_frame")
        data = frame.data
        if frame.event == "error":
            return self._stream_error(frame_error_detail(data))
        if data == "[DONE]":  # (before the parse: a failed parse costs an exception object)
            return self._done()
        try:
            native = orjson.loads(data)
        except orjson.JSONDecodeError:
            if not data:
                return []
            native = with_lone_surrogates(data)
            if native is None:
                return [lost_event(f"frame data is not JSON: {short(data, 80)!r}")]
        if type(native) is not dict:
            return [lost_event(f"frame data is JSON {type(native).__name__}, not an object")]
        return self._decoded(native, frame.event, data, owned=True)

    def feed_decoded(
        self, event: dict[str, Any], sse_event: str | None = None, data: str | bytes | None = None
    ) -> list[StreamEvent]:
        """Translate a frame whose data is already decoded to a JSON object.

        ``sse_event`` is the frame's event name; an ``error`` frame must go through
        :meth:`feed_frame` instead. ``data`` is the text ``event`` was decoded from, when the
        caller has it: arguments sent as a JSON object are then checked for repeated keys,
        which a decoded dict can no longer show. The same events as :meth:`feed_frame`.
        """
        return self._decoded(event, sse_event, data, owned=False)

    def _decoded(
        self, event: dict[str, Any], sse_event: str | None, data: str | bytes | None, owned: bool
    ) -> list[StreamEvent]:
        """:meth:`feed_decoded`; ``owned`` when ``event`` is the adapter's own decode."""
        hit = None if self._finished else self._continuation(event, sse_event)
        if hit is None:
            return self._feed_other(event, sse_event, data, owned)  # (raises once finished)
        return [ArgsDelta(key=hit[0], fragment=hit[1])]

    def _feed_other(
        self,
        event: dict[str, Any],
        sse_event: str | None,
        data: str | bytes | None = None,
        owned: bool = False,
    ) -> list[StreamEvent]:
        """:meth:`feed_decoded` for an event that :meth:`_continuation` declined
        (:meth:`translate` asks it first, and comes here to not ask twice). ``owned``: the
        adapter decoded ``event`` itself, so a value in it may travel on as the decoded form
        of a call's arguments (``ArgsDelta.decoded``): no caller can change it later."""
        if self._finished:
            raise self._after_finish("feed_decoded")
        self._data, self._native, self._owned = data, event, owned
        try:
            return self._feed(event, sse_event)
        finally:
            self._data = self._native = None
            self._owned = False

    # -- the pipeline's per-event step (package-internal) -----------------------------------

    def translate(self, event: str, payloads: Sequence[bytes], start: int = 0) -> Translated:
        """The next stretch of a run of events of one type (a byte stream's events, from
        their frames' event name and undecoded data), from ``payloads[start]``: ``(stop, key,
        texts, events)``. ``texts`` are the bare argument fragments of the open call ``key``
        that ``payloads[start:stop]`` hold, one per payload (maybe none: ``key`` is then
        None); ``events`` (or None) are the stream events of the payload that ended the
        stretch, ``payloads[stop - 1]``, when it is not such a fragment. A stretch also ends
        before a fragment of another call (``stop`` is then that payload's). Package-internal:
        ``StreamParser`` calls it for the runs the decoders' ``feed_payloads`` hand over, in
        turn until ``stop`` is the run's end, so that the bulk of a stream goes from bytes to
        a call's buffer without a frame or an event per fragment in between.

        The same decisions as :meth:`feed_frame` for each ``Frame(event, data)`` in turn,
        ``data`` being the payload decoded with ``surrogateescape``: each payload is decoded
        once; a fragment (:meth:`_continuation`) is what ``feed_frame`` would return as its one
        ``ArgsDelta``, and it changes the adapter alike; any other object goes to
        :meth:`_feed_other` (no second parse), and a payload that is not a JSON object, an
        ``error`` event or ``[DONE]`` to :meth:`feed_frame`. Raises ``UsageError`` after
        :meth:`finish`, like every ``feed``.
        """
        if self._finished:
            raise self._after_finish("translate")
        texts: list[str] = []
        key: CallKey | None = None
        continuation, loads, end = self._continuation, _loads, len(payloads)
        for i in range(start, end):
            payload = payloads[i]
            if event == "error" or payload[:1] != b"{":
                return i + 1, key, texts, self._undecoded(event, payload)
            try:
                native = loads(payload)
            except orjson.JSONDecodeError:  # not UTF-8, or not JSON: feed_frame says what it is
                native = with_lone_surrogates(payload)  # (or an escaped lone surrogate)
            if type(native) is not dict:
                return i + 1, key, texts, self._undecoded(event, payload)
            hit = continuation(native, event)
            if hit is None:
                return i + 1, key, texts, self._feed_other(native, event, payload, True)
            if key is not None and hit[0] != key:
                return i, key, texts, None  # another call's (decoded again next time: rare)
            key = hit[0]
            texts.append(hit[1])
        return end, key, texts, None

    def _undecoded(self, event: str, payload: bytes) -> list[StreamEvent]:
        """:meth:`feed_frame` for a payload :meth:`translate` does not decode itself."""
        return self.feed_frame(Frame(event, payload.decode("utf-8", "surrogateescape")))

    def _after_finish(self, method: str) -> UsageError:
        """The error for ``method`` called on a finished adapter."""
        return UsageError(f"{type(self).__name__}.{method}() called after finish()")

    def finish(self) -> list[StreamEvent]:
        """The transport ended: return what the end of input implies. Call exactly once."""
        if self._finished:
            raise UsageError(f"{type(self).__name__}.finish() called twice")
        self._finished = True
        return self._finish()

    # -- provider hooks ---------------------------------------------------------------------

    @abstractmethod
    def _feed(self, event: Mapping[str, Any], sse_event: str | None = None) -> list[StreamEvent]:
        """Translate one decoded native event (``sse_event``: the SSE event name, if any)."""

    def _continuation(
        self, event: dict[str, Any], sse_event: str | None
    ) -> tuple[CallKey, str] | None:
        """The decoded route of :meth:`translate`, once per argument fragment: ``(key,
        fragment)`` when ``event`` is a bare argument fragment of an open call, for which
        :meth:`_feed` would return exactly ``[ArgsDelta(key=key, fragment=fragment)]`` and
        change nothing else that matters (tests pin this per adapter); ``None`` sends the
        event down the general path."""
        return None

    def _stream_error(self, detail: str) -> list[StreamEvent]:
        """The provider reported an error (an SSE ``event: error`` frame, or an error event of
        its own): the stream failed. Adapters add their rules (e.g. only recorded after the
        end)."""
        return [StreamFailed(detail=detail)]

    def _done(self) -> list[StreamEvent]:
        """An SSE ``data: [DONE]`` sentinel arrived (OpenAI-style streams)."""
        return []

    @abstractmethod
    def _finish(self) -> list[StreamEvent]:
        """End-of-input rule of the provider."""
