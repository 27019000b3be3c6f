"""What a run that dies while its tool runs leaves for its conversation to go on, in each
provider's history format: the round it cut off, every call paired with its
``outcome_unknown`` result, and an assistant note, stored by whoever ends it
(:func:`toollatch.runtime._resume.file_interrupted`, the relay's lease sweep). The run's
store is copied while the tool runs (what a SIGKILLed worker leaves); the next message,
resumed from the copy, goes to the scripted server, which refuses a history the provider
would refuse (``toollatch.scripted._validate``). The relay's own test, with real workers and
SIGKILL: ``tests/test_relay_lease_chats.py``."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from toollatch import Agent, RetryPolicy, model_client, tool
from toollatch.core._round import ToolResult
from toollatch.ledger import LedgerKey
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._history import MemoryHistory, SQLiteHistory
from toollatch.runtime._resume import (
    INTERRUPTED,
    INTERRUPTED_NOTE,
    file_interrupted,
    ledger_fate,
)
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"]

SCRIPT = Script(
    turns=(
        Turn(items=(Call(call_id="c1", name="send_mail", arguments='{"to": "bob"}'),)),
        Turn(items=(Text(text="Sent."),)),
        Turn(items=(Text(text="Fine."),)),
    )
)


def turns(body: dict[str, Any]) -> list[Any]:
    """The history of a request body, whatever the provider calls it."""
    return list(body.get("messages") or body.get("contents") or body.get("input") or [])


@pytest.mark.parametrize("known", [False, True], ids=["unknown", "known"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_round_a_dead_run_cut_off_is_stored_paired_and_the_next_turn_is_valid(
    provider: str, known: bool, tmp_path: Path
) -> None:
    """``known``: the survivor knows the call's result (its ledger's), which the history
    then carries instead of ``outcome_unknown``."""
    store, dead = SQLiteHistory(tmp_path / "history.db"), MemoryHistory()  # (a shared store)

    @tool
    async def send_mail(to: str) -> str:
        """Send a mail (its worker "dies" while it runs: the store is copied now)."""
        for key in ("s", "s" + INTERRUPTED):
            await dead.append(key, await store.load(key), at=0)
        return "sent"

    async with ScriptedServer(delay_scale=0, scripts={"m": SCRIPT}) as server:
        url = server.base_url(provider)
        retry = RetryPolicy(attempts=1)
        async with model_client(provider, model="m", base_url=url, retry=retry) as client:
            first = Agent(client, [send_mail], history_store=store, session="s")
            assert [e async for e in first.run("mail bob")][-1].error is None
            kept = len(await dead.load("s"))
            assert kept == 1  # (only the user's message: no round had finished)
            stored = ToolResult(tool_call_id="c1", name="send_mail", content="sent at 10:02")

            async def fate(call_id: str) -> ToolResult | None:
                return stored if known else None

            assert await file_interrupted(dead, "s", fate) >= 3  # round, result(s), note
            assert await file_interrupted(dead, "s") == 0  # (once: it ends with the note)
            then = Agent(client, [send_mail], history_store=dead, session="s")
            events = [e.to_json() async for e in then.run("and?", resume=True)]
    await store.aclose()
    assert events[-1]["error"] is None
    assert [r.status for r in server.requests] == [200, 200, 200]  # valid histories
    sent = server.requests[-1].body
    history = turns(sent)
    text = str(history)
    assert ("outcome_unknown: the worker running this call stopped" in text) is not known
    assert ("it may have had its effect" in text) is not known and INTERRUPTED_NOTE in text
    assert ("sent at 10:02" in text) is known
    assert "send_mail" in text and "'sent'" not in text  # (the tool's own, never stored)
    roles = [m.get("role") for m in history]
    assert not [a for a, b in itertools.pairwise(roles) if a == b == "user"]


async def test_a_dead_run_without_a_finished_round_gets_only_the_note() -> None:
    """Died while its first answer streamed: the user's message, then the note."""
    store = MemoryHistory()
    user = {"role": "user", "content": "hi"}
    await store.append("s", [user], at=0)
    note = [{"role": "assistant", "content": INTERRUPTED_NOTE}]
    await store.append("s" + INTERRUPTED, [{"at": 1, "entries": [], "note": note}], at=0)
    assert await file_interrupted(store, "s") == 1
    assert await store.load("s") == [user, *note]
    assert await file_interrupted(MemoryHistory(), "s") == 0  # (nothing recorded: nothing)


async def test_a_round_already_stored_is_not_stored_twice() -> None:
    """Died while the round after the recorded one streamed: its history already holds the
    recorded round (with its real results); only the note goes after it."""
    store = MemoryHistory()
    user = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asked = {"role": "assistant", "content": None, "tool_calls": [call]}
    lost = {"role": "tool", "tool_call_id": "c1", "content": "outcome_unknown: lost"}
    got = {"role": "tool", "tool_call_id": "c1", "content": "done"}
    await store.append("s", [user, asked, got], at=0)
    note = [{"role": "assistant", "content": INTERRUPTED_NOTE}]
    record = {"at": 1, "entries": [asked, lost], "note": note}
    await store.append("s" + INTERRUPTED, [record], at=0)
    assert await file_interrupted(store, "s") == 1
    assert await store.load("s") == [user, asked, got, *note]
    await store.append("t" + INTERRUPTED, [{"other": "fields"}], at=0)
    assert await file_interrupted(store, "t") == 0  # (not a record of this version: nothing)


async def test_the_ledger_tells_what_became_of_a_dead_runs_call() -> None:
    """Claimed, never started: ``cancelled`` (not run); started: unknown (None); finished:
    its stored result; nothing recorded: unknown."""
    ledger = MemoryLedger()
    fate = ledger_fate(ledger, "scope")
    keys = [LedgerKey(scope="scope", call_id=c) for c in ("a", "b", "c")]
    claims = [await ledger.claim(k, digest="d", worker="w", now=0.0, lease_s=30) for k in keys]
    await ledger.start(keys[1], claims[1].token, now=0.0, lease_s=30)
    await ledger.start(keys[2], claims[2].token, now=0.0, lease_s=30)
    done = ToolResult(tool_call_id="c", name="f", content="42")
    await ledger.finish(keys[2], claims[2].token, done, now=0.0)
    not_run = await fate("a")
    assert not_run is not None and not_run.is_error and str(not_run.code) == "cancelled"
    assert not_run.content.startswith("cancelled: the worker running this call stopped")
    assert await fate("b") is None
    assert (await fate("c")) == done
    assert await fate("nothing") is None


async def test_a_store_of_one_process_gets_no_record() -> None:
    """Nobody else reads a :class:`MemoryHistory`: no record, no key more."""

    @tool
    def send_mail(to: str) -> str:
        """Send a mail."""
        return "sent"

    store = MemoryHistory()
    async with ScriptedServer(delay_scale=0, scripts={"m": SCRIPT}) as server:
        url = server.base_url("openai_chat")
        async with model_client("openai_chat", model="m", base_url=url) as client:
            agent = Agent(client, [send_mail], history_store=store, session="s")
            assert [e async for e in agent.run("mail bob")][-1].error is None
    assert len(await store.load("s")) == 4  # user, call, result, answer
    assert await store.load("s" + INTERRUPTED) == []
