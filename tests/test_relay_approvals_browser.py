"""The relay's page answers a call that waits for a person: the card shows the FULL
committed arguments (not the preview) with Approve / Deny; Approve runs the tool once
(Playwright driving Debian's Chromium, as tests/test_relay_browser.py; skips without it)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from toollatch import tool
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, Text, Turn

CHROMIUM = Path("/usr/bin/chromium")
LONG = "line of text " * 80
ran: list[str] = []


@tool(needs_approval=True)
def write_file(path: str, content: str) -> str:
    """Write a file (the list proves how often it ran)."""
    ran.append(path)
    return "ok"


def script(call_id: str) -> Script:
    args = json.dumps({"path": "notes.md", "content": LONG})
    first = Turn(items=(Call(call_id=call_id, name="write_file", arguments=args),))
    return Script(turns=(first, Turn(items=(Text(text="Written."),))))


@asynccontextmanager
async def relay_page() -> AsyncIterator[Any]:
    """A Chromium page on a fresh relay's page (skips without Chromium; fails under CI)."""
    if not CHROMIUM.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {CHROMIUM} is missing")
        pytest.skip(f"{CHROMIUM} not installed")
    from playwright.async_api import async_playwright

    ran.clear()
    server = RelayServer(scripts={"scripted": script("call_w")}, delay_scale=0, tools=[write_file])
    async with server, async_playwright() as p:
        chromium = await p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            page = await chromium.new_page()
            await page.goto(server.url + "/")
            yield page
        finally:
            await chromium.close()


@pytest.mark.parametrize("button", ["approve", "deny"])
async def test_the_card_shows_the_full_arguments_and_approve_or_deny_answers(button):
    async with relay_page() as page:
        await page.fill("#message", "write it down")
        await page.click("#send")
        card = page.locator('.card[data-call-id="call_w"][data-state="awaiting"]')
        await card.wait_for(timeout=20_000)
        shown = json.loads(await card.locator("pre.args").inner_text())
        assert shown == {"path": "notes.md", "content": LONG}  # whole, not a preview
        assert ran == []
        await card.locator(f"button.{button}").click()
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        assert await page.locator(".card .approval").count() == 0
    assert ran == (["notes.md"] if button == "approve" else [])


async def test_always_on_the_card_skips_the_next_runs_question_until_revoked_on_the_page():
    """The card's "Always (this session)" approves and lists the tool in the header; the
    session's next chat runs it unasked; its revoke button makes the next one ask again."""
    async with relay_page() as page:

        async def chat() -> None:
            await page.click("#newchat")
            await page.fill("#message", "write it down")
            await page.click("#send")

        await chat()
        card = page.locator('.card[data-call-id="call_w"][data-state="awaiting"]')
        await card.wait_for(timeout=20_000)
        await card.locator("button.always").click()
        revoke = page.locator('#always button.revoke[data-tool="write_file"]')
        await revoke.wait_for(timeout=20_000)
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        assert ran == ["notes.md"]

        await chat()  # a new chat of the same session: not asked
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
        assert ran == ["notes.md", "notes.md"]
        assert await page.locator(".card .approval").count() == 0

        await revoke.click()
        await revoke.wait_for(state="detached", timeout=20_000)
        await chat()  # asked again
        await card.wait_for(timeout=20_000)
        await card.locator("button.deny").click()
        await page.wait_for_selector('body[data-run="ended"]', timeout=20_000)
    assert ran == ["notes.md", "notes.md"]
