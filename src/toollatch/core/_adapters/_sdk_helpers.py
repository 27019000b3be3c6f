"""The official SDKs' stream helpers: which of their event objects carry the provider's events.

``client.chat.completions.stream()`` (openai-python) and ``client.messages.stream()``
(anthropic-python) yield their own event objects, not only the provider's. Each is one of:

- a *carrier*: the provider's event inside a field (openai's ``ChunkEvent``: ``.chunk``, a
  ``ChatCompletionChunk``; it has no ``choices`` of its own, so read as a chunk it is empty);
- the provider's event with fields *added* (anthropic's ``message_stop`` with ``.message``,
  ``content_block_stop`` with ``.content_block``: the helper's accumulated snapshots);
- a *derived* event, built from the provider event the helper yielded just before it
  (openai's ``content.delta``, ``tool_calls.function.arguments.delta``...; anthropic's
  ``text``, ``input_json``, ``citation``...). It holds nothing that event did not, so it is
  skipped; but one that does not follow such an event means the caller filtered the helper's
  output, and skipping it would lose calls silently: that is a ``UsageError``.

Sources of the event types: openai-python ``src/openai/lib/streaming/chat/_events.py``
(``ChatCompletionStreamEvent``), anthropic-python ``src/anthropic/lib/streaming/_types.py``
(``MessageStreamEvent``) and ``_beta_types.py`` (``compaction``). openai's
``client.responses.stream()`` yields the provider's events with fields added (``snapshot``,
``parsed``) that the Responses adapter does not read; it needs no entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import UsageError

SKIP: Any = object()
""":meth:`StreamHelper.take`'s answer for an event that carries nothing of the provider's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamHelper:
    """How one SDK's stream helper hands over one provider's events (see the module doc)."""

    name: str
    """The helper, as a user would call it (for the error message)."""
    carriers: Mapping[str, str]
    """Helper event type -> the attribute that holds the provider's event."""
    added: Mapping[str, frozenset[str]]
    """Provider event type -> the fields the helper adds to it (left out)."""
    derived: frozenset[str]
    """Helper event types built from the provider event yielded just before them."""
    sources: frozenset[str] | None
    """Provider event types a derived event follows (``None``: any)."""
    instead: str
    """What to feed instead of derived events alone."""

    def take(
        self, event: object, follows_source: bool, dump: Callable[[object], object]
    ) -> tuple[object, bool]:
        """``(native, source)`` for one event a caller fed: the provider's event it is or
        carries (``SKIP`` for a derived event), and whether a derived event may follow it.
        A ``Mapping`` is the provider's event as data, never a helper's.

        ``follows_source`` says whether the event fed before this one was a source (or a
        derived event after one); ``dump`` turns an SDK object into plain data.

        Raises UsageError for a derived event that does not follow a source.
        """
        if isinstance(event, Mapping):  # (the provider's event as data: taken as it is)
            kind = event.get("type")
            return event, self.sources is None or (type(kind) is str and kind in self.sources)
        kind = getattr(event, "type", None)
        if type(kind) is not str:
            return event, self.sources is None
        if kind in self.derived:
            if not follows_source:
                raise UsageError(
                    f"{kind!r} is an event {self.name} derives from the provider event it "
                    f"yields just before it, which was not fed: {self.instead}"
                )
            return SKIP, True
        attribute = self.carriers.get(kind)
        if attribute is not None:
            event = getattr(event, attribute, None)
            kind = getattr(event, "type", None)
            if type(kind) is not str:
                return event, self.sources is None
        source = self.sources is None or kind in self.sources
        added = self.added.get(kind)
        if added and any(getattr(event, name, None) is not None for name in added):
            return _without(event, added, dump), source
        return event, source


def _without(event: object, fields: frozenset[str], dump: Callable[[object], object]) -> object:
    """``event`` as plain data without ``fields`` (not dumped at all when it can say so)."""
    model_dump = getattr(event, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json", exclude_unset=True, by_alias=True, exclude=set(fields))
    native = dump(event)
    if isinstance(native, dict):
        return {k: v for k, v in native.items() if k not in fields}
    return native


OPENAI_CHAT = StreamHelper(
    name="openai-python's client.chat.completions.stream()",
    carriers={"chunk": "chunk"},
    added={},
    derived=frozenset(
        {
            "content.delta",
            "content.done",
            "refusal.delta",
            "refusal.done",
            "tool_calls.function.arguments.delta",
            "tool_calls.function.arguments.done",
            "logprobs.content.delta",
            "logprobs.content.done",
            "logprobs.refusal.delta",
            "logprobs.refusal.done",
        }
    ),
    sources=None,  # (every chunk event comes before the events derived from it)
    instead="feed every event the helper yields, or only the chunk events (or their .chunk)",
)

ANTHROPIC = StreamHelper(
    name="anthropic-python's client.messages.stream()",
    carriers={},
    added={
        "message_stop": frozenset({"message"}),
        "content_block_stop": frozenset({"content_block"}),
    },
    derived=frozenset({"text", "citation", "thinking", "signature", "input_json", "compaction"}),
    sources=frozenset({"content_block_delta"}),
    instead="feed every event the helper yields, or only its raw events (stream=True's)",
)

HELPERS: Mapping[str, StreamHelper] = {"openai_chat": OPENAI_CHAT, "anthropic": ANTHROPIC}
"""The stream helper of each provider that has one whose events need more than a dump."""
