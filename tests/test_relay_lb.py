"""Three ``toollatch serve --store redis://...`` workers (real processes, their own ports)
behind a round-robin load balancer written here (tests/lb_helpers.py: each new connection to
the next worker, one request a connection, nothing sticky), every request through it: a run
is read from the middle and cancelled on other workers than its own; its owner SIGKILLed
mid-stream and mid-tool, the run ends on a survivor; the relay's page (Playwright driving
Debian's Chromium) follows a run whose owner dies; Redis restarts under a run. Needs
redis-server and chromium: without them the tests skip, except under CI=true, where they
fail (as tests/test_relay_store.py and tests/test_relay_browser.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lb_helpers import Balancer, Route, Worker, balanced_workers
from ledger_helpers import RedisServer
from relay_helpers import Frame, parse_sse, slow_script
from test_relay_browser import CHROMIUM, _need_chromium
from test_relay_lease import assert_paired
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

GIVE_UP_S = 40.0
"""No read lasts longer (a run nobody ends keeps its stream open with heartbeats)."""

LOGGED_TOOL = '''
import os, time
from toollatch import tool

@tool(eager=True)
def get_weather(city: str, unit: str = "c") -> str:
    """The weather: one line in the side-effect file, then a wait."""
    with open(os.environ["LB_TOOL_LOG"], "a") as log:
        log.write(city[:4] + "\\n")
    time.sleep(float(os.environ["LB_TOOL_WAIT_S"]))
    return "sunny"
'''


def lb_client(lb: Balancer, session: str) -> httpx.Client:
    """A client of the balancer in ``session``: no keep-alive (each request a new
    connection, so the next worker)."""
    return httpx.Client(
        base_url=lb.url,
        timeout=30,
        headers={"x-toollatch-session": session},
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def raw_events(
    client: httpx.Client,
    url: str,
    *,
    last_id: int | None = None,
    until: Callable[[list[str]], bool] | None = None,
    opened: threading.Event | None = None,
) -> list[str]:
    """The frames of one GET as sent (``id:``/``event:``/``data:`` blocks) until the stream
    ends or ``until(blocks)``; ``opened`` is set once the answer is 200."""
    headers = {} if last_id is None else {"last-event-id": str(last_id)}
    blocks: list[str] = []
    buffer = ""
    give_up = time.monotonic() + GIVE_UP_S
    with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, (response.status_code, response.read())
        if opened is not None:
            opened.set()
        for text in response.iter_text():
            buffer += text
            *done, buffer = buffer.split("\n\n")
            blocks += [b for b in done if b.startswith("id: ")]
            if (until is not None and until(blocks)) or time.monotonic() > give_up:
                break
    return blocks


def frames_of(blocks: list[str]) -> list[Frame]:
    return parse_sse("\n\n".join(blocks) + "\n\n")[0] if blocks else []


def ids(blocks: list[str]) -> list[int]:
    return [f.id for f in frames_of(blocks)]


def count(n: int) -> Callable[[list[str]], bool]:
    return lambda blocks: len(blocks) >= n


def seen(event: str, times: int = 1) -> Callable[[list[str]], bool]:
    return lambda blocks: sum(f.event == event for f in frames_of(blocks)) >= times


def read_to_end(client: httpx.Client, url: str, blocks: list[str]) -> list[str]:
    """``blocks`` and the rest of the run, resumed from its last id on whichever worker the
    balancer picks, until ``run_ended`` (a stream a worker's death ends is resumed again)."""
    blocks = list(blocks)
    give_up = time.monotonic() + GIVE_UP_S
    while not (blocks and "\nevent: run_ended\n" in blocks[-1]):
        assert time.monotonic() < give_up, f"no run_ended after {ids(blocks)[-1:]}"
        last = ids(blocks)[-1] if blocks else None
        try:
            blocks += raw_events(client, url, last_id=last)
        except httpx.TransportError:
            continue  # (the worker died under the read: the next one goes elsewhere)
    return blocks


def owner_of(lb: Balancer, workers: list[Worker]) -> Worker:
    """The worker the (only) POST /runs went to."""
    [posted] = lb.routed("POST", "/runs")
    return workers[posted.backend]


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None:  # (a test before stopped it)
        redis_server.start()
    return redis_server.url


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    scripts = {
        "slow": slow_script(delay_ms=60.0),
        "slower": slow_script(delay_ms=120.0),
        "killed": _killed_script(),
        "restarted": _restarted_script(),
    }
    with ScriptedServer(scripts=scripts) as server:
        yield server


def _killed_script() -> Script:
    """A short call (its eager tool starts once the next call opens), then a call whose
    arguments stream for about 8 s: killed there, the run is mid-stream AND mid-tool."""
    long_city = ("Zürich " * 60).strip()
    first = Turn(
        items=(
            Text(text="Two cities.", chunk_chars=4),
            Call(call_id="call_a", name="get_weather", arguments='{"city": "Oslo"}'),
            Call(
                call_id="call_b",
                name="get_weather",
                arguments=json.dumps({"city": long_city}),
                fragment_chars=2,
            ),
        ),
        delay_ms=40.0,
    )
    return Script(turns=(first, Turn(items=(Text(text="Done."),))))


def _restarted_script() -> Script:
    """Two short calls (their tools wait 1 s: Redis stops then), a text of about 2 s."""
    first = Turn(
        items=(
            Text(text="Two cities.", chunk_chars=4),
            Call(call_id="call_a", name="get_weather", arguments='{"city": "Oslo"}'),
            Call(call_id="call_b", name="get_weather", arguments='{"city": "Zürich"}'),
        ),
        delay_ms=40.0,
    )
    final = Turn(items=(Text(text="Both sunny. " * 4, chunk_chars=1),), delay_ms=40.0)
    return Script(turns=(first, final))


def worker_args(redis_url: str, model: ScriptedServer, name: str, *more: str) -> tuple[str, ...]:
    return (
        "--store", redis_url, "--model", name, "--base-url", model.base_url("openai_chat"),
        *more,
    )  # fmt: skip


def test_a_run_started_on_one_worker_is_read_on_another_and_cancelled_through_a_third(
    redis_url: str, model: ScriptedServer
) -> None:
    session = secrets.token_urlsafe(32)
    args = worker_args(redis_url, model, "slow", "--ledger", "none")
    with balanced_workers(3, *args) as (lb, _workers):
        with lb_client(lb, session) as http, lb_client(lb, session) as other:
            run = http.post("/runs", json={"message": "two cities"})
            assert run.status_code == 201, run.text
            url, cancel_url = run.json()["events_url"], run.json()["cancel_url"]
            head = raw_events(http, url, until=count(10))[:10]
            opened = threading.Event()
            tail: list[str] = []
            reader = threading.Thread(
                target=lambda: tail.extend(raw_events(other, url, last_id=10, opened=opened))
            )
            reader.start()
            assert opened.wait(30)  # (its connection made: the next request goes elsewhere)
            more = raw_events(http, url, last_id=10, until=count(5))[:5]
            cancelled = http.post(cancel_url, json={})
            reader.join(GIVE_UP_S)
            wholes = [raw_events(http, url) for _ in range(3)]
    [posted] = lb.routed("POST", "/runs")
    [from_10, _more] = [r for r in lb.routed("GET", url) if r.last_event_id == 10]
    [cancel] = lb.routed("POST", cancel_url)
    assert len({posted.backend, from_10.backend, cancel.backend}) == 3
    whole_reads = [r for r in lb.routed("GET", url) if r.last_event_id is None][1:]
    assert {r.backend for r in whole_reads} == {0, 1, 2}
    assert cancelled.status_code == 202
    assert cancelled.json() == {"id": run.json()["id"], "cancelled": True}
    whole = wholes[0]
    assert wholes == [whole] * 3  # the same ids and the same bytes from every worker
    assert ids(whole) == list(range(1, len(whole) + 1))
    assert whole[:10] == head and whole[10:] == tail and more == whole[10:15]
    frames = frames_of(whole)
    assert frames[-1].event == "run_ended" and frames[-1].data["cancelled"] is True
    assert_paired(frames)


def test_the_owner_killed_mid_stream_and_mid_tool_the_run_ends_once_on_a_survivor(
    redis_url: str, model: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "logged_tools.py"
    tools.write_text(LOGGED_TOOL, encoding="utf-8")
    side_effects = tmp_path / "side_effects.txt"
    monkeypatch.setenv("LB_TOOL_LOG", str(side_effects))
    monkeypatch.setenv("LB_TOOL_WAIT_S", "60")
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"  # (the workers share it: one host)
    session = secrets.token_urlsafe(32)
    args = worker_args(redis_url, model, "killed", "--ledger", ledger, "--lease", "1")
    with balanced_workers(3, *args, "--tools", str(tools)) as (lb, workers):
        with lb_client(lb, session) as http:
            run = http.post("/runs", json={"message": "two cities"}).json()
            url = run["events_url"]
            started = raw_events(http, url, until=seen("tool_started"))
            # call_b streams on: its first two previews (at about 0.4 and 1.7 s; its
            # arguments stream for about 8 s, a preview every 1.3 s)
            head = raw_events(http, url, until=count(len(started) + 2))
            assert [f.event for f in frames_of(head[-2:])] == ["call_preview"] * 2
            owner = owner_of(lb, workers)
            killed_at = len(lb.routes)
            owner.kill()
            whole = read_to_end(http, url, head)
            survivors = {i for i, w in enumerate(workers) if w is not owner}
            again: list[list[str]] = []
            while {r.backend for r in lb.routes[killed_at:]} != survivors and len(again) < 4:
                again.append(raw_events(http, url))  # (until each survivor answered once)
    assert {r.backend for r in lb.routes[killed_at:]} == survivors  # (the dead one skipped)
    assert again == [whole] * len(again)  # the same bytes from both survivors
    frames = frames_of(whole)
    assert_paired(frames)
    ended = frames[-1].data
    assert "stopped (its lease of 1 s expired)" in ended["error"]
    results = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    failed = {f.data["id"]: f.data for f in frames if f.event == "call_failed"}
    assert results["call_a"]["error"] == "outcome_unknown" and results["call_a"]["is_error"]
    assert failed == {"call_b": failed["call_b"]}
    assert failed["call_b"]["error"] == "stream_interrupted"  # killed mid-stream
    events = [f.event for f in frames]
    assert events.count("tool_started") == 1  # call_a only; it ran once, nowhere again
    assert side_effects.read_text(encoding="utf-8").split() == ["Oslo"]


def mid_text(blocks: list[str]) -> bool:
    """Three events into the second round (its text streams, a write each)."""
    events = [f.event for f in frames_of(blocks)]
    return "round_ended" in events and len(events) - events.index("round_ended") > 3


@pytest.mark.parametrize(
    ("down_s", "outage_s", "when"),
    [(0.0, 5.0, mid_text), (3.0, 1.0, seen("tool_started", 2))],
    ids=["restart_mid_text", "outage_past_store_outage_mid_tool"],
)
def test_a_redis_restart_mid_run_runs_each_tool_once_and_every_reader_ends(
    redis_server: RedisServer,
    redis_url: str,
    model: ScriptedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    down_s: float,
    outage_s: float,
    when: Callable[[list[str]], bool],
) -> None:
    """Restarted at once (within ``--store-outage``) while the run writes, the run goes on
    (its failed writes retried); down past it while tools run, the owner cancels the run:
    either way every reader (on any worker, resumed through the balancer once Redis is back)
    gets the same log to its ``run_ended``, every call paired, each tool run once."""
    tools = tmp_path / "logged_tools.py"
    tools.write_text(LOGGED_TOOL, encoding="utf-8")
    side_effects = tmp_path / "side_effects.txt"
    monkeypatch.setenv("LB_TOOL_LOG", str(side_effects))
    monkeypatch.setenv("LB_TOOL_WAIT_S", "1")
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    session = secrets.token_urlsafe(32)
    args = worker_args(redis_url, model, "restarted", "--ledger", ledger)
    args += ("--store-outage", str(outage_s))
    with balanced_workers(3, *args, "--tools", str(tools)) as (lb, _workers):
        with lb_client(lb, session) as http, lb_client(lb, session) as other:
            url = http.post("/runs", json={"message": "two cities"}).json()["events_url"]
            opened = threading.Event()
            live: list[str] = []
            reader = threading.Thread(
                target=lambda: live.extend(raw_events(other, url, opened=opened))
            )
            reader.start()  # (on a worker that is not the run's: it reads Redis)
            assert opened.wait(30)
            raw_events(http, url, until=when)
            redis_server.stop()
            time.sleep(down_s)
            redis_server.start()
            reader.join(GIVE_UP_S)
            assert not reader.is_alive()
            resumed = read_to_end(http, url, live)
            wholes = [read_to_end(http, url, []) for _ in range(3)]
    assert wholes == [resumed] * 3  # the same log on every worker: nothing lost or twice
    frames = frames_of(resumed)
    assert_paired(frames)
    ended = frames[-1].data
    if down_s:
        assert live == resumed[: len(live)] and len(live) < len(resumed)  # ended by the outage
        assert ended["cancelled"] is True
        assert "run store (Redis) is unreachable" in ended["error"]
    else:
        assert ended["error"] is None  # it went on
        results = [f.data for f in frames if f.event == "tool_finished"]
        assert [r["is_error"] for r in results] == [False, False]
    assert sorted(side_effects.read_text(encoding="utf-8").split()) == ["Oslo", "Züri"]


# Every event each of the page's EventSources dispatched, on any connection, before the page
# itself drops one it had (installed before the page's scripts).
RECORDER = """
window.__received = [];
const Native = window.EventSource;
window.EventSource = class extends Native {
  addEventListener(type, listener, options) {
    const recorded = (e) => { window.__received.push([Number(e.lastEventId), type]); listener(e); };
    const own = type === "open" || type === "error";
    return super.addEventListener(type, own ? listener : recorded, options);
  }
};
"""


def _streams(lb: Balancer) -> list[Any]:
    """The connections that carried a run's event stream (oldest first)."""
    return [r for r in list(lb.routes) if r.method == "GET" and r.path.endswith("/events")]


async def _onto(lb: Balancer, owner: int) -> None:
    """Cut the page's event stream until it reconnects to worker ``owner`` (round robin:
    at most two cuts, a reconnect a second each)."""
    for _ in range(4):
        stream = _streams(lb)[-1]
        if stream.backend == owner:
            return
        lb.cut(stream)
        async with asyncio.timeout(10):
            while _streams(lb)[-1] is stream:
                await asyncio.sleep(0.05)
    raise AssertionError(f"the page never read from worker {owner}: {_streams(lb)}")


@contextlib.asynccontextmanager
async def page_running(lb: Balancer) -> AsyncIterator[tuple[Any, Route]]:
    """Chromium on the relay's page behind ``lb`` (every event it received recorded:
    ``RECORDER``), a run of "two cities" sent from it and shown, and the balancer sending
    the page's reads to the run's owner: the page, and the run's ``POST /runs`` as routed."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        chromium = await p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            page = await chromium.new_page()
            await page.add_init_script(RECORDER)
            await page.goto(lb.url + "/")
            await page.fill("#message", "two cities")
            await page.click("#send")
            await _shown(page, 2)
            [posted] = lb.routed("POST", "/runs")
            await _onto(lb, posted.backend)  # (the page now reads from the run's owner)
            yield page, posted
        finally:
            await chromium.close()


def _final_states(frames: list[Frame]) -> dict[str, str]:
    """Each call's card state as the log ends it (app.js: ``errorState``)."""
    states: dict[str, str] = {}
    for f in frames:
        if f.event in ("call_failed", "tool_finished") and f.data.get("is_error", True):
            error = f.data["error"]
            states[f.data["id"]] = {"outcome_unknown": "unknown", "cancelled": "cancelled"}.get(
                error, "failed"
            )
        elif f.event == "tool_finished":
            states[f.data["id"]] = "done"
    return states


async def _shown(page: Any, at_least: int) -> int:
    """The id of the newest event the page applied, once it is ``at_least`` (the page's
    Content-Security-Policy forbids wait_for_function's eval: polled)."""
    async with asyncio.timeout(20):
        while True:
            shown = int(await page.evaluate("() => document.body.dataset.lastEventId || 0"))
            if shown >= at_least:
                return shown
            await asyncio.sleep(0.05)


async def test_the_page_through_the_balancer_shows_the_end_of_a_run_whose_owner_died(
    redis_url: str, model: ScriptedServer
) -> None:
    _need_chromium()
    args = worker_args(redis_url, model, "slower", "--ledger", "none", "--lease", "1")
    with balanced_workers(3, *args) as (lb, workers):
        async with page_running(lb) as (page, posted):
            shown = await _shown(page, 0) + 3
            await _shown(page, shown)  # (events from the owner itself)
            before = len(_streams(lb))
            workers[posted.backend].kill()  # mid-run: call arguments still streaming
            await page.wait_for_selector('body[data-run="ended"]', timeout=30_000)
            received = await page.evaluate("window.__received")
            status = await page.locator("#status").inner_text()
            states = {
                await c.get_attribute("data-call-id"): await c.get_attribute("data-state")
                for c in await page.locator(".card").all()
            }
            text = await page.locator("#transcript").inner_text()
            cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
        after = _streams(lb)[before:]  # the page's reconnects once the owner died
        with lb_client(lb, cookies["toollatch_session"]) as http:
            whole = frames_of(raw_events(http, after[-1].path))
    assert after and all(r.backend != posted.backend for r in after)
    assert all(r.last_event_id is not None and r.last_event_id >= shown for r in after)
    assert received == [[f.id, f.event] for f in whole]  # each event once, none lost
    assert_paired(whole)
    assert "stopped (its lease of 1 s expired)" in status
    assert states == _final_states(whole) and "failed" in states.values()  # (mid-stream)
    assert text.count("Checking two cities, slowly.") == 1
