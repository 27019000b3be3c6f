"""Ending a dead worker's run from its log (internal; used by :mod:`._redis`).

A survivor that won a dead worker's run reads what the run's log holds and writes its end:
every call the log opened is paired, the open round ended, then ``run_ended``. What a call
gets depends on what is known of it (the log, and the ledger when the relay shares one):

- still streaming (``call_opened``, nothing after): ``call_failed`` ``stream_interrupted``;
- committed, never started: ``tool_finished`` ``cancelled`` (the tool did not run);
- started, no result: ``tool_finished`` ``outcome_unknown`` (it may have had its effect);
- the ledger holds its final result: ``tool_finished`` with that result's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...core._errors import ErrorCode


@dataclass(slots=True)
class OpenCalls:
    """What a run's log says of its calls and rounds (:func:`read_log`)."""

    names: dict[str, str] = field(default_factory=dict)
    """Every call id the log named, with its tool name, in order."""
    streaming: list[str] = field(default_factory=list)
    """Opened, neither committed nor failed."""
    committed: list[str] = field(default_factory=list)
    """Committed without a result."""
    started: set[str] = field(default_factory=set)
    """Of those, the ones with ``tool_started``."""
    results: dict[str, tuple[bool, str | None]] = field(default_factory=dict)
    """Every call with a result or a failure: ``(is_error, error)``."""
    rounds: int = 0
    """The ``round_ended`` events."""
    round_open: bool = False
    """Whether events followed the last ``round_ended`` (a round was going on)."""
    ended: bool = False
    """Whether the log already has ``run_ended`` (nothing to write)."""


_ROUND_EVENTS = frozenset(
    {"text", "reasoning", "call_opened", "call_preview", "call_committed", "call_failed"}
)


def read_log(frames: list[bytes]) -> OpenCalls:
    """What ``frames`` (a run's SSE frames, in order) leave open."""
    seen = OpenCalls()
    for frame in frames:
        _head, _, body = frame.partition(b"\ndata: ")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            continue  # (a lagged marker has no place in the stored log; nothing to pair)
        kind, call_id = data.get("type"), data.get("id")
        if kind in _ROUND_EVENTS:
            seen.round_open = True
        if kind == "round_ended":
            seen.rounds, seen.round_open = seen.rounds + 1, False
        elif kind == "run_ended":
            seen.ended = True
        elif not isinstance(call_id, str):
            continue
        elif kind == "call_opened":
            seen.names.setdefault(call_id, str(data.get("name")))
            seen.streaming.append(call_id)
        elif kind == "call_committed":
            seen.names.setdefault(call_id, str(data.get("name")))
            _drop(seen.streaming, call_id)
            seen.committed.append(call_id)
        elif kind == "call_failed":
            seen.names.setdefault(call_id, str(data.get("name")))
            _drop(seen.streaming, call_id)
            seen.results[call_id] = (True, data.get("error"))
        elif kind == "tool_started":
            seen.started.add(call_id)
        elif kind == "tool_finished":
            _drop(seen.committed, call_id)
            seen.results[call_id] = (bool(data.get("is_error")), data.get("error"))
    return seen


def _drop(ids: list[str], call_id: str) -> None:
    if call_id in ids:
        ids.remove(call_id)


def closing_events(
    seen: OpenCalls, error: str, known: Mapping[str, tuple[bool, str | None] | str] | None = None
) -> list[dict[str, Any]]:
    """The events that end the run ``seen`` describes, ``run_ended.error`` being ``error``.
    ``known``: what the ledger says of a committed call without a result (``"started"``, or
    its final ``(is_error, error)``; absent: the log decides)."""
    known = known or {}
    events: list[dict[str, Any]] = []
    detail = "the worker running the call stopped; " + error
    for call_id in seen.streaming:
        name = seen.names[call_id]
        events.append(
            {
                "type": "call_failed",
                "id": call_id,
                "name": name,
                "error": str(ErrorCode.STREAM_INTERRUPTED),
                "detail": detail,
            }
        )
        seen.results[call_id] = (True, str(ErrorCode.STREAM_INTERRUPTED))
    for call_id in seen.committed:
        fact = known.get(call_id)
        if isinstance(fact, tuple):
            is_error, code = fact
            text = None
        elif fact == "started" or call_id in seen.started:
            is_error, code = True, str(ErrorCode.OUTCOME_UNKNOWN)
            text = "started, outcome unknown: " + detail
        else:
            is_error, code = True, str(ErrorCode.CANCELLED)
            text = "not run: " + detail
        events.append(
            {
                "type": "tool_finished",
                "id": call_id,
                "name": seen.names[call_id],
                "is_error": is_error,
                "error": code,
                "result": text,
            }
        )
        seen.results[call_id] = (is_error, code)
    rounds = seen.rounds
    if seen.round_open or events:
        rounds += 1
        events.append(
            {"type": "round_ended", "round": rounds, "ended": "interrupted", "stop_reason": None}
        )
    calls = [
        {
            "id": call_id,
            "name": name,
            "state": "failed" if seen.results[call_id][0] else "committed",
            "is_error": seen.results[call_id][0],
            "error": seen.results[call_id][1],
        }
        for call_id, name in seen.names.items()
        if call_id in seen.results
    ]
    events.append(
        {
            "type": "run_ended",
            "rounds": rounds,
            "calls": calls,
            "history": [],
            "error": error,
            "history_omitted": 0,
        }
    )
    return events
