"""Tools from Python functions (internal; public names in :mod:`toollatch.runtime`).

Theory of operation: :func:`tool` reads a function's signature and docstring once, at
decoration time, and builds two things from them: a pydantic model of the parameters (which
coerces the arguments on every call: a ``datetime`` from its ISO text, an enum from its value,
a nested model from an object) and, from that model, the JSON Schema of a
:class:`toollatch.ToolSpec` the gate checks calls against. Whatever cannot work (``*args``, a
positional-only or unannotated parameter, a type pydantic has no schema for) is a
``ConfigError`` then, never a surprise while a model is waiting.

:meth:`Tool.invoke` never raises for anything the model or the tool did: arguments pydantic
refuses become a ``schema_violation`` outcome, an exception in the tool a ``tool_error``
outcome (its type and message, no traceback). Only cancellation passes through, so that a
dispatcher's deadline (``asyncio.timeout``) is the one source of ``TimeoutError`` around it.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import sys
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import (
    Any,
    Generic,
    Literal,
    ParamSpec,
    TypeAlias,
    TypeVar,
    cast,
    get_type_hints,
    overload,
)

import pydantic
import pydantic_core
from pydantic.json_schema import PydanticJsonSchemaWarning

from ..core._errors import ConfigError, ErrorCode, UsageError
from ..core._specs import ToolSpec
from ._results import check_budget
from ._threads import in_tool_thread

P = ParamSpec("P")
R = TypeVar("R")

SideEffects = Literal["read", "write"]
"""What a tool does to the world: ``read`` (nothing the model could not ask again) or
``write`` (the safe assumption for a tool that says nothing)."""

NeedsApproval: TypeAlias = "bool | Callable[[Mapping[str, Any], ApprovalContext], bool]"
"""Whether a call of a tool waits for a person before it runs: always (True), never (False),
or as a function of the call's committed arguments and its :class:`ApprovalContext`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalContext:
    """What a ``needs_approval`` function knows of a committed call besides its arguments."""

    session: str
    """The conversation (the ledger's scope) the call belongs to."""
    call_id: str
    """The provider's call id."""
    name: str
    """The tool name."""


_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""The tool-name rule OpenAI enforces (letters, digits, ``_``, ``-``; at most 64), the
strictest of the providers: https://platform.openai.com/docs/api-reference/chat/create"""

MAX_DETAIL_CHARS = 1000
"""Longest exception message or validation detail put in an error outcome: enough for the
model to correct itself, short enough that a tool raising with a whole file in its message
does not flood the context window."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOutcome:
    """What one run of a tool produced.

    A tool function may return one to set ``ui`` or ``is_error``; any other return value ``v``
    means ``ToolOutcome(content=v)``. :meth:`Tool.invoke` returns outcomes whose ``content``
    is already text: a ``str`` unchanged, anything else as compact JSON (``None`` is
    ``"null"``, so the model always reads a JSON value or the tool's own text).
    """

    content: Any
    """What the model reads: a str, or any JSON-able value (serialized to compact JSON)."""
    ui: Any = None
    """Optional payload for a user interface; never sent to the model."""
    is_error: bool = False
    """True when the tool reports failure (the model still reads ``content``)."""
    code: ErrorCode | None = None
    """The stable code of an error outcome; None on an error outcome the tool returned
    itself means ``tool_error``."""


class Tool(Generic[P, R]):
    """A Python function the model may call: its spec, its options, and :meth:`invoke`.

    Calling the Tool calls the original function unchanged (handy in tests and in code that
    uses the function directly); only :meth:`invoke` validates and coerces arguments.
    """

    __slots__ = (
        "__wrapped__",
        "_model",
        "_params",
        "client",
        "group",
        "idempotent",
        "max_result_bytes",
        "name",
        "needs_approval",
        "side_effects",
        "spec",
    )

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        spec: ToolSpec,
        side_effects: SideEffects,
        group: str | None,
        idempotent: bool,
        model: type[pydantic.BaseModel] | None,
        params: Mapping[str, str],
        max_result_bytes: int | None = None,
        needs_approval: NeedsApproval = False,
        client: bool = False,
    ) -> None:
        self.__wrapped__ = fn
        self.spec = spec
        """The :class:`toollatch.ToolSpec` to give ``Gate``/``StreamParser(tools=...)``."""
        self.name = spec.name
        """The name the model calls it by."""
        self.side_effects: SideEffects = side_effects
        """``read`` or ``write`` (see :data:`SideEffects`)."""
        self.group = group
        """Tools of one group never run at the same time (None: no such constraint)."""
        self.idempotent = idempotent
        """True when running a call twice has the effect of running it once, so a call whose
        outcome is unknown (its run was cancelled or timed out) may run again."""
        if max_result_bytes is not None:
            check_budget(f"tool {spec.name!r}: max_result_bytes", max_result_bytes)
        self.max_result_bytes = max_result_bytes
        """The size budget of this tool's results in UTF-8 bytes (None: the dispatcher's)."""
        self.needs_approval: NeedsApproval = needs_approval
        """Whether a committed call waits for a person's approval before it runs (see
        :data:`NeedsApproval`)."""
        self.client = client
        """True for a client tool: declared without a body, its result comes from outside
        (a browser, a script) through ``AgentRun.submit_result``; it never runs here."""
        self._model = model
        self._params = params  # model field name -> parameter name

    @property
    def eager(self) -> bool:
        """May start before the round ends, when the core says the call is safely complete."""
        return self.spec.eager

    @property
    def timeout_s(self) -> float | None:
        """Run-time limit of one call in seconds (None: the dispatcher's default)."""
        return self.spec.timeout_s

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the original function directly (no validation, no worker thread)."""
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name} side_effects={self.side_effects} eager={self.eager}>"

    def asks(self, arguments: Mapping[str, Any], context: ApprovalContext) -> bool:
        """Whether a call with these committed ``arguments`` needs a person's approval (a
        ``needs_approval`` function that raises means yes: a doubt asks). A client tool's
        call waits for its result instead, never for an approval."""
        decide = self.needs_approval
        if self.client or decide is False:
            return False
        if decide is True:
            return True
        try:
            return bool(decide(arguments, context))
        except Exception:  # the function's own bug: ask rather than run unasked
            return True

    async def invoke(self, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Run the tool with ``arguments`` (normally gate-validated) and return its outcome.

        Never raises for the model's or the tool's faults: see the module docstring. A sync
        function runs in a worker thread (a daemon thread of ``_threads.TOOL_THREADS``, with
        the caller's context variables) so the loop never blocks; a worker thread cannot be
        stopped, so a sync tool cancelled or timed out mid-run finishes in the background and
        its result is discarded, and a program that ends meanwhile abandons it (never waits).
        Raises ``UsageError`` when ``arguments`` is not a mapping.
        """
        if not isinstance(arguments, Mapping):
            raise UsageError(f"arguments must be a mapping, got {type(arguments).__name__}")
        if self.client:
            detail = "a client tool has no body here; its result comes from the client"
            return _failed(ErrorCode.TOOL_ERROR, detail)
        if self._model is None:  # a schema_tool: its function takes the argument mapping
            return await _call_with_mapping(self.__wrapped__, arguments)
        try:
            bound = self._model.model_validate(dict(arguments))
        except pydantic.ValidationError as exc:
            return _failed(ErrorCode.SCHEMA_VIOLATION, _validation_detail(exc))
        except Exception as exc:  # a validator of the tool's own types failed: its fault
            return _failed(ErrorCode.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        kwargs = {param: getattr(bound, field) for field, param in self._params.items()}
        try:
            value = await _run(self.__wrapped__, kwargs)
        except Exception as exc:  # the tool's fault, reported to the model (no traceback)
            return _failed(ErrorCode.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        return as_text(value)


async def _run(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await cast(Callable[..., Awaitable[Any]], fn)(**kwargs)
    value = await in_tool_thread(fn, **kwargs)
    if inspect.isawaitable(value):  # a sync wrapper returning a coroutine
        return await value
    return value


def as_text(value: Any) -> ToolOutcome:
    """A tool's return value as an outcome whose ``content`` is text (see ``ToolOutcome``)."""
    outcome = value if isinstance(value, ToolOutcome) else ToolOutcome(content=value)
    if isinstance(outcome.content, str):
        return outcome
    try:
        text = pydantic_core.to_json(outcome.content).decode()
    except pydantic_core.PydanticSerializationError as exc:
        if "surrogates not allowed" not in str(exc):
            return _failed(ErrorCode.TOOL_ERROR, f"the result is not JSON-serializable: {exc}")
        # A str holding a lone surrogate (a file name that is not UTF-8, from os.listdir):
        # written as text with it; the dispatcher's result boundary replaces it and says so.
        try:
            text = json.dumps(
                outcome.content,
                ensure_ascii=False,
                separators=(",", ":"),
                default=pydantic_core.to_jsonable_python,
            )
        except (TypeError, ValueError) as again:
            return _failed(ErrorCode.TOOL_ERROR, f"the result is not JSON-serializable: {again}")
    return ToolOutcome(content=text, ui=outcome.ui, is_error=outcome.is_error, code=outcome.code)


def _failed(code: ErrorCode, detail: str) -> ToolOutcome:
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[:MAX_DETAIL_CHARS] + "..."
    return ToolOutcome(content=f"{code}: {detail}", is_error=True, code=code)


def _validation_detail(exc: pydantic.ValidationError) -> str:
    """Where and why, never the input values (they may be large or secret)."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


# -- the decorator ---------------------------------------------------------------------------


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    eager: bool = False,
    timeout: float | None = None,
    side_effects: SideEffects = "write",
    group: str | None = None,
    idempotent: bool = False,
    max_result_bytes: int | None = None,
    needs_approval: NeedsApproval = False,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    eager: bool = False,
    timeout: float | None = None,
    side_effects: SideEffects = "write",
    group: str | None = None,
    idempotent: bool = False,
    max_result_bytes: int | None = None,
    needs_approval: NeedsApproval = False,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a :class:`Tool` of a sync or async function: ``@tool`` or ``@tool(...)``.

    ``name`` and ``description`` default to the function's name and docstring; ``timeout``
    is in seconds; ``max_result_bytes`` is the size budget of its results (UTF-8 bytes, at
    least 256; None: the dispatcher's); ``needs_approval``: True, or a function of the
    committed arguments and an :class:`ApprovalContext` returning a bool, makes a call wait
    for a person (``AgentRun.approve`` / ``deny``) before it runs. Raises ``ConfigError``
    (naming the function and parameter) for what cannot become a tool; see the module
    docstring.
    """
    options = _Options(
        name,
        description,
        eager,
        timeout,
        side_effects,
        group,
        idempotent,
        max_result_bytes,
        needs_approval,
    )
    if fn is None:

        def decorate(f: Callable[P, R]) -> Tool[P, R]:
            return _make(f, options, _caller_locals())

        return decorate
    return _make(fn, options, _caller_locals())


def _caller_locals() -> dict[str, Any]:
    """The locals where ``@tool`` was applied (two frames up), so that hints naming a class
    defined in a function resolve under ``from __future__ import annotations`` (what
    pydantic does for models defined in functions)."""
    frame = sys._getframe(2)
    return dict(frame.f_locals)


@dataclass(frozen=True, slots=True)
class _Options:
    name: str | None
    description: str | None
    eager: bool
    timeout: float | None
    side_effects: str
    group: str | None
    idempotent: bool
    max_result_bytes: int | None
    needs_approval: NeedsApproval = False


def _make(fn: Callable[P, R], options: _Options, localns: Mapping[str, Any]) -> Tool[P, R]:
    if not callable(fn):
        raise ConfigError(f"@tool needs a function, got {fn!r:.60}")
    label = getattr(fn, "__qualname__", repr(fn))
    name = options.name if options.name is not None else getattr(fn, "__name__", "")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{label}: tool name {name!r} must match {_NAME.pattern}")
    _check(options, label)
    summary, param_docs = parse_docstring(inspect.getdoc(fn) or "")
    model, params = _parameters_model(fn, label, param_docs, localns)
    description = options.description if options.description is not None else summary
    return _built(fn, options, name, _schema(model, label), description, model, params)


def _check(options: _Options, label: str) -> None:
    """The option checks ``@tool`` and :func:`schema_tool` share (``ConfigError``)."""
    if options.side_effects not in ("read", "write"):
        raise ConfigError(f"{label}: side_effects must be 'read' or 'write'")
    if options.group is not None and (not isinstance(options.group, str) or not options.group):
        raise ConfigError(f"{label}: group must be a non-empty string or None")
    timeout = options.timeout
    if timeout is not None and not (
        isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0
    ):
        raise ConfigError(f"{label}: timeout must be a positive number of seconds")
    if not isinstance(options.needs_approval, bool) and not callable(options.needs_approval):
        raise ConfigError(f"{label}: needs_approval must be a bool or a function")


def _built(
    fn: Callable[P, R],
    options: _Options,
    name: str,
    parameters: Mapping[str, Any],
    description: str,
    model: type[pydantic.BaseModel] | None,
    params: dict[str, str],
    client: bool = False,
) -> Tool[P, R]:
    """The :class:`Tool` of checked options (``@tool``'s and :func:`schema_tool`'s)."""
    timeout = options.timeout
    spec = ToolSpec(
        name=name,
        parameters=parameters,
        description=description,
        eager=bool(options.eager),
        timeout_s=None if timeout is None else float(timeout),
    )
    return Tool(
        fn,
        spec=spec,
        side_effects=cast(SideEffects, options.side_effects),
        group=options.group,
        idempotent=bool(options.idempotent),
        model=model,
        params=params,
        max_result_bytes=options.max_result_bytes,
        needs_approval=options.needs_approval,
        client=client,
    )


def _parameters_model(
    fn: Callable[..., Any], label: str, docs: Mapping[str, str], localns: Mapping[str, Any]
) -> tuple[type[pydantic.BaseModel], dict[str, str]]:
    """The pydantic model of ``fn``'s parameters, and model field name -> parameter name.

    Fields are named ``p0, p1...`` with the parameter name as alias, so that a parameter
    called ``json``, ``copy`` or ``model_config`` cannot collide with pydantic's own names.
    """
    try:
        signature = inspect.signature(fn)
        hints = get_type_hints(fn, localns=dict(localns), include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigError(f"{label}: cannot read the signature: {exc}") from None
    fields: dict[str, Any] = {}
    params: dict[str, str] = {}
    for i, param in enumerate(signature.parameters.values()):
        hint = _checked_hint(param, hints, label)
        default = ... if param.default is inspect.Parameter.empty else param.default
        field = pydantic.Field(default, alias=param.name, description=docs.get(param.name))
        fields[f"p{i}"] = (hint, field)
        params[f"p{i}"] = param.name
    config = pydantic.ConfigDict(extra="forbid", populate_by_name=False)
    try:
        model = pydantic.create_model(f"{label}_arguments", __config__=config, **fields)
    except (pydantic.PydanticUserError, TypeError) as exc:
        raise ConfigError(f"{label}: cannot build the arguments model: {exc}") from None
    return model, params


def _checked_hint(param: inspect.Parameter, hints: Mapping[str, Any], label: str) -> Any:
    kind = param.kind
    if kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        raise ConfigError(f"{label}: parameter {param.name!r}: *args/**kwargs cannot be a tool's")
    if kind is param.POSITIONAL_ONLY:
        raise ConfigError(f"{label}: parameter {param.name!r} is positional-only")
    if param.name not in hints:
        raise ConfigError(f"{label}: parameter {param.name!r} has no type hint")
    hint = hints[param.name]
    try:
        pydantic.TypeAdapter(hint).json_schema()
    except (pydantic.PydanticUserError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{label}: parameter {param.name!r}: no JSON Schema for {hint!r}: {exc}"
        ) from None
    return hint


def _schema(model: type[pydantic.BaseModel], label: str) -> dict[str, Any]:
    # A default pydantic cannot render in JSON is left out of the schema (it warns): the
    # model still applies it, and the schema stays valid.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        try:
            schema = model.model_json_schema(by_alias=True)
        except pydantic.PydanticUserError as exc:
            raise ConfigError(f"{label}: no JSON Schema for the parameters: {exc}") from None
    schema.pop("title", None)
    schema["additionalProperties"] = False
    schema.setdefault("properties", {})
    for prop in schema["properties"].values():
        if isinstance(prop, dict):
            prop.pop("title", None)  # the parameter's name again: noise for the model
    return schema


def schema_tool(
    name: str,
    parameters: Mapping[str, Any],
    fn: Callable[[dict[str, Any]], Awaitable[Any]] | None = None,
    *,
    description: str = "",
    eager: bool = False,
    timeout: float | None = None,
    side_effects: SideEffects = "write",
    group: str | None = None,
    idempotent: bool = False,
    max_result_bytes: int | None = None,
    needs_approval: NeedsApproval = False,
) -> Tool[..., Any]:
    """A :class:`Tool` from a name, a JSON Schema of its arguments and an async function
    taking the argument mapping (the gate has validated it against ``parameters``; no
    pydantic model is involved): tools from elsewhere, such as an MCP server's. The same
    options as :func:`tool`; ``invoke`` keeps its contract (an exception ``fn`` raises is a
    ``tool_error`` outcome). Without ``fn`` it is a *client tool* (:attr:`Tool.client`): the
    model may call it, and its committed call waits for the result a client submits
    (``AgentRun.submit_result``). Raises ``ConfigError`` for a bad name, schema or option."""
    if not _NAME.match(name if isinstance(name, str) else ""):
        raise ConfigError(f"tool name {name!r} must match {_NAME.pattern}")
    if fn is not None and not callable(fn):
        raise ConfigError(f"{name}: fn must be an async function of the arguments")
    options = _Options(
        name,
        description,
        eager,
        timeout,
        side_effects,
        group,
        idempotent,
        max_result_bytes,
        needs_approval,
    )
    _check(options, name)
    body = fn if fn is not None else _no_body
    return _built(body, options, name, parameters, description, None, {}, fn is None)


async def _no_body(arguments: dict[str, Any]) -> Any:
    """A client tool's stand-in body (``Tool.invoke`` never calls it)."""
    raise UsageError("a client tool has no body")  # pragma: no cover


async def _call_with_mapping(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> ToolOutcome:
    try:
        value = await fn(dict(arguments))
    except Exception as exc:  # the tool's fault, reported to the model (no traceback)
        return _failed(ErrorCode.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
    return as_text(value)


# -- docstrings ------------------------------------------------------------------------------

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?):\s*$"
)
_GOOGLE_ARG = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before the first section or ``:field:``) and each documented
    parameter's description, from a Google-style ``Args:`` section or ``:param x:`` lines."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent = -1  # indentation of the Args: entries (deeper lines continue one)
    for raw in inspect.cleandoc(doc).splitlines():
        line, indent = raw.strip(), len(raw) - len(raw.lstrip())
        header, sphinx = _SECTION.match(line), _SPHINX_PARAM.match(line)
        google = _GOOGLE_ARG.match(line) if section in _ARGS and indent > 0 else None
        if header:
            section, current, entry_indent = header.group(1), None, -1
        elif sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
        elif line.startswith(":"):
            section, current = "sphinx", None  # :returns:, :raises: ...
        elif section is None:
            summary.append(raw)
        elif google and (entry_indent < 0 or indent <= entry_indent):
            entry_indent, current = indent, google.group(1).lstrip("*")
            params[current] = google.group(2).strip()
        elif current is not None and line and (indent > 0 or section == "sphinx"):
            params[current] = f"{params[current]} {line}".strip()
    return "\n".join(summary).strip(), params


_ARGS = frozenset({"Args", "Arguments", "Parameters", "Params"})
