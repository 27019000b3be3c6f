"""Provider names -> adapter classes, and provider/format detection from a stream's start."""

from __future__ import annotations

import importlib
from typing import Literal

import orjson

from ._adapters._base import Adapter
from ._errors import UsageError

Framing = Literal["sse", "jsonl", "eventstream"]

_MODULES: dict[str, tuple[str, str]] = {
    "openai_chat": ("openai_chat", "OpenAIChatAdapter"),
    "openai_responses": ("openai_responses", "OpenAIResponsesAdapter"),
    "anthropic": ("anthropic", "AnthropicAdapter"),
    "gemini": ("gemini", "GeminiAdapter"),
    "bedrock": ("bedrock", "BedrockAdapter"),
}


def providers() -> tuple[str, ...]:
    """Every provider name an adapter is installed for."""
    names = []
    for name in _MODULES:
        try:
            adapter_class(name)
        except UsageError:
            continue
        names.append(name)
    return tuple(names)


_LOADED: dict[str, type[Adapter]] = {}
"""Adapter classes already imported, by provider (a parser is made per attempt)."""


def adapter_class(provider: str) -> type[Adapter]:
    """The adapter class for ``provider``; raises ``UsageError`` for an unknown name."""
    loaded = _LOADED.get(provider)
    if loaded is not None:
        return loaded
    try:
        module, cls = _MODULES[provider]
    except KeyError:
        raise UsageError(f"unknown provider {provider!r}; known: {', '.join(_MODULES)}") from None
    try:
        found: type[Adapter] = getattr(
            importlib.import_module(f"._adapters.{module}", __package__), cls
        )
    except (ImportError, AttributeError):
        raise UsageError(f"the {provider} adapter is not available in this build") from None
    _LOADED[provider] = found
    return found


def detect(head: bytes) -> tuple[str, Framing]:
    """Guess ``(provider, framing)`` from the first bytes of a stream (a few KiB suffice).

    Raises ``UsageError`` when nothing recognizable is there.
    """
    if len(head) >= 12 and head[:1] == b"\x00" and b":event-type" in head[:512]:
        return "bedrock", "eventstream"
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    framing: Framing = "jsonl"
    payloads: list[str] = []
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = raw.strip()
        if line.startswith(("data:", "event:", "id:", ":")):
            framing = "sse"
            if line.startswith("data:"):
                payloads.append(line[5:].strip())
        elif line.startswith("{"):
            payloads.append(line)
    for payload in payloads:
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        provider = _provider_of(obj)
        if provider is not None:
            return provider, framing
    raise UsageError("cannot detect the provider from the stream; pass --provider")


def _provider_of(obj: object) -> str | None:
    if not isinstance(obj, dict):
        return None
    kind = obj.get("type")
    if isinstance(kind, str):
        if kind.startswith("response."):
            return "openai_responses"
        if kind in {
            "message_start",
            "content_block_start",
            "content_block_delta",
            "ping",
            "message_delta",
            "message_stop",
            "content_block_stop",
        }:
            return "anthropic"
    if "choices" in obj or obj.get("object") == "chat.completion.chunk":
        return "openai_chat"
    if "candidates" in obj or "usageMetadata" in obj:
        return "gemini"
    if obj.keys() & {
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    }:
        return "bedrock"
    return None
