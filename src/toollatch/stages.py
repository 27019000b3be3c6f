"""The stages :class:`~toollatch.StreamParser` composes, for callers who own the loop.

Every stage has the shape ``feed(x) -> [y]`` then ``finish()``; each is pure (no sockets,
asyncio or clocks) and can be driven from a list in a unit test. In stream order:

* **decoders**, transport bytes -> :class:`Frame` values: :class:`SSEDecoder`,
  :class:`JSONLinesDecoder`, :class:`EventStreamDecoder` (AWS event-stream, for Bedrock). Bytes
  they cannot frame raise :class:`~toollatch.StreamDecodeError`.
* **adapters**, one provider's native events -> stream events: :class:`Adapter` and one
  subclass per provider; :func:`providers`, :func:`adapter_class`, and :func:`detect` (provider
  and framing from a stream's first bytes). Check your own adapter with
  :func:`toollatch.testing.check_adapter`.
* **stream events** (:data:`StreamEvent`), what adapters emit and the assembler consumes:
  :class:`CallOpened`, :class:`ArgsDelta`, :class:`CallClosed`, :class:`RoundEnded`... and the
  :class:`Anomaly` records a round keeps.
* **the assembler and the gate**: :class:`Assembler` keeps one bounded buffer per call and
  returns :data:`CallUpdate` values while the round streams (``CallFailed``,
  :class:`CallReady`, ``PreviewUpdated``, and with ``observe=True`` :class:`TextReceived`,
  :class:`CallAnnounced`, :class:`CallComplete`, with ``observe_arguments=True``
  :class:`ArgsReceived`; :class:`RoundOver` when a size limit ended the
  round); ``finish()`` decides every call once through the :class:`Gate` (a ``CommittedCall``
  or a :class:`Rejection`) and returns the ``Round``.
* **previews**: :class:`PartialJSON`, the incremental parser of a call's argument text, and
  its :class:`PathDelta` changes.
* **round parts**: a ``Round`` has one :class:`Choice` per completion, whose content is
  :data:`ContentItem` values (:class:`TextRun`, :class:`ReasoningBlock`,
  :class:`ServerToolBlock`, ``CallRecord``) in stream order.
* **history builders**, functions of a finalized Round: ``history +=
  assistant_messages(round_)``, then ``history += tool_results_messages(round_, results)`` with
  ``results`` the tools' outputs for ``round_.committed()`` plus ``error_results(round_)``:
  every call written to history gets exactly one result. :func:`repaired_history` leaves some
  failed calls out entirely (call and result), still valid for every provider.

The types a user of the parser or the agent needs (``Round``, ``CallRecord``, ``ToolResult``,
``CommittedCall``, ``CallFailed``, ``PreviewUpdated``, errors, limits) are in
:mod:`toollatch`.
"""

from .core._adapters._base import Adapter
from .core._adapters.anthropic import AnthropicAdapter
from .core._adapters.bedrock import BedrockAdapter
from .core._adapters.gemini import GeminiAdapter
from .core._adapters.openai_chat import OpenAIChatAdapter
from .core._adapters.openai_responses import OpenAIResponsesAdapter
from .core._assembler import (
    ArgsReceived,
    Assembler,
    CallAnnounced,
    CallComplete,
    CallReady,
    CallUpdate,
    RoundOver,
    TextReceived,
)
from .core._events import (
    Anomaly,
    AnomalyKind,
    ArgsDelta,
    ArgsMeasured,
    CallClosed,
    CallIdentified,
    CallKey,
    CallOpened,
    CallSettled,
    DecodedArguments,
    Frame,
    ReasoningBlock,
    RoundEnded,
    ServerToolBlock,
    StreamEvent,
    StreamFailed,
    TextDelta,
    UsageReported,
)
from .core._eventstream import EventStreamDecoder
from .core._gate import Gate, Rejection
from .core._lines import JSONLinesDecoder
from .core._messages import (
    assistant_messages,
    error_result,
    error_results,
    tool_results_messages,
)
from .core._messages._repair import drop_failed_calls, repaired_history
from .core._partial_json import PartialJSON, PathDelta
from .core._registry import adapter_class, detect, providers
from .core._round import Choice, ContentItem, TextRun
from .core._sse import SSEDecoder

__all__ = [
    "Adapter",
    "Anomaly",
    "AnomalyKind",
    "AnthropicAdapter",
    "ArgsDelta",
    "ArgsMeasured",
    "ArgsReceived",
    "Assembler",
    "BedrockAdapter",
    "CallAnnounced",
    "CallClosed",
    "CallComplete",
    "CallIdentified",
    "CallKey",
    "CallOpened",
    "CallReady",
    "CallSettled",
    "CallUpdate",
    "Choice",
    "ContentItem",
    "DecodedArguments",
    "EventStreamDecoder",
    "Frame",
    "Gate",
    "GeminiAdapter",
    "JSONLinesDecoder",
    "OpenAIChatAdapter",
    "OpenAIResponsesAdapter",
    "PartialJSON",
    "PathDelta",
    "ReasoningBlock",
    "Rejection",
    "RoundEnded",
    "RoundOver",
    "SSEDecoder",
    "ServerToolBlock",
    "StreamEvent",
    "StreamFailed",
    "TextDelta",
    "TextReceived",
    "TextRun",
    "UsageReported",
    "adapter_class",
    "assistant_messages",
    "detect",
    "drop_failed_calls",
    "error_result",
    "error_results",
    "providers",
    "repaired_history",
    "tool_results_messages",
]
