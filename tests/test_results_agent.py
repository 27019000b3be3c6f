"""End to end over loopback HTTP: a secret a tool returns never reaches the next request to
the scripted model server, the agent events, the SQLite ledger (its stored result, its
stored history, its files), or a log line; an oversized result reaches the model cut, with
its marker, and the event says so."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from toollatch import (
    Agent,
    PreviewPolicy,
    ResultLimits,
    RetryPolicy,
    RunLimits,
    model_client,
    open_history,
    open_ledger,
    tool,
)
from toollatch.ledger import LedgerKey
from toollatch.relay import redact_secrets
from toollatch.runtime import RedactedLog
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]
SECRET = "sk-live-Q8d2F7s9K1m3N5p7"
TEXT_SECRET = "AKIAABCDEFGHIJKLMNOP"
LOG_LINE = "2026-12-02 ok ☕ durée 😀 " * 400  # about 12 KB, multi-byte


@tool(side_effects="read")
def account(user: str) -> dict[str, Any]:
    """The account of a user, with its key (a secret the model must not see)."""
    return {"user": user, "api_key": SECRET, "plan": "pro"}


@tool(side_effects="read")
def env_dump() -> str:
    """Plain text holding a secret."""
    return f"HOME=/home/ana\nAWS_ACCESS_KEY_ID={TEXT_SECRET}\n"


@tool(side_effects="read", max_result_bytes=2048)
def read_log() -> str:
    """A long log (its budget: 2 KiB)."""
    return LOG_LINE


def script() -> Script:
    calls = (
        Call(call_id="c_acc", name="account", arguments='{"user": "ana"}'),
        Call(call_id="c_env", name="env_dump", arguments="{}"),
        Call(call_id="c_log", name="read_log", arguments="{}"),
    )
    return Script(turns=(Turn(items=(Text(text="Looking."), *calls), delay_ms=0),
                         Turn(items=(Text(text="Done."),), delay_ms=0)))  # fmt: skip


def mask(pointer: str, text: str) -> str:
    """A key inside plain text masked where it stands, then the relay's redactor (which masks
    a whole string that looks like a secret, or sits under a secret-looking key)."""
    return redact_secrets(pointer, text.replace(TEXT_SECRET, "[redacted]"))


async def play(provider: str, tmp_path: Path, redactor: Any) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger, history = open_ledger(url), open_history(url)
    async with ScriptedServer({"s": Script(turns=script().turns)}, delay_scale=0) as server:
        client = model_client(provider, model="s", base_url=server.base_url(provider),
                              retry=RetryPolicy(attempts=1))  # fmt: skip
        async with client:
            agent = Agent(
                client, [account, env_dump, read_log], previews=PreviewPolicy(redactor=redactor),
                ledger=ledger, history_store=history, session="run-1",
                run_limits=RunLimits(max_rounds=3), observers=[RedactedLog()],
                result_limits=ResultLimits(max_bytes=4096),
            )  # fmt: skip
            run = agent.run("Who am I?")
            events = [e.to_json() async for e in run]
        requests = server.requests
    ids = {c.name: c.call_id for c in run.rounds[0].calls}  # (Gemini's are made up)
    records = {n: await ledger.get(LedgerKey(scope="run-1", call_id=i)) for n, i in ids.items()}
    stored = await history.load("run-1")
    await ledger.aclose()
    await history.aclose()
    files = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    finished = {e["name"]: e for e in events if e["type"] == "tool_finished"}
    return {"events": events, "requests": requests, "records": records, "stored": stored,
            "files": files, "run": run, "finished": finished}  # fmt: skip


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_secret_a_tool_returns_reaches_no_request_event_ledger_or_log(
    provider, tmp_path, caplog
):
    with caplog.at_level(logging.DEBUG):
        seen = await play(provider, tmp_path, mask)
    assert [r.status for r in seen["requests"]] == [200, 200]  # the history stayed valid
    second = json.dumps(seen["requests"][1].body, ensure_ascii=False)
    assert "[redacted]" in second and "HOME=/home/ana" in second
    assert '\\"plan\\":\\"pro\\"' in second
    everywhere = {
        "next request": second,
        "events": json.dumps(seen["events"], ensure_ascii=False),
        "ledger records": repr(seen["records"]),
        "stored history": json.dumps(seen["stored"], ensure_ascii=False, default=repr),
        "run history": json.dumps(seen["run"].history, ensure_ascii=False),
        "logs": caplog.text,
    }
    for where, text in everywhere.items():
        assert SECRET not in text and TEXT_SECRET not in text, where
    assert SECRET.encode() not in seen["files"] and TEXT_SECRET.encode() not in seen["files"]
    assert seen["records"]["account"].result.content == (
        '{"user":"ana","api_key":"[redacted]","plan":"pro"}'
    )


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_oversized_result_reaches_the_model_cut_with_its_marker(provider, tmp_path):
    seen = await play(provider, tmp_path, mask)
    original = len(LOG_LINE.encode())
    finished = seen["finished"]
    assert finished["read_log"]["truncated_from"] == original
    assert "truncated_from" not in finished["account"]
    stored = seen["records"]["read_log"].result.content
    assert len(stored.encode()) <= 2048 and LOG_LINE.startswith(stored.split("\n[toollatch")[0])
    marker = f"of {original} bytes are shown]"
    assert stored.endswith(marker)
    second = json.dumps(seen["requests"][1].body, ensure_ascii=False)
    assert marker in second and LOG_LINE[:3000] not in second


async def test_a_redactor_that_raises_withholds_the_result_everywhere(tmp_path, caplog):
    def refuses(pointer: str, text: str) -> str:
        if SECRET in text or TEXT_SECRET in text:
            raise ValueError(f"will not show {text}")
        return text

    with caplog.at_level(logging.DEBUG):
        seen = await play("anthropic", tmp_path, refuses)
    second = json.dumps(seen["requests"][1].body, ensure_ascii=False)
    assert second.count("the result redactor failed (ValueError)") == 2
    for text in (second, json.dumps(seen["events"]), repr(seen["records"]), caplog.text):
        assert SECRET not in text and TEXT_SECRET not in text
    assert SECRET.encode() not in seen["files"] and TEXT_SECRET.encode() not in seen["files"]
    assert seen["records"]["account"].state == "failed"
    finished = seen["finished"]
    assert finished["account"]["error"] == "tool_error"
    assert finished["read_log"]["is_error"] is False
