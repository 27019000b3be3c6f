"""A run's history kept in a :class:`toollatch.ledger.History` store, so that another process
can resume the run by its session id (internal; used by the agent loop).

Only canonical messages are stored (what the next request sends: user turns, the assistant
entries of finished rounds and their results), appended after every round; never deltas or
half-assembled arguments. A round cut off by a crash is not stored: the resumed run asks the
model again from the last stored round, and the ledger decides what becomes of the calls the
dead process had claimed (a completed one returns its stored result, a started one is
"started, outcome unknown" unless its tool is idempotent).

What a dead process leaves behind for a conversation that goes on (a relay's chat, AG-UI
thread or resumable run, whose worker a survivor ends): beside the history, under
``<session>/interrupted``, the run writes one record when it starts and one before each round
whose calls it runs: ``{"at", "entries", "note", "assistant", "calls", "provider"}``,
``entries`` being that round as :meth:`StoredHistory.persist` would store it had every
committed call ended ``outcome_unknown`` (its stable error text; calls that failed the gate
their own error result), ``at`` where it would go, ``note`` a short assistant message in the
provider's format saying the answer was interrupted, ``assistant`` and ``calls`` what pairs
the round's calls again. :func:`file_interrupted` (the survivor) appends the last record's
round when the history stops where it would go (the round was cut off), each committed call
paired with what the survivor knows of it (:func:`ledger_fate`: the ledger's final result;
``cancelled`` when it was claimed and never started; else ``outcome_unknown``), then the
note when the history does not end with an assistant turn. The next message then follows an
assistant turn for every provider (Bedrock and Anthropic refuse two user turns in a row, and
their tool results are a user turn), and the model is told a side effect may have happened.
The survivor stores a note rather than the next request merging user turns: one rule for
every provider, the stored history stays valid as it is, and the model reads why the answer
stopped. Not covered: a run with ``drop_failed`` (its calls all ``outcome_unknown``), and an
eager call that started before its round ended (no record yet: only the note).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from ..core._errors import ErrorCode, UsageError
from ..core._events import CallKey, RoundEnd
from ..core._messages import (
    assistant_messages,
    error_result,
    error_results,
    results_for,
    tool_results_messages,
)
from ..core._messages._ids import history_round
from ..core._messages._repair import repaired_history
from ..core._round import NO_EXTRAS, CallRecord, Choice, Round, TextRun, ToolResult
from ..core._state import CallState
from ..ledger import History, HistoryConflict, Ledger, LedgerError, LedgerKey
from ..tools._results import made_error

INTERRUPTED = "/interrupted"
"""The key suffix of a session's interrupted-round records (see the module docstring)."""

LOST_DETAIL = (
    "the worker running this call stopped before its result was known; its outcome is "
    "unknown (it may have had its effect)"
)
"""The detail of a committed call's ``outcome_unknown`` result when its worker died."""

INTERRUPTED_NOTE = (
    "(This answer was interrupted: the worker running it stopped. A tool call above whose "
    "result says outcome_unknown may or may not have had its effect.)"
)
"""The assistant note a survivor stores after a dead run's history."""


def round_entries(
    round_: Round, results: Sequence[ToolResult], drop: Collection[ErrorCode] = ()
) -> list[dict[str, Any]]:
    """``round_`` and its ``results`` as history entries (the agent loop's, ``drop``: the
    error codes whose calls are left out of the history)."""
    if drop:
        return repaired_history(round_, results, drop)
    entries = assistant_messages(round_)
    if any(c.name for c in round_.calls):
        entries += tool_results_messages(round_, results)
    return entries


def lost_results(round_: Round) -> list[ToolResult]:
    """Every call of ``round_`` paired as if its worker died while the round ran: a
    committed call ``outcome_unknown``, a failed one its own error result."""
    lost = [
        made_error(c.call_id, c.name or "", ErrorCode.OUTCOME_UNKNOWN, LOST_DETAIL)
        for c in round_.calls
        if c.committed is not None
    ]
    return lost + error_results(round_)


Fate = Callable[[str], Awaitable[ToolResult | None]]
"""What became of a committed call (by its ledger call id) as its survivor knows it: its
result (a final one, or ``cancelled`` when it never started), or None (unknown)."""


NOT_STARTED = "the worker running this call stopped before the tool started; it was not run"
"""The detail of a committed call's ``cancelled`` result when its worker died first."""


def ledger_fate(ledger: Ledger, scope: str, *, unclaimed_not_run: bool = False) -> Fate:
    """What ``ledger`` says of a dead run's committed call (``scope``: its calls' ledger
    scope): its final result; ``cancelled`` when it was claimed and never started, and,
    with ``unclaimed_not_run`` (calls whose tool starts only once claimed: a durable run's),
    when the ledger holds no record of it; None (``outcome_unknown``) when it started, or
    the ledger cannot tell."""

    async def fate(call_id: str) -> ToolResult | None:
        try:
            record = await ledger.get(LedgerKey(scope=scope, call_id=call_id))
        except (LedgerError, UsageError):
            return None
        if record is None:
            not_run = unclaimed_not_run
        elif record.result is not None:
            return record.result
        else:
            not_run = record.state == "claimed"
        return made_error(call_id, "", ErrorCode.CANCELLED, NOT_STARTED) if not_run else None

    return fate


def answered_calls(round_: Round) -> list[dict[str, Any]]:
    """The calls ``round_``'s history writes, for :func:`file_interrupted` to pair again:
    ``{"call": its id, "id": its id in the history, "name", "made_up", "fixed": the error
    result of a call that did not commit (None: committed)}``."""
    calls = {c.key: c for c in round_.calls}
    out = []
    for written in history_round(round_).calls:
        call = calls[written.key]
        if not written.name:
            continue  # (not in the history)
        fixed = None if call.committed is not None else error_result(call)
        out.append(
            {
                "call": call.call_id,
                "id": written.call_id,
                "name": written.name,
                "made_up": written.id_made_up,
                "fixed": None if fixed is None else [fixed.content, fixed.is_error],
            }
        )
    return out


async def _paired_again(record: dict[str, Any], fate: Fate) -> list[dict[str, Any]] | None:
    """A record's round with each committed call paired with what ``fate`` says of it (None:
    the record cannot be: the pessimistic ``entries`` stand)."""
    assistant, calls, provider = (record.get(k) for k in ("assistant", "calls", "provider"))
    if not (isinstance(assistant, list) and isinstance(calls, list) and isinstance(provider, str)):
        return None
    pairs: list[tuple[CallRecord, ToolResult]] = []
    for n, c in enumerate(calls):
        stub = CallRecord(
            key=CallKey(attempt=0, choice=0, part=n), position=n, call_id=c["id"],
            id_made_up=c["made_up"], name=c["name"], state=CallState.COMMITTED,
            arguments_text="", arguments=None, error=None, detail="", committed=None,
            extras=NO_EXTRAS,
        )  # fmt: skip
        if c["fixed"] is not None:
            result = ToolResult(
                tool_call_id=c["id"], name=c["name"], content=c["fixed"][0], is_error=c["fixed"][1]
            )
        else:
            told = await fate(c["call"])
            result = told or made_error(c["id"], c["name"], ErrorCode.OUTCOME_UNKNOWN, LOST_DETAIL)
        pairs.append((stub, result))
    return assistant + (results_for(provider, pairs) if pairs else [])


def note_entries(provider: str) -> list[dict[str, Any]]:
    """:data:`INTERRUPTED_NOTE` as an assistant turn in ``provider``'s history format."""
    text = TextRun(block=0, text=INTERRUPTED_NOTE)
    choice = Choice(
        index=0, ended=RoundEnd.INTERRUPTED, stop_reason=None, calls=(), content=(text,)
    )
    round_ = Round(
        provider=provider, attempt=0, choices=(choice,), usage=None, anomalies=(), error=None
    )
    return assistant_messages(round_)


async def file_interrupted(store: History, session: str, fate: Fate | None = None) -> int:
    """What a dead run of ``session`` left (see the module docstring) appended to its
    stored history; the number of entries appended (0: nothing to add). ``fate``: what
    became of each committed call (default: every one ``outcome_unknown``).
    ``HistoryConflict`` when the history grew meanwhile (its run is alive after all)."""
    records = await store.load(session + INTERRUPTED)
    last = records[-1] if records else None
    if not isinstance(last, dict):
        return 0  # (nothing recorded: a run without calls to run, or not this version's)
    history = await store.load(session)
    added: list[dict[str, Any]] = []
    entries, note = last.get("entries"), last.get("note")
    if isinstance(entries, list) and entries and last.get("at") == len(history):
        try:
            again = None if fate is None else await _paired_again(last, fate)
        except (KeyError, TypeError, IndexError):  # (a record of another shape)
            again = None
        added += entries if again is None else again
    tail = (added or history)[-1:]
    if isinstance(note, list) and not (tail and tail[0].get("role") in ("assistant", "model")):
        added += note
    if added:
        await store.append(session, added, at=len(history))
    return len(added)


class StoredHistory:
    """One run's view of the store: what it loaded, and how much of its history is stored."""

    def __init__(self, store: History, session: str) -> None:
        self.store = store
        self.session = session
        self._stored = 0
        self._marks = 0

    async def begin(self, history: list[dict[str, Any]], *, resume: bool) -> list[dict[str, Any]]:
        """The run's starting history: the stored one followed by ``history`` when resuming
        (UsageError when nothing is stored), else ``history``, which is stored (UsageError
        when the session already has a stored history: one session is one run)."""
        loaded = await self.store.load(self.session)
        if resume and not loaded:
            raise UsageError(f"nothing is stored for session {self.session!r}: nothing to resume")
        if not resume and loaded:
            raise UsageError(
                f"session {self.session!r} already has a stored history of {len(loaded)} "
                "messages: resume it, or start the run under a new session"
            )
        self._stored = len(loaded)
        started = [*loaded, *history] if resume else history
        await self.persist(started)
        return started

    async def persist(self, history: list[dict[str, Any]]) -> None:
        """Append what ``history`` has beyond the stored part (a ``HistoryConflict`` when
        another process appended to this run meanwhile)."""
        if len(history) > self._stored:
            self._stored = await self.store.append(
                self.session, history[self._stored :], at=self._stored
            )

    async def mark(
        self, at: int, entries: list[dict[str, Any]], provider: str, round_: Round | None = None
    ) -> None:
        """Record what a survivor stores should the run die now (:func:`file_interrupted`;
        nothing in a store of one process, whose ``in_process`` is true):
        ``entries`` at ``at`` in the history, then the interrupted note; with ``round_``
        (whose history ``entries`` are, no call left out), what pairs its calls again."""
        if getattr(self.store, "in_process", False):
            return  # (nobody else reads it: no survivor would)
        record: dict[str, Any] = {"at": at, "entries": entries, "note": note_entries(provider)}
        if round_ is not None:
            record.update(
                provider=provider,
                assistant=assistant_messages(round_),
                calls=answered_calls(round_),
            )
        key = self.session + INTERRUPTED
        if self._marks == 0:
            self._marks = len(await self.store.load(key))  # (an earlier run's records)
        try:
            self._marks = await self.store.append(key, [record], at=self._marks)
        except HistoryConflict:  # (another run of the session wrote one: the last counts)
            self._marks = len(await self.store.load(key))
            self._marks = await self.store.append(key, [record], at=self._marks)
