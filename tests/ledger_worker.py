"""A worker process for the ledger's fault-injection tests: ``python ledger_worker.py JSON``.

It runs one round of calls through a ``Dispatcher(ledger=open_ledger(url))`` and prints the
results as JSON. Side effects go to files so that duplicates are observable:

- ``charge`` (not idempotent) appends ``call_id pid`` to ``effects`` on every run;
- ``put`` (idempotent) appends ``call_id pid`` to ``attempts`` on every run and, deduped by
  the idempotency key (as a downstream API with an ``Idempotency-Key`` would), to ``effects``
  only once per key.

``kill`` makes the process SIGKILL itself at one point of ``kill_call``: ``claim`` (the claim
is stored, nothing started: the call waits for a slot, so the dispatcher claims it and starts
it later), ``start`` (the record says started, the tool has not run: after the start write,
or after a claim that also started the call, as the dispatcher's claim does when nothing is
to be waited for) or ``effect`` (the tool's side effect is written, its result is not
stored). ``hold_slot`` (idempotent, no effect) holds a concurrency slot for a while;
``max_concurrency`` bounds the slots.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ledger_helpers import chat_round
from toollatch import open_ledger, tool
from toollatch.ledger import Claim, Ledger, LedgerKey, Won, current_call
from toollatch.runtime import Dispatcher

CONFIG: dict[str, Any] = json.loads(sys.argv[1])


def die_at(point: str, call_id: str) -> None:
    if CONFIG.get("kill") == point and CONFIG.get("kill_call") == call_id:
        os.kill(os.getpid(), signal.SIGKILL)


def append(path: str, line: str, *, unless_present: str | None = None) -> None:
    """Append ``line`` durably; with ``unless_present``, only when no line starts with it
    (checked under an exclusive file lock, as a database's unique key would)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        if unless_present is None or not any(x.startswith(unless_present) for x in f):
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


@tool
def charge(n: int) -> str:
    """Charge n (not idempotent)."""
    ctx = current_call()
    assert ctx is not None
    if "running" in CONFIG:  # tells a test the tool runs (its "started" record is stored)
        Path(CONFIG["running"]).touch()
    time.sleep(CONFIG.get("tool_sleep", 0.0))
    append(CONFIG["effects"], f"{ctx.call_id} {os.getpid()}")
    die_at("effect", ctx.call_id)
    return f"charged {n}"


@tool(idempotent=True)
def put(k: str) -> str:
    """Put k (idempotent by its key)."""
    ctx = current_call()
    assert ctx is not None
    append(CONFIG["attempts"], f"{ctx.call_id} {os.getpid()} rerun={ctx.rerun}")
    time.sleep(CONFIG.get("tool_sleep", 0.0))
    append(
        CONFIG["effects"],
        f"{ctx.idempotency_key} {ctx.call_id}",
        unless_present=ctx.idempotency_key,
    )
    die_at("effect", ctx.call_id)
    return f"put {k}"


class Killing:
    """The real ledger, with the process killed right after a chosen write."""

    def __init__(self, inner: Ledger) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def claim(self, key: LedgerKey, **kw: Any) -> Claim:
        claim = await self._inner.claim(key, **kw)
        if isinstance(claim, Won):
            die_at("start" if kw.get("start") else "claim", key.call_id)
        return claim

    async def start(self, key: LedgerKey, token: int, **kw: Any) -> None:
        await self._inner.start(key, token, **kw)
        die_at("start", key.call_id)


@tool(idempotent=True)
async def hold_slot(seconds: float) -> str:
    """Hold a concurrency slot for ``seconds`` (no side effect)."""
    await asyncio.sleep(seconds)
    return "held"


async def main() -> None:
    ledger = open_ledger(CONFIG["ledger"])
    d = Dispatcher(
        [charge, put, hold_slot],
        ledger=Killing(ledger),  # type: ignore[arg-type]
        max_concurrency=CONFIG.get("max_concurrency", 8),
        worker=CONFIG.get("worker", f"w{os.getpid()}"),
        lease_s=CONFIG.get("lease_s", 0.5),
        poll_s=0.02,
    )
    calls = [tuple(c) for c in CONFIG["calls"]]
    round_ = chat_round(d.specs, calls)  # type: ignore[arg-type]
    if "start_at" in CONFIG:  # racing workers start together
        await asyncio.sleep(max(0.0, CONFIG["start_at"] - time.time()))
    results = await d.run(round_, session=CONFIG.get("session", "run-1"))
    await ledger.aclose()
    out = [{**r.as_dict(), "code": r.code and str(r.code)} for r in results]
    print(json.dumps(out))


if __name__ == "__main__":
    Path(CONFIG["effects"]).touch()
    Path(CONFIG.get("attempts", CONFIG["effects"] + ".attempts")).touch()
    asyncio.run(main())
