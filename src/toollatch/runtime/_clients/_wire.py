"""What each provider's streaming request looks like on the wire (no I/O here).

One :class:`Dialect` per provider: default base URL, the key and base-URL variables, the
path, the auth headers and the JSON body. The history is taken as given (already in the
provider's format: the builders in :mod:`toollatch.messages` produce it); tools are converted
from :class:`toollatch.ToolSpec`. References per provider are on each ``_*_body`` function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ...core._registry import Framing
from ...core._specs import ToolSpec
from . import _bedrock as bedrock

Body = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One round's request, before it meets a base URL and a key."""

    history: Sequence[Mapping[str, Any]]
    """Messages / input items / contents, in the provider's own format."""
    tools: Sequence[ToolSpec]
    """The tools the model may call (converted per provider)."""
    system: str | None
    """System prompt (each provider's own field), or None."""
    max_tokens: int | None
    """Output token cap, or None for the provider default (Anthropic: the client default)."""
    extra: Mapping[str, Any]
    """Top-level body keys merged over the built body (``temperature``, ``store``...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """One provider's request format."""

    provider: str
    """The toollatch provider name (the adapter's)."""
    default_base_url: str
    """The provider's own base URL, as its official SDK takes it."""
    key_variables: tuple[str, ...]
    """Environment variables holding the key, first found wins; the first is the one named."""
    base_url_variable: str | None
    """Environment variable overriding the base URL (as the SDK reads it), if any."""
    path: Callable[[str], str]
    """The path under the base URL for a model (query string included)."""
    auth: Callable[[str], dict[str, str]]
    """Headers carrying a key."""
    body: Callable[[str, Request], Body]
    """The JSON body for a model and a request (streaming flags set)."""
    fixed_headers: Mapping[str, str]
    """Headers every request carries (e.g. ``anthropic-version``)."""
    framing: Framing = "sse"
    """How the answer's body is framed (Bedrock: the AWS binary ``eventstream``)."""
    extended: tuple[str, ...] = ()
    """Body objects that an ``extra`` object of the same name extends (one level deep)
    instead of replacing (Bedrock: ``toolConfig`` keeps its tools beside a ``toolChoice``)."""


def _chat_body(model: str, request: Request) -> Body:
    """https://platform.openai.com/docs/api-reference/chat/create: ``stream_options.
    include_usage`` adds a last chunk with usage; ``max_completion_tokens`` replaces the
    deprecated ``max_tokens`` (pass ``extra={"max_tokens": n}`` for servers lacking it)."""
    messages = list(request.history)
    if request.system is not None:
        messages.insert(0, {"role": "system", "content": request.system})
    body: Body = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {"type": "function", "function": _named(spec, "parameters")} for spec in request.tools
        ]
    if request.max_tokens is not None:
        body["max_completion_tokens"] = request.max_tokens
    return body


def _responses_body(model: str, request: Request) -> Body:
    """https://platform.openai.com/docs/api-reference/responses/create: ``input`` items,
    ``instructions`` for the system prompt, flat function tools, ``max_output_tokens``."""
    body: Body = {"model": model, "input": list(request.history), "stream": True}
    if request.system is not None:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {"type": "function", **_named(spec, "parameters")} for spec in request.tools
        ]
    if request.max_tokens is not None:
        body["max_output_tokens"] = request.max_tokens
    return body


ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
"""Anthropic requires ``max_tokens``; this is sent when the caller gives none (a common SDK
example value, well under every current model's output limit)."""


def _anthropic_body(model: str, request: Request) -> Body:
    """https://docs.anthropic.com/en/api/messages: ``max_tokens`` is required, tools carry
    ``input_schema``, the system prompt is a top-level ``system``."""
    max_tokens = request.max_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS
    body: Body = {
        "model": model,
        "messages": list(request.history),
        "max_tokens": max_tokens,
        "stream": True,
    }
    if request.system is not None:
        body["system"] = request.system
    if request.tools:
        body["tools"] = [_named(spec, "input_schema") for spec in request.tools]
    return body


def _gemini_body(model: str, request: Request) -> Body:
    """https://ai.google.dev/api/generate-content: ``contents``, ``systemInstruction``,
    ``generationConfig.maxOutputTokens`` and one tool holding every function declaration."""
    body: Body = {"contents": list(request.history)}
    if request.system is not None:
        body["systemInstruction"] = {"parts": [{"text": request.system}]}
    if request.tools:
        body["tools"] = [{"functionDeclarations": [gemini_declaration(t) for t in request.tools]}]
    if request.max_tokens is not None:
        body["generationConfig"] = {"maxOutputTokens": request.max_tokens}
    return body


def _bedrock_body(model: str, request: Request) -> Body:
    """See :func:`._bedrock.body` (the model is in the path, not the body)."""
    tools = [_named(spec, "parameters") for spec in request.tools]
    return bedrock.body(list(request.history), request.system, tools, request.max_tokens)


def _named(spec: ToolSpec, schema_key: str) -> Body:
    return {"name": spec.name, "description": spec.description, schema_key: dict(spec.parameters)}


# Gemini's ``parameters`` is a "select subset" of the OpenAPI 3.0 Schema object
# (https://ai.google.dev/api/caching#Schema): no $ref/$defs, allOf/oneOf, const, type arrays,
# additionalProperties... A schema using anything else goes as ``parametersJsonSchema``
# (https://ai.google.dev/api/caching#FunctionDeclaration: JSON Schema, mutually exclusive
# with ``parameters``), unchanged, instead of being silently weakened by a conversion.
_GEMINI_KEYWORDS = frozenset(
    {
        "type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems",
        "properties", "required", "minProperties", "maxProperties", "minLength", "maxLength",
        "pattern", "example", "anyOf", "propertyOrdering", "default", "items", "minimum",
        "maximum",
    }
)  # fmt: skip
_GEMINI_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})


def gemini_declaration(spec: ToolSpec) -> Body:
    """A Gemini function declaration for ``spec``: ``parameters`` when its schema is inside
    Gemini's OpenAPI subset, else ``parametersJsonSchema`` (the schema as is)."""
    schema = dict(spec.parameters)
    key = "parameters" if _in_gemini_subset(schema) else "parametersJsonSchema"
    return {"name": spec.name, "description": spec.description, key: schema}


def _in_gemini_subset(schema: object) -> bool:
    if not isinstance(schema, Mapping) or not _GEMINI_KEYWORDS.issuperset(schema):
        return False
    kind = schema.get("type")
    if kind is not None and not (isinstance(kind, str) and kind.lower() in _GEMINI_TYPES):
        return False
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return False
    children = [*properties.values(), *schema.get("anyOf", [])]
    if "items" in schema:
        children.append(schema["items"])
    return all(_in_gemini_subset(child) for child in children)


def _gemini_path(model: str) -> str:
    # "models/x" is how the API itself names a model; accept it as well as "x"
    name = model.removeprefix("models/")
    return f"/v1beta/models/{quote(name, safe='')}:streamGenerateContent?alt=sse"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


DIALECTS: dict[str, Dialect] = {
    "openai_chat": Dialect(
        provider="openai_chat",
        default_base_url="https://api.openai.com/v1",
        key_variables=("OPENAI_API_KEY",),
        base_url_variable="OPENAI_BASE_URL",
        path=lambda model: "/chat/completions",
        auth=_bearer,
        body=_chat_body,
        fixed_headers={},
    ),
    "openai_responses": Dialect(
        provider="openai_responses",
        default_base_url="https://api.openai.com/v1",
        key_variables=("OPENAI_API_KEY",),
        base_url_variable="OPENAI_BASE_URL",
        path=lambda model: "/responses",
        auth=_bearer,
        body=_responses_body,
        fixed_headers={},
    ),
    "anthropic": Dialect(
        provider="anthropic",
        default_base_url="https://api.anthropic.com",
        key_variables=("ANTHROPIC_API_KEY",),
        base_url_variable="ANTHROPIC_BASE_URL",
        path=lambda model: "/v1/messages",
        auth=lambda key: {"x-api-key": key},
        body=_anthropic_body,
        # https://docs.anthropic.com/en/api/versioning
        fixed_headers={"anthropic-version": "2023-06-01"},
    ),
    "gemini": Dialect(
        provider="gemini",
        default_base_url="https://generativelanguage.googleapis.com",
        # the google-genai SDK also reads GOOGLE_API_KEY and GOOGLE_GEMINI_BASE_URL
        key_variables=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        base_url_variable="GOOGLE_GEMINI_BASE_URL",
        path=_gemini_path,
        auth=lambda key: {"x-goog-api-key": key},
        body=_gemini_body,
        fixed_headers={},
    ),
    "bedrock": Dialect(
        provider="bedrock",
        # the region's endpoint in fact (._bedrock.default_base_url); this one for hints
        default_base_url="https://bedrock-runtime.us-east-1.amazonaws.com",
        key_variables=(bedrock.BEARER_VARIABLE,),
        base_url_variable=bedrock.ENDPOINT_VARIABLE,
        path=bedrock.path,
        auth=_bearer,
        body=_bedrock_body,
        fixed_headers={"accept": "application/vnd.amazon.eventstream"},
        framing="eventstream",
        extended=("toolConfig", "inferenceConfig"),
    ),
}
"""Every provider a model client speaks, by toollatch provider name."""
