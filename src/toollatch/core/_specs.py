"""Tool definitions: what the gate checks a call against.

Accepts the three shapes users already have: OpenAI ``{"type": "function", "function":
{name, description, parameters}}``, a bare ``{name, parameters}``, and Anthropic ``{name,
input_schema}``. The JSON Schema is checked once, here, so a bad schema is a ``ConfigError``
at load time and never a surprise while a stream is running.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import orjson

from ._errors import ConfigError
from ._quick_schema import QuickCheck, quick_check

_ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """One tool the model may call."""

    name: str
    """The name the model uses."""
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(_ANY_OBJECT))
    """JSON Schema (Draft 2020-12 unless ``$schema`` says otherwise) of the arguments."""
    description: str = ""
    """Human description (unused by the gate; kept for building requests)."""
    eager: bool = False
    """May run as soon as its call is safely complete, before the round ends (dispatcher)."""
    timeout_s: float | None = None
    """Run-time limit for one call, in seconds (dispatcher); None = the dispatcher default."""
    _validator: jsonschema.protocols.Validator = field(
        init=False, repr=False, compare=False, hash=False
    )
    _quick: QuickCheck | None = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"tool name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.parameters, Mapping):
            raise ConfigError(f"tool {self.name!r}: parameters must be a JSON Schema object")
        if self.timeout_s is not None and not (
            math.isfinite(self.timeout_s) and self.timeout_s > 0
        ):
            raise ConfigError(f"tool {self.name!r}: timeout_s must be a positive number")
        validator, quick = _compiled(self.name, self.parameters)
        object.__setattr__(self, "_validator", validator)
        object.__setattr__(self, "_quick", quick)

    def validator(self) -> jsonschema.protocols.Validator:
        """The compiled validator of :attr:`parameters` (shared by every spec with the same
        schema in this process)."""
        return self._validator

    @classmethod
    def from_definition(cls, definition: Mapping[str, Any]) -> ToolSpec:
        """A spec from an OpenAI, bare or Anthropic tool definition; raises ``ConfigError``."""
        if not isinstance(definition, Mapping):
            raise ConfigError(f"a tool definition must be an object, got {definition!r:.60}")
        body: Mapping[str, Any] = definition
        if definition.get("type") == "function" and isinstance(definition.get("function"), Mapping):
            body = definition["function"]
        schema = body.get("parameters", body.get("input_schema", _ANY_OBJECT))
        return cls(
            name=body.get("name"),  # type: ignore[arg-type]  # checked in __post_init__
            parameters=schema if schema is not None else _ANY_OBJECT,
            description=body.get("description") or "",
            eager=bool(body.get("x-toollatch-eager", False)),
        )


def surely_valid(spec: ToolSpec, args: Any) -> bool:
    """True when ``spec``'s schema certainly accepts ``args`` (its quick check, see
    :mod:`._quick_schema`); False when not sure: ask :meth:`ToolSpec.validator` then."""
    quick = spec._quick
    return quick is not None and quick(args)


_Compiled = tuple[jsonschema.protocols.Validator, QuickCheck | None]
_COMPILED: dict[bytes, _Compiled] = {}
"""Validators by canonical schema text: a gateway building a parser per request with its tools
checks and compiles each distinct schema once per process, not once per request. Validators
and specs are immutable, so sharing them is safe; both caches keep the newest ``_KEPT``."""
_KEPT = 1024


def _compiled(name: str, schema: Mapping[str, Any]) -> _Compiled:
    """The checked, compiled validator of ``schema`` and its quick check (or None); raises
    ``ConfigError`` for a bad schema."""
    key = _canonical(schema)
    compiled = _COMPILED.get(key) if key else None
    if compiled is not None:
        return compiled
    dialect = schema.get("$schema")
    if dialect is not None and not isinstance(dialect, str):
        raise ConfigError(f"tool {name!r}: $schema must be a string, got {dialect!r}")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"tool {name!r}: invalid JSON Schema: {exc.message}") from None
    compiled = (cls(schema), None if dialect is not None else quick_check(schema))
    if key:
        _keep(_COMPILED, key, compiled)
    return compiled


def load_tools(source: Iterable[Mapping[str, Any] | ToolSpec] | str | Path) -> tuple[ToolSpec, ...]:
    """Tool specs from definitions, specs, or a JSON file holding a list of definitions.

    Raises ``ConfigError`` for an unreadable file, a malformed definition or a duplicate name.
    """
    if isinstance(source, str | Path):
        try:
            raw = orjson.loads(Path(source).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read tools from {source}: {exc}") from None
        if isinstance(raw, Mapping) and isinstance(raw.get("tools"), list):
            raw = raw["tools"]
        if not isinstance(raw, list):
            raise ConfigError(f"{source}: expected a JSON list of tool definitions")
        source = raw
    items = source if isinstance(source, list | tuple) else list(source)
    if all(item.__class__ is ToolSpec for item in items):
        # already built (an agent's round passes its specs): only the names to check, not
        # the canonical text of every schema to look them up by
        return _unique(tuple(items))  # type: ignore[arg-type]  # (checked: all ToolSpec)
    key = _canonical(items)
    specs = _LOADED.get(key) if key else None
    if specs is not None:
        return specs
    specs = _unique(
        tuple(
            item if isinstance(item, ToolSpec) else ToolSpec.from_definition(item) for item in items
        )
    )
    if key:
        _keep(_LOADED, key, specs)
    return specs


def _unique(specs: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    """``specs``; ``ConfigError`` when two share a name."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"tool {spec.name!r} is defined twice")
        seen.add(spec.name)
    return specs


_LOADED: dict[bytes, tuple[ToolSpec, ...]] = {}
"""Specs by the canonical text of the definitions they came from (see ``_COMPILED``)."""


def _canonical(value: object) -> bytes:
    """``value`` as canonical JSON text (sorted keys), or ``b""`` when it is not plain JSON
    data (a ToolSpec, an integer over 64 bits...): such input is never cached."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return b""


def _keep(cache: dict[bytes, Any], key: bytes, value: object) -> None:
    if len(cache) >= _KEPT:
        del cache[next(iter(cache))]  # the oldest: a process has few distinct tool sets
    cache[key] = value
