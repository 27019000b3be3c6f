"""The Ledger contract, the same tests on every backend (memory, SQLite, a real Redis):
claims, fencing tokens, take-over of stale claims, final results, release, settle_unknown,
persistence across reopen, open_ledger URLs and clear errors for bad input or a dead backend.

Time is passed in (``now``), so SQLite and memory leases are exercised without sleeping;
Redis judges liveness by its own clock, so its stale cases use a lease of 50 ms."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ledger_helpers import RedisServer, free_port
from toollatch import (
    ConfigError,
    ErrorCode,
    ToolResult,
    UsageError,
    open_audit,
    open_history,
    open_ledger,
)
from toollatch.ledger import (
    Found,
    LeaseLost,
    Ledger,
    LedgerError,
    LedgerKey,
    Won,
    default_ledger_url,
    digest_of,
)
from toollatch.ledger._base import MemoryLedger
from toollatch.ledger._redis import RedisLedger
from toollatch.ledger._sqlite import SQLiteLedger

KEY = LedgerKey(scope="run-1", call_id="call_1")
D1 = digest_of("write", {"a": 1})
OK = ToolResult(tool_call_id="call_1", name="write", content="done")
BAD = ToolResult(
    tool_call_id="call_1", name="write", content="tool_error: x", is_error=True,
    code=ErrorCode.TOOL_ERROR,
)  # fmt: skip


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    if request.param == "memory":
        made: Ledger = MemoryLedger()
    elif request.param == "sqlite":
        made = SQLiteLedger(tmp_path / "ledger.db")
    else:
        server = request.getfixturevalue("redis_server")
        made = open_ledger(server.url)
        await made._r.flushdb()  # type: ignore[attr-defined]
    yield made
    await made.aclose()


async def expire(ledger: Ledger, lease_s: float) -> float:
    """A ``now`` after a lease of ``lease_s`` taken at 0 ran out (Redis: really wait)."""
    if isinstance(ledger, RedisLedger):
        await asyncio.sleep(lease_s + 0.05)
    return 1000.0


async def test_first_claim_wins_then_others_find_it_live(ledger: Ledger) -> None:
    won = await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30)
    assert won == Won(token=1)
    found = await ledger.claim(KEY, digest=D1, worker="w2", now=1.0, lease_s=30)
    assert isinstance(found, Found)
    assert found.live
    assert (found.record.worker, found.record.state, found.record.token) == ("w1", "claimed", 1)


async def test_a_finished_call_is_found_with_its_result(ledger: Ledger) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30)
    await ledger.start(KEY, 1, now=0.1, lease_s=30)
    await ledger.finish(KEY, 1, OK, now=0.2)
    later = await expire(ledger, 0.0)
    found = await ledger.claim(
        KEY, digest=D1, worker="w2", now=later, lease_s=30, rerun_started=True
    )
    assert isinstance(found, Found)
    assert not found.live
    assert (found.record.state, found.record.result) == ("completed", OK)


async def test_an_error_result_is_failed_and_keeps_its_code(ledger: Ledger) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30)
    await ledger.finish(KEY, 1, BAD, now=0.2)
    record = await ledger.get(KEY)
    assert record is not None
    assert record.state == "failed"
    assert record.result == BAD


async def test_other_arguments_are_found_with_the_first_digest(ledger: Ledger) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=0.05)
    later = await expire(ledger, 0.05)
    other = digest_of("write", {"a": 2})
    found = await ledger.claim(KEY, digest=other, worker="w2", now=later, lease_s=30)
    assert isinstance(found, Found)
    assert found.record.digest == D1


async def test_a_stale_claim_is_taken_over_and_the_old_token_is_fenced(ledger: Ledger) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=0.05)
    later = await expire(ledger, 0.05)
    won = await ledger.claim(KEY, digest=D1, worker="w2", now=later, lease_s=30)
    assert isinstance(won, Won)
    assert won.token == 2
    assert won.previous is not None
    assert won.previous.worker == "w1"
    for write in (
        ledger.start(KEY, 1, now=later, lease_s=30),
        ledger.renew(KEY, 1, now=later, lease_s=30),
        ledger.finish(KEY, 1, OK, now=later),
    ):
        with pytest.raises(LeaseLost):
            await write
    await ledger.finish(KEY, 2, OK, now=later)
    with pytest.raises(LeaseLost):  # final: even the holder cannot write again
        await ledger.finish(KEY, 2, BAD, now=later)
    record = await ledger.get(KEY)
    assert record is not None
    assert record.result == OK
    assert record.worker == "w2"


async def test_a_stale_started_call_is_taken_only_for_a_rerun(ledger: Ledger) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=0.05)
    await ledger.start(KEY, 1, now=0.0, lease_s=0.05)
    later = await expire(ledger, 0.05)
    found = await ledger.claim(KEY, digest=D1, worker="w2", now=later, lease_s=30)
    assert isinstance(found, Found)
    assert not found.live
    assert found.record.state == "started"
    won = await ledger.claim(KEY, digest=D1, worker="w2", now=later, lease_s=30, rerun_started=True)
    assert isinstance(won, Won)
    assert won.token == 2
    assert won.previous is not None
    assert won.previous.state == "started"


async def test_settle_unknown_finishes_only_a_stale_record(ledger: Ledger) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30)
    await ledger.start(KEY, 1, now=0.0, lease_s=30)
    live = await ledger.settle_unknown(KEY, 1, BAD, now=1.0)
    assert live.state == "started"  # its lease still runs: unchanged
    await ledger.renew(KEY, 1, now=0.0, lease_s=0.05)
    later = await expire(ledger, 0.05)
    assert (await ledger.settle_unknown(KEY, 2, BAD, now=later)).state == "started"  # not its token
    settled = await ledger.settle_unknown(KEY, 1, BAD, now=later)
    assert (settled.state, settled.result) == ("failed", BAD)
    with pytest.raises(LeaseLost):
        await ledger.finish(KEY, 1, OK, now=later)  # the dead worker's late write is refused


async def test_release_ends_the_lease_of_an_unfinished_claim_of_that_token(
    ledger: Ledger,
) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30)
    await ledger.release(KEY, 7)  # not its token: still live
    found = await ledger.claim(KEY, digest=D1, worker="w2", now=1.0, lease_s=30)
    assert isinstance(found, Found)
    assert found.live
    await ledger.release(KEY, 1)
    won = await ledger.claim(KEY, digest=D1, worker="w2", now=1.0, lease_s=30)
    assert isinstance(won, Won)
    assert won.token == 2  # never 1 again: the old holder's token stays fenced off
    with pytest.raises(LeaseLost):
        await ledger.start(KEY, 1, now=1.0, lease_s=30)
    await ledger.start(KEY, 2, now=1.0, lease_s=30)
    await ledger.release(KEY, 2)  # a started call: taken over only for a re-run
    found = await ledger.claim(KEY, digest=D1, worker="w3", now=1.0, lease_s=30)
    assert isinstance(found, Found)
    assert not found.live
    rerun = await ledger.claim(KEY, digest=D1, worker="w3", now=1.0, lease_s=30, rerun_started=True)
    assert rerun == Won(token=3, previous=rerun.previous)  # type: ignore[union-attr]
    await ledger.finish(KEY, 3, OK, now=1.0)
    await ledger.release(KEY, 3)
    record = await ledger.get(KEY)
    assert record is not None
    assert record.state == "completed"  # a final record is never released


async def test_scopes_never_meet(ledger: Ledger) -> None:
    await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30)
    other = LedgerKey(scope="run-2", call_id="call_1")
    assert await ledger.claim(other, digest=D1, worker="w1", now=0.0, lease_s=30) == Won(token=1)
    tricky = LedgerKey(scope="run-1}:x", call_id="call_1")  # braces and colons in a scope
    assert await ledger.claim(tricky, digest=D1, worker="w1", now=0.0, lease_s=30) == Won(token=1)


async def test_bad_lease_is_a_usage_error(ledger: Ledger) -> None:
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(UsageError):
            await ledger.claim(KEY, digest=D1, worker="w", now=0.0, lease_s=bad)


def test_call_key_refuses_empty_or_non_str() -> None:
    with pytest.raises(UsageError):
        LedgerKey(scope="", call_id="x")
    with pytest.raises(UsageError):
        LedgerKey(scope="s", call_id=1)  # type: ignore[arg-type]


def test_digest_is_canonical() -> None:
    assert digest_of("t", {"a": 1, "b": [1, 2]}) == digest_of("t", {"b": [1, 2], "a": 1})
    assert digest_of("t", {"a": 1}) != digest_of("u", {"a": 1})


async def test_sqlite_records_survive_reopen(tmp_path: Path) -> None:
    first = open_ledger(f"sqlite:///{tmp_path}/l.db")
    await first.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30)
    await first.finish(KEY, 1, BAD, now=1.0)
    await first.aclose()
    second = SQLiteLedger(tmp_path / "l.db")
    record = await second.get(KEY)
    assert record is not None
    assert record.result == BAD
    assert record.result.code is ErrorCode.TOOL_ERROR
    assert await second.purge(finished_before=0.5) == 0
    assert await second.purge(finished_before=2.0) == 1
    await second.aclose()
    with pytest.raises(LedgerError, match="closed"):
        await second.get(KEY)


async def test_sqlite_unwritable_path_is_a_ledger_error(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "missing" / "l.db")
    with pytest.raises(LedgerError, match="unable to open"):
        await ledger.get(KEY)
    await ledger.aclose()


async def test_redis_down_is_a_ledger_error() -> None:

    ledger = open_ledger(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(LedgerError, match="Redis ledger"):
        await ledger.claim(KEY, digest=D1, worker="w", now=0.0, lease_s=1)
    with pytest.raises(LedgerError):
        await ledger.get(KEY)
    await ledger.aclose()


@pytest.mark.parametrize(
    "url",
    ["mysql://x", "sqlite://", "sqlite:///", "sqlite://host/x.db", "", "redis://h:notaport/0", 5],
)
def test_open_ledger_refuses_bad_urls(url: object) -> None:
    with pytest.raises(ConfigError):
        open_ledger(url)  # type: ignore[arg-type]


def test_open_ledger_kinds(tmp_path: Path) -> None:
    assert isinstance(open_ledger("memory:"), MemoryLedger)
    sqlite = open_ledger(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(sqlite, SQLiteLedger)
    assert sqlite.path == tmp_path / "x.db"
    assert isinstance(open_ledger("redis://127.0.0.1:1/3"), RedisLedger)
    assert isinstance(open_ledger("memory:"), Ledger)
    relative = open_ledger("sqlite:///ledger.db")
    assert isinstance(relative, SQLiteLedger)
    assert relative.path == Path.cwd() / "ledger.db"  # (the working folder's, made absolute)


async def test_sqlite_urls_follow_sqlalchemys_rule(tmp_path, monkeypatch):
    # https://docs.sqlalchemy.org/en/20/core/engines.html#sqlite: three slashes and the
    # path is relative, four and it is absolute
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    cases = {
        "sqlite:///rel.db": tmp_path / "rel.db",
        "sqlite:///sub/rel.db": tmp_path / "sub" / "rel.db",
        f"sqlite:///{tmp_path}/abs.db": tmp_path / "abs.db",  # (tmp_path starts with /)
        f"sqlite:////{str(tmp_path).lstrip('/')}/abs2.db": tmp_path / "abs2.db",
        "sqlite:///sp%20ace.db": tmp_path / "sp ace.db",
    }
    for url, path in cases.items():
        assert open_ledger(url).path == path, url  # type: ignore[attr-defined]
        assert open_history(url).path == path, url  # type: ignore[attr-defined]
        assert open_audit(url).path == path, url  # type: ignore[attr-defined]
    # relative to the working folder of the open, not of the first write
    ledger = open_ledger("sqlite:///rel.db")
    monkeypatch.chdir(tmp_path / "sub")
    assert await ledger.get(KEY) is None
    await ledger.aclose()
    assert (tmp_path / "rel.db").is_file()
    assert not (tmp_path / "sub" / "rel.db").exists()


@pytest.mark.parametrize("opener", [open_ledger, open_history, open_audit])
def test_a_relative_path_meant_absolute_is_refused_with_the_url_to_write(
    opener, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # (no "dev" folder here; / has one)
    with pytest.raises(ConfigError, match=r"relative path 'dev/null'.*'sqlite:////dev/null'"):
        opener("sqlite:///dev/null")


@pytest.mark.parametrize("url", ["sqlite:///x.db?mode=ro", "sqlite:///x.db#f", "sqlite:///x.db?"])
def test_a_sqlite_url_with_options_is_refused(url):
    with pytest.raises(ConfigError, match=r"no \?options"):
        open_ledger(url)


async def test_the_default_ledger_is_sqlite_in_the_users_data_folder(tmp_path: Path) -> None:
    url = default_ledger_url({"XDG_DATA_HOME": str(tmp_path / "data")})
    assert url == f"sqlite:///{tmp_path}/data/toollatch/ledger.db"
    assert (
        default_ledger_url({"HOME": "/home/u"})
        == "sqlite:////home/u/.local/share/toollatch/ledger.db"
    )
    ledger = open_ledger(url, create_folder=True)
    assert await ledger.get(KEY) is None
    assert (tmp_path / "data" / "toollatch" / "ledger.db").is_file()
    await ledger.aclose()


async def test_redis_records_expire_after_their_retention(redis_server: RedisServer) -> None:

    client = aioredis.Redis.from_url(redis_server.url)
    ledger = RedisLedger(client, retention_s=0.2)
    await ledger.claim(KEY, digest=D1, worker="w", now=0.0, lease_s=30)
    assert await ledger.get(KEY) is not None
    await asyncio.sleep(0.4)
    assert await ledger.get(KEY) is None  # an abandoned claim does not stay forever
    await ledger.claim(KEY, digest=D1, worker="w", now=0.0, lease_s=30)
    await ledger.finish(KEY, 1, OK, now=0.0)
    await asyncio.sleep(0.4)
    assert await ledger.get(KEY) is None
    await ledger.aclose()
    with pytest.raises(ConfigError):
        RedisLedger(aioredis.Redis(), retention_s=-1)


async def test_a_claim_made_started_is_claim_then_start_in_one_write(ledger: Ledger) -> None:
    won = await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30, start=True)
    assert won == Won(token=1)
    record = await ledger.get(KEY)
    assert record is not None
    assert (record.state, record.token, record.lease_until) == ("started", 1, 30.0)
    with pytest.raises(LeaseLost):  # already started: a second start is refused
        await ledger.start(KEY, 1, now=0.0, lease_s=30)
    found = await ledger.claim(KEY, digest=D1, worker="w2", now=1.0, lease_s=30)
    assert isinstance(found, Found)
    assert found.live
    # a stale one: started, so taken over only for a rerun, then (start=True) started again
    other = LedgerKey(scope="run-1", call_id="call_2")
    await ledger.claim(other, digest=D1, worker="w1", now=0.0, lease_s=0.05, start=True)
    later = await expire(ledger, 0.05)
    found = await ledger.claim(other, digest=D1, worker="w2", now=later, lease_s=30)
    assert isinstance(found, Found)
    assert not found.live
    won = await ledger.claim(
        other, digest=D1, worker="w2", now=later, lease_s=30, rerun_started=True, start=True
    )
    assert isinstance(won, Won)
    assert won.token == 2
    assert won.previous is not None
    assert won.previous.state == "started"
    record = await ledger.get(other)
    assert record is not None
    assert (record.state, record.worker) == ("started", "w2")
    await ledger.finish(other, 2, OK, now=later)


async def test_sqlite_claims_and_starts_in_one_trip_to_its_thread(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.db")
    trips = 0
    call = ledger._file.call

    async def counted(fn):  # type: ignore[no-untyped-def]
        nonlocal trips
        trips += 1
        return await call(fn)

    ledger._file.call = counted  # type: ignore[method-assign]
    won = await ledger.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=30, start=True)
    assert isinstance(won, Won)
    assert trips == 1
    record = await ledger.get(KEY)
    assert record is not None
    assert record.state == "started"
    await ledger.aclose()


async def test_a_redis_claim_decided_on_a_record_that_changed_is_decided_again(
    redis_server: RedisServer,
) -> None:
    # The holder finishes between the taker's read and its write: the write must not land
    # (the record is completed), the taker reads again and finds the result.
    holder = open_ledger(redis_server.url)
    taker = open_ledger(redis_server.url)
    assert isinstance(taker, RedisLedger)
    await holder._r.flushdb()  # type: ignore[attr-defined]
    await holder.claim(KEY, digest=D1, worker="w1", now=0.0, lease_s=0.05)
    await holder.start(KEY, 1, now=0.0, lease_s=0.05)
    later = await expire(taker, 0.05)
    read = taker._read
    reads = 0

    async def racing(**kw):  # type: ignore[no-untyped-def]
        nonlocal reads
        reads += 1
        got = await read(**kw)
        if reads == 1:
            await holder.finish(KEY, 1, OK, now=later)  # (a late finish still holds token 1)
        return got

    taker._read = racing  # type: ignore[assignment]
    claim = await taker.claim(
        KEY, digest=D1, worker="w2", now=later, lease_s=30, rerun_started=True
    )
    assert reads == 2
    assert isinstance(claim, Found)
    assert claim.record.state == "completed"
    assert claim.record.result == OK
    record = await taker.get(KEY)
    assert record is not None
    assert (record.state, record.token, record.worker) == ("completed", 1, "w1")
    await holder.aclose()
    await taker.aclose()
