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
from typing import Any

import pytest

from toollatch import Agent, RetryPolicy, model_client, tool
from toollatch.ledger._history import MemoryHistory
from toollatch.runtime._resume import INTERRUPTED, INTERRUPTED_NOTE, file_interrupted
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


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_round_a_dead_run_cut_off_is_stored_paired_and_the_next_turn_is_valid(
    provider: str,
) -> None:
    store, dead = MemoryHistory(), MemoryHistory()

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
            assert await file_interrupted(dead, "s") >= 3  # round, result(s), note
            assert await file_interrupted(dead, "s") == 0  # (once: it ends with the note)
            then = Agent(client, [send_mail], history_store=dead, session="s")
            events = [e.to_json() async for e in then.run("and?", resume=True)]
    assert events[-1]["error"] is None
    assert [r.status for r in server.requests] == [200, 200, 200]  # valid histories
    sent = server.requests[-1].body
    history = turns(sent)
    text = str(history)
    assert "outcome_unknown: the worker running this call stopped" in text
    assert "it may have had its effect" in text and INTERRUPTED_NOTE in text
    assert "send_mail" in text and "sent" not in text.replace("Sent.", "")
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
