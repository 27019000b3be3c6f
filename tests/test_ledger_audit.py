"""The opt-in audit of calls that did not commit: redacted as the previews are (never more),
bounded, expiring (deleted on write and by prune), kept apart from the ledger's calls and the
histories; the same store contract on memory, SQLite and a real redis-server; the dispatcher
records a round's uncommitted calls on finish and abort, and a store that fails changes
nothing for the tools; the config file's ledger section."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_helpers import RedisServer
from toollatch import (
    ConfigError,
    ErrorCode,
    PreviewPolicy,
    Round,
    StreamParser,
    ToolPreview,
    ToolSpec,
    open_audit,
    open_history,
    open_ledger,
    tool,
)
from toollatch.cli._app_config import validate
from toollatch.ledger import (
    ArgumentAudit,
    AuditPolicy,
    AuditRecord,
    AuditStore,
    LedgerError,
    LedgerKey,
    audit_record,
)
from toollatch.ledger._audit import MemoryAudit
from toollatch.ledger._audit_redis import RedisAudit
from toollatch.ledger._audit_sqlite import SQLiteAudit
from toollatch.ledger._sqlite import SQLiteLedger
from toollatch.runtime import Dispatcher

SECRET = "sk-live-0123456789"


def raw_round(calls: Sequence[tuple[str, str, str]], *, finish: str | None = "tool_calls") -> Round:
    """An OpenAI chat round of ``calls`` (id, name, raw argument text); ``finish=None``
    ends the stream without a finish reason (the calls are cut off)."""
    specs = [ToolSpec(name=n, parameters={"type": "object"}) for n in ("write", "charge")]
    parser = StreamParser("openai_chat", tools=specs)
    for i, (call_id, name, text) in enumerate(calls):
        delta = {"index": i, "id": call_id, "function": {"name": name, "arguments": text}}
        parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    if finish is not None:
        parser.feed_event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return parser.finish()


def only_call(round_: Round, *, policy: AuditPolicy, now: float = 100.0) -> AuditRecord:
    [call] = [c for c in round_.calls if c.committed is None]
    return audit_record(call, scope="s", policy=policy, now=now)


# -- redaction ---------------------------------------------------------------------------


def test_the_default_policy_keeps_no_argument_text() -> None:
    text = f'{{"path": "a.txt", "token": "{SECRET}"'  # cut: never closed
    record = only_call(raw_round([("c1", "write", text)], finish="length"), policy=AuditPolicy())
    assert record.shown == ""
    assert (record.call_id, record.name, record.code) == ("c1", "write", "truncated")
    assert record.argument_bytes == len(text.encode())
    assert record.expires_at == 100.0 + 86400.0
    assert SECRET not in record.to_json()


def test_fields_mode_keeps_only_the_allowed_fields() -> None:
    previews = PreviewPolicy(tools={"write": ToolPreview(mode="fields", fields=("/path",))})
    text = f'{{"path": "a.txt", "token": "{SECRET}", "n": 1 oops'
    record = only_call(raw_round([("c1", "write", text)]), policy=AuditPolicy(previews=previews))
    assert record.code == "invalid_json"
    assert json.loads(record.shown) == {"path": "a.txt"}
    assert "token" not in record.shown
    assert record.parse_error is not None
    assert "byte" in record.parse_error


def test_the_redactor_masks_and_an_unfinished_string_is_never_shown() -> None:
    def redactor(pointer: str, text: str) -> str:
        return "[masked]" if pointer == "/token" else text

    previews = PreviewPolicy(default=ToolPreview(mode="full"), redactor=redactor)
    policy = AuditPolicy(previews=previews)
    text = f'{{"path": "a.txt", "token": "{SECRET}", "note": "half a sec'
    record = only_call(raw_round([("c1", "write", text)], finish=None), policy=policy)
    assert json.loads(record.shown) == {"path": "a.txt", "token": "[masked]"}
    assert "half" not in record.shown  # held until complete, and it never completed
    assert record.code == "stream_interrupted"


def test_text_past_a_syntax_error_is_never_kept() -> None:
    previews = PreviewPolicy(default=ToolPreview(mode="full"))
    text = f'{{"path": "a.txt"}} {SECRET}'
    record = only_call(raw_round([("c1", "write", text)]), policy=AuditPolicy(previews=previews))
    assert record.code == "invalid_json"
    assert json.loads(record.shown) == {"path": "a.txt"}
    assert SECRET not in record.to_json()


def test_the_kept_view_is_cut_at_max_bytes_on_a_character_boundary() -> None:
    previews = PreviewPolicy(default=ToolPreview(mode="full"))
    text = '{"note": "' + "é" * 200 + '"} x'
    policy = AuditPolicy(previews=previews, max_bytes=51)
    record = only_call(raw_round([("c1", "write", text)]), policy=policy)
    assert record.truncated
    assert len(record.shown.encode()) <= 51
    assert record.shown.startswith('{"note":"éé')
    whole = only_call(raw_round([("c1", "write", text)]), policy=AuditPolicy(previews=previews))
    assert not whole.truncated
    assert whole.shown == '{"note":"' + "é" * 200 + '"}'


@pytest.mark.parametrize(
    "kw",
    [{"max_bytes": -1}, {"max_bytes": True}, {"retention_s": 0}, {"retention_s": float("inf")},
     {"max_per_scope": 0}, {"previews": "full"}, {"max_depth": 0}],
)  # fmt: skip
def test_bad_audit_policies_are_config_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        AuditPolicy(**kw)


# -- the store contract on every backend -------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory:"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
async def store(url: str, request: pytest.FixtureRequest) -> AsyncIterator[AuditStore]:
    made = open_audit(url)
    if url.startswith("redis"):
        await made._r.flushdb()  # type: ignore[attr-defined]  # (one server for the module)
    yield made
    await made.aclose()


def rec(scope: str, call_id: str, at: float, *, retention: float = 10.0) -> AuditRecord:
    return AuditRecord(
        scope=scope, call_id=call_id, name="write", code="invalid_json", detail="d",
        argument_bytes=3, shown='{"a":1}', truncated=False, parse_error=None,
        recorded_at=at, expires_at=at + retention,
    )  # fmt: skip


async def test_records_are_kept_per_scope_in_order(store: AuditStore) -> None:
    await store.add([rec("s", "c1", 1.0), rec("t", "c9", 1.0)], max_per_scope=10)
    await store.add([rec("s", "c2", 2.0), rec("s", "c2", 2.0)], max_per_scope=10)
    assert [r.call_id for r in await store.records("s", now=3.0)] == ["c1", "c2", "c2"]
    assert await store.records("t", now=3.0) == [rec("t", "c9", 1.0)]
    assert await store.records("u", now=3.0) == []


async def test_expired_records_are_deleted_on_write(store: AuditStore) -> None:
    await store.add([rec("s", "old", 0.0), rec("t", "other", 0.0)], max_per_scope=10)
    await store.add([rec("s", "new", 20.0)], max_per_scope=10)  # both old ones expired at 10
    # Read as of a time before they expired: gone, not merely filtered out.
    assert [r.call_id for r in await store.records("s", now=0.0)] == ["new"]
    if isinstance(store, RedisAudit):
        # Redis deletes on write in the scopes written (the others' keys expire on the
        # server's clock, which this test does not drive); prune takes the rest.
        assert await store.prune(20.0) == 1
    assert await store.records("t", now=0.0) == []


async def test_prune_deletes_what_expired(store: AuditStore) -> None:
    records = [rec("s", "a", 0.0, retention=5), rec("s", "b", 0.0, retention=50)]
    await store.add(records, max_per_scope=10)
    assert await store.prune(4.0) == 0
    assert await store.prune(6.0) == 1
    assert [r.call_id for r in await store.records("s", now=0.0)] == ["b"]
    assert await store.prune(60.0) == 1
    assert await store.records("s", now=0.0) == []


async def test_a_scope_keeps_its_newest_records(store: AuditStore) -> None:
    for i in range(5):
        await store.add([rec("s", f"c{i}", float(i))], max_per_scope=3)
    assert [r.call_id for r in await store.records("s", now=0.0)] == ["c2", "c3", "c4"]


# -- apart from the ledger and the history -----------------------------------------------


async def test_an_audit_record_is_never_a_call_a_result_or_a_history(url: str) -> None:
    audit = open_audit(url)
    if url.startswith("redis"):
        await audit._r.flushdb()  # type: ignore[attr-defined]
    ledger, history = open_ledger(url), open_history(url)
    try:
        await audit.add([rec("run-1", "c1", 1.0)], max_per_scope=10)
        key = LedgerKey(scope="run-1", call_id="c1")
        assert await ledger.get(key) is None
        won = await ledger.claim(key, digest="d", worker="w", now=1.0, lease_s=5)
        assert getattr(won, "token", None) == 1  # a first claim: nothing was there
        assert await history.load("run-1") == []
        assert len(await audit.records("run-1", now=1.0)) == 1
    finally:
        for closing in (audit, ledger, history):
            await closing.aclose()


def test_open_audit_refuses_other_urls() -> None:
    for bad in ("ftp://x", "sqlite:///", 3):
        with pytest.raises(ConfigError):
            open_audit(bad)  # type: ignore[arg-type]


# -- the dispatcher ----------------------------------------------------------------------


@tool
def write(path: str) -> str:
    """Write."""
    return f"wrote {path}"


@tool
def charge(n: int) -> str:
    """Charge."""
    return f"charged {n}"


async def test_the_dispatcher_records_the_uncommitted_calls_of_a_round() -> None:
    store = MemoryAudit()
    d = Dispatcher([write, charge], audit=ArgumentAudit(store, clock=lambda: 5.0))
    round_ = raw_round([("c1", "write", '{"path": "a"}'), ("c2", "charge", '{"n": 1,')])
    results = await d.run(round_, session="s")
    assert [(r.is_error, r.code) for r in results] == [
        (False, None),
        (True, ErrorCode.INVALID_JSON),
    ]
    [record] = await store.records("s", now=5.0)
    assert (record.call_id, record.code, record.recorded_at) == ("c2", "invalid_json", 5.0)
    plain = Dispatcher([write, charge])  # off by default: nothing anywhere to write to
    assert await plain.run(round_, session="s") == results


async def test_an_aborted_round_records_its_cut_calls() -> None:
    store = MemoryAudit()
    d = Dispatcher([write, charge], audit=ArgumentAudit(store))
    parser = StreamParser("openai_chat", tools=d.specs)
    delta = {"index": 0, "id": "c1", "function": {"name": "write", "arguments": '{"pa'}}
    parser.feed_event({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]})
    async with d.round("s") as r:
        results = await r.abort(parser.cancel())
    assert results[0].code is ErrorCode.CANCELLED
    [record] = await store.records("s", now=0.0)
    assert (record.call_id, record.code) == ("c1", "cancelled")


class Broken(MemoryAudit):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def add(self, records: Sequence[AuditRecord], *, max_per_scope: int) -> None:
        raise self.error


@pytest.mark.parametrize("error", [LedgerError("disk full"), TypeError("a bug")])
async def test_a_failing_audit_store_changes_nothing_for_the_tools(error: Exception) -> None:
    d = Dispatcher([write, charge], audit=ArgumentAudit(Broken(error)))
    round_ = raw_round([("c1", "write", '{"path": "a"}'), ("c2", "charge", "{")])
    results = await d.run(round_, session="s")
    assert results[0].content == "wrote a"
    assert results[1].code is ErrorCode.INVALID_JSON


def test_bad_audit_options_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        Dispatcher([write], audit=MemoryAudit())  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ArgumentAudit(object())  # type: ignore[arg-type]


# -- the config file ---------------------------------------------------------------------


def test_the_config_ledger_section() -> None:
    assert validate({}).audit_policy() is None  # off by default
    config = validate(
        {
            "ledger": {"url": "sqlite:///l.db", "audit_uncommitted": True, "audit_max_bytes": 64,
                       "audit_retention_s": 60, "audit_max_per_scope": 5},
            "previews": {"tools": {"write": {"mode": "fields", "fields": ["/path"]}}},
        }
    )  # fmt: skip
    policy = config.audit_policy()
    assert policy is not None
    assert (policy.max_bytes, policy.retention_s, policy.max_per_scope) == (64, 60.0, 5)
    assert policy.previews.rule("write").fields == ("/path",)  # redacted as the previews
    off = validate({"ledger": {"audit_uncommitted": True},
                    "agent_stream_assemble": {"ui_forward_partial_args": False}})  # fmt: skip
    off_policy = off.audit_policy()
    assert off_policy is not None
    assert off_policy.previews == PreviewPolicy()  # previews off: no text at all
    for bad in ({"url": "ftp://x"}, {"audit_max_bytes": -1}, {"audit_retention_s": 0}):
        with pytest.raises(ConfigError, match="ledger"):
            validate({"ledger": bad})


async def test_sqlite_audit_shares_the_ledger_file(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger, audit = SQLiteLedger(path), SQLiteAudit(path)
    await asyncio.gather(
        audit.add([rec("s", "c1", 1.0)], max_per_scope=10),
        ledger.claim(LedgerKey(scope="s", call_id="c2"), digest="d", worker="w", now=1, lease_s=5),
    )
    assert [r.call_id for r in await audit.records("s", now=1.0)] == ["c1"]
    assert await ledger.get(LedgerKey(scope="s", call_id="c1")) is None
    await ledger.aclose()
    await audit.aclose()


async def test_a_redis_scope_key_expires_on_the_server_with_its_newest_record(
    redis_server: RedisServer,
) -> None:
    audit = open_audit(redis_server.url)
    assert isinstance(audit, RedisAudit)
    now = time.time()
    await audit.add([rec("gone", "c1", now, retention=0.3)], max_per_scope=10)
    assert await audit._r.exists("toollatch:audit:{gone}") == 1
    await asyncio.sleep(0.6)
    assert await audit._r.exists("toollatch:audit:{gone}") == 0  # never written again: gone
    await audit.aclose()


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    _nested,
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=5), _json, max_size=4), cut=st.integers(0, 400))
def test_the_full_view_is_the_text_parsed_so_far(doc: dict[str, Any], cut: int) -> None:
    previews = PreviewPolicy(default=ToolPreview(mode="full"))
    whole = json.dumps(doc)
    record = only_call(
        raw_round([("c1", "write", whole + " garbage")]),
        policy=AuditPolicy(previews=previews, max_bytes=1 << 20),
    )
    assert json.loads(record.shown) == doc  # every complete value, nothing past the error
    text = whole[:cut]
    if not text:
        return
    cut_record = only_call(
        raw_round([("c1", "write", text)], finish="length"),
        policy=AuditPolicy(previews=previews, max_bytes=1 << 20),
    )
    if cut_record.shown:
        json.loads(cut_record.shown)  # always valid JSON, whatever the cut
        assert len(cut_record.shown) <= len(json.dumps(doc, separators=(",", ":"))) + 2


class Slow(MemoryAudit):
    async def add(self, records: Sequence[AuditRecord], *, max_per_scope: int) -> None:
        await asyncio.sleep(0.2)
        await super().add(records, max_per_scope=max_per_scope)


async def test_a_round_torn_down_meanwhile_still_gets_its_records_and_its_cancel() -> None:
    store = Slow()
    d = Dispatcher([write, charge], audit=ArgumentAudit(store))
    round_ = raw_round([("c1", "charge", "{")])
    task = asyncio.create_task(d.run(round_, session="s"))
    await asyncio.sleep(0.05)  # the write has begun; the block waits for it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # the cancel is not swallowed
    await asyncio.sleep(0.3)
    assert [r.call_id for r in await store.records("s", now=0.0)] == ["c1"]
