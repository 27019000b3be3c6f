"""Runs a restarted relay resumes: those that were waiting for an answer (internal; used by
:class:`._app.Relay`).

Theory of operation. A run whose tools may ask (a tool declared ``needs_approval``, a client
tool, an approvals policy that names tools or asks for every one, or a tool source whose
tools are not known in advance) writes a *run record* to the relay's history store before it
starts: ``{"session": SHA-256 of the session token, "run", "provider", "model", "scope" (its
history), "conversation" (its questions' scope), "chat"?, "client_tools"?}``, appended under
``<conversation>/relay-run`` (the newest entry is the conversation's latest asking run). The
session token itself is never stored: a resumed run is owned by the token's digest and learns
the token from the first request of its session (:meth:`._runs.RunRegistry.owned`). When
the run ends (answered, cancelled, failed: anything but the process dying), its
conversation's records are deleted (:func:`forget`), unless a newer run of the conversation
wrote one meanwhile; each start's record holds a random ``start`` so that a run resumed
elsewhere (a survivor took it over) is never deleted by the worker it left.

At start (:meth:`Relay.restore <._app.Relay.restore>`) the relay lists the ledger's pending
questions (every built-in ledger lists them: ``pending_questions``), reads the record of each
question's scope and resumes that run under its id, as ``POST /runs {"resume": id}`` would:
the run continues its stored history, meets the waiting call again and asks its stored
question again (same call, arguments and expiry), so every reader and every answer path finds
it live. A scope without a record (a run of ``toollatch run``, or of a relay before records)
is left alone, and so is a run another live worker drives (:meth:`.store.RunStore.adopt`:
with a shared run store, only a dead owner's run is taken, by one worker; a surviving
worker's lease sweep resumes such a run the same way (:func:`of_run`), or ends it once
:func:`settle` has answered its questions ``cancelled``). The server
accepts connections once each resumed run has asked again (or
ended), at most ``wait_s`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..core._errors import UsageError
from ..ledger import ApprovalError, History, HistoryConflict, LedgerError, Question
from ..runtime._approvals import ApprovalPolicy
from ..tools._tools import Tool, schema_tool

_log = logging.getLogger("toollatch.relay")

SUFFIX = "/relay-run"
"""Where a conversation's run records are, after its scope."""
MAX_RESTORED = 1000
"""The pending questions read at start (the runs resumed are at most the relay's active runs)."""
_FIELDS = ("session", "run", "provider", "model", "scope", "conversation")


def may_ask(
    tools: Sequence[Tool[..., Any]], policy: ApprovalPolicy | None, has_source: bool
) -> bool:
    """Whether a run of ``tools`` may wait for an answer (then its record is written)."""
    if has_source or (policy is not None and (policy.tools or policy.default == "ask")):
        return True
    return any(
        getattr(t, "client", False) or getattr(t, "needs_approval", False) is not False
        for t in tools
    )


def client_tool_specs(tools: Sequence[Tool[..., Any]]) -> list[dict[str, Any]]:
    """What rebuilds a run's client tools (AG-UI's frontend tools) after a restart."""
    return [
        {"name": t.name, "description": t.spec.description, "parameters": t.spec.parameters}
        for t in tools
    ]


def client_tools(record: Mapping[str, Any]) -> list[Tool[..., Any]]:
    """The client tools a record names (see :func:`client_tool_specs`)."""
    return [
        schema_tool(t["name"], t["parameters"], description=t.get("description") or "")
        for t in record.get("client_tools") or ()
    ]


async def remember(history: History, record: Mapping[str, Any]) -> None:
    """Append ``record`` to its conversation's run records; a store that fails is logged
    (the run goes on; only its resumption after a restart is lost)."""
    key = f"{record['conversation']}{SUFFIX}"
    for _ in range(3):
        try:
            stored = await history.load(key)
            await history.append(key, [dict(record)], at=len(stored))
            return
        except HistoryConflict:
            continue  # (another run of the conversation wrote meanwhile)
        except (LedgerError, UsageError) as exc:
            _log.warning("run %s…: its record was not stored: %s", str(record["run"])[:6], exc)
            return


async def forget(history: History, record: Mapping[str, Any]) -> None:
    """Delete ``record``'s conversation's run records if ``record`` is still the newest
    (its run ended); a store that fails or cannot delete is logged (a later restart then
    finds no pending question for it, or resumes the run once more)."""
    key = f"{record['conversation']}{SUFFIX}"
    delete = getattr(history, "delete", None)
    if delete is None:
        return
    for _ in range(3):
        try:
            stored = await history.load(key)
            if not stored or stored[-1] != record:
                return  # (a newer run of the conversation: its record stays)
            await delete(key, at=len(stored))
            return
        except HistoryConflict:
            continue
        except (LedgerError, UsageError) as exc:
            _log.warning("run %s…: its record was not deleted: %s", str(record["run"])[:6], exc)
            return


async def pending_runs(
    ledger: object, history: History, *, limit: int = MAX_RESTORED
) -> list[tuple[dict[str, Any], list[str]]]:
    """The runs to resume: each conversation with pending questions that has a run record,
    its newest record and the waiting call ids (oldest question first). ``LedgerError``
    when the ledger cannot be read."""
    lister = getattr(ledger, "pending_questions", None)
    if lister is None:
        return []
    questions: list[Question] = await lister(limit)
    scopes: dict[str, list[str]] = {}
    for q in questions:
        scopes.setdefault(q.key.scope, []).append(q.key.call_id)
    found = []
    for scope, call_ids in scopes.items():
        records = await history.load(f"{scope}{SUFFIX}")
        record = records[-1] if records else None
        if record is None or not _valid(record, scope):
            continue
        found.append((record, call_ids))
    return found


async def of_run(
    ledger: object, history: History, run_id: str, scope: str, *, limit: int = MAX_RESTORED
) -> tuple[dict[str, Any] | None, list[Question]]:
    """The run ``run_id``'s newest record and its pending questions (those of a scope whose
    newest record names the run, or of its own ``scope``); ``LedgerError`` when the ledger
    cannot be read."""
    lister = getattr(ledger, "pending_questions", None)
    if lister is None:
        return None, []
    found: dict[str, Any] | None = None
    mine: list[Question] = []
    records: dict[str, dict[str, Any] | None] = {}
    for q in await lister(limit):
        at = q.key.scope
        if at not in records:
            stored = await history.load(f"{at}{SUFFIX}")
            records[at] = stored[-1] if stored and _valid(stored[-1], at) else None
        record = records[at]
        if record is not None and record["run"] == run_id:
            found = record
            mine.append(q)
        elif at == scope:
            mine.append(q)
    return found, mine


async def settle(ledger: object, questions: Sequence[Question], reason: str) -> None:
    """Answer ``questions`` ``cancelled`` (their run was ended: no restart resumes it); one
    answered meanwhile is left as it is."""
    answer = getattr(ledger, "answer", None)
    if answer is None:
        return
    for q in questions:
        try:
            now = time.time()
            await answer(q.key, digest=q.digest, decision="cancelled", now=now, reason=reason)
        except ApprovalError:
            continue  # (answered meanwhile)


def _valid(record: Mapping[str, Any], scope: str) -> bool:
    return all(isinstance(record.get(f), str) and record[f] for f in _FIELDS) and (
        record["conversation"] == scope
    )


def asked_again(asked: Collection[str], call_ids: Collection[str]) -> bool:
    """Whether a resumed run's log asks every one of ``call_ids`` again."""
    return set(call_ids) <= set(asked)
