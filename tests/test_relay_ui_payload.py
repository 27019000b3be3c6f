"""Results in the UI (issue 31): a tool's UI payload (``ToolOutcome.ui``) reaches the
browser in ``tool_finished.ui``, redacted as previews are and bounded; the model-facing
text then stays out of the event (``RelayLimits.result_text``), and a tool without one
still shows its short redacted summary. Real HTTP on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from relay_helpers import read_events, served_run, serving, start_run
from toollatch import ConfigError, RelayLimits, ToolOutcome, tool
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, Text, Turn

SECRET = "sk-live-Q8d2F7s9K1m3N5p7"


@tool(side_effects="read")
def chart(city: str) -> ToolOutcome:
    """A chart of a city's weather, for people; numbers for the model."""
    return ToolOutcome(
        content={"city": city, "temps": [3, 4, 5], "note": "model-facing only"},
        ui={"kind": "chart", "title": f"{city} this week", "token": SECRET, "points": [3, 4, 5]},
    )


@tool(side_effects="read")
def huge() -> ToolOutcome:
    """A UI payload over the relay's bound."""
    return ToolOutcome(content="ok", ui={"blob": "x" * 5000})


@tool(side_effects="read")
def plain(city: str) -> dict[str, Any]:
    """No UI payload: its summary shows."""
    return {"city": city, "api_key": SECRET}


def _script() -> Script:
    calls = (
        Call(call_id="c_chart", name="chart", arguments='{"city": "Oslo"}'),
        Call(call_id="c_huge", name="huge", arguments="{}"),
        Call(call_id="c_plain", name="plain", arguments='{"city": "Oslo"}'),
    )
    return Script(
        turns=(Turn(items=calls, delay_ms=0), Turn(items=(Text(text="Done."),), delay_ms=0))
    )


async def _finished(limits: RelayLimits) -> dict[str, dict[str, Any]]:
    scripts = {"scripted": _script()}
    tools = [chart, huge, plain]
    async with RelayServer(scripts=scripts, tools=tools, delay_scale=0, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url) as client:
            run = await start_run(client, "go")
            frames = await read_events(client, run["events_url"])
    return {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}


async def test_a_ui_payload_reaches_the_browser_redacted_and_bounded_the_text_does_not():
    events = await _finished(RelayLimits(max_ui_bytes=4096))
    shown = events["c_chart"]
    assert shown["ui"] == {
        "kind": "chart",
        "title": "Oslo this week",
        "token": "[redacted]",
        "points": [3, 4, 5],
    }
    assert shown["result"] is None  # the model-facing content stays server-side
    assert "ui" not in events["c_huge"]
    assert events["c_huge"]["ui_omitted"] > 4096
    plain_shown = events["c_plain"]
    assert "ui" not in plain_shown and "ui_omitted" not in plain_shown
    assert plain_shown["result"] == '{"city":"Oslo","api_key":"[redacted]"}'
    assert SECRET not in repr(events)


async def test_result_text_always_and_never():
    always = await _finished(RelayLimits(result_text="always"))
    assert "model-facing only" in always["c_chart"]["result"]
    assert always["c_chart"]["ui"]["kind"] == "chart"
    never = await _finished(RelayLimits(result_text="never"))
    assert all(e["result"] is None for e in never.values())
    assert never["c_chart"]["ui"]["kind"] == "chart"


def test_result_text_and_max_ui_bytes_are_checked():
    with pytest.raises(ConfigError, match="result_text"):
        RelayLimits(result_text="all")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_ui_bytes"):
        RelayLimits(max_ui_bytes=0)


def _served(*args: str) -> tuple[dict[str, Any], int]:
    """``serve`` with ``args`` running the demo: its ``write_file`` call's ``tool_finished``
    (the example tool returns a UI payload), and the status of a 3 KB ``POST /api/chat``."""
    with serving("--ledger", "none", *args) as url:
        _, frames = served_run(url, "weather in Oslo and Zurich, saved to a file")
        names = {f.data["id"]: f.data["name"] for f in frames if f.event == "call_committed"}
        finished = [
            f.data
            for f in frames
            if f.event == "tool_finished" and names.get(f.data["id"]) == "write_file"
        ]
        user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "y" * 3000}]}
        body = {"id": "big", "messages": [user], "trigger": "submit-message"}
        with httpx.Client(base_url=url, timeout=60) as client:
            status = client.post("/api/chat", json=body).status_code
    assert len(finished) == 1
    return finished[0], status


async def test_serve_takes_the_browser_bounds_from_flags_and_environment(monkeypatch):
    """``relay.max_ui_bytes``, ``relay.result_text``, ``relay.max_chat_body_bytes``: config
    keys, ``serve`` flags, ``TOOLLATCH_RELAY__`` variables."""
    shown, status = await asyncio.to_thread(_served)
    assert shown["ui"]["kind"] == "file_written" and shown["result"] is None  # (summary)
    assert status == 200
    flags = ("--max-ui-bytes", "10", "--result-text", "always", "--max-chat-body-bytes", "2048")
    shown, status = await asyncio.to_thread(_served, *flags)
    assert "ui" not in shown and shown["ui_omitted"] > 10
    assert isinstance(shown["result"], str) and shown["result"]
    assert status == 413
    monkeypatch.setenv("TOOLLATCH_RELAY__MAX_UI_BYTES", "10")
    monkeypatch.setenv("TOOLLATCH_RELAY__RESULT_TEXT", "never")
    monkeypatch.setenv("TOOLLATCH_RELAY__MAX_CHAT_BODY_BYTES", "2048")
    shown, status = await asyncio.to_thread(_served)
    assert "ui" not in shown and shown["ui_omitted"] > 10 and shown["result"] is None
    assert status == 413
