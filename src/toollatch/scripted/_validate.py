"""History validation of the scripted model server: the requests the real APIs refuse (pure).

:func:`check_request` checks one request body the way the provider does and returns the
number of assistant turns in its history (which picks the script's turn), or raises
:class:`InvalidRequest`, which the server answers as HTTP 400 in the provider's error shape.
The pairing rules and messages follow the ones collected in ``shared/QUIRKS.md`` ("What the real
APIs refuse in a next-turn history"):

* OpenAI chat: an assistant message with ``tool_calls`` must be followed by ``role: tool``
  messages answering each ``tool_call_id`` (any order), and a tool message must answer one;
* OpenAI Responses: each ``function_call`` item's ``call_id`` is answered by one
  ``function_call_output`` right after its assistant turn (the run of model-side items it is
  in), and each output answers a call of that turn;
* Anthropic: each ``tool_use`` id has a ``tool_result`` block in the immediately next user
  message, the results first in its content; each result answers a ``tool_use`` of the
  previous assistant message; the first message is a user message;
* Gemini: a model turn with ``functionCall`` parts comes right after a user turn or a
  function response turn, and is followed by a user turn with the same number of
  ``functionResponse`` parts, matched by position and name.
* Bedrock Converse: roles alternate from a user message; each assistant ``toolUse``
  (``toolUseId``, ``name``, ``input`` object) is answered by a ``toolResult`` block of the
  next user message; a history with either block needs ``toolConfig``
  (https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html).

Any call id answered twice, or used for two calls, is refused too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any


class InvalidRequest(Exception):
    """A request the provider would refuse with HTTP 400 (``param``: where, when known)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def check_request(provider: str, body: object) -> int:
    """The number of assistant turns in ``body``'s history; raises InvalidRequest when the
    provider would answer 400 (a malformed body or message, an unpaired call id, roles out of
    order). ``provider`` is one of ``openai_chat``, ``openai_responses``, ``anthropic``,
    ``gemini``, ``bedrock``."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    checks = {
        "openai_chat": _chat,
        "openai_responses": _responses,
        "anthropic": _anthropic,
        "gemini": _gemini,
        "bedrock": _bedrock,
    }
    return checks[provider](body)


def _obj(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where}: expected an object", where)
    return value


def _list(value: object, where: str, *, empty: bool = False) -> Sequence[Any]:
    if not isinstance(value, list) or (not value and not empty):
        raise InvalidRequest(f"{where}: expected a non-empty array", where)
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}: expected a non-empty string", where)
    return value


def _model(body: Mapping[str, Any]) -> None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("you must provide a model parameter", "model")


# --- OpenAI Chat Completions ------------------------------------------------------------------

_CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _chat(body: Mapping[str, Any]) -> int:
    _model(body)
    messages = _list(body.get("messages"), "messages")
    pending: dict[str, bool] = {}  # call ids of the last assistant turn -> answered
    turns = 0
    for n, raw in enumerate(messages):
        where = f"messages.[{n}]"
        message = _obj(raw, where)
        role = message.get("role")
        if role not in _CHAT_ROLES:
            raise InvalidRequest(
                f"{where}.role: {role!r} is not one of {sorted(_CHAT_ROLES)}", where
            )
        if role == "tool":
            _chat_result(message, where, pending)
            continue
        _chat_unanswered(pending)
        pending = {}
        content = message.get("content")
        if role == "assistant":
            turns += 1
            pending = _chat_calls(message, where)
            if content is None and not pending:
                raise InvalidRequest(
                    f"{where}: an assistant message needs content or tool_calls", where
                )
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(f"{where}.content: expected a string or an array", where)
    _chat_unanswered(pending)
    return turns


def _chat_calls(message: Mapping[str, Any], where: str) -> dict[str, bool]:
    calls = message.get("tool_calls")
    if calls is None:
        return {}
    ids: dict[str, bool] = {}
    for k, raw in enumerate(_list(calls, f"{where}.tool_calls")):
        call = _obj(raw, f"{where}.tool_calls.[{k}]")
        call_id = _text(call.get("id"), f"{where}.tool_calls.[{k}].id")
        function = _obj(call.get("function"), f"{where}.tool_calls.[{k}].function")
        _text(function.get("name"), f"{where}.tool_calls.[{k}].function.name")
        if not isinstance(function.get("arguments"), str):
            raise InvalidRequest(f"{where}.tool_calls.[{k}].function.arguments: expected a string")
        if call_id in ids:
            raise InvalidRequest(
                f"Duplicate value for 'tool_call_id' of {call_id} in message[{where}]"
            )
        ids[call_id] = False
    return ids


def _chat_result(message: Mapping[str, Any], where: str, pending: dict[str, bool]) -> None:
    call_id = _text(message.get("tool_call_id"), f"{where}.tool_call_id")
    if not pending:
        raise InvalidRequest(
            "Invalid parameter: messages with role 'tool' must be a response to a preceding "
            "message with 'tool_calls'.",
            where,
        )
    if call_id not in pending:
        raise InvalidRequest(
            f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of "
            "previous message.",
            where,
        )
    if pending[call_id]:
        raise InvalidRequest(f"Duplicate tool message for 'tool_call_id' of '{call_id}'.", where)
    pending[call_id] = True


def _chat_unanswered(pending: dict[str, bool]) -> None:
    missing = [i for i, answered in pending.items() if not answered]
    if missing:
        raise InvalidRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(missing)}",
            "messages",
        )


# --- OpenAI Responses -------------------------------------------------------------------------


def _responses(body: Mapping[str, Any]) -> int:
    _model(body)
    items = body.get("input")
    if isinstance(items, str):
        return 0
    pending: dict[str, bool] = {}
    seen: set[str] = set()
    turns, side = 0, "user"
    for n, raw in enumerate(_list(items, "input")):
        where = f"input[{n}]"
        item = _obj(raw, where)
        kind = _responses_side(item, where)
        if kind == "result":
            _responses_result(item, where, pending)
            side = "result"
            continue
        if kind == "user" or side == "result":
            _responses_unanswered(pending)
            pending = {}
        if kind == "assistant" and side != "assistant":
            turns += 1
        side = kind
        if item.get("type") == "function_call":
            call_id = _text(item.get("call_id"), f"{where}.call_id")
            _text(item.get("name"), f"{where}.name")
            if not isinstance(item.get("arguments"), str):
                raise InvalidRequest(f"{where}.arguments: expected a string", where)
            if call_id in seen:
                raise InvalidRequest(f"Duplicate function call with call_id {call_id}.", where)
            seen.add(call_id)
            pending[call_id] = False
    _responses_unanswered(pending)
    return turns


def _responses_side(item: Mapping[str, Any], where: str) -> str:
    """``user`` (a user/system/developer message), ``result`` or ``assistant`` (the rest)."""
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise InvalidRequest(f"{where}.type: expected a string", where)
    if kind == "function_call_output":
        return "result"
    if kind != "message":
        return "assistant"  # reasoning, function_call, hosted tool items
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise InvalidRequest(f"{where}.role: {role!r} is not a message role", where)
    if not isinstance(item.get("content"), str | list):
        raise InvalidRequest(f"{where}.content: expected a string or an array", where)
    return "assistant" if role == "assistant" else "user"


def _responses_result(item: Mapping[str, Any], where: str, pending: dict[str, bool]) -> None:
    call_id = _text(item.get("call_id"), f"{where}.call_id")
    if not isinstance(item.get("output"), str | list):
        raise InvalidRequest(f"{where}.output: expected a string or an array", where)
    if call_id not in pending:
        raise InvalidRequest(
            f"No tool call found for function call output with call_id {call_id}.", "input"
        )
    if pending[call_id]:
        raise InvalidRequest(f"Duplicate function call output for call_id {call_id}.", "input")
    pending[call_id] = True


def _responses_unanswered(pending: dict[str, bool]) -> None:
    for call_id, answered in pending.items():
        if not answered:
            raise InvalidRequest(f"No tool output found for function call {call_id}.", "input")


# --- Anthropic Messages -----------------------------------------------------------------------


def _anthropic(body: Mapping[str, Any]) -> int:
    _model(body)
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise InvalidRequest("max_tokens: Field required (a positive integer)")
    messages = _list(body.get("messages"), "messages")
    pending: list[str] = []
    seen: set[str] = set()
    turns = 0
    for n, raw in enumerate(messages):
        message = _obj(raw, f"messages.{n}")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{n}.role: Input should be 'user' or 'assistant'")
        if n == 0 and role != "user":
            raise InvalidRequest('messages: first message must use the "user" role')
        blocks = _anthropic_blocks(message.get("content"), f"messages.{n}")
        if role == "user":
            _anthropic_results(blocks, n, pending)
            pending = []
            continue
        turns += 1
        _anthropic_unanswered(pending, n - 1)
        pending = _anthropic_uses(blocks, n, seen)
    _anthropic_unanswered(pending, len(messages) - 1)
    return turns


def _anthropic_blocks(content: object, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return []
    blocks = [
        _obj(b, f"{where}.content.{k}") for k, b in enumerate(_list(content, f"{where}.content"))
    ]
    for k, block in enumerate(blocks):
        if not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}.content.{k}.type: Field required")
    return blocks


def _anthropic_uses(blocks: list[Mapping[str, Any]], n: int, seen: set[str]) -> list[str]:
    ids = []
    for k, block in enumerate(blocks):
        where = f"messages.{n}.content.{k}"
        if block["type"] == "tool_result":
            raise InvalidRequest(f"{where}: tool_result blocks are only allowed in user messages")
        if block["type"] != "tool_use":
            continue
        use_id = _text(block.get("id"), f"{where}.id")
        _text(block.get("name"), f"{where}.name")
        _obj(block.get("input"), f"{where}.input")
        if use_id in seen:
            raise InvalidRequest(f"{where}: `tool_use` ids must be unique: {use_id}")
        seen.add(use_id)
        ids.append(use_id)
    return ids


def _anthropic_results(blocks: list[Mapping[str, Any]], n: int, pending: list[str]) -> None:
    answered: set[str] = set()
    for k, block in enumerate(blocks):
        where = f"messages.{n}.content.{k}"
        if block["type"] == "tool_use":
            raise InvalidRequest(f"{where}: tool_use blocks are only allowed in assistant messages")
        if block["type"] != "tool_result":
            continue
        use_id = _text(block.get("tool_use_id"), f"{where}.tool_use_id")
        if k != len(answered):
            raise InvalidRequest(f"{where}: tool_result blocks must come first in the content")
        if use_id not in pending or use_id in answered:
            raise InvalidRequest(
                f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: {use_id}. "
                "Each `tool_result` block must have a corresponding `tool_use` block in the "
                "previous message."
            )
        answered.add(use_id)
    _anthropic_unanswered([i for i in pending if i not in answered], n - 1)


def _anthropic_unanswered(missing: list[str], n: int) -> None:
    if missing:
        raise InvalidRequest(
            f"messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message."
        )


# --- Gemini -----------------------------------------------------------------------------------

_FUNCTION_RESPONSE_COUNT = (
    "Please ensure that the number of function response parts is equal to the number of "
    "function call parts of the function call turn."
)


def _gemini(body: Mapping[str, Any]) -> int:
    contents = _list(body.get("contents"), "contents")
    pending: list[str] | None = None  # the names of the last model turn's calls
    previous, turns = "none", 0
    for n, raw in enumerate(contents):
        content = _obj(raw, f"contents[{n}]")
        role = content.get("role", "user")
        if role not in ("user", "model"):
            raise InvalidRequest(f"contents[{n}].role: Please use a valid role: user, model.")
        parts = [
            _obj(p, f"contents[{n}].parts[{k}]")
            for k, p in enumerate(_list(content.get("parts"), f"contents[{n}].parts"))
        ]
        calls = _gemini_named(parts, "functionCall", f"contents[{n}]")
        responses = _gemini_named(parts, "functionResponse", f"contents[{n}]")
        if role == "model":
            turns += 1
            if pending is not None:
                raise InvalidRequest(_FUNCTION_RESPONSE_COUNT)
            if calls and previous not in ("user", "response"):
                raise InvalidRequest(
                    "Please ensure that function call turn comes immediately after a user "
                    "turn or after a function response turn."
                )
            pending, previous = (calls or None), "model"
            continue
        _gemini_responses(n, pending, responses)
        pending, previous = None, ("response" if responses else "user")
    if pending is not None:
        raise InvalidRequest(_FUNCTION_RESPONSE_COUNT)
    return turns


def _gemini_responses(n: int, pending: list[str] | None, responses: list[str]) -> None:
    """A user turn's ``functionResponse`` names against the calls of the model turn before."""
    if responses and pending is None:
        raise InvalidRequest(
            "Please ensure that function response turn comes immediately after a "
            "function call turn."
        )
    if pending is not None and len(responses) != len(pending):
        raise InvalidRequest(_FUNCTION_RESPONSE_COUNT)
    for k, (call, response) in enumerate(zip(pending or [], responses, strict=False)):
        if call != response:
            raise InvalidRequest(
                f"contents[{n}]: function response {k} is named {response!r} but the "
                f"function call it answers is {call!r}."
            )


def _gemini_named(parts: list[Mapping[str, Any]], key: str, where: str) -> list[str]:
    """The names of the ``key`` parts (``functionCall``/``functionResponse``), checked."""
    names = []
    for k, part in enumerate(parts):
        if key not in part:
            continue
        value = _obj(part[key], f"{where}.parts[{k}].{key}")
        names.append(_text(value.get("name"), f"{where}.parts[{k}].{key}.name"))
        member = "args" if key == "functionCall" else "response"
        if member in value and not isinstance(value[member], Mapping):
            raise InvalidRequest(f"{where}.parts[{k}].{key}.{member}: expected an object")
    return names


# --- Bedrock Converse -------------------------------------------------------------------------


def _bedrock(body: Mapping[str, Any]) -> int:
    messages = _list(body.get("messages"), "messages")
    pending: list[str] = []
    seen: set[str] = set()
    turns, blocks_used = 0, False
    for n, raw in enumerate(messages):
        message = _obj(raw, f"messages.{n}")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{n}.role: must be user or assistant")
        if role != ("user" if n % 2 == 0 else "assistant"):
            raise InvalidRequest(
                "A conversation must start with a user message and alternate between user "
                "and assistant roles."
            )
        blocks = [
            _obj(b, f"messages.{n}.content.{k}")
            for k, b in enumerate(_list(message.get("content"), f"messages.{n}.content"))
        ]
        if role == "assistant":
            turns += 1
            pending = _bedrock_uses(blocks, n, seen)
        else:
            _bedrock_results(blocks, n, pending)
            pending = []
        blocks_used = blocks_used or any("toolUse" in b or "toolResult" in b for b in blocks)
    if pending:
        raise InvalidRequest(
            f"Expected toolResult blocks after messages.{len(messages) - 1} for the following "
            f"Ids: {', '.join(pending)}"
        )
    if blocks_used and not isinstance(body.get("toolConfig"), Mapping):
        needs = "The toolConfig field must be defined when using toolUse and toolResult"
        raise InvalidRequest(f"{needs} content blocks.")
    return turns


def _bedrock_uses(blocks: list[Mapping[str, Any]], n: int, seen: set[str]) -> list[str]:
    ids = []
    for k, block in enumerate(blocks):
        where = f"messages.{n}.content.{k}"
        if "toolResult" in block:
            raise InvalidRequest(f"{where}: toolResult blocks are only allowed in user messages")
        if "toolUse" not in block:
            continue
        use = _obj(block["toolUse"], f"{where}.toolUse")
        use_id = _text(use.get("toolUseId"), f"{where}.toolUse.toolUseId")
        _text(use.get("name"), f"{where}.toolUse.name")
        _obj(use.get("input"), f"{where}.toolUse.input")
        if use_id in seen:
            raise InvalidRequest(f"{where}: toolUseId {use_id} is used twice")
        seen.add(use_id)
        ids.append(use_id)
    return ids


def _bedrock_results(blocks: list[Mapping[str, Any]], n: int, pending: list[str]) -> None:
    answered: set[str] = set()
    for k, block in enumerate(blocks):
        where = f"messages.{n}.content.{k}"
        if "toolUse" in block:
            raise InvalidRequest(f"{where}: toolUse blocks are only allowed in assistant messages")
        if "toolResult" not in block:
            continue
        result = _obj(block["toolResult"], f"{where}.toolResult")
        use_id = _text(result.get("toolUseId"), f"{where}.toolResult.toolUseId")
        _list(result.get("content"), f"{where}.toolResult.content")
        if use_id not in pending or use_id in answered:
            raise InvalidRequest(
                f"{where}: toolResult {use_id} answers no toolUse block of the previous turn."
            )
        answered.add(use_id)
    missing = [i for i in pending if i not in answered]
    if missing:
        raise InvalidRequest(
            f"Expected toolResult blocks at messages.{n}.content for the following Ids: "
            f"{', '.join(missing)}"
        )


# SigV4's Authorization header (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-signing-elements.html):
# AWS4-HMAC-SHA256 Credential=<key id>/<yyyymmdd>/<region>/<service>/aws4_request,
# SignedHeaders=<lower-case names joined by ;>, Signature=<64 hex digits>
_SIGV4 = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[A-Z0-9]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/"
    r"(?P<service>[a-z0-9-]+)/aws4_request, ?SignedHeaders=(?P<signed>[a-z0-9;-]+), ?"
    r"Signature=[0-9a-f]{64}"
)


def bedrock_auth_problem(headers: Mapping[str, str]) -> str | None:
    """What is wrong with a Bedrock request's ``Authorization`` header, or None.

    This checks the *shape* only: a bearer token (a Bedrock API key), or a SigV4 header whose
    credential scope names the ``bedrock`` service and the ``x-amz-date`` day, and whose
    signed headers include ``host`` and ``x-amz-date``. The signature itself is not verified
    (the server knows no secret key). No header at all is let through, as every other wire
    of this server takes a request without a key.
    """
    value = headers.get("authorization")
    if value is None or (value.startswith("Bearer ") and value[7:].strip()):
        return None
    match = _SIGV4.fullmatch(value)
    if match is None:
        return "Authorization header requires a SigV4 AWS4-HMAC-SHA256 credential or a bearer"
    if match["service"] != "bedrock":
        return f"Credential should be scoped to the service 'bedrock', not {match['service']!r}"
    stamp = headers.get("x-amz-date", "")
    if stamp[:8] != match["date"]:
        return "Credential should be scoped to a valid date: the X-Amz-Date header's day"
    signed = match["signed"].split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        return "SignedHeaders must include host and x-amz-date"
    return None
