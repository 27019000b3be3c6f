"""The relay's own page (Playwright driving Debian's Chromium) follows a durable run
(``toollatch serve --durable``: a DBOS workflow) through the round-robin balancer of
tests/lb_helpers.py, and its owner is SIGKILLed mid-tool or mid-stream: a survivor recovers
the workflow and the run goes on in the same Redis event log, so the page, reconnected
through the balancer to a survivor, shows the run *finished* (not stopped by a lease), every
call paired, each event applied once, and each tool's side effect (a line the tool appends
to a file) happened once. Needs redis-server, PostgreSQL and chromium: without them the
tests skip, except under CI=true, where they fail (as tests/test_relay_durable.py and
tests/test_relay_lb.py)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_helpers import PostgresServer
from lb_helpers import Worker, balanced_workers
from ledger_helpers import RedisServer
from relay_helpers import Frame, slow_script
from test_relay_browser import _need_chromium
from test_relay_durable import SURVIVOR_SCALE, assert_attempts_paired
from test_relay_lb import (
    _final_states,
    _shown,
    _streams,
    frames_of,
    lb_client,
    page_running,
    raw_events,
)
from test_relay_lease import assert_paired
from toollatch.scripted import ScriptedServer

pytest.importorskip("dbos")

TOOL = '''
import asyncio, os
from pathlib import Path
from toollatch import tool

@tool(timeout=120)
async def get_weather(city: str, unit: str = "c") -> str:
    """The weather: a line in the side-effect file, then a wait for the test's go-ahead (a
    file; at most 60 s): the owner is killed while its first call waits."""
    with open(os.environ["PAGE_TOOL_LOG"], "a") as log:
        log.write(city[:4] + "\\n")
    go = Path(os.environ["PAGE_TOOL_GO"])
    for _ in range(600):
        if go.exists():
            break
        await asyncio.sleep(0.1)
    return "sunny"
'''

ENDED_MS = 90_000
"""How long the page may take to show the end once the owner died: the lease (1 s) runs
out, a survivor recovers the workflow (DBOS, PostgreSQL), the page reconnects (1 s)."""


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    scripts = {
        "quick": slow_script(delay_ms=20.0),  # (killed mid-tool: the stream's pace is moot)
        "slower": slow_script(delay_ms=150.0, city_chars=80),  # a round of about 20 s
    }
    with ScriptedServer(scripts=scripts) as server:
        yield server


def side_effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "side_effects.txt"
    return path.read_text(encoding="utf-8").split() if path.exists() else []


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Wait (polled: the state is in files and other processes) until ``condition()``."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)
    assert condition(), what


async def _applied(page: Any) -> list[str]:
    """The events the page applied so far, by type (the recorder's list)."""
    return [event for _id, event in await page.evaluate("window.__received")]


async def _mid_tool(page: Any, tmp_path: Path) -> None:
    """The owner's first tool has started (and waits): kill now."""
    await _until(lambda: len(side_effects(tmp_path)) == 1, "the first tool to start")


async def _mid_stream(page: Any, tmp_path: Path) -> None:
    """A call's arguments stream on (previews shown), nothing committed: kill now."""
    async with asyncio.timeout(30):
        while "call_preview" not in await _applied(page):
            await asyncio.sleep(0.05)
    assert "call_committed" not in await _applied(page)  # (still mid-stream)


def _worker_args(
    redis_url: str, pg_url: str, model: ScriptedServer, name: str, tmp_path: Path
) -> tuple[str, ...]:
    tools = tmp_path / "page_tools.py"
    tools.write_text(TOOL, encoding="utf-8")
    return (
        "--store", redis_url, "--durable", pg_url, "--lease", "1",
        "--ledger", f"sqlite:///{tmp_path / 'ledger.db'}",  # (the workers share it: one host)
        "--tools", str(tools), "--model", name, "--base-url", model.base_url("openai_chat"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("script", "kill_when"),
    [("quick", _mid_tool), ("slower", _mid_stream)],
    ids=["mid_tool", "mid_stream"],
)
async def test_the_page_shows_a_durable_run_finished_by_a_survivor_after_its_owner_died(
    redis_server: RedisServer,
    postgres: PostgresServer,
    model: ScriptedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    kill_when: Callable[[Any, Path], Any],
) -> None:
    _need_chromium()
    if redis_server.proc is None:  # (a test before stopped it)
        redis_server.start()
    go = tmp_path / "go"
    if kill_when is _mid_stream:
        go.touch()  # (nothing waits: the calls run on the survivor, after the kill)
    monkeypatch.setenv("PAGE_TOOL_LOG", str(tmp_path / "side_effects.txt"))
    monkeypatch.setenv("PAGE_TOOL_GO", str(go))
    pg_url = postgres.url("page_" + secrets.token_hex(4))
    args = _worker_args(redis_server.url, pg_url, model, script, tmp_path)
    with balanced_workers(3, *args) as (lb, workers):
        async with page_running(lb) as (page, posted):
            owner = workers[posted.backend]
            await kill_when(page, tmp_path)
            shown = await _shown(page, 0)
            before = len(_streams(lb))
            owner.kill()
            go.touch()  # (the survivor's tools need not wait)
            model.delay_scale = SURVIVOR_SCALE  # (the round asked again: 2 s, not 20 s)
            await page.wait_for_selector('body[data-run="ended"]', timeout=ENDED_MS)
            received = await page.evaluate("window.__received")
            status = await page.locator("#status").inner_text()
            status_state = await page.locator("#status").get_attribute("data-state")
            cards = [
                (await c.get_attribute("data-call-id"), await c.get_attribute("data-state"))
                for c in await page.locator(".card").all()
            ]
            text = await page.locator("#transcript").inner_text()
            cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
        after = _streams(lb)[before:]  # the page's reconnects once the owner died
        with lb_client(lb, cookies["toollatch_session"]) as http:
            whole = frames_of(raw_events(http, after[-1].path))
    survivors = [w for w in workers if w is not owner]
    assert after and all(r.backend != posted.backend for r in after), _logs(survivors)
    assert all(r.last_event_id is not None and r.last_event_id >= shown for r in after)
    assert received == [[f.id, f.event] for f in whole]  # each event applied once, none lost
    ended = whole[-1].data
    assert ended["error"] is None, _logs(survivors)  # the run went on: not ended by a lease
    assert status_state == "finished" and status.startswith("finished · 2 rounds"), status
    assert text.count("Both done.") == 1 and text.count("Checking two cities, slowly.") >= 1
    assert sorted(side_effects(tmp_path)) == ["Oslo", "Züri"]  # each side effect once
    calls = [(c["id"], c["error"]) for c in ended["calls"]]
    if kill_when is _mid_tool:
        assert_paired(whole)
        assert calls == [
            ("call_slow_a", "outcome_unknown"),  # started on the dead owner: not run again
            ("call_slow_b", None),  # run once, on the survivor
        ]
        assert cards == list(_final_states(whole).items())
        assert cards == [("call_slow_a", "unknown"), ("call_slow_b", "done")]
    else:
        assert_attempts_paired(whole)  # (the dead attempt closed, then the round asked again)
        assert calls == [("call_slow_a", None), ("call_slow_b", None)]
        assert _rounds(whole) == [(1, "interrupted"), (1, "normal"), (2, "normal")]
        # the dead attempt's cards failed (in its round), the new attempt's done (in theirs)
        cut = next(i for i, f in enumerate(whole) if f.event == "round_ended")
        dead = list(_final_states(whole[:cut]).items())
        assert dead and {state for _id, state in dead} == {"failed"}
        assert cards == [*dead, ("call_slow_a", "done"), ("call_slow_b", "done")]


def _rounds(frames: list[Frame]) -> list[tuple[int, str]]:
    return [(f.data["round"], f.data["ended"]) for f in frames if f.event == "round_ended"]


def _logs(workers: list[Worker]) -> str:
    """The survivors' stderr (what a failure shows)."""
    return "\n".join("".join(w.log)[-3000:] for w in workers)
