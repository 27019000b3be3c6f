"""History builders: a finalized Round and its results -> the next request's messages.

Public namespace: re-exports only. ``Round.assistant_message()`` and
``Round.tool_results_messages()`` call these for the round's own provider.
"""

from ._messages import assistant_message, tool_results_messages

__all__ = ["assistant_message", "tool_results_messages"]
