"""A quick "certainly valid" check for the commonest tool schemas (internal).

Theory of operation
-------------------
Most tool schemas are a flat object: ``{"type": "object", "properties": {name: {"type":
<one type>}, ...}, "required": [...], "additionalProperties": <bool>}``, as ``@tool``
writes them from a function's parameters. jsonschema walks such a schema in about 25 us per
call (a validator object per keyword, a resource per property); a call's gate check runs it
on every committed call. :func:`quick_check` turns such a schema, once, into a plain
function ``args -> bool`` that answers only **True: jsonschema finds no error**, or
**False: not sure**. The gate runs jsonschema whenever it says False, so the errors, their
order and their wording are jsonschema's, and a call is never let through that jsonschema
would stop.

Only what is certain for every draft that shares these keywords is answered True: exact
Python types as a strict JSON parse makes them (``int`` for integer, never ``bool``;
``1.0`` for an integer goes to jsonschema, which knows the draft's rule), a schema without
``$schema`` (Draft 2020-12) and with no keyword outside the table below. Anything else
makes no quick check (None): the schema is left to jsonschema alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

QuickCheck = Callable[[Any], bool]
"""``args -> bool``: True when the schema's validator would find no error (see above)."""

_ANNOTATIONS = frozenset({"title", "description", "default", "examples"})
"""Keywords that never make an instance invalid."""
_OBJECT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"})
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}
"""The exact classes of each JSON type after a strict parse (``bool`` is not an ``int``
here: the checks compare ``type(value)``, not ``isinstance``)."""


def quick_check(schema: Mapping[str, Any]) -> QuickCheck | None:
    """The quick check of ``schema`` (already checked as a schema), or None when it is not
    a flat object schema of the kind above."""
    if schema.get("type") != "object" or not set(schema) <= _OBJECT_KEYWORDS | _ANNOTATIONS:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        return None
    if not isinstance(extra, bool) or not all(isinstance(n, str) for n in required):
        return None
    types: dict[str, tuple[type, ...] | None] = {}  # None: any value
    for name, sub in properties.items():
        if not isinstance(sub, Mapping) or not set(sub) <= {"type"} | _ANNOTATIONS:
            return None
        kind = sub.get("type")
        if kind is None:
            types[name] = None
        elif isinstance(kind, str) and kind in _TYPES:
            types[name] = _TYPES[kind]
        else:
            return None  # (a list of types, an unknown one: jsonschema's)
    return _Flat(types, tuple(required), extra)


class _Flat:
    """The quick check of a flat object schema."""

    __slots__ = ("_extra", "_required", "_types")

    def __init__(
        self, types: dict[str, tuple[type, ...] | None], required: tuple[str, ...], extra: bool
    ) -> None:
        self._types = types
        self._required = required
        self._extra = extra

    def __call__(self, args: Any) -> bool:
        if type(args) is not dict:
            return False
        for name in self._required:
            if name not in args:
                return False
        types, missing = self._types, _MISSING
        for name, value in args.items():
            allowed = types.get(name, missing)
            if allowed is missing:
                if not self._extra:
                    return False
            elif allowed is not None and type(value) not in allowed:
                return False
        return True


_MISSING: Any = object()
