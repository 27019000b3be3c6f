"""Tool results sized and redacted before they go anywhere (internal; public names in
:mod:`toollatch.runtime`).

Theory of operation. The dispatcher turns every :class:`ToolOutcome` into a
:class:`~toollatch.ToolResult` through :meth:`ResultShaper.tool_result`, before the result is
stored (memo, ledger), emitted (agent events, relay, logs) or written to the history, so none
of them ever holds more than the budget or a secret the redactor masks, or a text that is not
valid Unicode. Three steps, in order:

0. **Valid Unicode**: a lone surrogate (what ``os.listdir`` and ``os.fsdecode`` make of a
   file name that is not UTF-8, ``"\\udcff"``; what a JSON ``"\\udcff"`` escape decodes to)
   cannot be written as UTF-8, so no request body, JSON line or ledger record could hold
   it. Each one becomes U+FFFD (a surrogate *pair* becomes the character it encodes) and the
   result ends with a note saying how many were replaced (:func:`valid_unicode`). This is the
   one place results are made valid: a tool's text, its JSON (nested values and keys) and
   the message of an exception it raised all pass here.
1. **Redaction** with the ``redactor`` of a :class:`~toollatch.PreviewPolicy` (the object the
   previews use; its ``mode``/``fields`` rules are not applied: they choose what a UI sees of
   *arguments*, while the model must read a result whole). See :func:`redact_result` for the
   pointer contract. It runs first so that the budget never cuts a secret in half and leaves
   its head visible to a redactor that would only recognise it whole. A redactor that raises
   or returns anything but a ``str`` fails closed: the result is replaced by a ``tool_error``
   result saying it was withheld (the exception's message, which may quote the secret, is
   neither sent nor logged; only its type is).
2. **The size budget**, in UTF-8 bytes (what a request body, the ledger and memory pay;
   characters would let a CJK or emoji result be 3-4 times the budget): see
   :func:`truncate_result`. Results toollatch makes itself (timeouts, cancellations, ledger
   errors) skip redaction but get the budget too (:meth:`ResultShaper.bounded`).

JSON results are cut as text, not re-shaped into smaller valid JSON: the model reads a result
as text either way, the head of a JSON text keeps the members a tool puts first, choosing which
members to drop is the tool's business (paginate, summarise), and the marker says the text is
cut. The cut never splits a code point, a surrogate pair, or a JSON escape (``\\n``,
``\\u00e9``, a ``\\ud83d\\ude00`` pair): a cut there backs off to before it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ..core._errors import ConfigError, ErrorCode
from ..core._preview import REDACTED, PreviewPolicy, Redactor
from ..core._redact import RedactionFailed, redact_result
from ..core._round import ToolResult
from ..core._secrets import redact_secrets

DEFAULT_MAX_RESULT_BYTES = 65_536
"""The default budget: 64 KiB of UTF-8, about 16k tokens of English, a sizeable but bounded
share of a 128k-token context window (several such results per round still fit)."""
MIN_RESULT_BYTES = 256
"""The smallest budget accepted: room for the marker (under 120 bytes) and some text."""
OFFLOAD_CHARS = 65_536
"""A result longer than this is redacted in a worker thread (``asyncio.to_thread``), so that
a redactor walking a large JSON result (about 40 ms per MiB, plus the redactor's own time)
does not hold up the event loop's streams."""

_log = logging.getLogger("toollatch.runtime")


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultLimits:
    """The size budgets of tool results, in UTF-8 bytes of the text the model reads.

    A call's budget is ``tools[name]`` when given (the deployer's word), else the tool's own
    ``@tool(max_result_bytes=...)``, else ``max_bytes``. Every budget is an ``int`` of at least
    :data:`MIN_RESULT_BYTES`; anything else is a ``ConfigError``.
    """

    max_bytes: int = DEFAULT_MAX_RESULT_BYTES
    """The budget of a tool that sets none."""
    tools: Mapping[str, int] = field(default_factory=dict)
    """Per-tool budgets by tool name, over the tools' own."""

    def __post_init__(self) -> None:
        check_budget("ResultLimits.max_bytes", self.max_bytes)
        if not isinstance(self.tools, Mapping):
            raise ConfigError(f"ResultLimits.tools must be a mapping, got {self.tools!r:.60}")
        for name, value in self.tools.items():
            if not isinstance(name, str):
                raise ConfigError(f"ResultLimits.tools keys are tool names, got {name!r:.60}")
            check_budget(f"ResultLimits.tools[{name!r}]", value)
        object.__setattr__(self, "tools", MappingProxyType(dict(self.tools)))

    def budget(self, name: str, declared: int | None = None) -> int:
        """The budget of a call of tool ``name`` whose tool declares ``declared`` (or None)."""
        own = self.tools.get(name)
        if own is not None:
            return own
        return declared if declared is not None else self.max_bytes


def check_budget(what: str, value: object) -> None:
    """``ConfigError`` unless ``value`` is an int of at least :data:`MIN_RESULT_BYTES`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < MIN_RESULT_BYTES:
        raise ConfigError(f"{what} must be an integer >= {MIN_RESULT_BYTES} bytes, got {value!r}")


class ResultShaper:
    """Applies a dispatcher's budgets and redaction to results (see the module docstring)."""

    __slots__ = ("limits", "redactor")

    def __init__(
        self,
        limits: ResultLimits | None,
        redaction: PreviewPolicy | None,
        redactor: Redactor | None = None,
    ) -> None:
        if limits is not None and not isinstance(limits, ResultLimits):
            raise ConfigError(f"result_limits must be a ResultLimits, got {limits!r:.60}")
        if redaction is not None and not isinstance(redaction, PreviewPolicy):
            raise ConfigError(f"redaction must be a PreviewPolicy, got {redaction!r:.60}")
        if redaction is not None and redactor is not None:
            raise ConfigError("pass redactor or redaction (a PreviewPolicy's redactor), not both")
        self.limits = limits or ResultLimits()
        self.redactor: Redactor | None = redaction.redactor if redaction else redactor
        if self.redactor is not None and not callable(self.redactor):
            raise ConfigError(f"the redactor must be callable, got {self.redactor!r:.60}")

    def heavy(self, result: ToolResult) -> bool:
        """True when shaping ``result`` is worth a worker thread (see :data:`OFFLOAD_CHARS`);
        the redactor must then be thread-safe (a pure function is)."""
        return self.redactor is not None and len(result.content) > OFFLOAD_CHARS

    def tool_result(self, result: ToolResult, budget: int) -> ToolResult:
        """``result`` (a tool's own text) made valid Unicode, redacted, then cut to
        ``budget``; a ``tool_error`` result when the redactor fails (fail closed)."""
        result, note = _valid(result)
        if self.redactor is not None:
            try:
                text = redact_result(result.content, self.redactor)
            except RedactionFailed as exc:
                _log.warning(
                    "the result redactor failed for call %s (%s): %s; the result was withheld",
                    result.tool_call_id, result.name, exc,
                )  # fmt: skip
                return self.bounded(_withheld(result, str(exc)), budget)
            if text is not result.content:
                result = replace(result, content=text)
        return _fit(result, budget, note)

    def bounded(self, result: ToolResult, budget: int) -> ToolResult:
        """``result`` made valid Unicode and cut to ``budget`` (unchanged when it is both
        already), no redaction."""
        result, note = _valid(result)
        return _fit(result, budget, note)


def _valid(result: ToolResult) -> tuple[ToolResult, str]:
    """``result`` in valid Unicode, and the note to end it with ("" when nothing changed)."""
    text, replaced = valid_unicode(result.content)
    if not replaced:
        return result, ""
    _log.warning(
        "the result of call %s (%s) held %d lone surrogate(s); replaced with U+FFFD",
        result.tool_call_id, result.name, replaced,
    )  # fmt: skip
    return replace(result, content=text), unicode_note(replaced)


def _fit(result: ToolResult, budget: int, note: str) -> ToolResult:
    """``result`` cut to ``budget`` with ``note`` (ASCII) kept after the cut."""
    text, original = _truncated(result.content, budget - len(note))
    if original is None:
        return replace(result, content=result.content + note) if note else result
    return replace(result, content=text + note, truncated_from=original)


def valid_unicode(text: str) -> tuple[str, int]:
    """``text`` with every lone surrogate replaced by U+FFFD and every surrogate pair joined
    into the character it encodes, and the number replaced (``(text, 0)``: ``text`` itself,
    already valid)."""
    if text.isascii():
        return text, 0
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return text, 0
    fixed = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return fixed, fixed.count("\ufffd") - text.count("\ufffd")


def unicode_note(replaced: int) -> str:
    """The text (ASCII) that ends a result in which ``replaced`` lone surrogates were
    replaced: it says so, and why."""
    return (
        f"\n[toollatch: {replaced} character(s) that were not valid Unicode (lone "
        "surrogates, e.g. from a file name that is not UTF-8) were replaced with U+FFFD]"
    )


def _withheld(result: ToolResult, kind: str) -> ToolResult:
    detail = (
        f"the tool ran to its end, but the result redactor failed ({kind}), so its result "
        "was withheld"
    )
    return made_error(result.tool_call_id, result.name, ErrorCode.TOOL_ERROR, detail)


PREVIEW_CHARS = 200
"""Longest result preview (characters) in ``tool_finished`` events and the terminal view."""
_PREVIEW_SCAN = 2
"""A preview redacts only the head of a long result, ``_PREVIEW_SCAN`` times its length: the
built-in redactor is linear in the text (measured: 0.02 ms for 400 characters, 0.3 ms for
16 KiB, 7.8 ms for a 92 KiB JSON walk), and a result's size has no bound a preview should pay
for on the event loop at every ``tool_finished``. A cut
head is not JSON, so it is redacted whole: a secret-looking span or a secret key's
assignment anywhere in it masks the whole preview (fail closed; ``--full-results`` redacts
the whole result and keeps its structure)."""


def result_preview(text: str, max_chars: int | None = PREVIEW_CHARS) -> str:
    """``text`` (a shaped result) as a preview may show it: through the built-in secret
    redactor (:func:`toollatch.relay.redact_secrets`, whatever redactor the run had), and
    cut to ``max_chars`` characters ending in ``…`` (None: whole, still redacted)."""
    scan = None if max_chars is None else max_chars * _PREVIEW_SCAN
    cut = scan is not None and len(text) > scan
    head = text[:scan] if cut else text
    try:
        shown = redact_result(head, redact_secrets)
    except RedactionFailed:  # pragma: no cover - the built-in redactor returns str
        return REDACTED
    if max_chars is not None and (cut or len(shown) > max_chars):
        shown = shown[: max_chars - 1] + "…"
    return shown


def made_error(tool_call_id: str, name: str, code: ErrorCode, detail: str) -> ToolResult:
    """An error result toollatch makes itself (no tool produced it): ``"<code>: <detail>."``."""
    return ToolResult(
        tool_call_id=tool_call_id,
        name=name,
        content=f"{code}: {detail}.",
        is_error=True,
        code=code,
    )


# -- the size budget -------------------------------------------------------------------------


def marker(kept: int, original: int) -> str:
    """The text that ends a truncated result (ASCII): it states both sizes."""
    return f"\n[toollatch: result truncated: the first {kept} of {original} bytes are shown]"


def truncate_result(text: str, max_bytes: int) -> tuple[str, int | None]:
    """``(text, None)`` when ``text`` is at most ``max_bytes`` UTF-8 bytes; else the longest
    head that fits with :func:`marker` appended, and the original size in bytes.

    The result is never longer than ``max_bytes`` bytes (marker included). Sizes count a lone
    surrogate as the three bytes ``surrogatepass`` writes. The head ends on a code point
    boundary, never between the two halves of a surrogate pair, and never inside a backslash
    escape of JSON text (or between the two ``\\uXXXX`` escapes of a pair), so a cut JSON text
    shows no half character. (Grapheme clusters, such as an emoji ZWJ sequence, may be cut
    between their code points.) ``ConfigError`` for a budget under :data:`MIN_RESULT_BYTES`.
    """
    check_budget("max_bytes", max_bytes)
    return _truncated(text, max_bytes)


def _truncated(text: str, max_bytes: int) -> tuple[str, int | None]:
    """:func:`truncate_result` without the budget check (a budget less a note's room)."""
    if len(text) * 4 <= max_bytes:  # no code point takes more than 4 bytes: surely fits
        return text, None
    # ASCII (known in O(1) in CPython): a character is a byte, nothing to encode.
    data = None if text.isascii() else text.encode("utf-8", "surrogatepass")
    original = len(text) if data is None else len(data)
    if original <= max_bytes:
        return text, None
    # The marker's length depends on the digits of the kept size: try the room each number
    # of digits leaves, from the original's down (kept < original), while the head fits it.
    best = _head(text, data, max_bytes - len(marker(original, original)))
    digits = len(str(original)) - 1
    while digits > 0:
        head, kept = _head(text, data, max_bytes - len(marker(10 ** (digits - 1), original)))
        if len(str(kept)) > digits:
            break  # fewer digits leave more room, for a head that needs more (never fits)
        best, digits = (head, kept), digits - 1
    return best[0] + marker(best[1], original), original


def _head(text: str, data: bytes | None, cut: int) -> tuple[str, int]:
    """The longest safe head of ``text`` within ``cut`` bytes of its UTF-8 ``data`` (None for
    ASCII text), and its size in bytes."""
    if data is None:
        end = _safe_end(text, cut)
        return text[:end], end
    while cut > 0 and data[cut] & 0xC0 == 0x80:  # a continuation byte: inside a code point
        cut -= 1
    head = data[:cut].decode("utf-8", "surrogatepass")
    end = _safe_end(text, len(head))
    return head[:end], cut - len(head[end:].encode("utf-8", "surrogatepass"))


def _safe_end(text: str, end: int) -> int:
    """The largest end ``<= end`` that splits no surrogate pair and no JSON escape."""
    while True:
        if 0 < end < len(text) and _high(text[end - 1]) and "\udc00" <= text[end] <= "\udfff":
            new = end - 1
        else:
            new = _escape_cut(text, end)
        if new == end:
            return end
        end = new


def _high(char: str) -> bool:
    return "\ud800" <= char <= "\udbff"


def _escape_cut(text: str, end: int) -> int:
    """The start of the escape that ``end`` cuts, or that is a high-surrogate ``\\uXXXX``
    ending at ``end`` before its low half; else ``end``."""
    j = text.rfind("\\", max(0, end - 6), end)
    if j < 0:
        return end
    run = j
    while run >= 0 and text[run] == "\\":
        run -= 1
    if (j - run) % 2 == 0:
        return end  # j closes a "\\" escape: everything before it is complete
    size = 6 if text[j + 1 : j + 2] == "u" else 2
    if j + size > end:
        return j
    pair_cut = (
        size == 6
        and j + 6 == end
        and _hex_in(text[j + 2 : end], 0xD800, 0xDBFF)
        and text[end : end + 2] == "\\u"
        and _hex_in(text[end + 2 : end + 6], 0xDC00, 0xDFFF)
    )
    return j if pair_cut else end


def _hex_in(digits: str, low: int, high: int) -> bool:
    try:
        return len(digits) == 4 and low <= int(digits, 16) <= high
    except ValueError:
        return False
