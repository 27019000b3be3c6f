"""Every type of a finalized round: plain, immutable data (public namespace: re-exports only).

A :class:`Round` has one :class:`Choice` per completion; a choice's ``content`` is a tuple of
:data:`ContentItem` (a :class:`TextRun`, a ``ReasoningBlock`` or ``ServerToolBlock``, or a
:class:`CallRecord`) in stream order; :class:`RoundEnd` says how it ended. A
:class:`ToolResult` answers one call. The history builders are in :mod:`toollatch.messages`.
"""

from .core._events import RoundEnd
from .core._round import CallRecord, Choice, ContentItem, Round, TextRun, ToolResult

__all__ = ["CallRecord", "Choice", "ContentItem", "Round", "RoundEnd", "TextRun", "ToolResult"]
