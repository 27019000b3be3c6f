"""Nothing unredacted reaches the browser: previews, committed arguments and the final
history all pass the relay's redaction policy (checked on the raw SSE bytes)."""

from __future__ import annotations

import json

import httpx
import pytest

from relay_helpers import parse_sse, start_run
from toollatch import PreviewPolicy, ToolPreview, tool
from toollatch.relay import RelayServer, default_previews, redact_secrets, shown_arguments
from toollatch.runtime import example_tools
from toollatch.scripted import Call, Script, Text, Turn

SECRET = "sk-live-0123456789abcdefghij"
CONTENT = "TOP-SECRET-FILE-BODY"


@tool
def login(user: str, api_key: str) -> str:
    """Log in.

    Args:
        user: Who.
        api_key: Their key.
    """
    return f"hello {user}"


def _script() -> Script:
    calls = (
        Call(
            call_id="c_login",
            name="login",
            fragment_chars=3,
            arguments=json.dumps({"user": "ana", "api_key": SECRET}),
        ),
        Call(
            call_id="c_note",
            name="write_file",
            fragment_chars=3,
            arguments=json.dumps({"path": "n.md", "note": SECRET, "content": CONTENT})[:-1].replace(
                ', "note": "' + SECRET + '"', ""
            )
            + "}",
        ),
        Call(
            call_id="c_echo",
            name="login",
            fragment_chars=3,
            arguments=json.dumps({"user": f"key {SECRET} inline", "api_key": "x"}),
        ),
    )
    return Script(
        turns=(
            Turn(items=(Text(text="ok"), *calls), delay_ms=0.0),
            Turn(items=(Text(text="done"),), delay_ms=0.0),
        )
    )


async def _raw_run(tmp_path, previews: PreviewPolicy | None) -> str:
    tools = [*example_tools(tmp_path), login]
    async with RelayServer(scripts={"s": _script()}, tools=tools, previews=previews) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
            run = await start_run(client, model="s")
            return (await client.get(run["events_url"])).text


async def test_secrets_and_hidden_fields_never_reach_the_browser(tmp_path):
    raw = await _raw_run(tmp_path, None)
    frames, _ = parse_sse(raw)
    assert frames[-1].data["error"] is None
    assert [c["is_error"] for c in frames[-1].data["calls"]] == [False, False, False]
    assert SECRET not in raw and CONTENT not in raw
    assert "sk-live" not in raw  # not even a prefix of it, from a half-streamed string
    committed = {f.data["id"]: f.data["arguments"] for f in frames if f.event == "call_committed"}
    assert committed == {
        "c_login": {"user": "ana", "api_key": "[redacted]"},
        "c_note": {"path": "n.md"},
        "c_echo": {"user": "[redacted]", "api_key": "[redacted]"},
    }
    previews = [f.data for f in frames if f.event == "call_preview" and f.data["id"] == "c_login"]
    shown = [d for p in previews for d in p["deltas"]]
    assert ["/user", "set", "ana"] in shown and ["/api_key", "set", "[redacted]"] in shown


async def test_the_check_sees_secrets_when_the_policy_lets_them_through(tmp_path):
    # the test above can fail: with no redactor and every field shown, they arrive
    raw = await _raw_run(tmp_path, PreviewPolicy(default=ToolPreview(mode="full")))
    assert SECRET in raw and CONTENT in raw


@pytest.mark.parametrize(
    ("pointer", "text", "shown"),
    [
        ("/api_key", "x", "[redacted]"),
        ("/password", "hunter2", "[redacted]"),
        ("/city", "Oslo", "Oslo"),
        ("/q", "AKIAABCDEFGHIJKLMNOP", "[redacted]"),
        ("/q", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIx", "[redacted]"),
        ("", "token", "token"),
    ],
)
def test_the_default_redactor(pointer, text, shown):
    assert redact_secrets(pointer, text) == shown


def test_shown_arguments_follow_the_tool_rule():
    policy = PreviewPolicy(
        tools={"t": ToolPreview(mode="fields", fields=("/a/b", "/c~1d", "/missing/x"))},
        redactor=redact_secrets,
    )
    arguments = {"a": {"b": [1, {"token": "t"}], "z": 2}, "c/d": "v", "e": 3}
    assert shown_arguments(policy, "t", arguments) == {
        "a": {"b": [1, {"token": "[redacted]"}]},
        "c/d": "v",
    }
    assert shown_arguments(policy, "other", arguments) == {}  # default rule: none
    assert shown_arguments(default_previews(), "write_file", {"path": "p", "content": "c"}) == {
        "path": "p"
    }
