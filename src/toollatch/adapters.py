"""Provider adapters (public namespace: re-exports only).

Each adapter turns one provider's native streaming events into toollatch stream events. Write
your own for another server by subclassing :class:`Adapter` and checking it with
:func:`toollatch.testing.check_adapter`.
"""

from ._adapters._base import Adapter
from ._adapters.anthropic import AnthropicAdapter
from ._adapters.bedrock import BedrockAdapter
from ._adapters.gemini import GeminiAdapter
from ._adapters.openai_chat import OpenAIChatAdapter
from ._adapters.openai_responses import OpenAIResponsesAdapter

__all__ = [
    "Adapter",
    "AnthropicAdapter",
    "BedrockAdapter",
    "GeminiAdapter",
    "OpenAIChatAdapter",
    "OpenAIResponsesAdapter",
]
