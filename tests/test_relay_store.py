"""Several relay workers on one Redis (``RelayServer(store="redis://...")``, a real
redis-server on loopback): a run started on one worker is read, resumed and cancelled on the
others, with the same ids and bytes; a worker that sees no such run answers 404; Redis
unreachable at start is a clear error; Redis lost mid-run ends every reader, bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger_helpers import RedisServer, free_port
from relay_helpers import (
    CLI,
    chatty_script,
    parse_sse,
    served_run,
    serving,
    slow_script,
    start_run,
)
from test_agui import agui_body, agui_events
from toollatch import ConfigError
from toollatch.cli import build_parser
from toollatch.cli._app_config import load_config
from toollatch.relay import RelayServer
from toollatch.relay._config import RelayLimits

SCRIPTS = {
    "slow": slow_script(delay_ms=30.0),
    "brisk": slow_script(delay_ms=5.0),
    "steady": slow_script(delay_ms=60.0),
    "slower": slow_script(delay_ms=150.0),
    "chatty": chatty_script(3000, chunk_chars=4),
}
"""Runs of about 0.5 s, 3 s, 6 s and 15 s (text, previews, two calls and their results, a
2nd round), and one of 750 text events at once. The window tests (a run's end read before
its owner closed it) take the 0.5 s one: their window is late_redis's, not the pace's."""


@contextlib.asynccontextmanager
async def workers(
    url: str, n: int = 3, ledger_url: str | None = None, **options: Any
) -> AsyncIterator[list[RelayServer]]:
    """``n`` relays (port 0 each) sharing the run store ``url`` (and ``ledger_url``)."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                RelayServer(
                    scripts=SCRIPTS, delay_scale=1.0, store=url, ledger=ledger_url, **options
                )
            )
            for _ in range(n)
        ]
        yield servers


@pytest.fixture
async def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None:  # (a test before stopped it)
        redis_server.start()
    return redis_server.url


def client_of(server: RelayServer, session: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, timeout=30, headers={"x-toollatch-session": session}
    )


async def raw_events(
    client: httpx.AsyncClient,
    url: str,
    *,
    last_id: int | None = None,
    limit: int | None = None,
    opened: asyncio.Event | None = None,
) -> list[str]:
    """The SSE frames of one GET as sent (``id:``/``event:``/``data:`` blocks), until the
    run ends or ``limit`` frames came (``opened`` is set once the answer is 200)."""
    headers = {} if last_id is None else {"last-event-id": str(last_id)}
    blocks: list[str] = []
    buffer = ""
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, (response.status_code, await response.aread())
        if opened is not None:
            opened.set()
        async for text in response.aiter_text():
            buffer += text
            *done, buffer = buffer.split("\n\n")
            blocks += [b for b in done if b.startswith("id: ")]
            if limit is not None and len(blocks) >= limit:
                return blocks[:limit]
    return blocks


def ids(blocks: list[str]) -> list[int]:
    return [int(b.split("\n", 1)[0][4:]) for b in blocks]


async def test_a_run_started_on_one_worker_is_read_on_another_and_cancelled_through_a_third(
    redis_url: str,
) -> None:
    session = secrets.token_urlsafe(32)
    async with workers(redis_url) as (a, b, c):
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            async with client_of(c, session) as on_c:
                run = await start_run(on_a, model="slow")
                head = await raw_events(on_a, run["events_url"], limit=10)
                assert ids(head) == list(range(1, 11))
                # B reads from the middle (Last-Event-ID), while the run goes on on A
                tail_b = asyncio.create_task(raw_events(on_b, run["events_url"], last_id=10))
                more = await raw_events(on_b, run["events_url"], last_id=10, limit=5)
                assert ids(more) == list(range(11, 16))
                answer = await on_c.post(run["cancel_url"], json={})
                assert answer.status_code == 202
                assert answer.json() == {"id": run["id"], "cancelled": True}
                tail = await asyncio.wait_for(tail_b, 30)
                whole_a = await raw_events(on_a, run["events_url"])
                whole_c = await raw_events(on_c, run["events_url"])
    assert whole_a == whole_c  # the same ids and the same bytes on every worker
    assert whole_a[:10] == head and tail == whole_a[10:]  # nothing lost, nothing twice
    assert ids(whole_a) == list(range(1, len(whole_a) + 1))
    frames, _ = parse_sse("\n\n".join(whole_a) + "\n\n")
    assert frames[-1].event == "run_ended" and frames[-1].data["cancelled"] is True
    # every call that was committed got its result (the cancel pairs them)
    committed = {f.data["id"] for f in frames if f.event == "call_committed"}
    finished = {f.data["id"] for f in frames if f.event == "tool_finished"}
    assert committed <= finished


async def test_a_finished_run_reads_the_same_everywhere_and_204_at_its_end(redis_url: str) -> None:
    session = secrets.token_urlsafe(32)
    async with workers(redis_url, 2) as (a, b):
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            run = await start_run(on_a, model="slow")
            whole_b = await raw_events(on_b, run["events_url"])  # live, from the start on B
            whole_a = await raw_events(on_a, run["events_url"])
            assert whole_a == whole_b
            last = ids(whole_a)[-1]
            done = await on_b.get(run["events_url"], headers={"last-event-id": str(last)})
            assert done.status_code == 204
            future = await on_b.get(run["events_url"], headers={"last-event-id": str(last + 1)})
            assert future.status_code == 400
            late = await on_b.post(run["cancel_url"], json={})
            assert late.json() == {"id": run["id"], "cancelled": False}


async def test_a_worker_that_sees_no_such_run_answers_404(redis_url: str) -> None:
    session, stranger = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    async with workers(redis_url, 2) as (a, b):
        async with client_of(a, session) as on_a, client_of(b, stranger) as other_on_b:
            run = await start_run(on_a, model="slow")
            assert (await other_on_b.get(run["events_url"])).status_code == 404
            assert (await other_on_b.post(run["cancel_url"], json={})).status_code == 404
            unknown = "x" * 24
            assert (await other_on_b.get(f"/runs/{unknown}/events")).status_code == 404
            assert (await on_a.post(run["cancel_url"], json={})).status_code == 202


def chat_body(chat: str, text: str, **extra: Any) -> dict[str, Any]:
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat, "messages": [user], "trigger": "submit-message", **extra}


async def test_the_ai_sdk_stream_resumes_on_another_worker(redis_url: str) -> None:
    session = secrets.token_urlsafe(32)
    async with workers(redis_url, 2) as (a, b):
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            body = chat_body("c1", "hi", model="slow")
            async with on_a.stream("POST", "/api/chat", json=body) as first:
                assert first.status_code == 200
                run_id = first.headers["x-toollatch-run-id"]
                async for _ in first.aiter_bytes():
                    break  # the connection drops
            resumed = await on_b.get("/api/chat/c1/stream")  # to the run's end
            assert resumed.status_code == 200
            assert resumed.headers["x-toollatch-run-id"] == run_id
            again = await on_a.get("/api/chat/c1/stream")
            assert again.status_code == 204  # ended: nothing to resume
            whole = await on_a.get(f"/runs/{run_id}/events")
    chunks = [json.loads(line[6:]) for line in resumed.text.split("\n") if line[:7] == "data: {"]
    assert chunks[0] == {"type": "start", "messageId": f"msg-{run_id}"}
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}
    assert resumed.text.endswith("data: [DONE]\n\n")
    frames, _ = parse_sse(whole.text)
    committed = [f.data["id"] for f in frames if f.event == "call_committed"]
    available = [c["toolCallId"] for c in chunks if c["type"] == "tool-input-available"]
    assert available == committed and len(committed) == 2


async def test_an_agui_run_is_posted_again_on_another_worker(redis_url: str) -> None:
    session = secrets.token_urlsafe(32)
    async with workers(redis_url, 2) as (a, b):
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            first = await on_a.post("/agui", json=agui_body("t", "r", model="slow"))
            assert first.status_code == 200
            events = agui_events(first.text)
            again = await on_b.post("/agui", json=agui_body("t", "r", model="slow"))
            assert again.headers["x-toollatch-run"] == first.headers["x-toollatch-run"]
            assert agui_events(again.text) == events  # read again, not run again
            numbered = [n for n, _ in events if n is not None]
            middle = numbered[len(numbered) // 2]
            resumed = await on_b.post(
                "/agui",
                json=agui_body("t", "r", model="slow"),
                headers={"last-event-id": str(middle)},
            )
            assert resumed.status_code == 200
    tail = agui_events(resumed.text)
    cut = max(i for i, (n, _) in enumerate(events) if n == middle)
    assert tail[0][1]["type"] == "RUN_STARTED"
    assert tail[len(tail) - (len(events) - cut - 1) :] == events[cut + 1 :]


async def test_redis_unreachable_at_start_is_a_clear_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(ConfigError, match="cannot reach Redis"):
        async with RelayServer(scripts=SCRIPTS, store=url, ledger=None):
            pass


def test_workers_sharing_a_store_cannot_each_make_their_own_token() -> None:
    with pytest.raises(ConfigError, match="share one access token"):
        RelayServer(store="redis://127.0.0.1:6379/0", token="auto")
    with pytest.raises(ConfigError, match="memory: or redis://"):
        RelayServer(store="postgres://x")


async def test_redis_lost_mid_run_ends_every_reader_and_the_run(
    redis_server: RedisServer, redis_url: str
) -> None:
    session = secrets.token_urlsafe(32)
    try:
        async with workers(redis_url, 2, store_outage_s=1.0) as (a, b):
            async with client_of(a, session) as on_a, client_of(b, session) as on_b:
                run = await start_run(on_a, model="slower")
                reader_a = asyncio.create_task(raw_events(on_a, run["events_url"]))
                reader_b = asyncio.create_task(raw_events(on_b, run["events_url"]))
                await raw_events(on_b, run["events_url"], limit=5)  # the run is under way
                redis_server.stop()
                # bounded: B's reader ends with an error, A's run ends, cancelled
                async with asyncio.timeout(30):
                    seen_b = await reader_b
                    seen_a = await reader_a
                frames_a, _ = parse_sse("\n\n".join(seen_a) + "\n\n")
                assert ids(seen_a) == list(range(1, len(seen_a) + 1))
                assert frames_a[-1].event == "run_ended"
                # the owner gave the run up after store_outage_s: cancelled, every call paired
                assert frames_a[-1].data["cancelled"] is True
                assert "run store (Redis) is unreachable" in frames_a[-1].data["error"]
                assert seen_b == seen_a[: len(seen_b)]  # what B got was exact, then it ended
                answer = await on_b.get(run["events_url"])
                assert answer.status_code == 503
                assert answer.json()["error"]["code"] == "store_unavailable"
                # Redis back: the owner writes the rest late, B's reader resumes to the end
                await asyncio.to_thread(redis_server.start)
                async with asyncio.timeout(30):
                    rest = await raw_events(on_b, run["events_url"], last_id=ids(seen_b)[-1])
                assert seen_b + rest == seen_a
    finally:
        if redis_server.proc is None:
            redis_server.start()


def test_toollatch_serve_store_shares_runs_between_two_processes(redis_url: str) -> None:
    with serving("--store", redis_url, "--ledger", "none") as first:
        with serving("--ledger", "none", "--store", redis_url) as second:
            run, frames = served_run(first, "weather in Oslo?")
            headers = {"x-toollatch-session": run["session"]}
            with httpx.Client(base_url=second, timeout=60, headers=headers) as client:
                again = client.get(run["events_url"], headers={"last-event-id": "2"})
    assert again.status_code == 200
    elsewhere, _ = parse_sse(again.text)
    assert elsewhere == frames[2:] and frames[-1].event == "run_ended"


def test_toollatch_serve_with_redis_unreachable_exits_2_naming_it() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--ledger", "none", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"run store {url}: cannot reach Redis: Error 111" in done.stderr
    flags = build_parser().parse_args(["serve", "--store-ttl", "60", "--store-outage", "2"])
    assert (flags.store_ttl, flags.store_outage) == (60, 2)
    env = {"TOOLLATCH_RELAY__STORE": "redis://h:1/0", "TOOLLATCH_RELAY__STORE_TTL_S": "9"}
    config = load_config(env=env)
    assert (config.relay.store, config.relay.store_ttl_s) == ("redis://h:1/0", 9)
    assert load_config(env={}).relay.store == "memory:"
    with pytest.raises(ConfigError):
        load_config(env={"TOOLLATCH_RELAY__STORE": "postgres://x"})


async def test_a_resumed_run_is_a_new_log_under_its_id_on_every_worker(
    redis_url: str, tmp_path: Path
) -> None:
    session = secrets.token_urlsafe(32)
    ledger = f"sqlite:///{tmp_path}/ledger.db"
    async with workers(redis_url, 2, ledger_url=ledger) as (a, b):
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            run = await start_run(on_a, model="slow")
            first = await raw_events(on_b, run["events_url"])
            again = await on_a.post("/runs", json={"resume": run["id"], "message": "more"})
            assert again.status_code == 201 and again.json()["id"] == run["id"]
            second_a = await raw_events(on_a, run["events_url"])
            second_b = await raw_events(on_b, run["events_url"])
    assert second_b == second_a and ids(second_b) == list(range(1, len(second_b) + 1))
    assert second_b != first[: len(second_b)]  # the resumed run's own events, not the old ones


@pytest.fixture
def late_redis(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every Redis pipeline's answer comes 0.3 s late once called: a reader on one worker has
    a run's ``run_ended`` from Redis while its owner has not yet seen the write confirmed."""
    import redis.asyncio.client

    execute = redis.asyncio.client.Pipeline.execute

    async def late(self: Any, *args: Any, **kwargs: Any) -> Any:
        answer = await execute(self, *args, **kwargs)
        await asyncio.sleep(0.3)
        return answer

    return lambda: monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", late)


async def test_a_resume_sent_as_run_ended_is_read_waits_for_the_owner_to_close_the_run(
    redis_url: str, tmp_path: Path, late_redis: Any
) -> None:
    # a resume posted to A or B in that window waits for the end instead of a 409
    session = secrets.token_urlsafe(32)
    ledger = f"sqlite:///{tmp_path}/ledger.db"
    async with asyncio.timeout(90):  # (a hang fails here, showing where it waited)
        async with workers(redis_url, 2, ledger_url=ledger) as (a, b):
            late_redis()
            async with client_of(a, session) as on_a, client_of(b, session) as on_b:
                for on in (on_a, on_b):
                    run = await start_run(on_a, model="brisk")
                    first = await raw_events(on_b, run["events_url"])
                    assert "\nevent: run_ended\n" in first[-1] + "\n"
                    owner = a.relay.runs.owned(run["id"], session) if a.relay else None
                    assert owner is not None and not owner.ended  # (the window itself)
                    again = await on.post("/runs", json={"resume": run["id"], "message": "more"})
                    assert again.status_code == 201, again.text
                    assert again.json()["id"] == run["id"]
                    await raw_events(on_a, run["events_url"])


@pytest.mark.parametrize("to", ["owner", "other"])
async def test_a_chats_next_message_sent_as_its_stream_ends_is_answered(
    redis_url: str, late_redis: Any, to: str
) -> None:
    # useChat posts the next message once the stream says finish: on the owner, before it
    # has closed the run, it is answered (not 409 chat_busy). On the other worker the store
    # usually has the run's end by then (its run_ended and its status go in one write), so
    # that case checks the next message across workers right at the end, not the window
    session = secrets.token_urlsafe(32)
    async with asyncio.timeout(90):  # (a hang fails here, showing where it waited)
        async with workers(redis_url, 2) as (a, b):
            late_redis()
            async with client_of(a, session) as on_a, client_of(b, session) as on_b:
                body = chat_body("c2", "first", model="brisk")
                async with on_a.stream("POST", "/api/chat", json=body) as going:
                    assert going.status_code == 200, await going.aread()
                    run_id = going.headers["x-toollatch-run-id"]
                    async for _ in going.aiter_bytes():
                        break  # (read to its end on B)
                read = await raw_events(on_b, f"/runs/{run_id}/events")
                assert "\nevent: run_ended\n" in read[-1] + "\n"
                owner = a.relay.runs.owned(run_id, session) if a.relay else None
                assert owner is not None and not owner.ended  # (the window itself)
                on = on_a if to == "owner" else on_b
                body = chat_body("c2", "next", model="brisk")
                async with on.stream("POST", "/api/chat", json=body) as after:
                    assert after.status_code == 200, await after.aread()
                    next_id = after.headers["x-toollatch-run-id"]
                assert next_id != run_id
                await raw_events(on_b, f"/runs/{next_id}/events")


async def test_a_run_outlives_its_ttl_while_it_goes_on_and_expires_after_its_end(
    redis_url: str,
) -> None:
    session = secrets.token_urlsafe(32)
    async with workers(redis_url, 2, store_ttl_s=0.6) as (a, b):
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            run = await start_run(on_a, model="slow")  # about 3 s: five TTLs
            await asyncio.sleep(1.5)
            whole = await raw_events(on_b, run["events_url"])  # from the start, on B
            assert ids(whole) == list(range(1, len(whole) + 1))
            assert "\nevent: run_ended\n" in whole[-1] + "\n"
            await asyncio.sleep(1.5)  # the run ended: one TTL later it is gone from Redis
            assert (await on_b.get(run["events_url"])).status_code == 404
            assert (await on_a.get(run["events_url"])).status_code == 200  # (its owner's)


async def test_a_stopping_worker_ends_its_reads_of_other_workers_runs_cleanly(
    redis_url: str,
) -> None:
    session = secrets.token_urlsafe(32)
    async with workers(redis_url, 1) as (a,), client_of(a, session) as on_a:
        run = await start_run(on_a, model="slower")
        async with workers(redis_url, 1) as (b,), client_of(b, session) as on_b:
            text = ""
            async with on_b.stream("GET", run["events_url"]) as response:
                parts = response.aiter_text()
                async for part in parts:
                    text += part
                    if "id: 3\n" in text:
                        break
                assert b.relay is not None
                stopping = asyncio.create_task(b.relay.close(1.0))
                async for part in parts:  # to the response's own end
                    text += part
                await stopping
        assert text.endswith(": this worker is stopping: read the run from another\n\n")
        last = ids([b for b in text.split("\n\n") if b.startswith("id: ")])[-1]
        rest = await raw_events(on_a, run["events_url"], last_id=last, limit=1)
        assert ids(rest) == [last + 1]  # the run goes on on its owner, from where B left
        assert (await on_a.post(run["cancel_url"], json={})).status_code == 202


async def test_a_stop_ends_the_stores_tasks_when_a_redis_command_swallows_their_cancel(
    redis_url: str,
) -> None:
    """A worker's stop ends its lease's sweep even when a Redis command swallows the cancel
    (redis-py sends each command under asyncio.wait_for, which on Python 3.11 swallows a
    cancel landing as the send ends, python/cpython#86296: a durable worker's lease was then
    renewed for ever and its stop held until it was killed). Here a command of the sweep
    swallows the stop's cancel once, then answers at once each time it is asked again."""
    entered = asyncio.Event()
    swallowed: list[bool] = []
    stack = contextlib.AsyncExitStack()
    server = await stack.enter_async_context(
        RelayServer(scripts=SCRIPTS, store=redis_url, lease_s=0.3)
    )
    try:
        assert server.relay is not None
        client = server.relay.store.client  # type: ignore[attr-defined]
        members = client.smembers

        async def smembers(*keys: Any) -> Any:
            if swallowed:
                return await members(*keys)
            entered.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.append(True)  # (and goes on, as if answered)
            return set()

        client.smembers = smembers
        async with asyncio.timeout(30):
            await entered.wait()  # (the sweep waits in the command: the stop cancels it)
    finally:
        stopping = asyncio.create_task(stack.aclose())
        done, _pending = await asyncio.wait({stopping}, timeout=20)
    assert done, "the worker still stopping 20 s on"
    await stopping
    assert swallowed == [True]


async def test_a_reader_behind_the_kept_log_is_told_it_lagged_the_same_on_every_worker(
    redis_url: str,
) -> None:
    session = secrets.token_urlsafe(32)
    limits = RelayLimits(max_kept_bytes=8192)  # about 130 of the run's 750 text events
    async with workers(redis_url, 2, limits=limits) as (a, b):
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            run = await start_run(on_a, model="chatty")
            live_b = await raw_events(on_b, run["events_url"])  # from the start, live
            whole_a = await raw_events(on_a, run["events_url"])
            whole_b = await raw_events(on_b, run["events_url"])
            from_3 = await raw_events(on_b, run["events_url"], last_id=3)
    assert whole_b == whole_a  # the stream trimmed as the owner's log: the same lag
    frames, _ = parse_sse("\n\n".join(whole_b) + "\n\n")
    lag, kept = frames[0], frames[1:]
    assert lag.event == "lagged" and kept[-1].event == "run_ended"
    first = lag.data["first_id"]
    assert lag.id == first - 1 and lag.data["missed"] == first - 1 > 0
    assert [f.id for f in kept] == list(range(first, kept[-1].id + 1))
    assert parse_sse(from_3[0] + "\n\n")[0][0].data["missed"] == first - 4
    live, _ = parse_sse("\n\n".join(live_b) + "\n\n")
    told = {f.data["first_id"] - 1: f.data["missed"] for f in live if f.event == "lagged"}
    events = [f.id for f in live if f.event != "lagged"]
    assert sorted(set(events)) == events and events[-1] == kept[-1].id  # none twice
    assert len(events) + sum(told.values()) == kept[-1].id  # each id read or told missed


async def test_a_redis_restart_mid_run_loses_nothing_and_readers_resume(
    redis_server: RedisServer, redis_url: str
) -> None:
    session = secrets.token_urlsafe(32)
    async with workers(redis_url, 2) as (a, b):  # (store_outage_s: 5 s, over the restart)
        async with client_of(a, session) as on_a, client_of(b, session) as on_b:
            run = await start_run(on_a, model="steady")  # (about 6 s; Redis back in 0.1 s)
            url = run["events_url"]
            reader_a = asyncio.create_task(raw_events(on_a, url))
            before = await raw_events(on_b, url, limit=5)
            opened = asyncio.Event()
            cut = asyncio.create_task(raw_events(on_b, url, last_id=5, opened=opened))
            await opened.wait()  # B found the run in Redis and streams it
            await asyncio.to_thread(redis_server.restart)  # its append-only file kept
            async with asyncio.timeout(30):
                seen_b = before + await cut  # B's stream ended when Redis went away
                assert not reader_a.done()  # (mid-run: the restart came before its end)
                assert "\nevent: run_ended\n" not in seen_b[-1] + "\n"
                seen_b += await raw_events(on_b, run["events_url"], last_id=ids(seen_b)[-1])
                whole_a = await reader_a
    assert seen_b == whole_a  # resumed on B: nothing lost, nothing twice, the same bytes
    frames, _ = parse_sse("\n\n".join(whole_a) + "\n\n")
    assert frames[-1].event == "run_ended" and "cancelled" not in frames[-1].data


async def test_a_dead_workers_run_is_adopted_by_one_worker_and_an_ended_one_by_none(
    redis_url: str,
) -> None:
    """``RunStore.adopt`` (a restarting worker) and the lease sweep share one compare-and-set:
    of two live workers asking at once for a dead worker's run, exactly one gets it (it is
    then its ``ender``); a run a survivor ended (``done`` with an ``ender``) goes to none."""
    import redis.asyncio as aioredis

    from toollatch.relay.store._redis import RedisRunStore, _meta

    async with workers(redis_url, 2) as servers:
        stores: list[RedisRunStore] = []
        for server in servers:
            assert server.relay is not None and isinstance(server.relay.store, RedisRunStore)
            stores.append(server.relay.store)
        raw = aioredis.Redis.from_url(redis_url)
        try:
            await raw.hset(_meta("orphan1"), mapping={"status": "running", "owner": "dead00"})
            won = await asyncio.gather(*(s.adopt("orphan1") for s in stores))
            assert sorted(won) == [False, True]
            winner = stores[won.index(True)].worker
            assert await raw.hmget(_meta("orphan1"), "status", "ender") == [
                b"ending",
                winner.encode(),
            ]
            assert await stores[won.index(True)].adopt("orphan1")  # (its own: still its)
            ended = {"status": "done", "owner": "dead00", "ender": winner}
            await raw.hset(_meta("ended1"), mapping=ended)
            assert await asyncio.gather(*(s.adopt("ended1") for s in stores)) == [False, False]
        finally:
            await raw.delete(_meta("orphan1"), _meta("ended1"))
            await raw.aclose()
