"""The commit gate: the only place a call becomes executable.

Theory of operation: the assembler hands the gate a call whose end the protocol announced in a
round that ended normally. The gate runs, in order and once: identity (id and name present),
registration (when tools are known), ONE strict RFC 8259 parse of the joined text, the object
check, the depth limit, the tool's JSON Schema (validator compiled once per tool; a flat
object schema's quick check first, which only answers "certainly valid" and leaves every
other case, and every error's wording, to jsonschema: :mod:`._quick_schema`), the policy
hook, and the run budget. A call whose text an adapter wrote from a value it decoded itself
(Gemini's ``args``) may come with that value (:class:`DecodedArguments`): the parse is then
replaced by the same checks applied to the value (:func:`strict_value`), never skipped. The
first failure wins and yields a :class:`Rejection` with a stable :class:`ErrorCode` and a
short detail that never quotes the argument text. Success yields a :class:`CommittedCall`, a
type nothing else can construct.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

import jsonschema

from ._errors import ConfigError, ErrorCode, UsageError
from ._events import CallKey, DecodedArguments
from ._limits import Limits
from ._specs import ToolSpec, load_tools, surely_valid

# -- the only constructor of CommittedCall -----------------------------------------------------


class _GateOnly(type):
    """Metaclass: calling the class raises; only the gate builds one (see ``_committed``),
    through ``type.__call__``, which runs the dataclass ``__init__`` as a call would."""

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise UsageError(f"{cls.__name__} is created only by the commit gate")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedCall(metaclass=_GateOnly):
    """A call that passed the gate: the only thing a dispatcher may execute."""

    call_id: str
    """The provider's call id; results are paired with it."""
    name: str
    """The registered tool name."""
    arguments: Mapping[str, Any]
    """The strictly parsed, schema-valid argument object."""
    arguments_text: str
    """The exact argument text the model produced (for history)."""
    key: CallKey
    """Identity of the call inside its round."""
    position: int
    """Order of the call in its choice (0-based); results are returned in this order."""
    spec: ToolSpec | None
    """The tool definition it was checked against (None when no tools were given)."""


def _committed(
    call_id: str,
    name: str,
    arguments: Mapping[str, Any],
    arguments_text: str,
    key: CallKey,
    position: int,
    spec: ToolSpec | None,
) -> CommittedCall:
    """The one constructor of :class:`CommittedCall` (the class itself refuses to be called):
    the metaclass's guard is skipped, the dataclass ``__init__`` runs (once per committed
    call, as trio's ``NoPublicConstructor._create`` does)."""
    call: CommittedCall = type.__call__(
        CommittedCall,
        call_id=call_id,
        name=name,
        arguments=arguments,
        arguments_text=arguments_text,
        key=key,
        position=position,
        spec=spec,
    )
    return call


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why the gate refused a call."""

    code: ErrorCode
    """Stable reason."""
    detail: str
    """Short human-readable explanation; never the raw argument text."""


# -- policy and budget -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Allow:
    """Policy decision: the call may run."""


@dataclass(frozen=True, slots=True)
class Deny:
    """Policy decision: the call may not run."""

    reason: str
    """Shown to the model in the error result."""


PolicyDecision: TypeAlias = Allow | Deny
"""What a :data:`Policy` returns for a call: :class:`Allow` or :class:`Deny`."""
Policy: TypeAlias = Callable[[str, Mapping[str, Any]], PolicyDecision | bool | None]
"""``policy(name, arguments)``: ``Allow()``/``True``/``None`` allows, ``Deny(reason)``/``False``
denies. A policy that raises denies (fail closed)."""


class RunBudget:
    """How many tool calls a whole run (several rounds) may commit; shared across rounds."""

    def __init__(self, max_calls: int) -> None:
        if not isinstance(max_calls, int) or max_calls < 0:
            raise ConfigError(f"RunBudget.max_calls must be an integer >= 0, got {max_calls!r}")
        self.max_calls = max_calls
        self.used = 0

    def take(self) -> bool:
        """Spend one call; False (nothing spent) when the budget is exhausted."""
        if self.used >= self.max_calls:
            return False
        self.used += 1
        return True


# -- strict JSON --------------------------------------------------------------------------------


class _Reject(Exception):
    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _no_constants(name: str) -> NoReturn:
    raise _Reject(ErrorCode.INVALID_JSON, f"{name} is not JSON (RFC 8259 has no {name})")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Reject(ErrorCode.INVALID_JSON, "an object has a duplicate key")
    return obj


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (_INF, -_INF):  # 1e999: JSON text, but no double holds it (RFC 8259 s.6)
        raise _Reject(ErrorCode.INVALID_JSON, f"the number {text[:40]} does not fit a double")
    return value


_INF = float("inf")
_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite_float
)
# The decoder's C scanner, called directly: raw_decode is a Python frame around it that only
# turns StopIteration into "Expecting value" (done below). Typeshed omits the attribute.
_scan_once: Callable[[str, int], tuple[object, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_WS_CHARS = " \t\n\r"


def strict_loads(text: str, *, max_depth: int) -> object:
    """Parse ``text`` as RFC 8259 JSON, strictly; raise ``_Reject`` with the reason otherwise.

    Rejects NaN/Infinity, numbers too large for a double (``1e999`` would become infinity),
    duplicate object keys, trailing data, control characters in strings, lone surrogates
    (escaped or raw), and nesting deeper than ``max_depth``: a committed value survives a
    strict JSON round trip.
    """
    start = _skip_ws(text, 0) if text[:1] in _WS_CHARS else 0
    try:
        value, end = _scan_once(text, start)  # (what JSONDecoder.raw_decode runs)
    except StopIteration as stop:
        raise _Reject(ErrorCode.INVALID_JSON, f"Expecting value at offset {stop.value}") from None
    except json.JSONDecodeError as exc:
        raise _Reject(ErrorCode.INVALID_JSON, f"{exc.msg} at offset {exc.pos}") from None
    except RecursionError:
        raise _Reject(ErrorCode.DEPTH_EXCEEDED, f"nesting deeper than {max_depth}") from None
    except ValueError as exc:  # e.g. an integer over sys.get_int_max_str_digits()
        raise _Reject(ErrorCode.INVALID_JSON, str(exc).split(";")[0]) from None
    if end != len(text) and _skip_ws(text, end) != len(text):
        raise _Reject(ErrorCode.INVALID_JSON, f"trailing data after the JSON value at offset {end}")
    _check_tree(value, max_depth)
    return value


def strict_value(value: object, *, max_depth: int) -> object:
    """Check a tree the stream already decoded as :func:`strict_loads` checks the tree it
    parses; return it, or raise ``_Reject`` with the reason.

    The second input form of the one strict route (``DecodedArguments``): what the text
    parse itself guarantees is checked on the tree instead (only exact JSON types, keys
    that are strings, finite floats, ints within ``sys.get_int_max_str_digits()`` digits),
    then the same depth and lone-surrogate walk. Whether the text is this tree's spelling
    is the adapter's contract (see ``DecodedArguments``), not checked here."""
    _check_types(value)  # (first: the parse refuses these before the tree is walked)
    _check_tree(value, max_depth)
    return value


def complete_object(text: str, *, max_depth: int) -> bool:
    """True when ``text`` is exactly one strict JSON object (see :func:`strict_loads`): then
    no further text can make it longer valid JSON, so it is final (eager start in OpenAI chat,
    which has no per-call close)."""
    if not text.lstrip(_WS_CHARS).startswith("{"):
        return False
    try:
        return isinstance(strict_loads(text, max_depth=max_depth), dict)
    except _Reject:
        return False


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in _WS_CHARS:
        pos += 1
    return pos


def _check_tree(value: object, max_depth: int) -> None:
    """Depth and lone-surrogate check over the parsed tree (iterative: no recursion limit).

    Strings are checked where they are met and only containers are stacked: arguments are
    mostly a few strings in one object, and this walk runs once per call. The root starts as
    the one item of a list at depth 0, so it is checked as any other item.
    """
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [([value], 0)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise _Reject(ErrorCode.DEPTH_EXCEEDED, f"nesting deeper than {max_depth}")
        if isinstance(node, dict):
            for key in node:
                if not key.isascii():
                    _check_str(key)
            items: Iterable[object] = node.values()
        else:
            items = node
        for item in items:
            if isinstance(item, str):
                if not item.isascii():
                    _check_str(item)
            elif isinstance(item, dict | list):
                stack.append((item, depth + 1))


def _check_types(value: object) -> None:
    """Refuse, in a tree given decoded, what no strict parse yields: a type that is not
    exactly a JSON one, a key that is not a string, a number the parse refuses (see
    :func:`_check_number`). Each container is walked once, so a cycle ends here too (and
    then fails the depth walk, as nesting without end)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            if id(node) in seen:
                continue  # (walked: a shared one; a cycle then fails the depth walk)
            seen.add(id(node))
            if kind is list:
                stack += node  # type: ignore[arg-type]
                continue
            for key in node:  # type: ignore[attr-defined]
                if type(key) is not str:
                    raise _Reject(ErrorCode.INVALID_JSON, "an object key is not a string")
            stack += node.values()  # type: ignore[attr-defined]
        elif kind is not str:
            if kind not in _LEAVES:
                raise _Reject(ErrorCode.INVALID_JSON, f"a {kind.__name__} is not a JSON value")
            _check_number(node)


_LEAVES = frozenset({int, float, bool, type(None)})
"""The leaf types a strict parse yields besides ``str`` (a tree given decoded)."""


def _check_number(item: object) -> None:
    """What the strict parse refuses in a number: not finite, or too many digits."""
    if type(item) is float and not math.isfinite(item):
        raise _Reject(ErrorCode.INVALID_JSON, "a number is not finite (RFC 8259 s.6)")
    if type(item) is int and item.bit_length() > _INT_BITS:
        try:
            str(item)
        except ValueError as exc:  # over sys.get_int_max_str_digits(), as strict_loads says
            raise _Reject(ErrorCode.INVALID_JSON, str(exc).split(";")[0]) from None


_INT_BITS = 2000
"""Ints at most this wide have at most 603 digits, under any ``int_max_str_digits`` limit
Python allows (640 at the least, or none): only wider ones are written out to be sure."""


def _check_str(s: str) -> None:
    """Reject a string holding a lone surrogate (``s`` is not ASCII)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise _Reject(ErrorCode.INVALID_JSON, "a string contains a lone surrogate") from None


# -- the gate -----------------------------------------------------------------------------------


class Gate:
    """Decides COMMITTED or FAILED for closed calls (pure; budget state aside)."""

    def __init__(
        self,
        tools: Iterable[Mapping[str, Any] | ToolSpec] | None = None,
        *,
        limits: Limits | None = None,
        policy: Policy | None = None,
        budget: RunBudget | None = None,
    ) -> None:
        """``tools=None`` skips the registration and schema checks (replay without tools)."""
        self.limits = limits or Limits()
        self.policy = policy
        self.budget = budget
        self.tools: dict[str, ToolSpec] | None = (
            None if tools is None else {s.name: s for s in load_tools(tools)}
        )

    def check(
        self,
        *,
        key: CallKey,
        position: int,
        call_id: str | None,
        name: str | None,
        text: str,
        decoded: DecodedArguments | None = None,
    ) -> CommittedCall | Rejection:
        """Run every check on one closed call; the first failure decides.

        ``decoded``, when given, is the value ``text`` is the canonical spelling of (see
        :class:`DecodedArguments`): it is checked as the strict parse of ``text`` would be
        (:func:`strict_value`) instead of parsing ``text`` again, with the same outcome.

        Raises ``UsageError`` when ``text`` is not a string (e.g. a preview), or ``decoded``
        not a ``DecodedArguments``: only the complete argument text of a closed call may
        enter the gate.
        """
        if not isinstance(text, str):
            raise UsageError(f"the gate takes argument text, not {type(text).__name__}")
        if decoded is not None and type(decoded) is not DecodedArguments:
            raise UsageError(f"decoded must be DecodedArguments, not {type(decoded).__name__}")
        if not call_id or not name:
            missing = " and ".join(w for w, v in (("id", call_id), ("name", name)) if not v)
            return Rejection(ErrorCode.MISSING_ID_OR_NAME, f"the call has no {missing}")
        spec = None
        if self.tools is not None:
            spec = self.tools.get(name)
            if spec is None:
                return Rejection(ErrorCode.UNKNOWN_TOOL, f"no tool named {name[:80]!r}")
        try:
            args = self._arguments(text) if decoded is None else self._decoded(decoded.value)
            if spec is not None:
                self._validate(spec, args)
            self._authorize(name, args)
        except _Reject as rej:
            return Rejection(rej.code, rej.detail)
        if self.budget is not None and not self.budget.take():
            return Rejection(
                ErrorCode.BUDGET_EXCEEDED,
                f"the run's budget of {self.budget.max_calls} tool calls is spent",
            )
        return _committed(call_id, name, args, text, key, position, spec)

    def _arguments(self, text: str) -> dict[str, Any]:
        if not text or text.isspace():  # (= not text.strip(), without copying the text)
            return {}
        return _object(strict_loads(text, max_depth=self.limits.max_json_depth))

    def _decoded(self, value: object) -> dict[str, Any]:
        """:meth:`_arguments` for a value given decoded (its text is never empty)."""
        strict_value(value, max_depth=self.limits.max_json_depth)
        return _object(value)

    def _validate(self, spec: ToolSpec, args: dict[str, Any]) -> None:
        if surely_valid(spec, args):
            return  # (the common case, without jsonschema's walk; see core._quick_schema)
        try:
            errors = list(spec.validator().iter_errors(args))
            error = jsonschema.exceptions.best_match(errors)
        except Exception as exc:  # the boundary to jsonschema: e.g. a $ref it cannot resolve
            raise _Reject(
                ErrorCode.SCHEMA_VIOLATION,
                f"the tool's schema could not be applied ({type(exc).__name__}: {str(exc)[:200]})",
            ) from None
        if error is not None:
            raise _Reject(ErrorCode.SCHEMA_VIOLATION, _schema_details(error, errors))

    def _authorize(self, name: str, args: Mapping[str, Any]) -> None:
        if self.policy is None:
            return
        try:
            decision = self.policy(name, args)
        except Exception as exc:  # fail closed: a broken policy never lets a call through
            raise _Reject(
                ErrorCode.POLICY_DENIED, f"policy hook raised {type(exc).__name__}"
            ) from None
        if isinstance(decision, Deny):
            raise _Reject(ErrorCode.POLICY_DENIED, decision.reason[:300] or "denied by policy")
        if decision is False:
            raise _Reject(ErrorCode.POLICY_DENIED, "denied by policy")


def _object(value: object) -> dict[str, Any]:
    """``value`` when it is a JSON object; else the ``arguments_not_object`` rejection."""
    if not isinstance(value, dict):
        raise _Reject(
            ErrorCode.ARGUMENTS_NOT_OBJECT,
            f"arguments must be a JSON object, got {_json_type(value)}",
        )
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else type(value).__name__


_OBJECT_RULES = ("additionalProperties", "required")
"""The rules about an object's property names, in the order a detail names them: a failed
call often breaks both at once (a ``town`` sent for a required ``city``), and the detail then
names both, the unexpected name first (usually the cause), whatever the schema's key order."""


def _schema_details(
    best: jsonschema.ValidationError, errors: list[jsonschema.ValidationError]
) -> str:
    """The detail of a schema violation: the best match's; when it breaks a property-name
    rule, that of each such rule broken at the same place (at most 300 characters)."""
    if best.validator in _OBJECT_RULES:
        found = {
            e.validator: e
            for e in reversed(errors)
            if e.absolute_path == best.absolute_path and e.validator in _OBJECT_RULES
        }
        found[best.validator] = best
        parts = [_schema_detail(found[rule]) for rule in _OBJECT_RULES if rule in found]
        text = "; ".join([parts[0], *(p.split(": ", 1)[1] for p in parts[1:])])
    else:
        text = _schema_detail(best)
    return text if len(text) <= 300 else text[:299] + "…"


def _schema_detail(error: jsonschema.ValidationError) -> str:
    """``/pointer: what (the rule)``: the property names involved and facts from the schema,
    never an argument value."""
    pointer = "".join(
        "/" + str(p).replace("~", "~0").replace("/", "~1") for p in error.absolute_path
    )
    where = pointer or "/"
    keyword = str(error.validator)
    expected = error.validator_value
    if keyword == "required" and isinstance(expected, list) and isinstance(error.instance, dict):
        missing = [k for k in expected if k not in error.instance]
        return f"{where}: missing required {_names(missing)} (required)"
    if keyword == "additionalProperties" and isinstance(error.instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        properties = schema.get("properties")
        known: Mapping[str, Any] = properties if isinstance(properties, Mapping) else {}
        patterns = schema.get("patternProperties") or {}
        extra = [k for k in error.instance if k not in known and not _matches(patterns, k)]
        allowed = f"; allowed: {_names(list(known), word='')}" if known else ""
        return f"{where}: unexpected {_names(extra)} (additionalProperties: false{allowed})"
    shown = json.dumps(expected, ensure_ascii=False)
    if len(shown) > 120:
        shown = shown[:119] + "…"
    return f"{where}: fails schema keyword {keyword!r} ({shown})"


def _names(keys: list[Any], *, word: str = "property") -> str:
    """``property "town"``, ``properties "a", "b"``, at most 5 names of at most 40
    characters each (JSON-quoted), then how many more."""
    plural = {"property": "properties"}.get(word, word) if len(keys) != 1 else word
    shown = [json.dumps(str(k)[:40], ensure_ascii=False) + ("…" if len(str(k)) > 40 else "")
             for k in keys[:5]]  # fmt: skip
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return f"{plural} {', '.join(shown)}{more}".strip()


def _matches(patterns: object, key: str) -> bool:
    """Whether ``key`` matches one of the ``patternProperties`` regexes (a bad regex: no)."""
    if not isinstance(patterns, Mapping):
        return False
    for pattern in patterns:
        try:
            if re.search(str(pattern), key):
                return True
        except re.error:
            continue
    return False
