"""History builders: functions of a finalized Round (public namespace: re-exports only).

``history += assistant_messages(round_)`` then ``history += tool_results_messages(round_,
results)``, where ``results`` are the tools' outputs for ``round_.committed()`` plus
``error_results(round_)``: every call written to history gets exactly one result. Entries are
in the round's provider format (for OpenAI Responses: input items for the next ``input``).
"""

from ._messages import assistant_messages, error_result, error_results, tool_results_messages

__all__ = ["assistant_messages", "error_result", "error_results", "tool_results_messages"]
