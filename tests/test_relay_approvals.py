"""The relay's answers to waiting calls over real HTTP: ``approval_requested`` carries the
full committed arguments and a signed token; ``POST /runs/{id}/calls/{call_id}/approve``,
``deny`` and ``result`` answer it, checked against the session, the token and the runtime's
refusals (stable codes); edited arguments and ``always`` (revocable) over HTTP. A serve
SIGKILLed while a question waits: tests/test_relay_restore.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_helpers import Frame, parse_sse, read_events, start_run
from toollatch import ApprovalPolicy, schema_tool, tool
from toollatch.relay import RelayServer
from toollatch.scripted import Call, Script, Text, Turn

LONG = "x" * 600  # longer than any preview: the question must carry it whole

ASK = Script(
    turns=(
        Turn(
            items=(
                Call(call_id="call_w", name="write_file",
                     arguments=json.dumps({"path": "a.md", "content": LONG})),
                Call(call_id="call_c", name="pick_color", arguments='{"hint": "warm"}'),
            )
        ),
        Turn(items=(Text(text="Done."),)),
    )
)  # fmt: skip

ran: list[str] = []


@tool(needs_approval=True)
def write_file(path: str, content: str) -> str:
    """Write a file (the list proves how often it ran)."""
    ran.append(path)
    return f"wrote {len(content)} chars to {path}"


COLOR = schema_tool(
    "pick_color",
    {"type": "object", "properties": {"hint": {"type": "string"}}, "required": ["hint"]},
)  # no function: the client's tool


def relay(**extra: Any) -> RelayServer:
    return RelayServer(scripts={"ask": ASK}, delay_scale=0, tools=[write_file, COLOR], **extra)


async def until_asked(
    client: httpx.AsyncClient, url: str, n: int, *, or_end: bool = False
) -> list[Frame]:
    """The run's frames up to its ``n`` th question (the stream is left then); ``or_end``:
    all of them when the run ends first (else that fails the test)."""
    frames: list[Frame] = []
    buffer = ""
    async with client.stream("GET", url) as response:
        async for text in response.aiter_text():
            buffer += text
            *blocks, buffer = buffer.split("\n\n")
            for block in blocks:
                frames += parse_sse(block + "\n\n")[0]
            asked = [f for f in frames if f.event in ("approval_requested", "client_call")]
            if len(asked) >= n:
                return frames
    if or_end:
        return frames
    raise AssertionError(f"fewer than {n} questions: {[f.event for f in frames]}")


def answer(
    client: httpx.AsyncClient, run: dict[str, Any], call_id: str, action: str, **body: Any
) -> Any:
    return client.post(f"/runs/{run['id']}/calls/{call_id}/{action}", json=body)


async def test_approve_with_the_signed_token_runs_the_call_once_and_refusals_have_codes():
    ran.clear()
    async with relay() as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        run = await start_run(client, "go", model="ask")
        frames = await until_asked(client, run["events_url"], 2)
        asked = {f.data["id"]: f.data for f in frames if "token" in f.data}
        write, color = asked["call_w"], asked["call_c"]
        assert write["type"] == "approval_requested"
        assert write["arguments"] == {"path": "a.md", "content": LONG}  # whole, not a preview
        assert color["type"] == "client_call"
        assert len(write["token"]) == 64

        stranger = httpx.AsyncClient(base_url=server.url, headers={"x-toollatch-session": "s" * 43})
        async with stranger:
            other = await answer(stranger, run, "call_w", "approve", token=write["token"])
        assert (other.status_code, other.json()["error"]["code"]) == (404, "not_found")
        forged = await answer(client, run, "call_w", "approve", token=color["token"])
        assert (forged.status_code, forged.json()["error"]["code"]) == (
            403,
            "invalid_approval_token",
        )
        unasked = await answer(client, run, "call_x", "approve", token=write["token"])
        assert (unasked.status_code, unasked.json()["error"]["code"]) == (409, "not_asked")
        kind = await answer(client, run, "call_w", "result", token=write["token"], value="x")
        assert (kind.status_code, kind.json()["error"]["code"]) == (409, "wrong_kind")
        edit = await answer(
            client, run, "call_w", "approve", token=write["token"], args={"path": 3}
        )
        assert (edit.status_code, edit.json()["error"]["code"]) == (422, "edit_rejected")
        assert ran == []  # nothing refused ran anything

        ok = await answer(client, run, "call_w", "approve", token=write["token"])
        assert ok.status_code == 202, ok.text
        again = await answer(client, run, "call_w", "approve", token=write["token"])
        assert (again.status_code, again.json()["error"]["code"]) == (409, "already_answered")
        result = await answer(client, run, "call_c", "result", token=color["token"], value="red")
        assert result.status_code == 202, result.text

        frames = await read_events(client, run["events_url"])
    answered = [f.data for f in frames if f.event == "approval_answered"]
    assert [(a["id"], a["decision"]) for a in answered] == [
        ("call_w", "approved"),
        ("call_c", "result"),
    ]
    assert ran == ["a.md"]  # exactly once
    ended = frames[-1].data
    assert frames[-1].event == "run_ended" and ended["error"] is None
    calls = {c["id"]: c for c in ended["calls"]}
    assert not calls["call_w"]["is_error"] and not calls["call_c"]["is_error"]


async def test_deny_pairs_the_call_with_approval_denied_and_the_tool_never_runs():
    ran.clear()
    policy = ApprovalPolicy(timeout_s=60)
    async with (
        relay(approvals=policy) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        run = await start_run(client, "go", model="ask")
        frames = await until_asked(client, run["events_url"], 2)
        asked = {f.data["id"]: f.data for f in frames if "token" in f.data}
        assert asked["call_w"]["expires_at"] is not None  # the relay's policy reached the run
        bad = await answer(client, run, "call_w", "deny", token=asked["call_w"]["token"], x=1)
        assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_body")
        no = await answer(
            client, run, "call_w", "deny", token=asked["call_w"]["token"], reason="not today"
        )
        assert no.status_code == 202, no.text
        token_c = asked["call_c"]["token"]
        wrong = await answer(client, run, "call_c", "deny", token=token_c)
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "wrong_kind")
        result = await answer(client, run, "call_c", "result", token=token_c, value="blue")
        assert result.status_code == 202, result.text
        frames = await read_events(client, run["events_url"])
    finished = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    assert finished["call_w"]["error"] == "approval_denied"
    assert ran == []


async def test_the_secret_signs_the_token_and_must_be_long_enough():
    from toollatch import ConfigError
    from toollatch.ledger import approval_token

    secret = b"k" * 32
    async with (
        relay(approval_secret=secret) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        run = await start_run(client, "go", model="ask")
        frames = await until_asked(client, run["events_url"], 1)
        q = next(f.data for f in frames if "token" in f.data)
        assert q["token"] == approval_token(secret, q["name"], q["id"], q["args_sha256"])
        await client.post(f"/runs/{run['id']}/cancel", json={})
    with pytest.raises(ConfigError):
        async with relay(approval_secret=b"short"):
            pass


def test_serve_refuses_a_short_or_missing_secret(tmp_path: Path) -> None:
    import subprocess

    from relay_helpers import CLI

    config = tmp_path / "toollatch.yaml"
    config.write_text("relay:\n  approval_secret_env: NO_SUCH_KEY_SET\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_KEY_SET"}
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--config", str(config), "--ledger", "none"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert "NO_SUCH_KEY_SET" in done.stderr


CHAT = Script(
    turns=(
        Turn(
            items=(
                Call(call_id="call_w1", name="write_file",
                     arguments=json.dumps({"path": "yes.md", "content": "y"})),
                Call(call_id="call_w2", name="write_file",
                     arguments=json.dumps({"path": "no.md", "content": "n"})),
                Call(call_id="call_c", name="pick_color", arguments='{"hint": "warm"}'),
            )
        ),
        Turn(items=(Text(text="Done."),)),
    )
)  # fmt: skip


async def test_use_chat_approves_denies_and_runs_a_client_tool_through_the_real_ai_client():
    from node_helpers import node_command, run_node

    command = node_command("ui_message_approvals.mjs", "ai")
    ran.clear()
    server = RelayServer(scripts={"chat": CHAT}, delay_scale=0, tools=[write_file, COLOR])
    async with server:
        got = await run_node(
            command,
            {
                "url": server.url, "session": "c" * 43, "chatId": "chat-1", "text": "go",
                "model": "chat", "clientTool": "pick_color", "clientOutput": {"color": "red"},
                "approve": ["call_w1"], "deny": ["call_w2"],
            },
        )  # fmt: skip
        assert server.relay is not None
        run_id = await server.relay.chats.latest_run("c" * 43, "chat-1")
        headers = {"x-toollatch-session": "c" * 43}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
            frames = await read_events(client, f"/runs/{run_id}/events")
    assert got["error"] is None and got["status"] == "ready", got
    assert got["requests"] == 2  # the message, then the answers (one POST)
    assert ran == ["yes.md"]  # the approved call ran once; the denied one never
    assistant = got["messages"][-1]
    tools = {p["toolCallId"]: p for p in assistant["parts"] if "toolCallId" in p}
    assert tools["call_w1"]["state"] == "output-available"
    assert tools["call_w2"]["state"] == "output-denied"
    assert tools["call_c"]["state"] == "output-available"
    assert tools["call_c"]["output"] == {"color": "red"}
    texts = [p["text"] for p in assistant["parts"] if p["type"] == "text"]
    assert texts == ["Done."]
    finished = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    assert json.loads(finished["call_c"]["result"]) == {"color": "red"}  # the client's value
    assert finished["call_w2"]["error"] == "approval_denied"
    assert len(finished) == 3 and frames[-1].event == "run_ended"  # every call paired


@pytest.mark.parametrize("approved", [True, False])
async def test_agui_http_agent_runs_a_frontend_tool_and_answers_an_interrupt(approved):
    from node_helpers import node_command, run_node

    command = node_command("agui_approvals.mjs", "@ag-ui/client")
    ran.clear()
    script = Script(
        turns=(
            Turn(
                items=(
                    Call(call_id="call_w", name="write_file",
                         arguments=json.dumps({"path": "a.md", "content": "x"})),
                    Call(call_id="call_c", name="pick_color", arguments='{"hint": "warm"}'),
                )
            ),
            Turn(items=(Text(text="Done."),)),
        )
    )  # fmt: skip
    frontend = {
        "name": "pick_color",
        "description": "Ask the user for a color.",
        "parameters": {"type": "object", "properties": {"hint": {"type": "string"}}},
    }
    async with RelayServer(scripts={"a": script}, delay_scale=0, tools=[write_file]) as server:
        got = await run_node(
            command,
            {
                "url": server.url, "session": "g" * 43, "threadId": "t-1", "text": "go",
                "model": "a", "tool": frontend, "clientOutput": "red", "approved": approved,
            },
        )  # fmt: skip
        first, second = got["runs"]
        assert first["relayRun"] == second["relayRun"]  # one relay run, answered
        headers = {"x-toollatch-session": "g" * 43}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
            frames = await read_events(client, f"/runs/{first['relayRun']}/events")
    assert first["ok"] and second["ok"], (first["error"], second["error"])
    assert first["problems"] == [] and second["problems"] == []
    started = [e["toolCallName"] for e in first["wire"] if e["type"] == "TOOL_CALL_START"]
    assert started == ["write_file", "pick_color"]  # committed, then the run waits
    assert [i["toolCallId"] for i in got["interrupts"]] == ["call_w"]  # the person's call
    assert first["wire"][-1]["type"] == "RUN_FINISHED"
    results = {e["toolCallId"]: e["content"] for e in second["wire"]
               if e["type"] == "TOOL_CALL_RESULT"}  # fmt: skip
    assert "call_c" not in results  # (the client's own result is not sent back to it)
    assert second["wire"][-1]["type"] == "RUN_FINISHED"
    assert second["wire"][-1].get("outcome") is None
    texts = [e["delta"] for e in second["wire"] if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert texts == ["Done."]
    assert ran == (["a.md"] if approved else [])
    finished = {f.data["id"]: f.data for f in frames if f.event == "tool_finished"}
    assert finished["call_c"]["result"] == "red"  # the frontend tool's result reached the run
    assert finished["call_w"]["error"] == (None if approved else "approval_denied")


async def test_an_unanswered_call_expires_and_a_late_answer_is_refused():
    ran.clear()
    only = Script(
        turns=(
            Turn(items=(Call(call_id="call_w", name="write_file",
                             arguments='{"path": "late.md", "content": "x"}'),)),
            Turn(items=(Text(text="Too late."),)),
        )
    )  # fmt: skip
    server = RelayServer(
        scripts={"w": only}, delay_scale=0, tools=[write_file],
        approvals=ApprovalPolicy(timeout_s=0.5),
    )  # fmt: skip
    async with server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        run = await start_run(client, "go", model="w")
        frames = await read_events(client, run["events_url"])
        asked = next(f.data for f in frames if f.event == "approval_requested")
        late = await answer(client, run, "call_w", "approve", token=asked["token"])
    answered = [f.data for f in frames if f.event == "approval_answered"]
    assert [(a["id"], a["decision"]) for a in answered] == [("call_w", "expired")]
    finished = [f.data for f in frames if f.event == "tool_finished"]
    assert [(f["id"], f["error"]) for f in finished] == [("call_w", "approval_expired")]
    assert (late.status_code, late.json()["error"]["code"]) == (409, "run_not_running")
    assert ran == []


async def test_approve_with_edited_arguments_over_http_passes_the_gate_and_the_model_is_told():
    from toollatch.relay._requests import run_scope

    ran.clear()
    only = Script(
        turns=(
            Turn(items=(Call(call_id="call_w", name="write_file",
                             arguments='{"path": "asked.md", "content": "x"}'),)),
            Turn(items=(Text(text="Done."),)),
        )
    )  # fmt: skip
    server = RelayServer(scripts={"e": only}, delay_scale=0, tools=[write_file], ledger="memory:")
    async with server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        run = await start_run(client, "go", model="e")
        frames = await until_asked(client, run["events_url"], 1)
        token = next(f.data["token"] for f in frames if f.event == "approval_requested")
        bad = await answer(client, run, "call_w", "approve", token=token, args='{"path": 1}')
        assert (bad.status_code, bad.json()["error"]["code"]) == (422, "edit_rejected")
        edited = {"path": "edited.md", "content": "changed"}
        ok = await answer(client, run, "call_w", "approve", token=token, args=edited)
        assert ok.status_code == 202, ok.text
        frames = await read_events(client, run["events_url"])
        assert server.relay is not None
        session = client.headers["x-toollatch-session"]
        history = await server.relay.history.load(run_scope(session, run["id"]))  # type: ignore[union-attr]
    assert ran == ["edited.md"]  # the edited call ran, once; the asked one never
    answered = next(f.data for f in frames if f.event == "approval_answered")
    assert (answered["decision"], answered["edited"]) == ("approved", True)
    told = next(m["content"] for m in history if m.get("role") == "tool")
    assert "edited arguments" in told and '"path":"edited.md"' in told
    assert told.endswith("wrote 7 chars to edited.md")
    assert frames[-1].event == "run_ended" and frames[-1].data["error"] is None


async def test_always_over_http_runs_the_tool_unasked_in_the_run_until_revoked():
    import asyncio

    went_on = asyncio.Event()
    recorded: list[str] = []

    @tool(needs_approval=True)
    async def note(key: str) -> str:
        """Record key (the second call waits until the test revoked the always)."""
        recorded.append(key)
        if key == "b":
            await went_on.wait()
        return f"noted {key}"

    def call(n: str) -> Turn:
        return Turn(items=(Call(call_id=f"call_{n}", name="note", arguments=f'{{"key": "{n}"}}'),))

    script = Script(turns=(call("a"), call("b"), call("c"), Turn(items=(Text(text="ok"),))))
    async with (
        RelayServer(scripts={"n": script}, delay_scale=0, tools=[note]) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        run = await start_run(client, "go", model="n")
        frames = await until_asked(client, run["events_url"], 1)
        token = next(f.data["token"] for f in frames if f.event == "approval_requested")
        bad = await answer(client, run, "call_a", "approve", token=token, always="yes")
        assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_body")
        ok = await answer(client, run, "call_a", "approve", token=token, always=True)
        assert ok.status_code == 202, ok.text
        while recorded != ["a", "b"]:  # b ran without a question
            await asyncio.sleep(0.01)
        revoke = await client.post(f"/runs/{run['id']}/tools/note/revoke", json={})
        assert revoke.status_code == 202, revoke.text
        went_on.set()
        frames = await until_asked(client, run["events_url"], 2)  # c asks again
        asked = [f.data["id"] for f in frames if f.event == "approval_requested"]
        assert asked == ["call_a", "call_c"]
        token_c = next(
            f.data["token"] for f in frames if f.data.get("id") == "call_c" and "token" in f.data
        )
        no = await answer(client, run, "call_c", "deny", token=token_c, reason="not c")
        assert no.status_code == 202, no.text
        frames = await read_events(client, run["events_url"])
        gone = await client.post(f"/runs/{run['id']}/tools/note/revoke", json={})
    assert recorded == ["a", "b"]
    finished = {f.data["id"]: f.data["error"] for f in frames if f.event == "tool_finished"}
    assert finished == {"call_a": None, "call_b": None, "call_c": "approval_denied"}
    assert (gone.status_code, gone.json()["error"]["code"]) == (409, "run_not_running")
