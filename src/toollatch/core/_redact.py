"""Redaction of JSON and text by a :data:`~toollatch.Redactor` (internal): what the
dispatcher does to every tool result (:mod:`toollatch.tools._results`) and what the
redacting stores do to what they keep (:mod:`toollatch.ledger._redacted`), one walk for both.

Theory of operation. A redactor is called as ``redactor(pointer, text)`` for each string and
returns what may be shown (the previews' contract, see :class:`~toollatch.PreviewPolicy`).
:func:`redact_result` takes a text: one that is a JSON object or array (strict RFC 8259)
is parsed with its objects as their pairs in order (duplicate keys kept, each one redacted)
and its non-integer numbers as their literals (``2.50`` stays ``2.50``, ``1e400`` does not
become ``Infinity``), walked (every string value with its JSON pointer, every key with the
pointer of its object), and written again compact only when something changed; any other
text, and JSON nested deeper than the walk can go, is redacted whole (``redactor("", text)``).
:func:`redact_value` takes plain JSON data (a message of a run's history). With ``nested``,
a string that is itself a JSON object or array (OpenAI's ``arguments``, a JSON result inside
a message) is walked inside, its pointers continuing. A redactor that raises or returns a
non-str raises :class:`RedactionFailed`, naming only the exception's type (its message may
quote the secret): callers fail closed.
"""

from __future__ import annotations

import json
from typing import Any

from ._preview import Redactor


class RedactionFailed(Exception):
    """The redactor raised or returned a non-str, or plain data nested too deeply to walk
    (internal: what would have been redacted is withheld)."""


class _Object(list[tuple[str, Any]]):
    """A parsed JSON object as its pairs in order (duplicate keys kept, each one redacted)."""


class _Float(str):
    """A JSON number with a fraction or exponent, kept as its literal (``2.50`` stays
    ``2.50`` and ``1e400`` does not become ``Infinity``). Integers are exact as ``int``."""


_ENCODER = json.JSONEncoder(ensure_ascii=False)


def redact_result(text: str, redactor: Redactor, *, nested: bool = False, pointer: str = "") -> str:
    """``text`` passed through ``redactor(pointer, text)``, the contract of the previews.

    A text that is a JSON object or array (strict RFC 8259: no ``NaN``) gets the redactor on
    every string value, with the value's JSON pointer (``redactor("/token", "sk-...")``), and
    on every object key, with the pointer of the object holding it (``redactor("", "token")``
    for a top-level key); pointers are the keys as the tool wrote them. When nothing changed the
    text is returned as it is (the same object); else the JSON is written again, compact, with
    numbers as they were written. Any other text (plain text, a bare JSON scalar, malformed or
    too deeply nested JSON) is redacted whole: ``redactor("", text)``. Raises
    :class:`RedactionFailed` when the redactor raises or returns a non-str. ``nested``:
    string values that are JSON objects or arrays are walked inside too; ``pointer``: where
    ``text`` sits (the pointers continue from it).
    """
    tree = _parsed(text)
    try:
        if tree is None:
            return _whole(redactor, text, pointer)
        walk = _Walk(redactor, nested)
        walk.visit(tree, pointer)
        return _dump(tree) if walk.changed else text
    except RecursionError:  # nested deeper than the walk can go: whole-text redaction
        return _whole(redactor, text, pointer)
    except RedactionFailed:
        raise
    except Exception as exc:  # the redactor's: its message may hold the secret
        raise RedactionFailed(type(exc).__name__) from None


def _parsed(text: str) -> Any:
    if text[:1] not in ("{", "[") and text.lstrip()[:1] not in ("{", "["):
        return None
    try:
        return json.loads(
            text, object_pairs_hook=_Object, parse_float=_Float, parse_constant=_refuse_constant
        )
    except (ValueError, RecursionError):  # (an int past Python's digit limit is one)
        return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def redact_value(value: Any, redactor: Redactor, *, nested: bool = True) -> Any:
    """``value`` (plain JSON data: dicts, lists, str, numbers, bools, None) with every string
    and key passed through ``redactor`` with its pointer, as :func:`redact_result` does for
    a text (a new value; ``value`` is left as it was); with ``nested`` (the default here), a
    string holding a JSON object or array is redacted as such a text, inside. Raises
    :class:`RedactionFailed` when the redactor fails or ``value`` is nested too deeply."""
    walk = _Walk(redactor, nested)
    try:
        return walk.plain(value, "")
    except RecursionError:
        raise RedactionFailed("nested too deeply to redact") from None
    except RedactionFailed:
        raise
    except Exception as exc:  # the redactor's: its message may hold the secret
        raise RedactionFailed(type(exc).__name__) from None


def _whole(redactor: Redactor, text: str, pointer: str = "") -> str:
    try:
        shown = redactor(pointer, text)
    except Exception as exc:
        raise RedactionFailed(type(exc).__name__) from None
    if not isinstance(shown, str):
        raise RedactionFailed(f"returned {type(shown).__name__}, not str")
    return shown


class _Walk:
    """Redacts a parsed tree in place (it is ours), noting whether anything changed. Written
    for speed: one call per container, strings inline, and a redactor that returns its
    argument costs an identity test."""

    __slots__ = ("changed", "nested", "redactor")

    def __init__(self, redactor: Redactor, nested: bool = False) -> None:
        self.redactor = redactor
        self.nested = nested
        self.changed = False

    def text(self, value: str, pointer: str) -> str:
        """A string value at ``pointer``: walked inside when ``nested`` and it is JSON."""
        if self.nested and (tree := _parsed(value)) is not None:
            inner = _Walk(self.redactor, True)
            inner.visit(tree, pointer)
            if not inner.changed:
                return value
            self.changed = True
            return _dump(tree)
        shown = self.redactor(pointer, value)
        return value if shown is value else self.checked(shown, value)

    def plain(self, value: Any, pointer: str) -> Any:
        """A copy of plain data ``value`` at ``pointer``, redacted."""
        if isinstance(value, str):
            return self.text(value, pointer)
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                shown_key = key
                if isinstance(key, str):
                    shown_key = self.redactor(pointer, key)
                    if shown_key is not key:
                        shown_key = self.checked(shown_key, key)
                token = _token(str(key))
                out[shown_key] = self.plain(item, f"{pointer}/{token}")
            return out
        if isinstance(value, list | tuple):
            return [self.plain(item, f"{pointer}/{i}") for i, item in enumerate(value)]
        return value

    def checked(self, shown: object, text: str) -> str:
        """The redactor's answer ``shown`` for ``text``, when it is not ``text`` itself."""
        if not isinstance(shown, str):
            raise RedactionFailed(f"returned {type(shown).__name__}, not str")
        if shown != text:
            self.changed = True
        return shown

    def visit(self, node: list[Any], pointer: str) -> None:
        redactor = self.redactor
        if type(node) is _Object:
            for i, (key, value) in enumerate(node):
                shown_key = redactor(pointer, key)
                if shown_key is not key:
                    shown_key = self.checked(shown_key, key)
                token = key if "~" not in key and "/" not in key else _token(key)
                kind = type(value)
                if kind is str:
                    if self.nested:
                        shown = self.text(value, f"{pointer}/{token}")
                        if shown is not value:
                            node[i] = (shown_key, shown)
                            continue
                    else:
                        shown = redactor(f"{pointer}/{token}", value)
                        if shown is not value:
                            node[i] = (shown_key, self.checked(shown, value))
                            continue
                elif kind is _Object or kind is list:
                    self.visit(value, f"{pointer}/{token}")
                if shown_key is not key:
                    node[i] = (shown_key, value)
            return
        for i, value in enumerate(node):
            kind = type(value)
            if kind is str:
                if self.nested:
                    node[i] = self.text(value, f"{pointer}/{i}")
                    continue
                shown = redactor(f"{pointer}/{i}", value)
                if shown is not value:
                    node[i] = self.checked(shown, value)
            elif kind is _Object or kind is list:
                self.visit(value, f"{pointer}/{i}")


def _token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _dump(node: Any) -> str:
    kind = type(node)
    if kind is str:
        return _ENCODER.encode(node)
    if kind is _Object:
        return "{" + ",".join(f"{_ENCODER.encode(k)}:{_dump(v)}" for k, v in node) + "}"
    if kind is list:
        return "[" + ",".join([_dump(v) for v in node]) + "]"
    if kind is _Float:
        return str.__str__(node)
    return _ENCODER.encode(node)  # int, True, False, None
