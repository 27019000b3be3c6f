"""MCP tools go through the same result path: the example MCP server (a real process on
stdio) returns a credential and an oversized text; the next request to the scripted model
server carries neither the credential nor more than the budget, and the events say which
result was cut."""

from __future__ import annotations

import json
import logging

from mcp_helpers import stdio_server
from toollatch import Agent, PreviewPolicy, ResultLimits, RetryPolicy, RunLimits, model_client
from toollatch.mcp import McpToolSource
from toollatch.mcp._example_server import FAKE_SECRET
from toollatch.relay import redact_secrets
from toollatch.runtime import RedactedLog
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn


async def test_an_mcp_tool_result_is_redacted_and_cut_before_the_next_request(tmp_path, caplog):
    first = Turn(items=(Text(text="Fetching."),
                        Call(call_id="c_secret", name="secret", arguments="{}"),
                        Call(call_id="c_big", name="big", arguments='{"size": 300000}')),
                 delay_ms=0)  # fmt: skip
    done = Turn(items=(Text(text="ok"),), delay_ms=0)
    with caplog.at_level(logging.DEBUG):
        async with (
            McpToolSource([stdio_server(tmp_path, "ex")]) as source,
            ScriptedServer({"s": Script(turns=(first, done))}) as model,
        ):
            client = model_client("anthropic", model="s", base_url=model.base_url("anthropic"),
                                  retry=RetryPolicy(attempts=1))  # fmt: skip
            async with client:
                agent = Agent(
                    client, [], tool_source=source, run_limits=RunLimits(max_rounds=3),
                    previews=PreviewPolicy(redactor=redact_secrets), observers=[RedactedLog()],
                    result_limits=ResultLimits(tools={"big": 4096}),
                )  # fmt: skip
                events = [e.to_json() async for e in agent.run("go")]
            requests = model.requests
    assert [r.status for r in requests] == [200, 200]
    second = json.dumps(requests[1].body, ensure_ascii=False)
    assert FAKE_SECRET not in second and "[redacted]" in second
    assert "the first " in second and " of 300000 bytes are shown]" in second
    assert "0123456789" * 500 not in second  # no more than the 4 KiB budget of big
    finished = {e["id"]: e for e in events if e["type"] == "tool_finished"}
    assert finished["c_big"]["truncated_from"] == 300_000
    assert "truncated_from" not in finished["c_secret"]
    assert FAKE_SECRET not in json.dumps(events) and FAKE_SECRET not in caplog.text
