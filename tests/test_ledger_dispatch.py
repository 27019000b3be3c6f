"""Dispatcher(ledger=...) in one process: stored results are not run again, other arguments
are duplicate_call_id, a live claim is awaited (its heartbeat keeps it live), a stale started
call is "outcome unknown" unless the tool is idempotent (then re-run, knowing it), a ledger
that cannot be reached means "not run", cancellation leaves the right record, and the tool
reads its call with current_call(). Ordering is forced with asyncio.Event, not sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ledger_helpers import chat_round, free_port
from toollatch import ConfigError, ErrorCode, Tool, open_ledger, tool
from toollatch.ledger import CallContext, LedgerError, LedgerKey, current_call, digest_of
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._sqlite import SQLiteLedger
from toollatch.runtime import Dispatcher


class World:
    """Tools that count their runs and can be held at a gate."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, CallContext | None]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.entered = asyncio.Event()

    def tools(self) -> list[Tool[Any, Any]]:
        async def record(kind: str, value: str) -> str:
            self.runs.append((kind, current_call()))
            self.entered.set()
            await self.hold.wait()
            return f"{kind} {value}"

        @tool
        async def charge(v: str) -> str:
            """Not idempotent."""
            return await record("charge", v)

        @tool(idempotent=True)
        async def put(v: str) -> str:
            """Idempotent."""
            return await record("put", v)

        return [charge, put]


def dispatcher(world: World, ledger: Any, **kw: Any) -> Dispatcher:
    return Dispatcher(world.tools(), ledger=ledger, poll_s=0.01, **kw)


async def test_a_stored_result_is_returned_without_running() -> None:
    ledger, world = MemoryLedger(), World()
    first = dispatcher(world, ledger, worker="a")
    round_ = chat_round(first.specs, [("c1", "charge", {"v": "x"})])
    one = await first.run(round_, session="s")
    two = await dispatcher(world, ledger, worker="b").run(round_, session="s")
    assert one == two
    assert one[0].content == "charge x"
    assert len(world.runs) == 1
    other_session = await dispatcher(world, ledger).run(round_, session="t")
    assert other_session == one
    assert len(world.runs) == 2


async def test_other_arguments_are_a_duplicate_call_id() -> None:
    ledger, world = MemoryLedger(), World()
    d = dispatcher(world, ledger)
    await d.run(chat_round(d.specs, [("c1", "charge", {"v": "x"})]), session="s")
    again = chat_round(d.specs, [("c1", "charge", {"v": "y"})])
    result = (await dispatcher(world, ledger).run(again, session="s"))[0]
    assert result.code is ErrorCode.DUPLICATE_CALL_ID
    assert len(world.runs) == 1


async def test_a_live_claim_is_awaited_and_its_heartbeat_keeps_it_live() -> None:
    ledger, world = MemoryLedger(), World()
    world.hold.clear()
    a, b = (dispatcher(world, ledger, worker=w, lease_s=0.06) for w in "ab")
    round_ = chat_round(a.specs, [("c1", "charge", {"v": "x"})])
    first = asyncio.create_task(a.run(round_, session="s"))
    await world.entered.wait()
    second = asyncio.create_task(b.run(round_, session="s"))
    await asyncio.sleep(0.3)  # five leases: only the heartbeat keeps the claim live
    assert not second.done()
    world.hold.set()
    assert await first == await second
    assert len(world.runs) == 1


class SwallowingLedger(MemoryLedger):
    """A ledger whose first renewal swallows its cancel (as redis-py's commands can under
    Python 3.11's asyncio.wait_for, python/cpython#86296); counts renewals after a finish."""

    def __init__(self) -> None:
        super().__init__()
        self.in_renewal = asyncio.Event()
        self.swallowed = self.finished = False
        self.renewed_after_finish = 0

    async def renew(self, key: LedgerKey, token: int, *, now: float, lease_s: float) -> None:
        self.renewed_after_finish += self.finished
        if not self.swallowed:
            self.in_renewal.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.swallowed = True  # (and answers as if renewed)
            return
        await super().renew(key, token, now=now, lease_s=lease_s)

    async def finish(self, key: LedgerKey, token: int, result: Any, *, now: float) -> None:
        self.finished = True
        await super().finish(key, token, result, now=now)


async def test_a_calls_heartbeat_ends_with_it_even_when_a_renewal_swallowed_the_cancel() -> None:
    ledger, world = SwallowingLedger(), World()
    world.hold.clear()
    d = dispatcher(world, ledger, lease_s=0.06)
    round_ = chat_round(d.specs, [("c1", "charge", {"v": "x"})])
    call = asyncio.create_task(d.run(round_, session="s"))
    await ledger.in_renewal.wait()  # (the heartbeat waits in a renewal: the call's end cancels it)
    world.hold.set()
    assert (await call)[0].content == "charge x"
    await asyncio.sleep(0.2)  # ten beats of its lease: a heartbeat going on renews meanwhile
    assert ledger.swallowed and ledger.renewed_after_finish == 0


async def stale_started(ledger: MemoryLedger, name: str, v: str, *, now: float = 100.0) -> None:
    """A record like a worker's that started the call and died (its lease ran out)."""
    key = LedgerKey(scope="s", call_id="c1")
    await ledger.claim(key, digest=digest_of(name, {"v": v}), worker="dead", now=0.0, lease_s=1)
    await ledger.start(key, 1, now=0.0, lease_s=1)


async def test_a_stale_started_call_is_outcome_unknown_not_run() -> None:
    ledger, world = MemoryLedger(), World()
    await stale_started(ledger, "charge", "x")
    d = dispatcher(world, ledger)
    result = (await d.run(chat_round(d.specs, [("c1", "charge", {"v": "x"})]), session="s"))[0]
    assert result.is_error
    assert result.code is ErrorCode.OUTCOME_UNKNOWN
    assert "outcome is unknown" in result.content
    assert world.runs == []
    record = await ledger.get(LedgerKey(scope="s", call_id="c1"))
    assert record is not None
    assert record.state == "failed"
    assert record.result == result


async def test_a_stale_started_idempotent_call_runs_again_knowing_it() -> None:
    ledger, world = MemoryLedger(), World()
    await stale_started(ledger, "put", "x")
    d = dispatcher(world, ledger)
    result = (await d.run(chat_round(d.specs, [("c1", "put", {"v": "x"})]), session="s"))[0]
    assert result.content == "put x"
    [(_, ctx)] = world.runs
    assert ctx is not None
    assert ctx.rerun
    assert ctx.token == 2
    assert ctx.session == "s"


async def test_the_idempotency_key_is_the_same_on_every_worker() -> None:
    world = World()
    for worker in ("a", "b"):
        d = dispatcher(world, MemoryLedger(), worker=worker)
        await d.run(chat_round(d.specs, [("c1", "put", {"v": "x"})]), session="s")
    keys = {ctx.idempotency_key for _, ctx in world.runs if ctx is not None}
    assert len(world.runs) == 2
    assert len(keys) == 1
    no_ledger = Dispatcher(world.tools())
    await no_ledger.run(chat_round(no_ledger.specs, [("c1", "put", {"v": "x"})]), session="s")
    ctx = world.runs[-1][1]
    assert ctx is not None
    assert ctx.token is None
    assert ctx.idempotency_key in keys


async def test_an_unreachable_ledger_means_not_run(tmp_path: Path) -> None:
    world = World()
    d = dispatcher(world, SQLiteLedger(tmp_path / "missing" / "l.db"))
    result = (await d.run(chat_round(d.specs, [("c1", "charge", {"v": "x"})]), session="s"))[0]
    assert result.is_error
    assert result.code is ErrorCode.LEDGER_UNAVAILABLE
    assert "ledger is unavailable" in result.content
    assert world.runs == []


class Flaky(MemoryLedger):
    """A memory ledger whose first ``down`` claims fail as an unreachable backend would."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    async def claim(self, key: LedgerKey, **kw: Any) -> Any:
        if self.down > 0:
            self.down -= 1
            raise LedgerError("connection refused")
        return await super().claim(key, **kw)


async def test_a_call_not_run_for_an_unavailable_ledger_runs_once_it_is_back() -> None:
    world = World()
    d = dispatcher(world, Flaky(down=1))
    round_ = chat_round(d.specs, [("c1", "charge", {"v": "x"})])
    [down] = await d.run(round_, session="s")
    assert down.code is ErrorCode.LEDGER_UNAVAILABLE
    assert world.runs == []
    [back] = await d.run(round_, session="s")  # the same dispatcher: the id was not kept
    assert (back.is_error, back.content) == (False, "charge x")
    assert len(world.runs) == 1


@pytest.mark.parametrize(("name", "state"), [("charge", "failed"), ("put", None)])
async def test_cancelled_while_running(name: str, state: str | None) -> None:
    ledger, world = MemoryLedger(), World()
    world.hold.clear()
    d = dispatcher(world, ledger)
    task = asyncio.create_task(d.run(chat_round(d.specs, [("c1", name, {"v": "x"})]), session="s"))
    await world.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await ledger.get(LedgerKey(scope="s", call_id="c1"))
    assert record is not None
    if state is None:  # idempotent: released (lease ended), it may run again
        assert record.state == "started"
        assert record.lease_until == 0.0
    else:  # not idempotent: its cancelled, outcome-unknown result is final
        assert record is not None
        assert record.state == state
        assert record.result is not None
        # The code names the cause (this process's cancel); the text says what it means.
        assert record.result.code is ErrorCode.CANCELLED
        assert "outcome is unknown" in record.result.content


async def test_cancelled_before_start_releases_the_claim() -> None:
    ledger, world = MemoryLedger(), World()
    d = dispatcher(world, ledger, max_concurrency=1)
    world.hold.clear()
    round_ = chat_round(d.specs, [("c0", "put", {"v": "w"}), ("c1", "charge", {"v": "x"})])
    task = asyncio.create_task(d.run(round_, session="s"))
    await world.entered.wait()  # c0 holds the only slot; c1 is claimed and waiting
    await asyncio.sleep(0.02)
    assert await ledger.get(LedgerKey(scope="s", call_id="c1")) is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await ledger.get(LedgerKey(scope="s", call_id="c1"))
    assert record is not None
    assert (record.state, record.lease_until) == ("claimed", 0.0)  # released
    world.hold.set()
    again = await dispatcher(world, ledger).run(round_, session="s")  # at once: no lease wait
    assert [r.content for r in again] == ["put w", "charge x"]


@pytest.mark.parametrize(
    "kw",
    [{"ledger": object()}, {"ledger": MemoryLedger(), "lease_s": 0},
     {"ledger": MemoryLedger(), "poll_s": float("inf")}, {"ledger": MemoryLedger(), "worker": ""}],
)  # fmt: skip
def test_bad_ledger_options_are_config_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Dispatcher(World().tools(), **kw)


async def test_waiting_for_another_workers_run_is_bounded() -> None:
    ledger, world = MemoryLedger(), World()
    world.hold.clear()
    a = dispatcher(world, ledger, worker="a", default_timeout_s=None, lease_s=0.05)
    b = dispatcher(world, ledger, worker="b", default_timeout_s=0.1, lease_s=0.05)
    round_ = chat_round(a.specs, [("c1", "charge", {"v": "x"})])
    first = asyncio.create_task(a.run(round_, session="s"))
    await world.entered.wait()
    [waited] = await b.run(round_, session="s")  # 0.1 s + two leases, then it gives up
    assert waited.code is ErrorCode.TOOL_TIMEOUT
    assert "another worker" in waited.content
    assert len(world.runs) == 1
    assert not first.done()
    world.hold.set()
    assert (await first)[0].content == "charge x"


async def test_a_redis_ledger_that_is_down_means_not_run() -> None:

    world = World()
    d = dispatcher(world, open_ledger(f"redis://127.0.0.1:{free_port()}/0"))
    result = (await d.run(chat_round(d.specs, [("c1", "charge", {"v": "x"})]), session="s"))[0]
    assert result.is_error
    assert result.code is ErrorCode.LEDGER_UNAVAILABLE
    assert "ledger is unavailable" in result.content
    assert world.runs == []


# -- claim and start in one write when nothing is waited for ----------------------------------


class Writes:
    """A ledger that lists the writes made to it (``claim`` with its ``start`` flag); a
    claim that wins may be held at ``gate`` after it is stored."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.log: list[tuple[str, str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.claimed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, key: LedgerKey, **kw: Any) -> Any:
        self.log.append(("claim+start" if kw.get("start") else "claim", key.call_id))
        claim = await self.inner.claim(key, **kw)
        self.claimed.set()
        await self.gate.wait()
        return claim

    async def start(self, key: LedgerKey, token: int, **kw: Any) -> None:
        self.log.append(("start", key.call_id))
        await self.inner.start(key, token, **kw)

    async def finish(self, key: LedgerKey, token: int, result: Any, **kw: Any) -> None:
        self.log.append(("finish", key.call_id))
        await self.inner.finish(key, token, result, **kw)


async def test_a_call_with_nothing_to_wait_for_is_claimed_and_started_in_one_write() -> None:
    world, ledger = World(), Writes(MemoryLedger())
    d = dispatcher(world, ledger)
    round_ = chat_round(d.specs, [("c1", "charge", {"v": "x"}), ("c2", "put", {"v": "y"})])
    results = await d.run(round_, session="s")
    assert [r.content for r in results] == ["charge x", "put y"]
    assert sorted(ledger.log) == [
        ("claim+start", "c1"), ("claim+start", "c2"), ("finish", "c1"), ("finish", "c2")
    ]  # fmt: skip
    record = await ledger.get(LedgerKey(scope="s", call_id="c1"))
    assert record is not None
    assert record.state == "completed"


@pytest.mark.parametrize("busy", ["slot", "group"])
async def test_a_call_that_waits_is_claimed_then_started_after_its_wait(busy: str) -> None:
    world, ledger = World(), Writes(MemoryLedger())

    @tool(group="g")
    async def first(v: str) -> str:
        """Held at the world's gate."""
        world.entered.set()
        await world.hold.wait()
        return f"first {v}"

    @tool(group="g")
    async def second(v: str) -> str:
        """Returns at once."""
        return f"second {v}"

    kw = {"max_concurrency": 1} if busy == "slot" else {}
    d = Dispatcher([first, second], ledger=ledger, poll_s=0.01, **kw)
    world.hold.clear()
    round_ = chat_round(d.specs, [("c0", "first", {"v": "a"}), ("c1", "second", {"v": "b"})])
    task = asyncio.create_task(d.run(round_, session="s"))
    await world.entered.wait()  # c0 holds the slot (or the group): c1 waits, claimed only
    for _ in range(50):
        if ("claim", "c1") in ledger.log:
            break
        await asyncio.sleep(0.01)
    record = await ledger.get(LedgerKey(scope="s", call_id="c1"))
    assert record is not None
    assert record.state == "claimed"
    world.hold.set()
    assert [r.content for r in await task] == ["first a", "second b"]
    assert [w for w in ledger.log if w[1] == "c1"] == [
        ("claim", "c1"), ("start", "c1"), ("finish", "c1")
    ]  # fmt: skip
    assert ("claim+start", "c0") in ledger.log


async def test_a_call_cancelled_in_its_claim_and_start_write_is_released() -> None:
    world, ledger = World(), Writes(MemoryLedger())
    d = dispatcher(world, ledger)
    ledger.gate.clear()
    round_ = chat_round(d.specs, [("c1", "put", {"v": "x"})])
    task = asyncio.create_task(d.run(round_, session="s"))
    await ledger.claimed.wait()  # stored as started; the dispatcher has not seen it yet
    task.cancel()
    await asyncio.sleep(0)
    ledger.gate.set()  # the write in flight comes back: the won claim is given back
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await ledger.get(LedgerKey(scope="s", call_id="c1"))
    assert record is not None
    assert (record.state, record.lease_until) == ("started", 0.0)  # released, as a cancel
    assert world.runs == []  # between a claim and its start is (the tool never ran)
    again = await dispatcher(world, ledger).run(round_, session="s")  # idempotent: run again
    assert [r.content for r in again] == ["put x"]
