"""Provider adapters and provider detection (public namespace: re-exports only).

Each adapter turns one provider's native streaming events into toollatch stream events
(:mod:`toollatch.events`). :func:`providers` lists the provider names, :func:`adapter_class`
maps one to its adapter, and :func:`detect` guesses provider and framing from a stream's first
bytes. Write your own adapter for another server by subclassing :class:`Adapter` and checking
it with :func:`toollatch.testing.check_adapter`.
"""

from .core._adapters._base import Adapter
from .core._adapters.anthropic import AnthropicAdapter
from .core._adapters.bedrock import BedrockAdapter
from .core._adapters.gemini import GeminiAdapter
from .core._adapters.openai_chat import OpenAIChatAdapter
from .core._adapters.openai_responses import OpenAIResponsesAdapter
from .core._registry import adapter_class, detect, providers

__all__ = [
    "Adapter",
    "AnthropicAdapter",
    "BedrockAdapter",
    "GeminiAdapter",
    "OpenAIChatAdapter",
    "OpenAIResponsesAdapter",
    "adapter_class",
    "detect",
    "providers",
]
