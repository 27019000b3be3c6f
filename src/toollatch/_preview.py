"""The preview channel: a lenient, redacted, throttled view of calls still streaming.

Theory of operation: a UI wants "writing notes.md…" while a call's arguments stream, long
before the call may run. For each open call the assembler keeps a :class:`PreviewTracker`. In
``none`` mode (the default) it only counts bytes. In ``fields`` and ``full`` modes it feeds each
fragment to an incremental :class:`PartialJSON` parser (linear time, never re-parses), filters
the resulting path deltas through the tool's redaction rule and a value redactor, coalesces
them, and releases a :class:`PreviewUpdated` every ``every_bytes`` bytes or when a value starts
or ends. Previews are a type of their own: nothing converts one into a
:class:`~toollatch.CommittedCall`, and the gate refuses anything but argument text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from ._errors import ConfigError
from ._events import CallKey
from ._partial_json import PartialJSON, PathDelta

PreviewMode: TypeAlias = Literal["none", "fields", "full"]
Redactor: TypeAlias = Callable[[str, str], str]
"""``redactor(pointer, text) -> shown text``, applied to every complete string value shown."""

REDACTED = "[redacted]"
"""What a masked value shows in ``fields`` mode."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPreview:
    """How much of one tool's arguments a preview may show."""

    mode: PreviewMode = "none"
    """``none``: tool name and byte count only; ``fields``: only the JSON pointers in
    ``fields`` (and the containers leading to them), other values show as ``[redacted]``;
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
    """Optional hook over every string value before it leaves the core (e.g. to mask things
    that look like secrets). With a redactor, strings are shown only once complete, so a
    secret split across fragments is always seen whole."""
    every_bytes: int = 256
    """Release an update after at least this many argument bytes..."""
    on_structure: bool = True
    """...or as soon as a value starts or ends (a new key, a finished string)."""

    def __post_init__(self) -> None:
        if not isinstance(self.every_bytes, int) or self.every_bytes < 1:
            raise ConfigError(f"every_bytes must be a positive integer, got {self.every_bytes!r}")

    def rule(self, name: str | None) -> ToolPreview:
        """The rule for a tool name (the default for unknown or missing names)."""
        return self.tools.get(name, self.default) if name else self.default


@dataclass(frozen=True, slots=True, kw_only=True)
class PreviewUpdated:
    """Notice: what a UI may show of a call that is still streaming. Never executable."""

    key: CallKey
    """The call's identity in its round."""
    call_id: str | None
    """Provider call id, if known yet."""
    name: str | None
    """Tool name, if known yet."""
    bytes_so_far: int
    """UTF-8 bytes of argument text received."""
    deltas: tuple[PathDelta, ...]
    """Changes since the previous update, after redaction (empty in ``none`` mode)."""
    provisional: frozenset[str]
    """Visible pointers whose value may still change (the growing edge)."""
    final: bool = False
    """True on the last update of the call (closed, failed or round over)."""
    error: str | None = None
    """Why the preview stopped early (malformed text), if it did; says nothing about commit."""


class PreviewTracker:
    """One call's preview state (internal to the assembler)."""

    __slots__ = ("_every", "_filter", "_last", "_parser", "_pending", "_policy", "_rule", "nbytes")

    def __init__(self, policy: PreviewPolicy, name: str | None, *, max_depth: int) -> None:
        self._policy = policy
        self._rule = policy.rule(name)
        self._parser = PartialJSON(max_depth=max_depth) if self._rule.mode != "none" else None
        self._filter = _Filter(self._rule, policy.redactor)
        self._pending: list[PathDelta] = []
        self._every = policy.every_bytes
        self._last = 0
        self.nbytes = 0

    def feed(self, fragment: str, size: int) -> bool:
        """Take one fragment of ``size`` bytes; True when an update is due."""
        self.nbytes += size
        structural = False
        if self._parser is not None and self._parser.failed is None:
            for delta in self._filter.apply(self._parser.feed(fragment)):
                structural = structural or delta.op != "append"
                self._pending.append(delta)
        due = self.nbytes - self._last >= self._every
        return due or (structural and self._policy.on_structure) or self._last == 0

    def release(
        self, key: CallKey, call_id: str | None, name: str | None, *, final: bool = False
    ) -> PreviewUpdated:
        """The update carrying everything pending (coalesced)."""
        if final and self._parser is not None and self._parser.failed is None:
            self._pending += self._filter.apply(self._parser.finish())
        self._last = max(self.nbytes, 1)
        deltas, self._pending = _coalesce(self._pending), []
        parser = self._parser
        return PreviewUpdated(
            key=key,
            call_id=call_id,
            name=name,
            bytes_so_far=self.nbytes,
            deltas=deltas,
            provisional=frozenset()
            if final or parser is None
            else self._filter.visible_paths(parser.provisional),
            final=final,
            error=parser.failed if parser is not None else None,
        )


class _Filter:
    """Redaction of path deltas by a tool rule and an optional string redactor."""

    __slots__ = ("_fields", "_full", "_masked", "_redactor", "_strings")

    def __init__(self, rule: ToolPreview, redactor: Redactor | None) -> None:
        self._full = rule.mode == "full"
        self._fields = rule.fields
        self._redactor = redactor
        self._masked: set[str] = set()  # topmost masked pointers
        self._strings: dict[str, list[str]] = {}  # held strings (redactor on)

    def apply(self, deltas: list[PathDelta]) -> list[PathDelta]:
        out: list[PathDelta] = []
        for delta in deltas:
            verdict = "show" if self._full else self._verdict(delta)
            if verdict == "show":
                out += self._redact(delta)
            elif verdict == "mask" and delta.op == "set":
                self._masked.add(delta.path)
                out.append(PathDelta(path=delta.path, op="set", value=REDACTED))
        return out

    def visible_paths(self, paths: frozenset[str]) -> frozenset[str]:
        if self._full:
            return paths
        return frozenset(p for p in paths if self._place(p) != "mask")

    def _verdict(self, delta: PathDelta) -> str:
        place = self._place(delta.path)
        if place == "ancestor":  # a container leading to a shown field
            return "show" if isinstance(delta.value, dict | list) or delta.op == "end" else "mask"
        if place == "mask" and _parent(delta.path) in self._masked | {None}:
            return "drop"
        if place == "mask" and any(delta.path.startswith(m + "/") for m in self._masked):
            return "drop"
        return place

    def _place(self, path: str) -> str:
        for pointer in self._fields:
            if path == pointer or path.startswith(pointer + "/"):
                return "show"
            if path == "" or pointer.startswith(path + "/"):
                return "ancestor"
        return "mask"

    def _redact(self, delta: PathDelta) -> list[PathDelta]:
        if self._redactor is None:
            return [delta]
        held = self._strings.get(delta.path)
        if delta.op == "set" and isinstance(delta.value, str):
            self._strings[delta.path] = [delta.value]
            return []
        if delta.op == "append" and held is not None:
            held.append(str(delta.value))
            return []
        if delta.op == "end" and held is not None:
            del self._strings[delta.path]
            text = self._redactor(delta.path, "".join(held))
            return [PathDelta(path=delta.path, op="set", value=text), delta]
        return [delta]


def _parent(path: str) -> str | None:
    return path.rsplit("/", 1)[0] if path else None


def _coalesce(deltas: list[PathDelta]) -> tuple[PathDelta, ...]:
    """Merge runs of appends to the same path, joining each run once (linear)."""
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
        out[-1] = PathDelta(path=out[-1].path, op="append", value="".join(run))
