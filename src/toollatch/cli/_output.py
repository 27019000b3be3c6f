"""What the ``toollatch`` command prints, printable whatever the input: one-line error
messages, file names that are not valid UTF-8, characters the standard output cannot encode,
and JSON that orjson refuses.

* JSON is serialized by orjson; when orjson refuses a value (an integer outside 64 bits, nesting
  deeper than its limit, a lone surrogate) the whole object is written by :func:`json_text`'s
  exact fallback instead, so a big integer is still printed as a JSON integer, digit for digit.
* A file name that is not valid UTF-8 (Python holds its bytes as ``surrogateescape``
  surrogates) is printed as its bytes decoded as UTF-8 with each undecodable byte shown as
  ``\\xNN`` (``b"caf\\xe9.sse"`` is printed ``caf\\xe9.sse``); see :func:`display_name`.
* On a standard output that cannot encode a character (``PYTHONIOENCODING=ascii``, a C locale
  without UTF-8 mode), JSON lines show it as a ``\\uXXXX`` escape (still valid JSON, same
  value) and text lines as a Python backslash escape (``\\xe9``, ``\\u2615``); see
  :func:`write`.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping
from typing import TextIO

import orjson


def fail(message: str) -> int:
    """``toollatch: error: MESSAGE`` (whitespace runs as one space) on standard error; 2."""
    write(sys.stderr, f"toollatch: error: {' '.join(message.split())}\n")
    return 2


def one_line(exc: BaseException) -> str:
    """``Type: message`` of an unexpected exception, on one line, at most 200 characters of
    message."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= 200 else text[:199] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def display_name(name: str) -> str:
    """``name`` as printed: unchanged when it is valid Unicode without surrogates; else its
    bytes (``os.fsencode``, which undoes ``surrogateescape``) decoded as UTF-8 with each byte
    that does not decode shown as ``\\xNN`` (``backslashreplace``)."""
    if not _has_surrogates(name):
        return name
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:  # a surrogate that no byte stands for
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def write(stream: TextIO, text: str, *, json_line: bool = False) -> None:
    """Write ``text`` whatever ``stream`` can encode: JSON gets ``\\uXXXX`` escapes (the same
    JSON value), text Python backslash escapes."""
    if not text.isascii():
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            text.encode(encoding)
        except LookupError:
            pass
        except UnicodeEncodeError:
            if json_line:
                text = _NON_ASCII.sub(_json_escape, text)
            else:
                text = text.encode(encoding, "backslashreplace").decode(encoding)
    stream.write(text)


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _json_escape(match: re.Match[str]) -> str:
    # Outside strings JSON text is ASCII, so each non-ASCII character is inside one.
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(value: object) -> str:
    """``value`` as compact JSON text, as orjson writes it; when orjson refuses the value (an
    integer outside 64 bits, nesting over its depth limit, a lone surrogate), the whole value
    is written by an iterative serializer with the same output conventions: integers exact,
    non-finite floats ``null``, strings as written by ``json.dumps`` (surrogates escaped)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _slow_json(value)


class _Raw(str):
    """JSON text already written (punctuation), as opposed to a string value to encode."""

    __slots__ = ()


def _slow_json(value: object) -> str:
    out: list[str] = []
    work: list[object] = [value]  # a stack, so depth costs no Python recursion
    while work:
        item = work.pop()
        if type(item) is _Raw:
            out.append(item)
        elif isinstance(item, Mapping):
            out.append("{")
            work.append(_Raw("}"))
            for i, (key, member) in reversed(list(enumerate(item.items()))):
                work.append(member)
                work.append(_Raw(("," if i else "") + _json_string(str(key)) + ":"))
        elif isinstance(item, list | tuple):
            out.append("[")
            work.append(_Raw("]"))
            for i, element in reversed(list(enumerate(item))):
                work.append(element)
                if i:
                    work.append(_Raw(","))
        else:
            out.append(_json_scalar(item))
    return "".join(out)


def _json_scalar(item: object) -> str:
    if item is None:
        return "null"
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return int.__repr__(item)
    if isinstance(item, float):
        return float.__repr__(item) if math.isfinite(item) else "null"
    if isinstance(item, str):
        return _json_string(item)
    raise TypeError(f"cannot write {type(item).__name__} as JSON")


def _json_string(text: str) -> str:
    written = json.dumps(text, ensure_ascii=False)
    return written if not _has_surrogates(written) else json.dumps(text)


_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What a terminal would act on rather than show: C0 controls (ESC starts CSI and OSC
sequences: OSC 8 links, OSC 52 clipboard writes, OSC 0 titles; BEL ends an OSC, CR rewrites
a line), DEL, the C1 controls (U+009B is a one-character CSI, U+009D an OSC) and the
bidirectional overrides and isolates, which reorder what is shown (CVE-2021-42574)."""
_UNSAFE_TEXT = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
"""The same for model text, where a newline and a tab are shown as they are."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with every character a terminal would act on (:data:`_UNSAFE`) shown as its
    Python escape (ESC as ``\\x1b``, U+202E as ``\\u202e``); with ``lines``, newlines and
    tabs are kept. For the terminal view and error lines only: ``--json`` is exact."""
    return (_UNSAFE_TEXT if lines else _UNSAFE).sub(_escape, text)
