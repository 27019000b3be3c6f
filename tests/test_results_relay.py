"""``toollatch serve``'s relay: its preview policy (secret-looking values as ``[redacted]``)
also masks what tools return, so a secret a tool returns reaches neither the model's next
request nor the browser's event stream."""

from __future__ import annotations

import json
from typing import Any

import httpx

from relay_helpers import read_events, start_run
from toollatch import tool
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, Text, Turn

SECRET = "sk-live-Q8d2F7s9K1m3N5p7"


@tool(side_effects="read")
def account(user: str) -> dict[str, Any]:
    """The account of a user, with its key."""
    return {"user": user, "api_key": SECRET, "plan": "pro"}


async def test_a_secret_a_tool_returns_reaches_neither_the_model_nor_the_browser():
    call = Call(call_id="c_acc", name="account", arguments='{"user": "ana"}')
    script = Script(turns=(Turn(items=(Text(text="Looking."), call), delay_ms=0),
                           Turn(items=(Text(text="Done."),), delay_ms=0)))  # fmt: skip
    async with RelayServer(scripts={"scripted": script}, tools=[account], delay_scale=0) as relay:
        async with httpx.AsyncClient(base_url=relay.url) as client:
            run = await start_run(client, "who am I?")
            frames = await read_events(client, run["events_url"])
        assert relay._scripted is not None
        requests = relay._scripted.requests
    assert [f.event for f in frames][-1] == "run_ended"
    assert [r.status for r in requests] == [200, 200]
    second = json.dumps(requests[1].body)
    assert SECRET not in second
    assert '\\"api_key\\":\\"[redacted]\\"' in second and '\\"plan\\":\\"pro\\"' in second
    assert SECRET not in json.dumps([f.data for f in frames])
