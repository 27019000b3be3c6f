"""The preview channel: a lenient, redacted, throttled view of calls still streaming.

Theory of operation: a UI wants "writing notes.md…" while a call's arguments stream, long
before the call may run. For each open call the assembler keeps a :class:`PreviewTracker`. In
``none`` mode (the default) it only counts bytes. In ``fields`` and ``full`` modes it feeds the
text to an incremental :class:`PartialJSON` parser (linear time, never re-parses), filters
the resulting path deltas through the tool's redaction rule and a redactor of keys and strings,
coalesces them, and releases a :class:`PreviewUpdated` every ``every_bytes`` bytes or when a
shown value starts or ends (the contract: :attr:`PreviewPolicy.on_structure`). The parser is
fed lazily: string text that cannot end its string is held and parsed in one piece when an
update is due or a fragment may start or end a value, so updates come at exactly the fragments
where parsing each fragment would release them, with the same content, while the parser runs
about once per update instead of once per fragment (:class:`PreviewTracker`; providers send
3-20 characters per event, the default update is every 256 bytes). Previews are a type of
their own: nothing converts one into a
:class:`~toollatch.CommittedCall`, and the gate refuses anything but argument text.

What a ``fields`` preview does not show, it does not hint at either: a member outside the
allowed fields is left out whole (its key, its value, its size and that it exists), so no
pointer, ``provisional`` entry or extra update names or counts it; only the bytes received and
where a parse failed are told. Each delta is filtered in constant time plus its pointer's
length, so a preview stays linear in the argument text however many members it masks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from ._errors import ConfigError
from ._events import CallKey
from ._partial_json import PartialJSON, PathDelta, _delta, _pointer_token

PreviewMode: TypeAlias = Literal["none", "fields", "full"]
Redactor: TypeAlias = Callable[[str, str], str]
"""``redactor(pointer, text) -> shown text``, applied to every complete string value shown and
to every object key shown (see :attr:`PreviewPolicy.redactor` for the pointer each gets)."""

REDACTED = "[redacted]"
"""What an array element before a shown one shows in ``fields`` mode (its index is told by
the shown element's pointer anyway; nothing else masked is shown at all)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPreview:
    """How much of one tool's arguments a preview may show."""

    mode: PreviewMode = "none"
    """``none``: tool name and byte count only; ``fields``: only the JSON pointers in
    ``fields`` and the objects and arrays leading to them; every other member is left out,
    its key name too (an array element before a shown one shows as ``[redacted]``);
    ``full``: every value."""
    fields: tuple[str, ...] = ()
    """RFC 6901 pointers shown in ``fields`` mode (a pointer shows its whole subtree)."""

    def __post_init__(self) -> None:
        if self.mode not in ("none", "fields", "full"):
            raise ConfigError(f"preview mode must be none, fields or full, not {self.mode!r}")
        for pointer in self.fields:
            if not pointer.startswith("/"):
                raise ConfigError(f"preview field {pointer!r} is not a JSON pointer ('/a/b')")


@dataclass(frozen=True, slots=True, kw_only=True)
class PreviewPolicy:
    """Which previews the assembler produces, how often, and how they are redacted."""

    default: ToolPreview = field(default_factory=ToolPreview)
    """Rule for tools not listed in ``tools`` (and calls whose name is not known yet)."""
    tools: Mapping[str, ToolPreview] = field(default_factory=dict)
    """Per-tool rules by tool name."""
    redactor: Redactor | None = None
    """Optional hook over every string value and object key before it leaves the core (e.g. to
    mask things that look like secrets). With a redactor, strings are shown only once complete,
    so a secret split across fragments is always seen whole (keys always are).

    It gets pointers as the model wrote them (before any key redaction): for a string value,
    the value's own pointer (``redactor("/token", "sk-...")``); for a key, the pointer of the
    object holding it (``redactor("", "token")`` for a top-level key, ``redactor("/env",
    "HOME")`` inside ``/env``), so a rule written for a value's pointer never hides its key.
    A key is shown as the text returned, escaped as a pointer token; two keys redacted alike
    share a pointer, as duplicate keys do."""
    every_bytes: int = 256
    """Release an update after at least this many argument bytes..."""
    on_structure: bool = True
    """...or as soon as a value starts or ends (a new key, a finished string).

    The contract a UI can rely on: a call's first fragment releases an update; after that, the
    fragment that brings the bytes since the last update to ``every_bytes``, and (with
    ``on_structure``) a fragment in which a shown value starts or ends, each release one; the
    call's close (or failure, or the round's end) releases a ``final`` one. Every update
    carries all the changes up to and including the fragment that released it, so the latest
    update always reflects all the text received so far, and between updates nothing is owed.
    How the text is parsed in between (held and parsed in one piece) is not observable."""

    def __post_init__(self) -> None:
        if not isinstance(self.every_bytes, int) or self.every_bytes < 1:
            raise ConfigError(f"every_bytes must be a positive integer, got {self.every_bytes!r}")

    def rule(self, name: str | None) -> ToolPreview:
        """The rule for a tool name (the default for unknown or missing names)."""
        return self.tools.get(name, self.default) if name else self.default


@dataclass(frozen=True, slots=True, kw_only=True)
class PreviewUpdated:
    """A call update: what a UI may show of a call that is still streaming. Never executable."""

    key: CallKey
    """The call's identity in its round."""
    call_id: str | None
    """Provider call id, if known yet."""
    name: str | None
    """Tool name, if known yet."""
    bytes_so_far: int
    """UTF-8 bytes of argument text received."""
    deltas: tuple[PathDelta, ...]
    """Changes since the previous update, after redaction (empty in ``none`` mode); pointers
    carry the keys as redacted."""
    provisional: frozenset[str]
    """Shown pointers whose value may still change (the growing edge; with a redactor, not a
    string still held back)."""
    final: bool = False
    """True on the last update of the call (closed, failed or round over)."""
    error: str | None = None
    """Why the preview stopped early (malformed text), if it did; says nothing about commit."""

    @classmethod
    def of(
        cls,
        key: CallKey,
        call_id: str | None,
        name: str | None,
        bytes_so_far: int,
        deltas: tuple[PathDelta, ...],
        provisional: frozenset[str],
        final: bool,
        error: str | None,
    ) -> PreviewUpdated:
        """``PreviewUpdated(key=key, ...)``, positionally, in the order of the fields."""
        return cls(
            key=key,
            call_id=call_id,
            name=name,
            bytes_so_far=bytes_so_far,
            deltas=deltas,
            provisional=provisional,
            final=final,
            error=error,
        )


class PreviewTracker:
    """One call's preview state (internal to the assembler).

    The parser is fed lazily, and an update is released at exactly the fragments where an
    eager parser would release one. Fragments are held (not parsed) while the parser is inside
    a string and they hold no ``"`` that may end it (:func:`quotes_escaped`): there, text can
    only grow the string (or be malformed), so it cannot start or end a value, and no update is
    due before ``every_bytes`` (or at all, without ``on_structure``). At a fragment
    that may change structure, or when an update is due, the held text is fed to the parser in
    one piece: the deltas are those of the fragments one by one, with adjacent appends merged
    (:class:`PathDelta`), which :func:`_coalesce` merges anyway. So a release reflects all the
    text so far and the work per fragment on the quiet path is a few operations; the parser does
    its linear work in pieces of about ``every_bytes`` or larger.
    """

    __slots__ = (
        "_before",
        "_due",
        "_error",
        "_every",
        "_filter",
        "_moved",
        "_on_structure",
        "_parser",
        "_pending",
        "_provisional",
        "_quiet",
        "_rule",
        "held",
        "nbytes",
        "quiet_below",
    )

    def __init__(self, policy: PreviewPolicy, name: str | None, *, max_depth: int) -> None:
        self._rule = policy.rule(name)
        self._parser = (
            PartialJSON(max_depth=max_depth, keep_values=False)
            if self._rule.mode != "none"
            else None
        )
        self._filter = _Filter(self._rule, policy.redactor)
        self._pending: list[PathDelta] = []
        self._error: str | None = None  # the parser's failed, as of its last feed or finish
        self.held: list[str] | None = [] if self._parser is not None else None
        """Text not parsed yet, or None when nothing is parsed (none mode, or failed)."""
        self._before = ""  # the last two characters parsed (see _may_end)
        # Held text cannot change structure (see the class docstring), or nothing is held.
        self._quiet = self.held is None
        self._on_structure = policy.on_structure
        self._every = policy.every_bytes
        self._due = 0  # bytes at which an update is due (the first fragment releases one)
        self.quiet_below = -1
        """The byte count at which an update is due, while fragments below it need no call:
        with text held, while the parser is in a string (or structure does not matter), for
        a fragment without ``"``, or whose every ``"`` is escaped (:func:`quotes_escaped`)
        (it can only grow that string, and ``feed`` would just hold it: the assembler appends
        it to :attr:`held` itself); with nothing held (``none``
        mode, or the parser failed), for any fragment (``feed`` would just count it); else
        -1. The assembler then tells :attr:`nbytes` at the next call (``feed`` takes it, and
        it sets the attribute before a final ``release``)."""
        self._provisional: frozenset[str] = frozenset()  # as last released...
        self._moved = True  # ...unless a value started or ended since (then recomputed)
        self.nbytes = 0
        """The call's argument bytes, as of the last :meth:`feed` (the assembler's count)."""

    def feed(self, fragment: str, nbytes: int) -> bool:
        """Take one fragment, after which the call has ``nbytes`` bytes of argument text;
        True when an update is due."""
        self.nbytes = nbytes
        held = self.held
        if held is None:
            return nbytes >= self._due
        held.append(fragment)
        if nbytes < self.quiet_below and ('"' not in fragment or not self._may_end(held)):
            return False
        return self._catch_up(held)

    def _may_end(self, held: list[str]) -> bool:
        """Whether a quote in the last held fragment may end the string: unless every quote
        is escaped, judged with the two characters before the fragment (:func:`_escaped`)."""
        before = held[-2] if len(held) > 1 else self._before
        if len(before) < 2 and len(held) > 1:  # (a one-character fragment before it)
            before = (held[-3] if len(held) > 2 else self._before) + before
        return not _escaped(before[-2:], held[-1])

    def _catch_up(self, held: list[str]) -> bool:
        """Parse the held text; True when an update is due (by bytes, or a value started or
        ended in the last fragment: the held ones before it were quiet)."""
        parser = self._parser
        assert parser is not None  # (text is held only for a parser)
        text = held[0] if len(held) == 1 else "".join(held)
        held.clear()
        self._before = text[-2:] if len(text) > 1 else self._before[-1:] + text
        deltas = parser.feed(text)
        if len(deltas) != 1 or deltas[0].op != "append":  # (one append: the common case)
            self._moved = True
        shown = deltas if self._filter.passes else self._filter.apply(deltas)
        self._pending += shown
        self._error = error = parser.failed
        if error is not None:
            self.held = None  # a failed parser takes nothing more (and holds nothing)
            self._quiet = True  # (only the byte count matters now)
        elif not self._quiet or '"' in text:  # (else still in the string: see in_string)
            # (without on_structure only the byte count releases: every fragment may wait)
            self._quiet = parser.in_string or not self._on_structure
        self.quiet_below = self._due if self._quiet else -1
        if self.nbytes >= self._due:
            return True
        if self._on_structure:
            for delta in shown:
                if delta.op != "append":
                    return True
        return False

    def release(
        self, key: CallKey, call_id: str | None, name: str | None, *, final: bool = False
    ) -> PreviewUpdated:
        """The update carrying everything pending (coalesced); it reflects all the text fed."""
        parser = self._parser
        held = self.held
        if held:
            self._catch_up(held)
        if final and parser is not None and self._error is None:
            self._pending += self._filter.apply(parser.finish())
            self._error = parser.failed
            self.held = None
        nbytes = self.nbytes
        self._due = due = (nbytes if nbytes > 0 else 1) + self._every
        self.quiet_below = due if self._quiet else -1
        pending = self._pending
        self._pending = []
        # (one delta or none, the common case, needs no merging: see _coalesce)
        deltas = tuple(pending) if len(pending) < 2 else _coalesce(pending)
        if final or parser is None:
            provisional = _NO_POINTERS
        else:
            provisional = self._shown_edge(parser) if self._moved else self._provisional
        error = self._error
        return PreviewUpdated(
            key=key,
            call_id=call_id,
            name=name,
            bytes_so_far=nbytes,
            deltas=deltas,
            provisional=provisional,
            final=final,
            error=error,
        )

    def _shown_edge(self, parser: PartialJSON) -> frozenset[str]:
        """The provisional pointers, recomputed only when a value started or ended since the
        last update (appends to the growing string change nothing there)."""
        if self._moved:
            self._provisional = self._filter.provisional(parser)
            self._moved = False
        return self._provisional


def _escaped(before: str, fragment: str) -> bool:
    """True if every ``"`` in ``fragment``, string text that follows ``before`` (the two
    characters before it, or fewer at the start), is escaped and so cannot end the string
    (see :func:`quotes_escaped`)."""
    return quotes_escaped(before + fragment, len(before), len(before) + len(fragment))


def quotes_escaped(text: str, start: int, end: int) -> bool:
    """True if every ``"`` in ``text[start:end]``, string text, is escaped and so cannot end
    the string, judged with the text before it in ``text``.

    A quote is escaped here when an odd number of backslashes precede it and a character
    other than a backslash, known, precedes them: the first of them then starts an escape
    whatever the string's state before it, so they pair up from there and the last one
    escapes the quote (or the text is malformed, a failure, never a new value). Any other
    quote (after an even number, or too near the start of ``text`` to tell) counts as one
    that may end the string.
    """
    i = text.find('"', start, end)
    while i >= 0:
        j = i - 1
        while j >= 0 and text[j] == "\\":
            j -= 1
        if j < 0 or (i - j) % 2:  # (i - j - 1 backslashes: the start, or an even number)
            return False
        i = text.find('"', i + 1, end)
    return True


_SHOW: Final = 0  # an allowed field or inside one (every value in full mode): shown whole
_LEAD: Final = 1  # an object or array leading to an allowed field: shown, its members filtered


class _Filter:
    """What a preview shows of the parser's deltas: the rule's fields, with keys and strings
    passed through the redactor.

    The parser sends a value's ``set`` after its container's and before the container's
    ``end``, so a value's fate follows from its parent's: ``_open`` keeps the shown values that
    may still get deltas (at most one per nesting level) and each delta costs a dict lookup and
    the length of its pointer, never a scan of what was shown or masked before. A value whose
    parent is not in ``_open`` was not shown, and neither is anything inside it.
    """

    __slots__ = ("_ancestors", "_fields", "_lengths", "_open", "_redactor", "_strings", "passes")

    def __init__(self, rule: ToolPreview, redactor: Redactor | None) -> None:
        full = rule.mode == "full"
        self.passes = full and redactor is None
        """Every delta is shown as the parser made it (``apply`` returns its argument)."""
        self._fields = frozenset(rule.fields)
        # The containers leading to an allowed field: every proper prefix of a field pointer
        # ("" for the root); in full mode the root is shown whole instead.
        self._ancestors = frozenset(
            field[:i] for field in rule.fields for i, c in enumerate(field) if c == "/"
        )
        self._redactor = redactor
        # raw pointer -> (shown pointer, place, is an array), for the open strings and
        # containers shown: the growing edge, bounded by the depth.
        self._open: dict[str, tuple[str, int, bool]] = {}
        if full:
            self._open[_ROOT_PARENT] = ("", _SHOW, False)
        elif self._ancestors:
            self._open[_ROOT_PARENT] = ("", _LEAD, False)
        self._strings: dict[str, tuple[str, list[str]]] = {}  # held strings (redactor on)
        self._lengths: dict[str, int] = {}  # leading arrays: elements shown so far

    def apply(self, deltas: list[PathDelta]) -> list[PathDelta]:
        """The deltas a preview shows, in order, for the parser's next ``deltas``."""
        if self.passes:
            return deltas
        out: list[PathDelta] = []
        for delta in deltas:
            if delta.op == "set":
                self._set(delta, out)
                continue
            path = delta.path
            held = self._strings.get(path)
            if held is not None:
                if delta.op == "append":
                    held[1].append(str(delta.value))
                    continue
                del self._strings[path]
                shown, pieces = held
                assert self._redactor is not None  # (strings are held only for it)
                text = self._redactor(path, "".join(pieces))
                out += [_shown_delta(shown, "set", text), _shown_delta(shown, "end", None)]
                continue
            entry = self._open.get(path)
            if entry is None:
                continue  # inside a value not shown
            if delta.op == "end":
                del self._open[path]
                self._lengths.pop(path, None)
            out.append(delta if entry[0] == path else _shown_delta(entry[0], delta.op, delta.value))
        return out

    def provisional(self, parser: PartialJSON) -> frozenset[str]:
        """The shown pointers whose value may still change (a held string is not shown yet)."""
        if self.passes:
            return parser.provisional
        return frozenset(shown for raw, (shown, _, _) in self._open.items() if raw != _ROOT_PARENT)

    def _set(self, delta: PathDelta, out: list[PathDelta]) -> None:
        """A value starts: show it, under its shown pointer, or leave it out (its name too)."""
        path = delta.path
        parent_path, token = path.rsplit("/", 1) if path else (_ROOT_PARENT, "")
        parent = self._open.get(parent_path)
        if parent is None:
            return  # inside a value not shown
        parent_shown, parent_place, in_array = parent
        value = delta.value
        is_container = isinstance(value, dict | list)
        if parent_place == _SHOW or path in self._fields:
            place = _SHOW
        elif is_container and path in self._ancestors:
            place = _LEAD
        else:
            return  # masked: neither its name nor its value, nor that it exists
        if not path:
            shown = ""
        elif in_array:
            shown = f"{parent_shown}/{token}"
            if parent_place == _LEAD:
                # The elements before a shown one stand in as REDACTED: the shown element's
                # index tells that many exist anyway, and the array's length stays hidden.
                index = int(token)
                for hidden in range(self._lengths[parent_path], index):
                    out.append(_shown_delta(f"{parent_shown}/{hidden}", "set", REDACTED))
                self._lengths[parent_path] = index + 1
        else:
            shown = f"{parent_shown}/{self._key(parent_path, token)}"
        if isinstance(value, str) and self._redactor is not None:
            self._strings[path] = (shown, [value])  # shown once complete (see PreviewPolicy)
            return
        out.append(delta if shown == path else _shown_delta(shown, "set", value))
        if is_container or isinstance(value, str):
            self._open[path] = (shown, place, isinstance(value, list))
            if place == _LEAD and isinstance(value, list):
                self._lengths[path] = 0

    def _key(self, object_path: str, token: str) -> str:
        """The pointer token shown for a member's key: the key as the redactor shows it."""
        if self._redactor is None:
            return token
        key = token.replace("~1", "/").replace("~0", "~")
        return _pointer_token(self._redactor(object_path, key))


_NO_POINTERS: Final[frozenset[str]] = frozenset()

_ROOT_PARENT: Final = "#"
"""The slot of ``_Filter._open`` for the root's parent: not a pointer (those start with '/')."""


_shown_delta: Final = _delta


def _coalesce(deltas: list[PathDelta]) -> tuple[PathDelta, ...]:
    """Merge runs of appends to the same path, joining each run once (linear)."""
    if len(deltas) < 2:
        return tuple(deltas)
    out: list[PathDelta] = []
    run: list[str] = []
    for delta in deltas:
        if delta.op == "append" and run and out[-1].path == delta.path:
            run.append(str(delta.value))
            continue
        _close_run(out, run)
        out.append(delta)
        run = [str(delta.value)] if delta.op == "append" else []
    _close_run(out, run)
    return tuple(out)


def _close_run(out: list[PathDelta], run: list[str]) -> None:
    if len(run) > 1:
        out[-1] = _delta(out[-1].path, "append", "".join(run))
