"""The relay's page in a real browser: Playwright driving Debian's Chromium (headless).

Without /usr/bin/chromium these tests skip with the reason, except under CI=true, where
they fail: `.ci/run` installs it (apt-get install -y chromium).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from pathlib import Path

import pytest
import pytest_asyncio

from relay_helpers import slow_script
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, Text, Turn

CHROMIUM = Path("/usr/bin/chromium")

# One Chromium for the module (its launch was the most part of each test's time), so one event
# loop for the module; every test still opens its own browser context (own cookies, storage).
pytestmark = pytest.mark.asyncio(loop_scope="module")

# Every card's state changes, as the page made them, in order (installed before its scripts).
RECORDER = """
window.__transitions = [];
new MutationObserver((records) => {
  for (const r of records) {
    const node = r.target;
    if (r.type === "attributes" && node.classList && node.classList.contains("card")) {
      window.__transitions.push([node.dataset.callId, node.dataset.state]);
    }
    for (const [nodes, how] of [[r.addedNodes, "on"], [r.removedNodes, "off"]]) {
      for (const n of nodes || []) {  // the thinking indicator, by round
        if (n.classList && n.classList.contains("thinking")) {
          window.__transitions.push(["thinking", `${node.dataset.round}:${how}`]);
        }
      }
    }
  }
}).observe(document, {subtree: true, childList: true, attributes: true,
                      attributeFilter: ["data-state"]});
"""


def _need_chromium() -> None:
    if CHROMIUM.is_file():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {CHROMIUM} is missing (apt-get install -y chromium)")
    pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium)")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chromium():
    _need_chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        chromium = await p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            # attacker.example resolves to loopback: a DNS-rebinding page, as the browser sees it
            args=["--no-sandbox", "--host-resolver-rules=MAP attacker.example 127.0.0.1"],
        )
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(loop_scope="module")
async def browser(chromium):
    """The module's Chromium; the contexts a test opened are closed after it."""
    yield chromium
    for context in chromium.contexts:
        await context.close()


@pytest_asyncio.fixture(loop_scope="module")
async def relay():
    scripts = {"slow": slow_script(delay_ms=40), "broken": _broken()}
    async with RelayServer(scripts=scripts, delay_scale=5) as server:
        yield server


async def _page(browser, relay):
    context = await browser.new_context(viewport={"width": 1366, "height": 800})
    page = await context.new_page()
    await page.add_init_script(RECORDER)
    await page.goto(relay.url + "/")
    return page


async def _start(page, message: str) -> None:
    await page.fill("#message", message)
    await page.click("#send")


async def _states(page) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for call_id, state in await page.evaluate("window.__transitions"):
        if not seen.get(call_id) or seen[call_id][-1] != state:
            seen.setdefault(call_id, []).append(state)
    return seen


async def test_two_parallel_calls_preview_then_final_cards_in_call_order(browser, relay, tmp_path):
    page = await _page(browser, relay)
    await _start(page, "What is the weather in Oslo and in Zürich? Write it down.")
    first = page.locator('.card[data-call-id="call_demo_weather_oslo"]')
    await first.wait_for()
    await page.locator('.card.preview[data-call-id="call_demo_weather_zurich"]').wait_for()
    await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
    cards = page.locator(".round").first.locator(".card")
    ids = [await c.get_attribute("data-call-id") for c in await cards.all()]
    assert ids == ["call_demo_weather_oslo", "call_demo_weather_zurich"]
    states = await _states(page)
    for call_id in ids:  # preview first, then committed, ran, and final only at the join
        assert states[call_id][0] == "streaming"
        assert states[call_id][-1] == "done"
        assert states[call_id].index("committed") < states[call_id].index("done")
    finals = [c for c, s in await page.evaluate("window.__transitions") if s == "done"]
    assert finals[:2] == ids  # final cards appear in call order
    assert await page.locator(".card.final").count() == 3
    assert await page.locator("#gatelog li.committed").count() == 3
    assert "Zürich" in await first.locator("xpath=..").inner_text()
    assert await page.locator("#status").inner_text() == "finished · 3 rounds · 3 calls"
    text = await page.locator("#transcript").inner_text()
    assert text.count("Let me check the weather in both cities.") == 1
    artifacts = Path(os.environ.get("TOOLLATCH_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(artifacts / "relay_finished.png"), full_page=True)
    assert (artifacts / "relay_finished.png").stat().st_size > 10_000


def _broken() -> Script:
    bad = Call(call_id="call_bad", name="get_weather", arguments='{"city": "Oslo"} trailing')
    good = Call(call_id="call_good", name="add", arguments='{"a": 1, "b": 2}')
    turn = Turn(items=(Text(text="Two calls, one broken."), bad, good))
    return Script(turns=(turn, Turn(items=(Text(text="Sorry."),))))


async def _slow_run(page, model: str = "slow") -> None:
    await page.evaluate(
        """async (model) => {
            const r = await fetch("/runs", {method: "POST",
                                            headers: {"content-type": "application/json"},
                                            body: JSON.stringify({message: "slowly", model})});
            const body = await r.json();
            sessionStorage.setItem("toollatch.run", JSON.stringify({...body, message: "slowly"}));
        }""",
        model,
    )
    await page.reload()  # the page follows the stored run, as after a reload


async def test_stop_mid_stream_shows_cancelled_cards(browser, relay):
    page = await _page(browser, relay)
    await _slow_run(page)
    await page.locator('.card.preview[data-call-id="call_slow_a"]').wait_for()
    await page.click("#stop")
    await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
    states = {
        await c.get_attribute("data-call-id"): await c.get_attribute("data-state")
        for c in await page.locator(".card").all()
    }
    assert states.get("call_slow_a") == "cancelled"
    assert set(states.values()) <= {"cancelled", "done"}  # nothing left streaming or running
    assert await page.locator(".meta", has_text="cancelled").count() == 1
    assert await page.locator("#gatelog li.failed", has_text="CANCELLED").count() >= 1
    assert await page.locator("#stop").is_disabled()
    assert (await page.locator("#status").inner_text()).startswith("stopped · 1 round · ")


async def test_reload_mid_run_resumes_without_loss_or_duplicates(browser):
    # the slow run with a shorter city, twice the pace: the reload comes ~1 s in and the run
    # goes on ~5 s after it (the module's relay: ~2 s in, ~17 s after; 23 s for this test)
    scripts = {"slow": slow_script(delay_ms=20, city_chars=8)}
    async with RelayServer(scripts=scripts, delay_scale=5) as relay:
        page = await _page(browser, relay)
        await _slow_run(page)
        await page.locator('.card.preview[data-call-id="call_slow_a"]').wait_for()
        await page.reload()
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        texts = [await t.inner_text() for t in await page.locator(".round .text").all()]
        assert "".join(texts) == "Checking two cities, slowly.Both done."
        ids = [await c.get_attribute("data-call-id") for c in await page.locator(".card").all()]
        assert ids == ["call_slow_a", "call_slow_b"]
        assert [await c.get_attribute("data-state") for c in await page.locator(".card").all()] == [
            "done",
            "done",
        ]
        assert await page.locator("#gatelog li").count() == 2
        assert await page.locator(".user").count() == 1


async def test_another_session_gets_404(browser, relay):
    page = await _page(browser, relay)
    await _slow_run(page)
    run = await page.evaluate('JSON.parse(sessionStorage.getItem("toollatch.chat")).runs.at(-1)')
    other = await _page(browser, relay)  # a new context: its own cookie
    statuses = await other.evaluate(
        """async (run) => [
            (await fetch(run.events_url)).status,
            (await fetch(run.cancel_url, {method: "POST", body: "{}",
                                          headers: {"content-type": "application/json"}})).status,
        ]""",
        run,
    )
    assert statuses == [404, 404]
    own = await page.evaluate(
        """async (run) => (await fetch(run.cancel_url, {method: 'POST', body: '{}',
                                  headers: {'content-type': 'application/json'}})).status""",
        run,
    )
    assert own == 202


async def test_a_call_that_fails_the_gate_shows_its_error_code_and_reason(browser, relay):
    page = await _page(browser, relay)
    await _slow_run(page, "broken")
    await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
    bad = page.locator('.card[data-call-id="call_bad"]')
    assert await bad.get_attribute("data-state") == "failed"
    assert await bad.locator(".state").inner_text() == "invalid_json"
    good = page.locator('.card[data-call-id="call_good"]')
    assert await good.get_attribute("data-state") == "done"
    log = page.locator('#gatelog li[data-call-id="call_bad"]')
    assert (await log.locator(".decision").inner_text()) == "FAILED INVALID_JSON"
    assert "trailing" in await log.locator(".reason").inner_text()


async def test_a_page_behind_the_kept_events_shows_the_gap(browser):
    """A page that opens a run whose first events the relay no longer keeps gets
    ``lagged``, shows how many it missed, then the rest of the run to its end."""
    from relay_helpers import chatty_script
    from toollatch import RelayLimits

    limits = RelayLimits(max_kept_bytes=16 * 1024)
    scripts = {"chatty": chatty_script(200_000, chunk_chars=1000)}
    async with RelayServer(scripts=scripts, delay_scale=0, limits=limits) as server:
        page = await _page(browser, server)
        run = await page.evaluate(
            """async () => {
                const r = await fetch("/runs", {method: "POST",
                    headers: {"content-type": "application/json"},
                    body: JSON.stringify({message: "talk", model: "chatty"})});
                const body = await r.json();
                sessionStorage.setItem("toollatch.run", JSON.stringify({...body, message: "talk"}));
                return body;
            }"""
        )
        cookies = await page.context.cookies()
        session = next(c["value"] for c in cookies if c["name"] == "toollatch_session")
        stored = server.relay.runs.owned(run["id"], session)
        while not stored.done:  # the page reads nothing until the run has ended
            await asyncio.sleep(0.05)
        assert stored.log.first_id > 1
        await page.reload()
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        note = page.locator(".meta.lagged")
        assert await note.count() == 1
        missed = int((await note.inner_text()).split()[0])
        assert missed > 100  # of about 200 text events, most were forgotten
        text = "".join([await t.inner_text() for t in await page.locator(".round .text").all()])
        assert 0 < len(text) < 200_000
        assert set(text) == {"x"}
        assert (await page.locator("#status").inner_text()).startswith("finished")


async def test_a_cut_result_says_so_on_its_card(browser):
    from toollatch import tool

    @tool
    def big() -> str:
        """A result far over the default 64 KiB budget."""
        return "x" * 100_000

    turn = Turn(items=(Call(call_id="call_big", name="big", arguments="{}"),), delay_ms=0)
    scripts = {"big": Script(turns=(turn, Turn(items=(Text(text="Done."),), delay_ms=0)))}
    async with RelayServer(scripts=scripts, delay_scale=0, tools=[big]) as server:
        page = await _page(browser, server)
        await _slow_run(page, "big")
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        card = page.locator('.card[data-call-id="call_big"]')
        assert await card.get_attribute("data-state") == "done"
        assert "result cut from 100000 bytes" in await card.inner_text()


async def test_a_call_whose_server_died_shows_outcome_unknown(browser, tmp_path):
    """A real MCP server (stdio) that dies mid-call: the card ends in its own 'unknown'
    state, not 'failed' or 'cancelled' (the call may have had its effect)."""
    from mcp_helpers import stdio_server
    from toollatch.mcp import McpToolSource

    turn = Turn(items=(Call(call_id="call_crash", name="crash", arguments="{}"),), delay_ms=0)
    scripts = {"crash": Script(turns=(turn, Turn(items=(Text(text="Hm."),), delay_ms=0)))}
    source = McpToolSource([stdio_server(tmp_path)])
    async with RelayServer(scripts=scripts, delay_scale=0, tool_source=source) as server:
        page = await _page(browser, server)
        await _slow_run(page, "crash")
        await page.wait_for_selector('body[data-run="ended"]', timeout=30_000)
        card = page.locator('.card[data-call-id="call_crash"]')
        assert await card.get_attribute("data-state") == "unknown"
        assert await card.locator(".state").inner_text() == "outcome_unknown"


async def test_a_rebinding_page_gets_nothing_and_another_origin_cannot_drive_the_relay(
    browser, relay
):
    """SEC1/SEC12 in Chromium: a page whose name resolves to the relay (DNS rebinding) gets
    400 and no session; a page of another origin on the same site (another port of
    localhost, so the SameSite=Strict cookie goes along) that posts to the relay (no-cors
    fetches, a form) is refused 403 and starts and cancels nothing."""
    port = relay.url.rsplit(":", 1)[1]
    context = await browser.new_context()
    page = await context.new_page()
    answer = await page.goto(f"http://attacker.example:{port}/")
    assert answer.status == 400
    assert "host_not_allowed" in await page.content()
    assert await context.cookies() == []
    home = f"http://localhost:{port}"
    own = await context.new_page()
    await own.goto(home + "/")
    await _slow_run(own)
    run = await own.evaluate('JSON.parse(sessionStorage.getItem("toollatch.chat")).runs.at(-1)')
    evil = await context.new_page()  # same browser, same cookies: only the origin differs
    refused: list[tuple[str, int]] = []
    evil.on(
        "response",
        lambda r: refused.append((r.request.method, r.status)) if r.url.startswith(home) else None,
    )
    async with _plain_page() as other:  # a real page on another port (no CSP of ours)
        await evil.goto(other)
        await _attack(evil, home, run)
    assert refused == [("POST", 403)] * 3, refused
    assert relay.relay.runs.active() == 1  # only the page's own run, still going
    assert await own.get_attribute("body", "data-run") == "running"  # not cancelled
    await own.click("#stop")  # its own page may stop it
    await own.wait_for_selector('body[data-run="ended"]', timeout=20_000)
    assert (await own.locator("#status").inner_text()).startswith("stopped")


@contextlib.asynccontextmanager
async def _plain_page():
    """A loopback server of one plain page at ``http://localhost:PORT/`` (its URL)."""
    page = b"<!doctype html><p>another site"
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n" % len(page)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(answer + b"\r\n" + page)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://localhost:{server.sockets[0].getsockname()[1]}/"
    finally:
        server.close()


async def _attack(evil, home: str, run: dict) -> None:
    """What a page of another origin can send the relay without a CORS preflight."""
    await evil.evaluate(
        """async ([home, run]) => {
            const body = JSON.stringify({message: "rm -rf"});
            for (const url of [home + "/runs", home + run.cancel_url]) {
                await fetch(url, {method: "POST", mode: "no-cors", credentials: "include", body,
                                  headers: {"content-type": "text/plain"}});
            }
        }""",
        [home, run],
    )
    await evil.evaluate(
        """(home) => {
            const form = document.createElement("form");
            form.method = "POST"; form.action = home + "/runs"; form.enctype = "text/plain";
            const field = document.createElement("input");
            field.name = '{"message": "x", "pad": "'; field.value = '"}';
            form.append(field); document.body.append(form); form.submit();
        }""",
        home,
    )
    await evil.wait_for_url(home + "/runs")


async def test_the_page_works_with_a_token_kept_in_cookies_only(browser):
    """SEC2/SEC11: the printed URL with ?token= opens the page (the token moves into an
    HttpOnly cookie and out of the address bar); the page's script sees neither the token
    nor the session token, and a run works to its end."""
    token = "browser-token-0123456789"
    # (about 1.8 s a run: the second run's Stop must land while it runs, under load too)
    async with RelayServer(scripts={"slow": slow_script(delay_ms=20)}, token=token) as server:
        context = await browser.new_context()
        page = await context.new_page()
        refused = await page.goto(server.url.replace("127.0.0.1", "localhost") + "/")
        assert refused.status == 401
        await page.goto(server.token_url.replace("127.0.0.1", "localhost"))
        assert "token" not in page.url
        await _start(page, "What is the weather?")
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        assert (await page.locator("#status").inner_text()).startswith("finished")
        assert await page.evaluate("document.cookie") == ""  # both HttpOnly
        stored = await page.evaluate('sessionStorage.getItem("toollatch.chat")')
        cookies = {c["name"]: c for c in await context.cookies()}
        session = cookies["toollatch_session"]["value"]
        assert session not in stored
        assert token not in stored
        assert all(c["httpOnly"] and c["sameSite"] == "Strict" for c in cookies.values())
        await page.reload()  # a reload replays the stored run, cookies only
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        assert await page.locator(".user").count() == 1
        await page.click("#newchat")  # (the same chat would go on past the script: text only)
        await _start(page, "Again.")  # a second run, and its Stop, with the checks in place
        await page.wait_for_selector('body[data-run="running"]', timeout=20_000)
        await page.click("#stop")
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)


async def test_each_card_shows_its_redacted_result_or_error_message(browser):
    """Issue 35 item 1: the relay's tool_finished carries a redacted result preview, and
    each card shows it on one line (an error result: its message, marked as an error)."""
    from toollatch import tool

    secret = "sk-live-Q8d2F7s9K1m3N5p7"

    @tool
    def account(user: str) -> dict[str, str]:
        """An account, with its key."""
        return {"user": user, "api_key": secret, "plan": "pro"}

    @tool
    def save(path: str) -> str:
        """Fails as a read-only disk does."""
        raise OSError(f"read-only file system: {path}")

    calls = (
        Call(call_id="call_acc", name="account", arguments='{"user": "ana"}'),
        Call(call_id="call_save", name="save", arguments='{"path": "/ro/x.md"}'),
    )
    turns = (Turn(items=calls, delay_ms=0), Turn(items=(Text(text="Done."),), delay_ms=0))
    scripts = {"results": Script(turns=turns)}
    async with RelayServer(scripts=scripts, delay_scale=0, tools=[account, save]) as server:
        page = await _page(browser, server)
        await _slow_run(page, "results")
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        ok = page.locator('.card[data-call-id="call_acc"] .result')
        assert await ok.inner_text() == '→ {"user":"ana","api_key":"[redacted]","plan":"pro"}'
        bad = page.locator('.card[data-call-id="call_save"] .result')
        assert await bad.inner_text() == "error: OSError: read-only file system: /ro/x.md"
        assert "error" in (await bad.get_attribute("class") or "")
        assert secret not in await page.content()


async def test_a_refused_calls_preview_is_marked_as_not_what_was_checked(browser, relay):
    """Issue 35 item 5: an invalid_json call's preview can look valid; its card marks it
    as not what the gate checked (a committed call's card has no such mark)."""
    page = await _page(browser, relay)
    await _slow_run(page, "broken")
    await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
    bad = page.locator('.card[data-call-id="call_bad"]')
    assert await bad.locator("pre.args.unchecked").count() == 1
    note = await bad.locator(".unchecked-note").inner_text()
    assert note == "preview of the streamed arguments, not what the gate checked"
    good = page.locator('.card[data-call-id="call_good"]')
    assert await good.locator(".unchecked, .unchecked-note").count() == 0


async def test_the_page_has_a_favicon_and_asks_for_no_other(browser, relay):
    """Issue 35 item 6: an inline SVG icon (the CSP's img-src allows data:), so the browser
    neither shows a blank tab icon nor asks the relay for /favicon.ico (a 404)."""
    asked: list[str] = []
    context = await browser.new_context()
    page = await context.new_page()
    page.on("request", lambda r: asked.append(r.url))
    await page.goto(relay.url + "/")
    href = await page.locator('link[rel="icon"]').get_attribute("href")
    assert href is not None
    assert href.startswith("data:image/svg+xml;base64,")
    size = await page.evaluate(
        """(href) => new Promise((done) => {
            const image = new Image();
            image.onload = () => done([image.naturalWidth, image.naturalHeight]);
            image.onerror = () => done(null);
            image.src = href;
        })""",
        href,
    )
    assert size is not None
    assert size[0] > 0
    await page.wait_for_timeout(300)
    assert not [url for url in asked if url.endswith("/favicon.ico")]


# -- a chat, not a form (issue 31) -------------------------------------------------------------


async def _ended_turns(page, count: int) -> None:
    turns = page.locator(".turn[data-ended]")
    await turns.nth(count - 1).wait_for(timeout=20_000)
    assert await turns.count() == count


async def test_a_chat_keeps_every_exchange_clears_the_box_and_thinks_until_the_model_answers(
    browser, relay
):
    from playwright.async_api import expect

    page = await _page(browser, relay)
    bodies: list[dict] = []
    page.on(
        "request",
        lambda r: (
            bodies.append(json.loads(r.post_data or "{}"))
            if r.method == "POST" and r.url.endswith("/runs")
            else None
        ),
    )
    await _start(page, "What is the weather in Oslo and in Zürich?")
    await expect(page.locator("#message")).to_have_value("")
    await _ended_turns(page, 1)
    # "thinking…" before the first token, and between rounds, gone at the model's answer
    assert (await _states(page))["thinking"] == ["1:on", "1:off", "2:on", "2:off", "3:on", "3:off"]
    assert await page.locator(".thinking").count() == 0
    # the write_file tool's UI payload on its card (its path as the model wrote it), and no
    # model-facing text for it
    card = page.locator('.card[data-call-id="call_demo_write_notes"]')
    assert await card.locator(".ui").inner_text() == "wrote notes/weather.md · 84 B"
    assert await card.locator(".result").is_hidden()
    await _start(page, "And tomorrow?")
    await _ended_turns(page, 2)
    users = [await u.inner_text() for u in await page.locator(".turn .user").all()]
    assert users == ["What is the weather in Oslo and in Zürich?", "And tomorrow?"]
    first, second = await page.locator(".turn").all()
    assert await first.locator(".card").count() == 3  # the first exchange stays, whole
    assert await first.locator(".round .text p").count() >= 1
    # the second message continues the chat on the server (its history went to the model):
    # the scripted model, past its script, answers it with text only
    assert await second.locator(".card").count() == 0
    assert await second.locator(".round .text p").count() >= 1
    assert await page.input_value("#message") == ""
    chat_id = await page.evaluate("document.body.dataset.chatId")
    assert re.fullmatch(r"[A-Za-z0-9_-]{24}", chat_id)
    assert [b.get("chat_id") for b in bodies] == [chat_id, chat_id]
    await page.reload()  # the thread is replayed, in order
    await _ended_turns(page, 2)
    assert [await u.inner_text() for u in await page.locator(".turn .user").all()] == users
    await page.click("#newchat")
    assert await page.locator(".turn").count() == 0
    assert await page.locator("#gatelog li").count() == 0
    await _start(page, "Hello again")
    await _ended_turns(page, 1)
    assert bodies[-1]["chat_id"] != chat_id
    assert bodies[-1]["chat_id"] == await page.evaluate("document.body.dataset.chatId")


async def test_stop_is_one_stopped_state_during_tools_and_between_rounds(browser):
    from toollatch import tool

    @tool
    async def nap(seconds: float) -> str:
        """Sleep (cancellable)."""
        await asyncio.sleep(seconds)
        return "rested"

    @tool
    def quick() -> str:
        """At once."""
        return "ok"

    nap_call = Call(call_id="call_nap", name="nap", arguments='{"seconds": 60}')
    quick_call = Call(call_id="call_quick", name="quick", arguments="{}")
    scripts = {
        "tools": Script(turns=(Turn(items=(nap_call,), delay_ms=0), Turn(items=(Text(text="."),)))),
        "rounds": Script(
            turns=(
                Turn(items=(quick_call,), delay_ms=0),
                Turn(items=(Text(text="late"),), delay_ms=60_000),  # before its first byte
            )
        ),
    }
    async with RelayServer(scripts=scripts, delay_scale=1, tools=[nap, quick]) as server:
        during = await _page(browser, server)
        await _slow_run(during, "tools")
        await during.locator('.card[data-call-id="call_nap"][data-state="running"]').wait_for()
        await during.click("#stop")
        between = await _page(browser, server)
        await _slow_run(between, "rounds")
        await between.locator('.round[data-round="2"] .thinking').wait_for()
        await between.click("#stop")
        for page in (during, between):
            await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
            for _ in range(2):  # as the page saw it, then replayed after a reload
                status = page.locator("#status")
                assert await status.get_attribute("data-state") == "stopped"
                assert (await status.inner_text()).startswith("stopped · ")
                assert await page.locator(".thinking").count() == 0
                await page.reload()
                await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        card = during.locator('.card[data-call-id="call_nap"]')
        assert await card.get_attribute("data-state") == "cancelled"
        foot = await card.locator(".foot").inner_text()
        assert foot == "stopped while running: it may already have had its effect"
        done = between.locator('.card[data-call-id="call_quick"]')
        assert await done.get_attribute("data-state") == "done"


HOSTILE = """# Weather

It is **cold** in *Oslo*, `4 °C` and snake_case_stays.

- first
- second, with [a link](https://example.com/x)

1. one
2. two

```py
print("<b>hi</b>")
```
<img src=x onerror="window.__pwned='img'"><script>window.__pwned='script'</script>
[click me](javascript:window.__pwned='link') [data](data:text/html,<b>x</b>) [rel](/runs)
<a href="javascript:window.__pwned='a'">raw</a> <iframe src="javascript:alert(1)"></iframe>
**<svg onload="window.__pwned='svg'">** _<img src=y onerror="window.__pwned='em'">_"""


async def test_markdown_is_rendered_and_hostile_markup_stays_inert(browser):
    turn = Turn(items=(Text(text=HOSTILE, chunk_chars=7),), delay_ms=1)
    async with RelayServer(scripts={"md": Script(turns=(turn,))}, delay_scale=1) as server:
        page = await _page(browser, server)
        dialogs: list[str] = []
        page.on("dialog", lambda d: dialogs.append(d.message))
        await _slow_run(page, "md")
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        text = page.locator(".round .text")
        assert await text.locator("h3").inner_text() == "Weather"
        assert await text.locator("strong").first.inner_text() == "cold"
        assert await text.locator("em").first.inner_text() == "Oslo"
        assert await text.locator("p code").inner_text() == "4 °C"
        assert "snake_case_stays" in await text.locator("p").first.inner_text()
        assert await text.locator("ul > li").count() == 2
        assert await text.locator("ol > li").count() == 2
        assert await text.locator("pre > code").inner_text() == 'print("<b>hi</b>")'
        links = await text.locator("a").all()
        assert len(links) == 1
        assert await links[0].get_attribute("href") == "https://example.com/x"
        assert await links[0].get_attribute("rel") == "noopener noreferrer"
        assert await links[0].inner_text() == "a link"
        hostile = "img, script, iframe, svg, b, [onerror], [onload]"
        assert await page.locator("#transcript").locator(hostile).count() == 0
        shown = await text.inner_text()
        assert "<img src=x onerror=" in shown and "<script>" in shown
        assert "[click me](javascript:window.__pwned='link')" in shown
        await text.get_by_text("click me", exact=False).click()
        await page.wait_for_timeout(200)
        assert await page.evaluate("window.__pwned") is None
        assert dialogs == []
