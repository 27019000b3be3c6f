"""``drop_with_protocol_repair``: history without some failed calls (internal, pure).

The default is to write every named call to history with an error result, so the model
learns what went wrong. A gateway may prefer the model never to see a broken call again:
then the call is removed from the assistant turn *and* its result is removed, and what is
left must still be a history each provider accepts:

* the call leaves ``Choice.calls`` and ``Choice.content`` (so no builder writes it), and its
  result is not written (``tool_results_messages`` refuses results for unknown calls);
* an assistant turn left empty is not written at all: OpenAI chat refuses an assistant
  message without ``content`` or ``tool_calls``, Anthropic an empty ``content`` ("all
  messages must have non-empty content"), Gemini a content without ``parts``;
* OpenAI Responses: a reasoning item right before a dropped function call goes with it (a
  reasoning item sent without its following item is refused: "Item ... of type
  'reasoning' was provided without its required following item").

Only failed calls are dropped (a committed call has run, or will run, so its result stays).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from .._errors import ErrorCode
from .._round import Round, ToolResult
from . import assistant_messages, tool_results_messages
from ._ids import pair_results, without_calls


def drop_failed_calls(round_: Round, codes: Collection[ErrorCode]) -> Round:
    """``round_`` without the calls of choice 0 that failed with one of ``codes`` (see the
    module docstring); ``round_`` itself when none did."""
    dropped = {c.key for c in round_.calls if c.committed is None and c.error in codes}
    return without_calls(round_, dropped)


def repaired_history(
    round_: Round, results: Sequence[ToolResult], codes: Collection[ErrorCode]
) -> list[dict[str, Any]]:
    """The history entries of ``round_`` and its ``results`` (one per call, as for
    :func:`tool_results_messages`) with the failed calls of ``codes`` dropped, results
    included; an assistant turn left empty is left out."""
    repaired = drop_failed_calls(round_, codes)
    keys = {c.key for c in repaired.calls}
    pairs, _ = pair_results(round_, results)
    kept = [r for c, r in pairs if c.key in keys and r is not None]
    entries = [e for e in assistant_messages(repaired) if not _empty_turn(e)]
    if any(c.name for c in repaired.calls):
        entries += tool_results_messages(repaired, kept)
    return entries


def _empty_turn(entry: dict[str, Any]) -> bool:
    """An assistant entry with nothing in it (see the module docstring)."""
    if entry.get("role") == "assistant" and "content" in entry:
        return not entry["content"] and not entry.get("tool_calls")
    if entry.get("role") == "model":
        return not entry.get("parts")
    return False
