"""The example useChat app (examples/usechat, @ai-sdk/react's useChat bundled by esbuild) in
Chromium against `toollatch serve`'s POST /api/chat: tool parts go from streaming to
output-available with the committed input, and a reload mid-run resumes the stream
(useChat's `resume: true`, GET /api/chat/{id}/stream)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import pytest_asyncio

from node_helpers import ROOT, node_command
from relay_helpers import slow_script
from test_relay_browser import _need_chromium
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


async def open_app(chromium, relay: RelayServer, app: Path, model: str):
    """The app's page, served from the relay's own origin (the route answers its files)."""
    context = await chromium.new_context()

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
