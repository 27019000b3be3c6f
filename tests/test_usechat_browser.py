"""The example useChat app (examples/usechat, @ai-sdk/react's useChat bundled by esbuild) in
Chromium against `toollatch serve`'s POST /api/chat: tool parts go from streaming to
output-available with the committed input, and a reload mid-run resumes the stream
(useChat's `resume: true`, GET /api/chat/{id}/stream).

Human approval (issue 32): a call the relay holds for a person shows as an
``approval-requested`` card with its name and full input; Approve / Deny answer it through
``addToolApprovalResponse`` (the tool runs once, or the model goes on with the denial); a
client tool (``get_location``, declared without a body) is answered by the page through
``onToolCall`` + ``addToolOutput`` (the browser's own geolocation); a reload while a call
waits resumes the stream up to the question, which can still be approved."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import pytest_asyncio

from node_helpers import ROOT, node_command
from relay_helpers import slow_script
from test_relay_browser import _need_chromium
from toollatch import schema_tool, tool
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, Text, Turn

pytestmark = pytest.mark.asyncio(loop_scope="module")
CHROMIUM = Path("/usr/bin/chromium")
TWO = Script(
    turns=(
        Turn(
            items=(
                Text(text="Checking both."),
                Call(call_id="c_osl", name="get_weather", arguments='{"city": "Oslo"}'),
                Call(
                    call_id="c_lim", name="get_weather", arguments='{"city": "Lima", "unit": "f"}'
                ),
            ),
        ),
    )
)


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    """The example app, built into a temporary folder."""
    node, _ = node_command("openai_compatible_client.mjs", "esbuild")
    out = tmp_path_factory.mktemp("usechat")
    subprocess.run(
        [node, str(ROOT / "examples" / "usechat" / "build.mjs"), str(out)],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chromium():
    _need_chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            await browser.close()


async def open_app(chromium, relay: RelayServer, app: Path, model: str, **options):
    """The app's page, served from the relay's own origin (the route answers its files);
    ``options`` go to the browser context (geolocation, permissions)."""
    context = await chromium.new_context(**options)

    async def serve_file(route):
        name = route.request.url.split("/usechat/", 1)[1].split("?", 1)[0] or "index.html"
        kind = "text/html" if name.endswith(".html") else "text/javascript"
        await route.fulfill(body=(app / name).read_bytes(), content_type=kind)

    await context.route(f"{relay.url}/usechat/**", serve_file)
    page = await context.new_page()
    await page.goto(f"{relay.url}/usechat/index.html?model={model}")
    return context, page


async def cards(page) -> list[dict]:
    found = []
    for card in await page.locator(".card").all():
        found.append(
            {
                "id": await card.get_attribute("data-call-id"),
                "state": await card.get_attribute("data-state"),
                "input": json.loads(await card.locator(".input").inner_text()),
            }
        )
    return found


async def test_the_tool_parts_reach_output_available_with_the_committed_input(chromium, app):
    async with RelayServer(scripts={"two": TWO}, delay_scale=0) as relay:
        context, page = await open_app(chromium, relay, app, "two")
        await page.fill("#message", "Weather in Oslo and Lima?")
        await page.click("#send")
        await page.wait_for_selector('.card[data-call-id="c_lim"][data-state="output-available"]')
        await page.wait_for_selector('main[data-status="ready"]', timeout=20_000)
        assert await cards(page) == [
            {"id": "c_osl", "state": "output-available", "input": {"city": "Oslo"}},
            {"id": "c_lim", "state": "output-available", "input": {"city": "Lima", "unit": "f"}},
        ]
        assert "Checking both." in await page.locator(".assistant .text").first.inner_text()
        await context.close()


async def test_a_reload_mid_run_resumes_the_stream(chromium, app):
    async with RelayServer(scripts={"slow": slow_script(delay_ms=40)}, delay_scale=2) as relay:
        context, page = await open_app(chromium, relay, app, "slow")
        await page.fill("#message", "Weather, slowly?")
        await page.click("#send")
        await page.wait_for_selector(".card", timeout=20_000)  # a call is streaming
        assert await page.locator('.card[data-state="output-available"]').count() == 0
        await page.reload()  # useChat({resume: true}) asks GET /api/chat/{id}/stream
        await page.wait_for_selector(
            '.card[data-call-id="call_slow_b"][data-state="output-available"]', timeout=60_000
        )
        states = {c["id"]: c["state"] for c in await cards(page)}
        assert states == {"call_slow_a": "output-available", "call_slow_b": "output-available"}
        await context.close()


# -- human approval and client tools -----------------------------------------------------------

ran: list[str] = []


@tool(needs_approval=True)
def write_file(path: str, content: str) -> str:
    """Write a file (a person approves it first; the list counts the runs)."""
    ran.append(path)
    Path(path).write_text(content, encoding="utf-8")
    return f"wrote {len(content)} chars"


LOCATION = schema_tool(
    "get_location", {"type": "object", "properties": {}}, description="Where the user is."
)  # no function: the page answers it
HERE = {"latitude": 59.91, "longitude": 10.75}
LOCATED = {"geolocation": HERE, "permissions": ["geolocation"]}


def writing(path: Path, *first: Call, after: str = "Written.") -> Script:
    """A turn asking to write ``path`` (and ``first``'s calls), then a final text."""
    content = "line\n" * 200  # longer than any preview: the card shows it whole
    call = Call(
        call_id="call_w", name="write_file",
        arguments=json.dumps({"path": str(path), "content": content}),
    )  # fmt: skip
    return Script(
        turns=(Turn(items=(Text(text="Asking."), call, *first)), Turn(items=(Text(text=after),)))
    )


def approval_relay(script: Script) -> RelayServer:
    return RelayServer(scripts={"s": script}, delay_scale=0, tools=[write_file, LOCATION])


async def asked(page, call_id: str) -> dict:
    """The card waiting for a person: its tool name and the full input it shows."""
    card = page.locator(f'.card[data-call-id="{call_id}"][data-state="approval-requested"]')
    await card.wait_for(timeout=20_000)
    await card.locator("button.approve").wait_for()
    return {
        "name": await card.locator(".name").inner_text(),
        "input": json.loads(await card.locator(".input").inner_text()),
    }


async def run_events(relay: RelayServer, context) -> list:
    """The relay's own events of the page's chat run (its session cookie, its chat id)."""
    import httpx

    from relay_helpers import read_events

    page = context.pages[0]
    session = next(c["value"] for c in await context.cookies() if c["name"] == "toollatch_session")
    chat_id = await page.evaluate("sessionStorage.getItem('usechat.id')")
    assert relay.relay is not None
    run_id = await relay.relay.chats.latest_run(session, chat_id)
    headers = {"x-toollatch-session": session}
    async with httpx.AsyncClient(base_url=relay.url, headers=headers, timeout=30) as client:
        return await read_events(client, f"/runs/{run_id}/events")


async def test_approving_a_call_runs_it_once_beside_a_client_tool(chromium, app, tmp_path):
    ran.clear()
    target = tmp_path / "approved.md"
    located = Call(call_id="call_l", name="get_location", arguments="{}")
    async with approval_relay(writing(target, located)) as relay:
        context, page = await open_app(chromium, relay, app, "s", **LOCATED)
        await page.fill("#message", "Write it, and where am I?")
        await page.click("#send")
        question = await asked(page, "call_w")
        assert question == {
            "name": "write_file",
            "input": {"path": str(target), "content": "line\n" * 200},
        }
        # the page answered its own tool; the run still waits for the person
        await page.wait_for_selector('.card[data-call-id="call_l"][data-state="output-available"]')
        await page.wait_for_selector('main[data-status="ready"]')
        assert ran == [] and not target.exists()
        await page.click('.card[data-call-id="call_w"] button.approve')
        await page.wait_for_selector('.card[data-call-id="call_w"][data-state="output-available"]')
        await page.wait_for_selector('.text:has-text("Written.")', timeout=20_000)
        await page.wait_for_selector('main[data-status="ready"]')
        output = await page.locator('.card[data-call-id="call_l"] .output').inner_text()
        frames = await run_events(relay, context)
        await context.close()
    assert ran == [str(target)]  # exactly once
    assert target.read_text() == "line\n" * 200
    assert json.loads(output) == HERE  # the browser's geolocation, from onToolCall
    finished = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    assert json.loads(finished["call_l"]["result"]) == HERE  # the page's value reached the run
    assert finished["call_w"]["error"] is None
    assert frames[-1].event == "run_ended" and frames[-1].data["error"] is None


async def test_denying_a_call_shows_output_denied_and_the_model_goes_on(chromium, app, tmp_path):
    ran.clear()
    target = tmp_path / "denied.md"
    async with approval_relay(writing(target, after="Not written, then.")) as relay:
        context, page = await open_app(chromium, relay, app, "s")
        await page.fill("#message", "Write it?")
        await page.click("#send")
        await asked(page, "call_w")
        await page.wait_for_selector('main[data-status="ready"]')
        await page.click('.card[data-call-id="call_w"] button.deny')
        await page.wait_for_selector('.card[data-call-id="call_w"][data-state="output-denied"]')
        await page.wait_for_selector('.text:has-text("Not written, then.")', timeout=20_000)
        frames = await run_events(relay, context)
        await context.close()
    assert ran == [] and not target.exists()
    finished = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    assert finished["call_w"]["error"] == "approval_denied"
    assert "denied on the page" in finished["call_w"]["result"]  # the person's reason


async def test_a_client_tool_alone_is_answered_by_the_page(chromium, app):
    script = Script(
        turns=(
            Turn(items=(Call(call_id="call_l", name="get_location", arguments="{}"),)),
            Turn(items=(Text(text="You are in Oslo."),)),
        )
    )
    async with approval_relay(script) as relay:
        context, page = await open_app(chromium, relay, app, "s", **LOCATED)
        await page.fill("#message", "Where am I?")
        await page.click("#send")
        await page.wait_for_selector('.text:has-text("You are in Oslo.")', timeout=20_000)
        await page.wait_for_selector('main[data-status="ready"]')
        card = page.locator('.card[data-call-id="call_l"]')
        assert await card.get_attribute("data-state") == "output-available"
        assert json.loads(await card.locator(".output").inner_text()) == HERE
        frames = await run_events(relay, context)
        await context.close()
    finished = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    assert json.loads(finished["call_l"]["result"]) == HERE


async def test_a_reload_while_a_call_waits_resumes_and_can_still_approve(chromium, app, tmp_path):
    ran.clear()
    target = tmp_path / "after_reload.md"
    async with approval_relay(writing(target)) as relay:
        context, page = await open_app(chromium, relay, app, "s")
        await page.fill("#message", "Write it?")
        await page.click("#send")
        first = await asked(page, "call_w")
        await page.reload()  # the question is found again on the resumed stream
        assert await asked(page, "call_w") == first
        await page.wait_for_selector('main[data-status="ready"]')
        await page.click('.card[data-call-id="call_w"] button.approve')
        await page.wait_for_selector('.card[data-call-id="call_w"][data-state="output-available"]')
        await page.wait_for_selector('.text:has-text("Written.")', timeout=20_000)
        await context.close()
    assert ran == [str(target)]
    assert target.read_text() == "line\n" * 200
