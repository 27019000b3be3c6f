"""``toollatch proxy --upstream-provider``: an OpenAI chat request sent to a non-chat upstream
(Anthropic Messages, Gemini, OpenAI Responses, Bedrock ConverseStream) and its stream read
back (internal; the server is :mod:`._proxy`).

Theory of operation. The client's Chat Completions body is translated into the chosen provider's
*history* (:func:`translate`: pure, one function per provider) plus the parts the runtime's
model client places itself (system prompt, tools, ``max_tokens``) and the top-level extras it
merges last (``tool_choice``, sampling settings). The request is then built and sent by the
runtime's own :func:`toollatch.model_client` (its dialects know each provider's path, body,
fixed headers and key header: ``x-api-key`` + ``anthropic-version``, ``x-goog-api-key``,
``Authorization: Bearer``; Bedrock: the bearer is a Bedrock API key, else the proxy's own
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` sign each request with SigV4), one client per
request (the key is the request's), on the proxy's shared httpx client, without retries (the
proxy's client retries itself). Its :class:`~toollatch.runtime.ModelStream` is what the proxy's
reader reads (:class:`ModelAnswer`), with the upstream provider's adapter, so the answer is the
same OpenAI chat answer as from a chat upstream. An upstream's error status comes back as an
OpenAI-shaped error with that status (and ``Retry-After``).

What does not cross: content other than text (images, audio) is refused (400), reasoning
blocks and Gemini thought signatures of earlier turns are not in an OpenAI history, and
Gemini's made-up call ids (``gemini:...``: Gemini sends none) are not sent back to it.
Bedrock has no ``tool_choice: none`` (a 400 here) and its answers are not recorded.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..core._errors import ConfigError, UsageError
from ..core._specs import ToolSpec
from ..runtime import ModelStream
from ..runtime._clients._client import model_client
from ..runtime._clients._errors import (
    ModelConnectError,
    ModelError,
    ModelHTTPError,
    StreamTimeout,
)
from ..runtime._clients._policy import ClientLimits, RetryPolicy

UPSTREAM_PROVIDERS = ("openai_chat", "anthropic", "gemini", "openai_responses", "bedrock")
"""The upstream wires the proxy reads (``openai_chat``: passed through, the default)."""
_PASSED = ("temperature", "top_p")
"""Sampling settings every target takes under its own name (Gemini: in generationConfig)."""
_GEMINI_MADE_UP = "gemini:"
_MODEL_PAGES = 10
"""Pages of a provider's model list read at most for one ``GET /v1/models`` (each up to
1,000 models: the most Anthropic's ``limit`` and Gemini's ``pageSize`` take)."""
"""The prefix of the call ids the Gemini adapter makes up (Gemini sent none)."""


class Upstream(Protocol):
    """What the proxy's reader needs of an upstream answer (an httpx response has it)."""

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come."""
        ...

    async def aclose(self) -> None:
        """Close the answer (the connection goes back to the pool)."""
        ...


class Untranslatable(Exception):
    """An OpenAI request that cannot be said in the upstream's format (a 400)."""


@dataclass(slots=True, kw_only=True)
class Translated:
    """One OpenAI chat request, in the upstream provider's terms."""

    history: list[dict[str, Any]] = field(default_factory=list)
    """Messages / input items / contents in the provider's format."""
    system: str | None = None
    """The system (and developer) messages' text, for the provider's own field."""
    max_tokens: int | None = None
    """``max_completion_tokens`` or ``max_tokens``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level body keys (tool choice, sampling), merged over the built body."""


def translate(provider: str, body: Mapping[str, Any]) -> Translated:
    """``body`` (an OpenAI Chat Completions request) for ``provider``. Raises
    :class:`Untranslatable` for what has no equivalent or is malformed."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Untranslatable("messages must be a list")
    out = Translated(max_tokens=_max_tokens(body))
    system: list[str] = []
    names: dict[str, str] = {}  # call id -> tool name (Gemini answers by name)
    build = _BUILDERS[provider]
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Untranslatable(f"messages[{n}] must be an object")
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text(message.get("content"), n))
            continue
        if role == "assistant":
            calls = _calls(message.get("tool_calls"), n)
            names.update((call_id, name) for call_id, name, _ in calls)
            build.assistant(out.history, _text(message.get("content"), n), calls)
        elif role == "user":
            build.user(out.history, _text(message.get("content"), n))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise Untranslatable(f"messages[{n}].tool_call_id must be a non-empty string")
            result = _text(message.get("content"), n)
            build.result(out.history, call_id, names.get(call_id, ""), result)
        else:
            raise Untranslatable(f"messages[{n}].role {role!r} is not translated")
    out.system = "\n\n".join(system) if system else None
    out.extra = build.extra(body)
    return out


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise Untranslatable(f"max_tokens must be a positive integer, got {value!r}")
    return value


def _text(content: object, n: int) -> str:
    """A message's text: a string, or its ``text`` parts joined (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Untranslatable(f"messages[{n}].content must be a string or a list of parts")
    texts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") == "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise Untranslatable(
                f"messages[{n}].content: only text parts reach this upstream, not {kind!r}"
            )
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _calls(raw: object, n: int) -> list[tuple[str, str, dict[str, Any]]]:
    """An assistant message's ``tool_calls`` as (id, name, arguments object)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Untranslatable(f"messages[{n}].tool_calls must be a list")
    calls = []
    for k, call in enumerate(raw):
        where = f"messages[{n}].tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise Untranslatable(f"{where}.function must be an object")
        call_id, name = call.get("id"), function.get("name")
        if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
            raise Untranslatable(f"{where} needs an id and a function name")
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except (orjson.JSONDecodeError, TypeError):
            raise Untranslatable(f"{where}.function.arguments is not JSON text") from None
        if not isinstance(arguments, dict):
            raise Untranslatable(f"{where}.function.arguments is not a JSON object")
        calls.append((call_id, name, arguments))
    return calls


def _choice(body: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """The request's ``tool_choice`` as (mode, tool name): mode auto, required or none."""
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if choice in ("auto", "required", "none"):
        return str(choice), None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise Untranslatable("tool_choice must be auto, required, none or a named function")
    return "required", name


# --- Anthropic Messages: https://docs.anthropic.com/en/api/messages ----------------------------


class _Anthropic:
    """``tool_use`` blocks in the assistant's content; results as ``tool_result`` blocks
    first in the next user message (several results: one message); ``tool_choice`` auto /
    any / none / tool (https://docs.anthropic.com/en/docs/build-with-claude/tool-use)."""

    @staticmethod
    def user(history: list[dict[str, Any]], text: str) -> None:
        last = history[-1] if history else None
        if last is not None and last["role"] == "user" and isinstance(last["content"], list):
            last["content"].append({"type": "text", "text": text})  # after the results
        else:
            history.append({"role": "user", "content": text})

    @staticmethod
    def assistant(
        history: list[dict[str, Any]], text: str, calls: list[tuple[str, str, dict[str, Any]]]
    ) -> None:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]
        if blocks:
            history.append({"role": "assistant", "content": blocks})

    @staticmethod
    def result(history: list[dict[str, Any]], call_id: str, _name: str, text: str) -> None:
        block = {"type": "tool_result", "tool_use_id": call_id, "content": text}
        last = history[-1] if history else None
        if last is not None and last["role"] == "user" and isinstance(last["content"], list):
            last["content"].append(block)
        else:
            history.append({"role": "user", "content": [block]})

    @staticmethod
    def extra(body: Mapping[str, Any]) -> dict[str, Any]:
        extra = {k: body[k] for k in _PASSED if k in body}
        stop = body.get("stop")
        if stop is not None:
            extra["stop_sequences"] = [stop] if isinstance(stop, str) else stop
        choice = _choice(body)
        if choice is not None:
            mode, name = choice
            kind = {"auto": "auto", "required": "any", "none": "none"}[mode]
            tool_choice: dict[str, Any] = {"type": "tool", "name": name} if name else {"type": kind}
            if body.get("parallel_tool_calls") is False and mode != "none":
                tool_choice["disable_parallel_tool_use"] = True
            extra["tool_choice"] = tool_choice
        return extra


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """``temperature``, ``top_p`` and ``stop`` in the camel case Gemini's
    ``generationConfig`` and Bedrock's ``inferenceConfig`` share (``topP``,
    ``stopSequences``)."""
    config: dict[str, Any] = {k: body[k] for k in _PASSED if k in body}
    config = {"topP" if k == "top_p" else k: v for k, v in config.items()}
    stop = body.get("stop")
    if stop is not None:
        config["stopSequences"] = [stop] if isinstance(stop, str) else stop
    return config


# --- Gemini: https://ai.google.dev/api/generate-content ----------------------------------------


class _Gemini:
    """``functionCall`` parts in a ``model`` content; results as ``functionResponse`` parts
    (by name, in call order) in one ``user`` content; ``toolConfig.functionCallingConfig``
    (https://ai.google.dev/gemini-api/docs/function-calling#function_calling_modes)."""

    @staticmethod
    def user(history: list[dict[str, Any]], text: str) -> None:
        history.append({"role": "user", "parts": [{"text": text}]})

    @staticmethod
    def assistant(
        history: list[dict[str, Any]], text: str, calls: list[tuple[str, str, dict[str, Any]]]
    ) -> None:
        parts: list[dict[str, Any]] = [{"text": text}] if text else []
        for call_id, name, arguments in calls:
            function: dict[str, Any] = {"name": name, "args": arguments}
            if not call_id.startswith(_GEMINI_MADE_UP):
                function["id"] = call_id
            parts.append({"functionCall": function})
        if parts:
            history.append({"role": "model", "parts": parts})

    @staticmethod
    def result(history: list[dict[str, Any]], call_id: str, name: str, text: str) -> None:
        if not name:
            raise Untranslatable(f"tool result {call_id!r} answers no earlier tool call")
        response: dict[str, Any] = {"name": name, "response": {"output": text}}
        if not call_id.startswith(_GEMINI_MADE_UP):
            response["id"] = call_id
        last = history[-1] if history else None
        if last is not None and last["role"] == "user" and "functionResponse" in last["parts"][0]:
            last["parts"].append({"functionResponse": response})
        else:
            history.append({"role": "user", "parts": [{"functionResponse": response}]})

    @staticmethod
    def extra(body: Mapping[str, Any]) -> dict[str, Any]:
        config = _sampling(body)
        tokens = _max_tokens(body)
        if tokens is not None:  # (here: the model client's would be replaced by extra's)
            config["maxOutputTokens"] = tokens
        extra: dict[str, Any] = {"generationConfig": config} if config else {}
        choice = _choice(body)
        if choice is not None:
            mode, name = choice
            modes = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
            calling: dict[str, Any] = {"mode": modes[mode]}
            if name:
                calling["allowedFunctionNames"] = [name]
            extra["toolConfig"] = {"functionCallingConfig": calling}
        return extra


# --- OpenAI Responses: https://platform.openai.com/docs/api-reference/responses/create --------


class _Responses:
    """``function_call`` and ``function_call_output`` input items; ``tool_choice`` as chat's
    with a named function flattened (``{"type": "function", "name"}``)."""

    @staticmethod
    def user(history: list[dict[str, Any]], text: str) -> None:
        history.append({"role": "user", "content": text})

    @staticmethod
    def assistant(
        history: list[dict[str, Any]], text: str, calls: list[tuple[str, str, dict[str, Any]]]
    ) -> None:
        if text:
            history.append({"role": "assistant", "content": text})
        for call_id, name, arguments in calls:
            item = {"type": "function_call", "call_id": call_id, "name": name}
            history.append({**item, "arguments": orjson.dumps(arguments).decode()})

    @staticmethod
    def result(history: list[dict[str, Any]], call_id: str, _name: str, text: str) -> None:
        history.append({"type": "function_call_output", "call_id": call_id, "output": text})

    @staticmethod
    def extra(body: Mapping[str, Any]) -> dict[str, Any]:
        extra = {k: body[k] for k in (*_PASSED, "parallel_tool_calls") if k in body}
        choice = _choice(body)
        if choice is not None:
            mode, name = choice
            extra["tool_choice"] = {"type": "function", "name": name} if name else mode
        return extra


# --- Bedrock Converse: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html


class _Bedrock:
    """``toolUse`` blocks in the assistant's content; results as ``toolResult`` blocks in
    the next user message (several results: one message; roles must alternate, so a user
    text after results joins them); ``toolConfig.toolChoice`` auto / any / tool
    (https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ToolChoice.html:
    there is no "none"); sampling and stop sequences in ``inferenceConfig``."""

    @staticmethod
    def _add(history: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
        if history and history[-1]["role"] == role:
            history[-1]["content"].extend(blocks)
        elif blocks:
            history.append({"role": role, "content": blocks})

    @staticmethod
    def user(history: list[dict[str, Any]], text: str) -> None:
        _Bedrock._add(history, "user", [{"text": text}] if text else [])

    @staticmethod
    def assistant(
        history: list[dict[str, Any]], text: str, calls: list[tuple[str, str, dict[str, Any]]]
    ) -> None:
        blocks: list[dict[str, Any]] = [{"text": text}] if text else []
        blocks += [{"toolUse": {"toolUseId": i, "name": n, "input": a}} for i, n, a in calls]
        _Bedrock._add(history, "assistant", blocks)

    @staticmethod
    def result(history: list[dict[str, Any]], call_id: str, _name: str, text: str) -> None:
        block = {"toolResult": {"toolUseId": call_id, "content": [{"text": text}]}}
        _Bedrock._add(history, "user", [block])

    @staticmethod
    def extra(body: Mapping[str, Any]) -> dict[str, Any]:
        config = _sampling(body)
        extra: dict[str, Any] = {"inferenceConfig": config} if config else {}
        choice = _choice(body)
        if choice is not None:
            mode, name = choice
            if mode == "none":
                raise Untranslatable("tool_choice none has no Bedrock equivalent: send no tools")
            kind = {"tool": {"name": name}} if name else {mode.replace("required", "any"): {}}
            extra["toolConfig"] = {"toolChoice": kind}
        return extra


_BUILDERS: dict[str, Any] = {
    "anthropic": _Anthropic,
    "bedrock": _Bedrock,
    "gemini": _Gemini,
    "openai_responses": _Responses,
}


# --- sending -------------------------------------------------------------------------------------


class ModelAnswer:
    """A model client's open stream, read as the proxy reads an upstream response."""

    def __init__(self, stream: ModelStream) -> None:
        self._stream = stream

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's chunks; a broken one raises a :class:`toollatch.ModelError`."""
        return aiter(self._stream)

    async def aclose(self) -> None:
        """Close the stream (idempotent)."""
        await self._stream.__aexit__(None, None, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Upstreams:
    """How the proxy reaches a non-chat upstream: ``provider`` at ``base_url`` (as that
    provider's SDK takes it), through ``http``; ``upstream_key`` (else the client's bearer)
    goes in the provider's key header; ``idle_timeout_s``: the proxy's own, which the model
    client's idle deadline leaves to the proxy."""

    provider: str
    base_url: str
    http: httpx.AsyncClient
    upstream_key: str | None
    idle_timeout_s: float
    record: Path | None = None

    async def open(
        self, request: Request, body: Mapping[str, Any], tools: Sequence[ToolSpec]
    ) -> tuple[ModelAnswer, None] | Response:
        """The upstream's stream for ``body``, or the error response to give instead."""
        try:
            wanted = translate(self.provider, body)
            client = model_client(
                self.provider,
                model=str(body.get("model") or ""),
                base_url=self.base_url,
                api_key=self.upstream_key or _bearer(request),
                http=self.http,
                limits=ClientLimits(idle_s=self.idle_timeout_s * 2 + 1),
                retry=RetryPolicy(attempts=1, stream_retries=0),
                env=_aws_environment() if self.provider == "bedrock" else {},
                record=self.record,
            )
            stream = client.stream(
                wanted.history,
                tools=tools,
                system=wanted.system,
                max_tokens=None if self.provider == "gemini" else wanted.max_tokens,
                extra=wanted.extra,
            )
        except (Untranslatable, UsageError) as exc:
            return openai_error(400, "untranslatable_request", str(exc))
        except ConfigError as exc:  # (no key for the provider's own host, a bad model name)
            if "API key" not in str(exc) and "no credentials" not in str(exc):
                return openai_error(400, "invalid_request", str(exc))
            message = f"{self.base_url} needs an API key: send it as the bearer token"
            return openai_error(401, "missing_api_key", message, "authentication_error")
        try:
            await stream.__aenter__()
        except ModelError as exc:
            return _refused(exc)
        return ModelAnswer(stream), None  # (the model client records, when asked)


_AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


# --- GET /v1/models ------------------------------------------------------------------------------


async def list_models(upstreams: Upstreams, request: Request) -> Response | None:
    """``GET /v1/models`` on a non-chat upstream as OpenAI's list (``{"object": "list",
    "data": [{"id", "object": "model", "created", "owned_by"}]}``), from Anthropic's
    ``GET /v1/models`` (https://docs.anthropic.com/en/api/models-list: ``data``, ``has_more``,
    ``last_id``) or Gemini's ``GET /v1beta/models``
    (https://ai.google.dev/api/models#method:-models.list: ``models[].name``,
    ``nextPageToken``), pages followed up to ``_MODEL_PAGES``; an upstream's error comes back
    OpenAI-shaped with its status. None for an OpenAI upstream (passed through as it is);
    Bedrock lists its models on its control plane, not bedrock-runtime: a 404 saying so."""
    provider = upstreams.provider
    if provider == "openai_responses":
        return None
    if provider == "bedrock":
        message = "GET /v1/models is not offered on a bedrock upstream (bedrock-runtime lists none)"
        return openai_error(404, "not_found", message)
    key = upstreams.upstream_key or _bearer(request)
    models: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(_MODEL_PAGES):
        try:
            answer = await _model_page(upstreams, key, cursor)
        except httpx.HTTPError as exc:
            message = f"cannot reach the upstream {upstreams.base_url}: {exc}"
            return openai_error(502, "upstream_unreachable", message, "upstream_error")
        if answer.status_code >= 400:
            kind, code, message = _provider_error(answer.content)
            return openai_error(answer.status_code, code, message, kind)
        page, cursor = _models_of(provider, answer.content)
        models += page
        if cursor is None:
            break
    return JSONResponse({"object": "list", "data": models})


async def _model_page(upstreams: Upstreams, key: str | None, cursor: str | None) -> httpx.Response:
    """One page of the provider's model list (``cursor``: where the last one ended)."""
    if upstreams.provider == "anthropic":
        headers = {"anthropic-version": "2023-06-01", **({"x-api-key": key} if key else {})}
        params = {"limit": "1000", **({"after_id": cursor} if cursor else {})}
        url = f"{upstreams.base_url}/v1/models"
    else:
        headers = {"x-goog-api-key": key} if key else {}
        params = {"pageSize": "1000", **({"pageToken": cursor} if cursor else {})}
        url = f"{upstreams.base_url}/v1beta/models"
    return await upstreams.http.get(url, headers=headers, params=params)


def _models_of(provider: str, raw: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """One page's models in OpenAI's shape, and the cursor of the next page (None: last)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return [], None
    if provider == "anthropic":
        entries = [m for m in data.get("data") or () if isinstance(m, dict)]
        page = [
            _openai_model(m.get("id"), _epoch(m.get("created_at")), "anthropic") for m in entries
        ]
        more = data.get("has_more") is True and isinstance(data.get("last_id"), str)
        return [m for m in page if m], data["last_id"] if more else None
    entries = [m for m in data.get("models") or () if isinstance(m, dict)]
    page = [_openai_model(_gemini_id(m.get("name")), 0, "google") for m in entries]
    token = data.get("nextPageToken")
    return [m for m in page if m], token if isinstance(token, str) and token else None


def _gemini_id(name: object) -> object:
    return name.removeprefix("models/") if isinstance(name, str) else name


def _openai_model(model_id: object, created: int, owner: str) -> dict[str, Any]:
    """An OpenAI model entry; empty for an entry without a usable id (left out)."""
    if not isinstance(model_id, str) or not model_id:
        return {}
    return {"id": model_id, "object": "model", "created": created, "owned_by": owner}


def _epoch(stamp: object) -> int:
    """An RFC 3339 time as Unix seconds (0 when absent or unreadable)."""
    if not isinstance(stamp, str):
        return 0
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


def _aws_environment() -> dict[str, str]:
    """The proxy's own AWS keys and region (SigV4 for a Bedrock upstream when the request
    brings no bearer); never its ``AWS_BEARER_TOKEN_BEDROCK``: the key is the request's."""
    return {name: os.environ[name] for name in _AWS_VARIABLES if os.environ.get(name)}


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def openai_error(
    status: int, code: str, message: str, kind: str = "invalid_request_error", **headers: str
) -> JSONResponse:
    """An error as OpenAI answers one: ``{"error": {"message", "type", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers or None)


def _refused(exc: ModelError) -> Response:
    """The OpenAI-shaped answer to an upstream that refused or could not be reached."""
    if isinstance(exc, ModelHTTPError):
        kind, code, _ = _provider_error(exc.body)
        headers = {}
        if exc.retry_after_s is not None:
            headers["retry-after"] = f"{exc.retry_after_s:g}"
        return openai_error(exc.status, code, exc.message, kind, **headers)
    if isinstance(exc, ModelConnectError):
        return openai_error(502, "upstream_unreachable", str(exc), "upstream_error")
    if isinstance(exc, StreamTimeout):
        return openai_error(504, "upstream_timeout", str(exc), "upstream_error")
    return openai_error(502, "upstream_error", str(exc), "upstream_error")


def _provider_error(raw: bytes) -> tuple[str, str, str]:
    """(type, code, message) from a provider's error body: Anthropic's ``error.type``,
    Gemini's ``error.status``, ``upstream_error`` when it says neither; ``error.message``
    (AWS: the top-level ``message``), else the start of the body."""
    shown = raw[:300].decode("utf-8", "replace").strip() or "(empty body)"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "upstream_error", "upstream_error", shown
    if isinstance(data, list) and data:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        message = data.get("message") if isinstance(data, dict) else None
        return "upstream_error", "upstream_error", str(message or shown)
    kind = error.get("type") or error.get("status")
    code = error.get("code") if isinstance(error.get("code"), str) else kind
    message = str(error.get("message") or shown)
    return str(kind or "upstream_error"), str(code or "upstream_error"), message
