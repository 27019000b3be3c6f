"""Incremental, resumable, lenient JSON parser behind the preview channel.

Theory of operation
-------------------
:class:`PartialJSON` reads JSON text in fragments of any size and keeps three things up to
date, each in time linear in the text fed (the value is never rebuilt, and a fragment is scanned
again only where an attempt to read a value in one step fails: at most once per nesting level
and fragment):

* a **tokenizer state** (``_state``) that can stop between any two characters: inside a
  string (also between the characters of an escape such as ``\\u00e9``, and between the two
  halves of a surrogate pair), a number, a literal, or whitespace;
* a **stack of open containers**: the dicts and lists of the snapshot itself, mutated in place,
  with the RFC 6901 pointer of each (the path stack);
* the **growing string** at the edge, kept as a list of pieces and joined only when it ends or
  when :meth:`PartialJSON.snapshot` is asked for (a parser made with ``keep_values=False``, for
  a reader of the deltas alone, drops a value's pieces once reported and has no snapshot).

String content is consumed in C: the json module's own string decoder reads a run of plain
text and complete escapes (a regular expression first finds where the run ends when an escape
may be cut by the fragment's end); only an escape cut by a fragment's end is finished character
by character. A fragment that is all content of a string value, an escape cut by the previous
fragment included, is one such step and one delta (:meth:`PartialJSON._content`); when it is
whole and complete content (the commonest: a preview's held text), orjson checks and decodes it
in one pass instead, and accepts it only when the json module reads it to the same text.
One-character fragments of plain string content take the one fast path, in
:meth:`PartialJSON.feed` (no state change, a reused delta, one byte counter), because
providers really stream arguments one character per event; every other fragment, of any
length, takes the general route (:meth:`PartialJSON._content` or the state handlers).

Structure is read in big steps where the fragment allows (:meth:`PartialJSON._structure`): a
value that ends inside the fragment (a member with its key and colon, an element, or the rest
of the innermost container after a comma) is read by the json module's C scanner and then
reported exactly as the step-by-step reading would; whatever is cut by the fragment's end (and
any error, so that it is found and worded the same way) is left to a small Python step per
token, the state handlers.

What a reader sees (the *snapshot* and the *deltas*) follows one rule: **nothing that could
still change into a different value is reported as a final value.** Numbers are reported only
when a delimiter ends them (``12`` may become ``123``), literals only when complete (``tr`` is
never ``true``), object keys only when their value starts. Strings are visible while they grow,
and marked provisional until their closing quote.

Snapshot (:meth:`PartialJSON.snapshot`):

* an object holds every member whose value is visible: complete scalars, strings (partial while
  growing), objects and arrays (partial while open); a key whose value has not started, or whose
  value is a number or literal still being read, is absent;
* an array holds its visible elements in order, by the same rule;
* a growing string holds the characters decoded so far; an unfinished escape, and a high
  surrogate escape whose pair has not arrived, are not yet part of it;
* ``None`` until the top-level value is visible (and for a top-level ``null``);
* duplicate keys: the last value wins, as with :func:`json.loads`.

Lenient about *where* the text stops, strict about *what* it says: malformed text (an invalid
character or escape, a control character in a string, an invalid number, ``NaN``, text after
the top-level value, nesting over ``max_depth``, more than ``max_bytes``) stops the parser. It
never raises on any text: :attr:`PartialJSON.failed` gets a short reason with the UTF-8 byte
offset where it was found (never the text itself), the value keeps what was reported before,
and later feeds return nothing. This is a preview: the strict gate decides execution from the
complete text on its own.
"""

from __future__ import annotations

import json.decoder
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, cast

import orjson

from ._errors import UsageError

__all__ = ["DeltaOp", "PartialJSON", "PathDelta"]

DeltaOp: TypeAlias = Literal["set", "append", "end"]
"""The delta vocabulary; see :class:`PathDelta`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PathDelta:
    """One change to the parsed value, addressed by an RFC 6901 JSON pointer.

    ======== ========================= ======================================================
    op       value                     meaning
    ======== ========================= ======================================================
    set      the value                 a value starts at ``path``: a new object member (or a
                                       duplicate key replacing the old value), the next array
                                       element (the last pointer token equals the array's
                                       length), or the root (``""``). A number, ``true``,
                                       ``false`` or ``null`` is complete and final. A string
                                       starts as ``""`` and grows by ``append``; an object or
                                       array starts as a fresh empty ``{}`` / ``[]`` (owned by
                                       the receiver) and fills through deltas on child paths.
    append   the new text (non-empty)  the string at ``path`` grows by ``value``.
    end      ``None``                  the string, object or array at ``path`` is complete.
    ======== ========================= ======================================================

    Each string, object and array gets exactly one ``set`` and, once its closing quote or
    bracket is read, exactly one ``end``; scalars get one ``set`` only. The pointers set and
    not yet ended are exactly :attr:`PartialJSON.provisional`. Folding the deltas in order into
    an empty document reproduces :meth:`PartialJSON.snapshot`. Appends are coalesced per
    :meth:`PartialJSON.feed` call, so the deltas of one text under any fragmentation are equal
    once adjacent ``append`` deltas on the same path are merged.
    """

    path: str
    """RFC 6901 JSON pointer of the value (``""`` is the root, ``/items/0`` an element)."""
    op: DeltaOp
    """What happened: ``set``, ``append`` or ``end`` (see the class docstring)."""
    value: object
    """The value set, the text appended, or ``None`` for ``end``."""

    @classmethod
    def of(cls, path: str, op: DeltaOp, value: object) -> PathDelta:
        """``PathDelta(path=path, op=op, value=value)``, positionally."""
        return cls(path=path, op=op, value=value)


def _delta(path: str, op: DeltaOp, value: object) -> PathDelta:
    """``PathDelta(path=path, op=op, value=value)`` (for the parser's and the filter's use)."""
    return PathDelta(path=path, op=op, value=value)


# Tokenizer states: what the next character may be.
_VALUE: Final = 0  # a value (top level, after ':' or after ',' in an array)
_ARRAY_FIRST: Final = 1  # a value or ']' (just after '[')
_OBJECT_FIRST: Final = 2  # a key or '}' (just after '{')
_KEY: Final = 3  # a key (after ',' in an object)
_COLON: Final = 4  # ':' after a key
_AFTER_VALUE: Final = 5  # ',' or the closing bracket of the innermost container
_END: Final = 6  # only whitespace: the top-level value is complete (states up to here skip it)
_STRING: Final = 7  # string content (a key or a value: see _str_is_key)
_ESCAPE: Final = 8  # the character after a backslash
_UNICODE: Final = 9  # the hex digits of \uXXXX (collected in _hex)
_NUMBER: Final = 10  # number characters (collected in _num)
_LITERAL: Final = 11  # the rest of true / false / null

_WS: Final = " \t\n\r"
_WS_RUN: Final = re.compile(r"[ \t\n\r]*")
# String content up to a quote, a control character, or an escape that is incomplete or invalid.
_STRING_BODY: Final = re.compile(r'(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+')
_ESCAPE_CUT: Final = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?\Z")  # an escape's start, at the end
_LOW_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][c-fC-F]")
# The json module's own string decoder (C), exactly json.loads's rules; typeshed omits it.
_ScanString: TypeAlias = Callable[[str, int], tuple[str, int]]
_scanstring: Final[_ScanString] = json.decoder.scanstring  # type: ignore[attr-defined]
# orjson's parser, for string content in one piece (PartialJSON._content): it checks and
# decodes in one pass, and accepts a string only when json reads it to the same text.
_orjson_loads: Final[Callable[[str], Any]] = orjson.loads
_OrjsonError: Final = orjson.JSONDecodeError
_NUMBER_RUN: Final = re.compile(r"[0-9eE.+\-]*")  # validated as a whole when it ends
_NUMBER_SYNTAX: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_HEX_RUN: Final = re.compile(r"[0-9a-fA-F]*")
# An object key without escapes, its colon and the whitespace up to the value.
_MEMBER_KEY: Final = re.compile(r'[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*:[ \t\n\r]*')
_DELIMITERS: Final = ",}] \t\n\r"  # what may follow a number (anything else: the handlers)


def _reject_constant(name: str) -> object:
    raise ValueError(name)  # NaN and Infinity are not JSON (json.loads accepts them)


# The json module's own scanner (C): one complete value, strictly as json.loads reads it, with
# objects as their (key, value) pairs so that duplicate keys stay visible. Typeshed omits it.
_ScanValue: TypeAlias = Callable[[str, int], tuple[Any, int]]
_scan_value: Final[_ScanValue] = json.decoder.JSONDecoder(
    object_pairs_hook=tuple, parse_constant=_reject_constant
).scan_once  # type: ignore[attr-defined]
_SCAN_ERRORS: Final = (StopIteration, ValueError, RecursionError)


class _TooDeep(Exception):
    """A complete value read in one step nests deeper than max_depth: read it step by step."""


_NUMBER_START: Final = "-0123456789"
_ESCAPES: Final[dict[str, str]] = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}
_LITERALS: Final[dict[str, str]] = {"t": "true", "f": "false", "n": "null"}
_LITERAL_VALUES: Final[dict[str, object]] = {"true": True, "false": False, "null": None}

_COMPACT_BYTES: Final = 1024
"""A growing string's pieces are joined into one block whenever this many bytes have been fed
(every piece comes from at least one byte), so that one-character fragments cost a pointer each
only briefly (memory stays a small multiple of the text) while each character is still copied a
bounded number of times. The same count enforces ``max_bytes`` (:meth:`PartialJSON._refill`)."""

_CACHE_ENTRIES: Final = 256
"""Distinct one-character append deltas reused per growing string (they are immutable)."""

# What PartialJSON.feed looks a fragment up in first (PartialJSON._hot), which also says where
# the parser is: the open string value's _cache in its plain content, else one of these (empty).
_Known: TypeAlias = Mapping[str, tuple[PathDelta, int]]
_COLD: Final[_Known] = {}  # anywhere else
_STOPPED: Final[_Known] = {}  # finished or failed: feed() takes nothing more

Container: TypeAlias = dict[str, object] | list[object]


def _pointer_token(key: str) -> str:
    """Escape an object key as one RFC 6901 reference token."""
    return key.replace("~", "~0").replace("/", "~1")


def _run_end(pattern: re.Pattern[str], text: str, i: int) -> int:
    """End of the run of ``pattern`` (a starred character class) starting at ``i``."""
    match = pattern.match(text, i)
    assert match is not None  # a starred pattern matches the empty string
    return match.end()


def _pair(high: str, low: str) -> str:
    """The character a UTF-16 surrogate pair encodes."""
    return chr(0x10000 + ((ord(high) - 0xD800) << 10) + (ord(low) - 0xDC00))


def _utf8_length(text: str) -> int:
    # surrogatepass: lone surrogates are possible in a str and must not raise here.
    return len(text.encode("utf-8", "surrogatepass"))


class PartialJSON:
    """Parse one JSON text fed in fragments; report the value so far and path-level deltas.

    Use: ``feed(fragment)`` for every fragment, in order, then ``finish()`` once. Both return
    the :class:`PathDelta` list of what changed. Total work is linear in the text fed plus the
    length of the pointers reported, whatever the fragment sizes. Nothing here raises on any
    text; feeding or finishing a finished parser raises :class:`UsageError`.
    """

    __slots__ = (
        "_blocks",
        "_cache",
        "_complete",
        "_failed",
        "_finished",
        "_hex",
        "_high",
        "_hot",
        "_keep",
        "_key",
        "_literal",
        "_literal_seen",
        "_mark",
        "_max_bytes",
        "_max_depth",
        "_num",
        "_out",
        "_parts",
        "_pieces",
        "_pointers",
        "_reach",
        "_room",
        "_root",
        "_stack",
        "_state",
        "_str_is_key",
        "_str_parent",
        "_str_pointer",
        "_str_slot",
    )

    def __init__(
        self, *, max_depth: int = 64, max_bytes: int | None = None, keep_values: bool = True
    ) -> None:
        """Start before the first character.

        ``max_depth`` bounds the nesting of objects and arrays (``[`` is depth 1), as
        ``Limits.max_json_depth``. ``max_bytes`` bounds the UTF-8 size of all text fed; ``None``
        means no bound here (the assembler already bounds each call's buffer by
        ``Limits.max_argument_bytes`` before feeding its preview). ``keep_values=False`` is
        for a reader of the deltas alone (a preview tracker): the text of a string value is
        not kept once its deltas are out (keys still are), so a long string costs no second
        copy, and :meth:`snapshot` raises :class:`UsageError`. Invalid values raise
        :class:`UsageError`.
        """
        if max_depth < 1 or (max_bytes is not None and max_bytes < 0):
            raise UsageError("max_depth must be >= 1 and max_bytes >= 0 (or None)")
        self._keep = keep_values
        self._max_depth = max_depth
        self._max_bytes = sys.maxsize if max_bytes is None else max_bytes
        self._state = _VALUE
        self._stack: list[Container] = []
        self._pointers: list[str] = []  # the pointer of each open container
        self._key = ""  # the last complete key of the innermost object
        self._root: object = None
        self._complete = False
        self._failed: str | None = None
        self._finished = False
        self._hot: _Known = _COLD  # _cache, _COLD or _STOPPED
        # Bytes that may still be fed before _refill must look (< 0: it must), and the count
        # fed by then: bytes fed = _mark - _room. One small counter for the hot paths.
        self._room = min(_COMPACT_BYTES, self._max_bytes)
        self._mark = self._room
        self._str_is_key = False
        self._str_parent: Container | None = None  # where the growing string value lives
        self._str_slot: str | int = ""
        self._str_pointer = ""
        self._pieces: list[str] = []  # the growing string: recent pieces...
        self._blocks: list[str] = []  # ...and older pieces already joined
        self._high = ""  # a high surrogate escape waiting for its low half
        self._hex = ""
        self._num: list[str] = []
        self._literal = ""
        self._literal_seen = 0
        self._cache: dict[str, tuple[PathDelta, int]] = {}
        self._out: list[PathDelta] = []  # deltas of the current call
        self._parts: list[str] = []  # text added to the string value during the current call
        self._reach = 0  # the open containers this deep or less do not end in this fragment

    # ------------------------------------------------------------------ public API

    @property
    def failed(self) -> str | None:
        """Why the text is not valid JSON, or ``None``: a short reason and a UTF-8 byte offset.

        Once set it never changes; the snapshot and :attr:`provisional` stay as they were at
        the failure point and later feeds return ``[]``.
        """
        return self._failed

    @property
    def complete(self) -> bool:
        """True once the top-level value is complete (whitespace may still follow)."""
        return self._complete

    @property
    def bytes_fed(self) -> int:
        """UTF-8 bytes of the fragments fed until the parser stopped (the stopping one too)."""
        return self._mark - self._room

    @property
    def in_string(self) -> bool:
        """True while inside a string (a key or a value), an unfinished escape included.

        Until a ``"`` is fed, feeds can then only grow that string (or fail on malformed text):
        no value starts or ends, so a caller may hold such text and feed it later in one piece.
        """
        return _STRING <= self._state <= _UNICODE

    @property
    def provisional(self) -> frozenset[str]:
        """Pointers of the visible values that may still change: the open string and containers.

        These are the values on the path from the root to the growing edge: exactly the
        pointers that got a ``set`` delta and no ``end`` yet. Everything else in the snapshot
        is final. Costs O(depth) per call.
        """
        paths = set(self._pointers)
        if self._state in (_STRING, _ESCAPE, _UNICODE) and not self._str_is_key:
            paths.add(self._str_pointer)
        return frozenset(paths)

    @property
    def pending(self) -> str | None:
        """Pointer of a number or literal being read (not yet in the snapshot), else ``None``.

        Lets a UI show that a value is being typed at a path without ever showing a number or
        literal that might still change.
        """
        if self._state in (_NUMBER, _LITERAL):
            return self._child_pointer()
        return None

    def snapshot(self) -> object:
        """Return the value so far (see the module docstring for exactly what it contains).

        The result is the parser's own value, updated in place by later feeds: read it, or
        ``copy.deepcopy`` it to keep a version; do not mutate it. Costs O(1) plus the length
        of the growing string, which is joined here (the deltas are the incremental channel).

        Raises:
            UsageError: for a parser made with ``keep_values=False``.
        """
        if not self._keep:
            raise UsageError("snapshot() of a PartialJSON made with keep_values=False")
        if self._state in (_STRING, _ESCAPE, _UNICODE) and not self._str_is_key:
            self._install(self._joined())
        return self._root

    def feed(self, fragment: str) -> list[PathDelta]:
        """Consume the next fragment of text; return the deltas it caused, in order.

        Never raises on any text: malformed text sets :attr:`failed` and the deltas up to the
        failure point are returned; after a failure every feed returns ``[]``.
        """
        # The one fast path, inlined because it is the hot one: providers stream arguments
        # one character per event, and most characters are plain content of a string value.
        # Its append delta is made once per string and character (_cache_plain) and reused.
        if len(fragment) == 1:
            known = self._hot.get(fragment)  # _hot is the open string value's _cache, or empty
            if known is not None:
                delta, size = known
                self._room -= size
                if self._room < 0 and not self._refill():
                    return []
                self._pieces.append(fragment)
                return [delta]
            if self._hot is self._cache and fragment.isprintable() and fragment not in '"\\':
                self._cache_plain(fragment)  # a character new to this string: keep its delta...
                return self.feed(fragment)  # ...and take the fast path
        # The general route, for any other text (a preview's held text, parsed in one piece).
        hot = self._hot
        if hot is _STOPPED:
            if self._finished:
                raise UsageError("feed() after finish()")
            return []
        if not fragment:
            return []
        # (_utf8_length inlined: every fragment that is not ASCII would pay a call)
        self._room -= (
            len(fragment) if fragment.isascii() else len(fragment.encode("utf-8", "surrogatepass"))
        )
        if self._room < 0 and not self._refill():
            return []
        # (hot: in plain content of a string value; in _ESCAPE or _UNICODE, an escape was
        # cut by the end of the last text)
        if hot is not _COLD or (
            _STRING <= self._state <= _UNICODE and not self._str_is_key and not self._high
        ):
            out = self._content(fragment)
            if out is not None:
                return out
        return self._feed_tokens(fragment)

    def finish(self) -> list[PathDelta]:
        """Declare the end of the text; return the deltas this causes.

        The end completes nothing that needs a closing character: an open string, object or
        array stays open and :attr:`failed` becomes ``"input ended before the value was
        complete"``. The one value the end itself completes is a top-level number, which JSON
        delimits by the end of the text.
        """
        if self._finished:
            raise UsageError("finish() called twice")
        self._finished = True
        self._hot = _STOPPED
        if self._failed is not None:
            return []
        out: list[PathDelta] = []
        self._out = out
        if self._state == _NUMBER and not self._stack:
            self._end_number("", 0)
        if self._failed is None and not self._complete:
            started = self._stack or self._state != _VALUE
            what = "the value was complete" if started else "any value"
            self._failed = f"input ended before {what}"
        return out

    # ------------------------------------------------------------------ feeding

    def _cache_plain(self, char: str) -> None:
        """Keep the ``append`` of a plain character to the open string, and its UTF-8 size.

        They are reused while this string is open (they are values).
        """
        if len(self._cache) >= _CACHE_ENTRIES:
            self._cache.clear()
        self._cache[char] = (
            PathDelta(path=self._str_pointer, op="append", value=char),
            1 if char.isascii() else _utf8_length(char),
        )

    def _content(self, fragment: str) -> list[PathDelta] | None:
        """Read ``fragment`` in one step if it is all content of the open string value.

        That is: text and complete escapes, then at most the start of an escape cut by the
        fragment's end; an escape cut by the previous fragment's end is read with it. Then it
        is one decoding and one delta, exactly as the handlers would read it
        (:meth:`_on_string` and :meth:`_add_body`). Anything else (a closing quote, a control
        character, an invalid escape) returns ``None`` with nothing changed, for the handlers.
        Only called with no high surrogate waiting.

        Content whole and complete, the commonest, is one call of orjson's parser on the text
        quoted: it reads it as one JSON string only if it is all valid content, and then to
        the text the json module reads (a test pins both). What it refuses (a quote, a control
        character, an escape cut by the end, a lone surrogate escape, which json keeps) goes
        the json module's way: a regular-expression match where an escape may be cut by the
        end, then its string decoder, which stops at a quote and raises on what is invalid.
        """
        state = self._state
        if state == _STRING:
            body = fragment
            if body[-1] != "\\" and "\\u" not in body[-5:]:  # (else orjson refuses: no call)
                try:
                    text = _orjson_loads(f'"{body}"')
                except _OrjsonError:
                    pass
                else:
                    self._hot = self._cache
                    self._pieces.append(text)
                    return [PathDelta(path=self._str_pointer, op="append", value=text)]
        elif state == _ESCAPE:
            body = "\\" + fragment
        else:
            body = "\\u" + self._hex + fragment
        if body[-1] == "\\" or "\\u" in body[-5:]:  # an escape may be cut by the end
            match = _STRING_BODY.match(body)
            end = match.end() if match else 0
            if end < len(body):
                cut = _ESCAPE_CUT.match(body, end)
                if cut is None:
                    return None
                if cut.end() - end == 1:
                    self._state = _ESCAPE
                else:
                    self._state, self._hex = _UNICODE, body[end + 2 :]
                self._hot = _COLD
                body = body[:end]
                if not body:
                    return []
            else:
                self._state = _STRING
                self._hot = self._cache
            text = _scanstring(body + '"', 0)[0] if "\\" in body else body
        else:
            # All of it or none: the decoder stops at a quote, and raises on a control
            # character or an invalid escape (the handlers then find and word it).
            try:
                text, end = _scanstring(body + '"', 0)
            except ValueError:
                return None
            if end <= len(body):
                return None
            self._state = _STRING
            self._hot = self._cache
        last = text[-1]
        if "\ud800" <= last <= "\udbff" and body[-1] != last:  # from an escape
            self._high = last  # waits for its low half: the short path is off
            self._hot = _COLD
            text = text[:-1]
            if not text:
                return []
        self._pieces.append(text)
        return [_delta(self._str_pointer, "append", text)]

    def _refill(self) -> bool:
        """The byte count passed ``_mark``: fail if it is over ``max_bytes`` (return False),
        else compact the growing string and count up to the next mark."""
        fed = self._mark - self._room
        if fed > self._max_bytes:
            self._failed = f"size over {self._max_bytes} bytes"
            self._hot = _STOPPED
            return False
        if self._pieces:
            self._compact()
        self._room = min(_COMPACT_BYTES, self._max_bytes - fed)
        self._mark = fed + self._room
        return True

    def _feed_tokens(self, text: str) -> list[PathDelta]:
        """General path: run the state machine over ``text``."""
        out: list[PathDelta] = []
        self._out = out
        self._parts = []
        self._reach = 0
        handlers = _HANDLERS
        i, n = 0, len(text)
        while i < n and self._failed is None:
            if self._state <= _AFTER_VALUE and n > 1:
                i = self._structure(text, i)  # (stops only where a handler must go on)
                if i == n or self._failed is not None:
                    break
            i = handlers[self._state](self, text, i)
        if self._parts:  # the open string value grew during this call
            out.append(_delta(self._str_pointer, "append", "".join(self._parts)))
        if self._failed is None:
            fast = self._state == _STRING and not self._str_is_key and not self._high
            self._hot = self._cache if fast else _COLD
        return out

    def _fail(self, reason: str, text: str, index: int) -> int:
        """Stop the parser for good at ``text[index]``, the last fragment fed."""
        offset = self._mark - self._room - _utf8_length(text[index:])
        self._failed = f"{reason} at byte {offset}"
        self._hot = _STOPPED
        return index

    # ------------------------------------------------------------------ state handlers
    # Each takes the fragment and a position, consumes what its state allows and returns the
    # new position (or sets _failed). Non-string states start by skipping whitespace.

    def _on_value(self, text: str, i: int) -> int:
        if text[i] in _WS:
            i = _run_end(_WS_RUN, text, i)
            if i == len(text):
                return i
        char = text[i]
        if char == '"':
            self._open_string(is_key=False)
            return i + 1
        if char in "{[":
            return self._open_container(text, i)
        if char in _NUMBER_START:
            self._state = _NUMBER
            return i
        literal = _LITERALS.get(char)
        if literal is not None:
            self._state = _LITERAL
            self._literal, self._literal_seen = literal, 0
            return i
        if char == "]" and self._state == _ARRAY_FIRST:
            return self._close_container(i)
        return self._fail("expected a value", text, i)

    def _on_key(self, text: str, i: int) -> int:
        if text[i] in _WS:
            i = _run_end(_WS_RUN, text, i)
            if i == len(text):
                return i
        char = text[i]
        if char == '"':
            self._open_string(is_key=True)
            return i + 1
        if char == "}" and self._state == _OBJECT_FIRST:
            return self._close_container(i)
        return self._fail("expected a key", text, i)

    def _on_colon(self, text: str, i: int) -> int:
        if text[i] in _WS:
            i = _run_end(_WS_RUN, text, i)
            if i == len(text):
                return i
        if text[i] != ":":
            return self._fail("expected ':'", text, i)
        self._state = _VALUE
        return i + 1

    def _on_after_value(self, text: str, i: int) -> int:
        if text[i] in _WS:
            i = _run_end(_WS_RUN, text, i)
            if i == len(text):
                return i
        char = text[i]
        in_object = isinstance(self._stack[-1], dict)
        if char == ",":
            self._state = _KEY if in_object else _VALUE
            return i + 1
        if char == ("}" if in_object else "]"):
            return self._close_container(i)
        return self._fail("expected ',' or a closing bracket", text, i)

    def _on_end(self, text: str, i: int) -> int:
        if text[i] in _WS:
            i = _run_end(_WS_RUN, text, i)
            if i == len(text):
                return i
        return self._fail("trailing data after the value", text, i)

    def _on_string(self, text: str, i: int) -> int:
        j = _run_end(_STRING_BODY, text, i)
        if j < len(text) and text[j] == '"' and not (self._pieces or self._blocks or self._high):
            # The whole string is in this fragment (most keys and short values): decode it in
            # one step, with no pieces to keep.
            self._close_string(_scanstring(text, i)[0])
            return j + 1
        if j > i:
            self._add_body(text[i:j])
        if j == len(text):
            return j
        char = text[j]
        if char == '"':
            if self._high:
                self._add("")
            self._close_string()
            return j + 1
        if char == "\\":  # an escape split by the fragment's end, or an invalid one
            self._state = _ESCAPE
            return j + 1
        return self._fail("control character in string", text, j)

    def _on_escape(self, text: str, i: int) -> int:
        char = text[i]
        if char == "u":
            self._state, self._hex = _UNICODE, ""
            return i + 1
        decoded = _ESCAPES.get(char)
        if decoded is None:
            return self._fail("invalid escape", text, i)
        self._add(decoded)
        self._state = _STRING
        return i + 1

    def _on_unicode(self, text: str, i: int) -> int:
        part = text[i : i + 4 - len(self._hex)]
        valid = _run_end(_HEX_RUN, part, 0)
        if valid < len(part):
            return self._fail("invalid \\u escape", text, i + valid)
        digits = self._hex + part
        if len(digits) < 4:
            self._hex = digits
            return i + len(part)
        self._hex = ""
        self._state = _STRING
        self._code_unit(int(digits, 16))
        return i + len(part)

    def _on_number(self, text: str, i: int) -> int:
        j = _run_end(_NUMBER_RUN, text, i)
        if j > i:
            self._num.append(text[i:j])
        if j < len(text):  # a delimiter: the number is complete
            self._end_number(text, j)
        return j

    def _on_literal(self, text: str, i: int) -> int:
        word, seen = self._literal, self._literal_seen
        part = text[i : i + len(word) - seen]
        if not word.startswith(part, seen):
            bad = next(k for k, char in enumerate(part) if char != word[seen + k])
            return self._fail("invalid literal", text, i + bad)
        seen += len(part)
        self._literal_seen = seen
        if seen == len(word):
            self._set_scalar(_LITERAL_VALUES[word])
        return i + len(part)

    # ------------------------------------------------------------------ structure, fast

    def _structure(self, text: str, i: int) -> int:
        """Read structure from ``text[i]`` on in big steps; return where the handlers take over.

        Runs in the structural states (``_VALUE`` to ``_AFTER_VALUE``) and leaves them in the
        state the handlers would. A step reads a whole value that ends in this text with the
        json module's C scanner (with the comma, key and colon before it, for an object
        member) and reports it exactly as the handlers would (:meth:`_build`); after a comma,
        the rest of the innermost container is one step if it ends in this text
        (:meth:`_rest`); a container that does not end in this text is opened and read on.
        It stops, consuming nothing the handlers would not, at what it leaves to them: a
        string, number or literal cut by the end of the text (a number is final only before
        a delimiter), an escaped key, or an error (so that they find and word it). A scan
        that fails costs up to the rest of the text: at most one fails per nesting level and
        fragment (``_reach``), so the work stays linear.
        """
        n = len(text)
        stack = self._stack
        while i < n:
            char = text[i]
            if char in _WS:
                i = _run_end(_WS_RUN, text, i + 1) if text[i + 1 : i + 2] in _WS else i + 1
                if i == n:
                    return i
                char = text[i]
            state = self._state
            if state == _AFTER_VALUE:
                top = stack[-1]
                in_object = type(top) is dict
                if char != ",":
                    if char == ("}" if in_object else "]"):
                        i = self._close_container(i)
                        continue
                    return i
                if len(stack) > self._reach and text.find("}" if in_object else "]", i) >= 0:
                    j = self._rest(text, i)
                    if j > i:
                        i = j
                        continue
                i += 1
                if in_object:
                    state = _KEY
                else:
                    self._state = _VALUE
                    continue
            if state in (_KEY, _OBJECT_FIRST):
                match = _MEMBER_KEY.match(text, i)
                if match is None:
                    self._state = state
                    return i
                self._key = match.group(1)  # as the key's string and the colon would
                self._state = _VALUE
                i = match.end()
                if i == n:
                    return i
                char = text[i]
            elif state == _COLON:
                if char != ":":
                    return i
                self._state = _VALUE
                i += 1
                continue
            elif state == _END:
                return i
            # A value starts at text[i].
            j = self._value(text, i)
            if j == i:
                return i
            i = j
        return i

    def _value(self, text: str, i: int) -> int:
        """The value at ``text[i]``, a step of :meth:`_structure`: return where it stops."""
        stack = self._stack
        char = text[i]
        if char in "{[":
            if len(stack) >= self._reach and text.find("}" if char == "{" else "]", i) >= 0:
                j = self._whole(text, i)
                if j > i:
                    return j
            return self._open_container(text, i)  # (or fails, at i)
        if char == '"' and text.find('"', i + 1) < 0:  # it cannot end here
            return i
        try:
            value, end = _scan_value(text, i)
        except _SCAN_ERRORS:  # cut by the end of the text, or invalid
            return i
        kind = type(value)
        if (kind is int or kind is float) and (end == len(text) or text[end] not in _DELIMITERS):
            return i  # 12 may become 123
        if stack:
            top = stack[-1]
            if isinstance(top, dict):
                key = self._key
                top[key] = value
                pointer = f"{self._pointers[-1]}/{key.replace('~', '~0').replace('/', '~1')}"
            else:
                pointer = f"{self._pointers[-1]}/{len(top)}"
                top.append(value)
            self._state = _AFTER_VALUE
        else:
            self._root = value
            pointer = ""
            self._state = _END
            self._complete = True
        out = self._out
        if kind is str:
            out.append(PathDelta(path=pointer, op="set", value=""))
            if value:
                out.append(PathDelta(path=pointer, op="append", value=value))
            out.append(PathDelta(path=pointer, op="end", value=None))
        else:
            out.append(PathDelta(path=pointer, op="set", value=value))
        return end

    def _whole(self, text: str, i: int) -> int:
        """Read the object or array at ``text[i]`` in one step if it ends in this text.

        Returns where it ends, or ``i`` with nothing changed if it does not end here (then no
        container this deep ends here: ``_reach``), if it is invalid, or if it nests deeper
        than ``max_depth``.
        """
        try:
            value, end = _scan_value(text, i)
        except _SCAN_ERRORS:
            self._reach = len(self._stack) + 1
            return i
        out = self._out
        mark = len(out)
        try:
            value = self._build(self._child_pointer(), value, len(self._stack) + 1, out)
        except (_TooDeep, RecursionError):
            del out[mark:]
            return i
        self._place(value)
        self._value_done()
        return end

    def _rest(self, text: str, i: int) -> int:
        """After the comma at ``text[i]``: read the rest of the innermost container in one step.

        As :meth:`_whole`, for the members or elements that follow the comma and the closing
        bracket: the scanner reads them as a container of their own.
        """
        top = self._stack[-1]
        is_object = type(top) is dict
        j = _run_end(_WS_RUN, text, i + 1)
        if j == len(text) or (text[j] != '"' if is_object else text[j] == "]"):
            return i  # (a comma before the closing bracket is an error: the handlers say so)
        try:
            value, end = _scan_value(("{" if is_object else "[") + text[j:], 0)
        except _SCAN_ERRORS:
            self._reach = len(self._stack)
            return i
        out = self._out
        mark = len(out)
        pointer = self._pointers[-1]
        depth = len(self._stack) + 1
        build = self._build
        try:
            if is_object:
                members = [
                    (
                        key,
                        build(
                            f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}",
                            item,
                            depth,
                            out,
                        ),
                    )
                    for key, item in value
                ]
            else:
                elements = [
                    build(f"{pointer}/{index}", item, depth, out)
                    for index, item in enumerate(value, len(top))
                ]
        except (_TooDeep, RecursionError):
            del out[mark:]
            return i
        if is_object:
            top.update(members)  # type: ignore[union-attr]  # in order: the last duplicate wins
        else:
            top.extend(elements)  # type: ignore[union-attr]
        return self._close_container(end + j - 2)  # (the bracket: end - 1 in the scanned text)

    def _build(self, pointer: str, value: Any, depth: int, out: list[PathDelta]) -> object:
        """Report a complete value read by the C scanner; return it as the snapshot holds it.

        The deltas are those the handlers would send for its text (objects arrive as their
        pairs, so a duplicate key is a second ``set``); ``depth`` is the nesting of ``value``
        if it is a container. Raises :class:`_TooDeep` over ``max_depth``.
        """
        kind = type(value)
        if kind is str:
            out.append(PathDelta(path=pointer, op="set", value=""))
            if value:
                out.append(PathDelta(path=pointer, op="append", value=value))
            out.append(PathDelta(path=pointer, op="end", value=None))
            return value
        if kind is tuple:  # an object, as its (key, value) pairs
            if depth > self._max_depth:
                raise _TooDeep
            out.append(PathDelta(path=pointer, op="set", value={}))
            members: dict[str, object] = {}
            for key, item in value:
                child = f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"
                members[key] = self._build(child, item, depth + 1, out)
            out.append(PathDelta(path=pointer, op="end", value=None))
            return members
        if kind is list:
            if depth > self._max_depth:
                raise _TooDeep
            out.append(PathDelta(path=pointer, op="set", value=[]))
            elements: list[object] = []
            for index, item in enumerate(value):
                elements.append(self._build(f"{pointer}/{index}", item, depth + 1, out))
            out.append(PathDelta(path=pointer, op="end", value=None))
            return elements
        out.append(PathDelta(path=pointer, op="set", value=value))
        return value

    # ------------------------------------------------------------------ values

    def _child_pointer(self) -> str:
        """Pointer of the value about to be placed in the innermost container."""
        if not self._stack:
            return ""
        top = self._stack[-1]
        if isinstance(top, dict):
            return f"{self._pointers[-1]}/{_pointer_token(self._key)}"
        return f"{self._pointers[-1]}/{len(top)}"

    def _place(self, value: object) -> str:
        """Put a new value in the innermost container (or at the root); return its pointer."""
        if not self._stack:
            self._root = value
            return ""
        top = self._stack[-1]
        if isinstance(top, dict):
            top[self._key] = value
            return f"{self._pointers[-1]}/{_pointer_token(self._key)}"
        top.append(value)
        return f"{self._pointers[-1]}/{len(top) - 1}"

    def _value_done(self) -> None:
        if self._stack:
            self._state = _AFTER_VALUE
        else:
            self._state = _END
            self._complete = True

    def _set_scalar(self, value: object) -> None:
        self._out.append(PathDelta(path=self._place(value), op="set", value=value))
        self._value_done()

    def _end_number(self, text: str, end: int) -> None:
        """The number ends before ``text[end]`` (a delimiter, or the end of the text)."""
        number = "".join(self._num)
        self._num = []
        if _NUMBER_SYNTAX.fullmatch(number) is None:
            self._fail("invalid number ending", text, end)
            return
        is_float = "." in number or "e" in number or "E" in number
        try:
            value = float(number) if is_float else int(number)
        except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
            self._fail("number with too many digits ending", text, end)
            return
        self._set_scalar(value)

    def _open_container(self, text: str, i: int) -> int:
        char = text[i]
        if len(self._stack) >= self._max_depth:
            return self._fail(f"nesting deeper than {self._max_depth}", text, i)
        container: Container = {} if char == "{" else []
        pointer = self._place(container)
        self._out.append(PathDelta(path=pointer, op="set", value={} if char == "{" else []))
        self._stack.append(container)
        self._pointers.append(pointer)
        self._state = _OBJECT_FIRST if char == "{" else _ARRAY_FIRST
        return i + 1

    def _close_container(self, i: int) -> int:
        self._stack.pop()
        self._out.append(PathDelta(path=self._pointers.pop(), op="end", value=None))
        self._value_done()
        return i + 1

    # ------------------------------------------------------------------ strings

    def _open_string(self, *, is_key: bool) -> None:
        self._state = _STRING  # _pieces, _blocks, _cache: the last string emptied them
        self._str_is_key = is_key
        if is_key:
            return
        self._str_pointer = self._place("")
        top = self._stack[-1] if self._stack else None
        self._str_parent = top
        self._str_slot = self._key if isinstance(top, dict) else len(top or ()) - 1
        self._out.append(PathDelta(path=self._str_pointer, op="set", value=""))

    def _add(self, text: str) -> None:
        """Append decoded text to the open string (a waiting high surrogate goes first)."""
        if self._high:  # the next character is not its low half: keep it alone, as json does
            text = self._high + text
            self._high = ""
        if not text:
            return
        self._pieces.append(text)
        if not self._str_is_key:
            self._parts.append(text)

    def _add_body(self, body: str) -> None:
        """Add content whose escapes are all complete, decoded in C by the json module.

        Only a surrogate pair split between two bodies needs care: a waiting high surrogate
        pairs with a low surrogate escape opening this body, and a high surrogate escape closing
        this body waits for the next one.
        """
        if "\\" not in body:
            self._add(body)
            return
        decoded = _scanstring(body + '"', 0)[0]
        if self._high and _LOW_SURROGATE_ESCAPE.match(body) is not None:
            decoded = _pair(self._high, decoded[0]) + decoded[1:]
            self._high = ""
        last = decoded[-1]
        if "\ud800" <= last <= "\udbff" and body[-1] != last:  # it came from an escape
            self._add(decoded[:-1])
            self._high = last
        else:
            self._add(decoded)

    def _code_unit(self, unit: int) -> None:
        """Add one decoded \\uXXXX code unit, pairing surrogates as :func:`json.loads` does."""
        if self._high and 0xDC00 <= unit <= 0xDFFF:
            pair = _pair(self._high, chr(unit))
            self._high = ""
            self._add(pair)
        elif 0xD800 <= unit <= 0xDBFF:
            self._add("")  # a previous high surrogate stays alone
            self._high = chr(unit)
        else:
            self._add(chr(unit))

    def _compact(self) -> None:
        # (Without keep_values a value's pieces are dropped: its deltas are out. _on_string may
        # then read the rest of the string as if whole, which makes the same deltas.)
        if self._keep or self._str_is_key:
            self._blocks.append("".join(self._pieces))
        self._pieces.clear()

    def _joined(self) -> str:
        """The string so far as one str (kept as the only block, so repeated calls are cheap)."""
        if self._pieces:
            self._compact()
        joined = "".join(self._blocks)  # returns a lone block itself, without a copy
        self._blocks = [joined]
        return joined

    def _install(self, value: str) -> None:
        parent = self._str_parent
        if parent is None:
            self._root = value
        elif isinstance(parent, dict):
            parent[cast(str, self._str_slot)] = value
        else:
            parent[cast(int, self._str_slot)] = value

    def _close_string(self, whole: str | None = None) -> None:
        """The closing quote was read; ``whole`` is the string if it had no pieces yet."""
        if whole is None:
            value = self._joined() if self._keep or self._str_is_key else ""
            self._pieces, self._blocks = [], []
        else:
            value = whole
        if self._str_is_key:
            self._key = value
            self._state = _COLON
            return
        if self._keep:
            self._install(value)
        if whole:
            self._parts.append(whole)
        if self._parts:
            self._out.append(
                PathDelta(path=self._str_pointer, op="append", value="".join(self._parts))
            )
            self._parts = []
        self._out.append(PathDelta(path=self._str_pointer, op="end", value=None))
        self._cache.clear()
        self._value_done()


# Indexed by state. Plain functions rather than bound methods kept on the instance, which would
# make every parser a reference cycle (freed only by the cyclic GC, with its whole value).
_HANDLERS: Final = (
    PartialJSON._on_value,  # _VALUE
    PartialJSON._on_value,  # _ARRAY_FIRST
    PartialJSON._on_key,  # _OBJECT_FIRST
    PartialJSON._on_key,  # _KEY
    PartialJSON._on_colon,
    PartialJSON._on_after_value,
    PartialJSON._on_end,
    PartialJSON._on_string,
    PartialJSON._on_escape,
    PartialJSON._on_unicode,
    PartialJSON._on_number,
    PartialJSON._on_literal,
)
