"""History builders: functions of a finalized Round (public namespace: re-exports only).

``history += assistant_messages(round_)`` then ``history += tool_results_messages(round_,
results)``, where ``results`` are the tools' outputs for ``round_.committed()`` plus
``error_results(round_)``: every call written to history gets exactly one result. Entries are
in the round's provider format (for OpenAI Responses: input items for the next ``input``).
:func:`repaired_history` is the same with some failed calls left out entirely, call and result
(``on_invalid_json: drop_with_protocol_repair``), still valid for every provider.
"""

from .core._messages import assistant_messages, error_result, error_results, tool_results_messages
from .core._messages._repair import drop_failed_calls, repaired_history

__all__ = [
    "assistant_messages",
    "drop_failed_calls",
    "error_result",
    "error_results",
    "repaired_history",
    "tool_results_messages",
]
