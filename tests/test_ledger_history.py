"""Stored run histories (for resume): append-only canonical messages, a compare-and-append
on the length so two writers cannot interleave one run, persistence across processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from toollatch import UsageError
from toollatch.ledger import History, HistoryConflict
from toollatch.ledger._history import MemoryHistory, SQLiteHistory
from toollatch.ledger._redis import RedisHistory

USER = {"role": "user", "content": "charge 5"}
ASSISTANT = {
    "role": "assistant",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "charge", "arguments": '{"n":5}'}}
    ],
}  # fmt: skip
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "charged 5"}


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def history(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[History]:
    if request.param == "redis":
        client = aioredis.Redis.from_url(request.getfixturevalue("redis_server").url)
        await client.flushdb()
        made: History = RedisHistory(client)
    else:
        made = MemoryHistory() if request.param == "memory" else SQLiteHistory(tmp_path / "h.db")
    yield made
    await made.aclose()


async def test_append_then_load_in_order(history: History) -> None:
    assert await history.load("run-1") == []
    assert await history.append("run-1", [USER], at=0) == 1
    assert await history.append("run-1", [ASSISTANT, RESULT], at=1) == 3
    assert await history.load("run-1") == [USER, ASSISTANT, RESULT]
    assert await history.load("run-2") == []


async def test_a_second_writer_at_the_same_length_is_refused(history: History) -> None:
    await history.append("run-1", [USER], at=0)
    await history.append("run-1", [ASSISTANT], at=1)
    with pytest.raises(HistoryConflict, match="has 2 messages, not 1"):
        await history.append("run-1", [RESULT], at=1)
    assert await history.load("run-1") == [USER, ASSISTANT]  # nothing half-written


@pytest.mark.parametrize(
    ("run", "messages", "at"),
    [("", [USER], 0), ("r", [USER], -1), ("r", ["text"], 0), ("r", [{"x": float("nan")}], 0),
     ("r", [{"x": object()}], 0)],
)  # fmt: skip
async def test_bad_input_is_a_usage_error(
    history: History, run: str, messages: list, at: int
) -> None:  # type: ignore[type-arg]
    with pytest.raises(UsageError):
        await history.append(run, messages, at=at)


async def test_sqlite_history_is_read_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    code = (
        "import asyncio, sys; from toollatch.ledger._history import SQLiteHistory\n"
        "async def main():\n"
        "    h = SQLiteHistory(sys.argv[1])\n"
        f"    await h.append('run-1', [{USER!r}, {ASSISTANT!r}], at=0)\n"
        "    await h.aclose()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    resumed = SQLiteHistory(path)
    assert await resumed.load("run-1") == [USER, ASSISTANT]
    assert await resumed.append("run-1", [RESULT], at=2) == 3
    await resumed.aclose()
