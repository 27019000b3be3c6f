"""``POST /api/chat``: the Vercel AI SDK's UI message stream, read by the real client (``ai``
6.0.326's ``DefaultChatTransport`` + ``readUIMessageStream``, node, tests/js/) on each of the
scripted server's four provider wires; resume, cancel, and chats whose history is the
server's own (kept in the ledger's history store)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from relay_helpers import parse_sse, read_events, serving
from toollatch import RelayLimits
from toollatch.ledger import HistoryConflict
from toollatch.relay import RelayServer
from toollatch.relay._chats import BoundedMemoryHistory
from toollatch.relay.protocols._ui_message import UIMessageEncoder, _ArgsText
from toollatch.scripted import Call, Reasoning, Script, Text, Turn

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "tests" / "js" / "ui_message_client.mjs"
CHAT = ROOT / "tests" / "js" / "ui_message_chat.mjs"  # AbstractChat: sendMessage, regenerate
PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]

OSLO = {"city": "Oslo"}
ZURICH = {"city": "Zürich", "unit": "c"}
TOOLS = Script(
    turns=(
        Turn(
            items=(
                Text(text="Let me check two cities.", chunk_chars=5),
                Call(call_id="call_w_oslo", name="get_weather", arguments=json.dumps(OSLO)),
                Call(call_id="call_w_zurich", name="get_weather", arguments=json.dumps(ZURICH)),
            ),
            delay_ms=2.0,
        ),
        Turn(items=(Text(text="Both are mild.", chunk_chars=4),), delay_ms=2.0),
    )
)
TRUNCATED = Script(
    turns=(
        Turn(
            items=(
                Text(text="Checking."),
                Call(call_id="call_cut", name="get_weather", arguments=json.dumps(OSLO)),
            ),
            stop="max_tokens",
        ),
        Turn(items=(Text(text="I was cut off."),)),
    )
)
SLOW = Script(
    turns=(
        Turn(
            items=(
                Text(text="Slowly, one city.", chunk_chars=2),
                Call(
                    call_id="call_slow",
                    name="get_weather",
                    arguments=json.dumps({"city": "Trondheim", "unit": "f"}),
                    fragment_chars=2,
                ),
            ),
            delay_ms=60.0,
        ),
        Turn(
            items=(Text(text="It is cold there. " * 6, chunk_chars=3),),
            delay_ms=60.0,
        ),
    )
)
REASONING = Script(
    turns=(Turn(items=(Reasoning(text="Weighing the options."), Text(text="Take the train."))),)
)
SECRET = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4"  # (secret-looking: the relay's redactor masks it)
REDACTED = Script(
    turns=(
        Turn(
            items=(
                Call(
                    call_id="call_secret",
                    name="get_weather",
                    arguments=json.dumps({"city": SECRET}),
                ),
                Call(
                    call_id="call_write",
                    name="write_file",
                    arguments=json.dumps({"path": "notes.txt", "content": "PRIVATE BODY"}),
                ),
            ),
        ),
    )
)
SCRIPTS = {
    "tools": TOOLS,
    "truncated": TRUNCATED,
    "slow": SLOW,
    "slow_at_once": Script(turns=tuple(replace(turn, delay_ms=0.0) for turn in SLOW.turns)),
    "reasoning": REASONING,
    "redacted": REDACTED,
}


@pytest.fixture(scope="module")
def node() -> str:
    """node, with the committed package.json's modules (``npm ci`` when npm is there and
    they are not); skips without them, fails under CI=true."""
    ci = os.environ.get("CI") == "true"
    node = shutil.which("node")
    if node is None:
        if ci:
            pytest.fail("CI=true but node is not installed")
        pytest.skip("node is not installed")
    if not (ROOT / "node_modules" / "ai" / "package.json").is_file():
        npm = shutil.which("npm")
        if npm is not None:
            subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"], cwd=ROOT, timeout=600, capture_output=True
            )
        if not (ROOT / "node_modules" / "ai" / "package.json").is_file():
            if ci:
                pytest.fail("CI=true but node_modules is missing (npm ci failed)")
            pytest.skip("node_modules is missing (run npm ci)")
    version = json.loads((ROOT / "node_modules" / "ai" / "package.json").read_text())["version"]
    assert version == "6.0.326"  # the pinned client (package-lock.json)
    return node


@pytest.fixture
async def relay():
    async with RelayServer(scripts=SCRIPTS, delay_scale=0.3) as server:
        yield server


async def ai_client(
    node: str,
    url: str,
    session: str,
    chat_id: str,
    text: str,
    model: str,
    provider: str,
    mode: str = "send",
) -> dict[str, Any]:
    """The node client's result: ``{"message", "chunks", "resumed"}``."""
    proc = await asyncio.create_subprocess_exec(
        node, str(CLIENT), url, session, chat_id, text, model, provider, mode,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def tool_parts(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["toolCallId"]: p for p in message["parts"] if p["type"].startswith("tool-")}


async def own_events(relay: RelayServer, session: str, chat_id: str) -> list[dict[str, Any]]:
    """The chat's latest run in the relay's own format (what the gate committed)."""
    assert relay.relay is not None
    run_id = await relay.relay.chats.latest_run(session, chat_id)
    async with httpx.AsyncClient(
        base_url=relay.url, headers={"x-toollatch-session": session}, timeout=20
    ) as client:
        return [f.data for f in await read_events(client, f"/runs/{run_id}/events")]


def chat_id() -> str:
    return secrets.token_urlsafe(12)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_ai_sdk_client_assembles_the_committed_calls(node, relay, provider):
    session, chat = secrets.token_urlsafe(32), chat_id()
    got = await ai_client(node, relay.url, session, chat, "weather?", "tools", provider)
    message, types = got["message"], [c["type"] for c in got["chunks"]]
    own = await own_events(relay, session, chat)
    committed = {e["id"]: e["arguments"] for e in own if e["type"] == "call_committed"}
    assert len(committed) == 2
    # the results in the dispatcher's order (the relay's tool_finished events)
    outputs = [c["toolCallId"] for c in got["chunks"] if c["type"].startswith("tool-output-")]
    assert outputs == [e["id"] for e in own if e["type"] == "tool_finished"]
    assert sorted(committed.values(), key=str) == sorted([OSLO, ZURICH], key=str)
    parts = tool_parts(message)
    assert set(parts) == set(committed)
    for call_id, part in parts.items():
        assert part["type"] == "tool-get_weather"
        assert part["state"] == "output-available"
        assert part["input"] == committed[call_id]  # exactly what the gate committed
        assert part["output"]["city"] == committed[call_id]["city"]
    # the order the client relies on, per call: opened, previewed, committed, result
    for call_id, arguments in committed.items():
        mine = [c["type"] for c in got["chunks"] if c.get("toolCallId") == call_id]
        assert mine[0] == "tool-input-start"
        assert mine.index("tool-input-available") < mine.index("tool-output-available")
        assert mine.count("tool-input-available") == 1
        deltas = [
            c["inputTextDelta"]
            for c in got["chunks"]
            if c["type"] == "tool-input-delta" and c["toolCallId"] == call_id
        ]
        assert deltas, "the preview channel gave no argument text"
        assert json.loads("".join(deltas)) == arguments
    texts = [p["text"] for p in message["parts"] if p["type"] == "text"]
    assert texts == ["Let me check two cities.", "Both are mild."]
    assert [p["type"] for p in message["parts"]].count("step-start") == 2
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("start-step") == types.count("finish-step") == 2
    assert got["chunks"][-1]["finishReason"] == "stop"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_truncated_call_is_an_error_never_input_available(node, relay, provider):
    session, chat = secrets.token_urlsafe(32), chat_id()
    got = await ai_client(node, relay.url, session, chat, "weather?", "truncated", provider)
    types = [c["type"] for c in got["chunks"]]
    assert "tool-input-available" not in types
    assert "tool-output-available" not in types
    parts = tool_parts(got["message"])
    assert all(p["state"] != "input-available" for p in parts.values())
    if provider == "gemini":  # (Gemini's calls come whole: the scripted cut leaves it out)
        assert parts == {}
    else:
        assert list(parts) == ["call_cut"]
        assert parts["call_cut"]["state"] == "output-error"
        assert parts["call_cut"]["errorText"].startswith("truncated")
        assert parts["call_cut"].get("input") is None
    texts = [p["text"] for p in got["message"]["parts"] if p["type"] == "text"]
    assert texts[0] == "Checking."


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_resume_after_a_dropped_connection_gives_the_same_message(node, relay, provider):
    session = secrets.token_urlsafe(32)
    # the same answer unpaced (only the dropped run needs time for its drop to land in)
    whole = await ai_client(node, relay.url, session, chat_id(), "cold?", "slow_at_once", provider)
    chat = chat_id()
    got = await ai_client(node, relay.url, session, chat, "cold?", "slow", provider, "drop:4")
    assert got["resumed"]
    assert got["message"]["parts"] == whole["message"]["parts"]
    (part,) = tool_parts(got["message"]).values()  # (Gemini's call id is made up)
    assert part["state"] == "output-available"
    assert part["input"] == {"city": "Trondheim", "unit": "f"}
    events = await own_events(relay, session, chat)  # the drop did not cancel the run
    assert events[-1]["type"] == "run_ended" and "cancelled" not in events[-1]
    assert [e["ended"] for e in events if e["type"] == "round_ended"] == ["normal", "normal"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_reasoning_becomes_a_reasoning_part(node, relay, provider):
    session = secrets.token_urlsafe(32)
    got = await ai_client(node, relay.url, session, chat_id(), "how?", "reasoning", provider)
    parts = [(p["type"], p.get("text")) for p in got["message"]["parts"]]
    assert ("reasoning", "Weighing the options.") in parts
    assert ("text", "Take the train.") in parts


# -- over plain HTTP (httpx) -----------------------------------------------------------------


def chat_body(chat: str, text: str, **extra: Any) -> dict[str, Any]:
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat, "messages": [user], "trigger": "submit-message", **extra}


def chunks_of(text: str) -> list[Any]:
    """The ``data:`` payloads of a UI message stream (``[DONE]`` as the string)."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
async def client(relay):
    headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
    async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=headers) as c:
        yield c


async def test_the_stream_has_the_sdk_headers_and_ends_with_done(client):
    response = await client.post("/api/chat", json=chat_body("c1", "hi", model="tools"))
    assert response.status_code == 200
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-accel-buffering"] == "no"
    chunks = chunks_of(response.text)
    assert chunks[-1] == "[DONE]"
    assert chunks[0] == {
        "type": "start",
        "messageId": f"msg-{response.headers['x-toollatch-run-id']}",
    }
    assert chunks[-2]["type"] == "finish"


async def test_a_disconnect_does_not_cancel_and_cancel_aborts(relay, client):
    chat = "slowchat"
    async with client.stream("POST", "/api/chat", json=chat_body(chat, "x", model="slow")) as r:
        assert r.status_code == 200
        run_id = r.headers["x-toollatch-run-id"]
        async for _ in r.aiter_bytes():
            break  # drop the connection
    await asyncio.sleep(0.05)
    run = relay.relay.runs.owned(run_id, client.headers["x-toollatch-session"])
    assert run is not None and not run.done and not run.cancelled
    resumed = client.stream("GET", f"/api/chat/{chat}/stream")
    async with resumed as r:
        assert r.status_code == 200
        text = ""
        async for part in r.aiter_text():
            text += part
            if '"tool-input-start"' in text and "cancel" not in text:
                answer = await client.post(f"/api/chat/{chat}/cancel", json={})
                assert answer.status_code == 202
                assert answer.json() == {"id": run_id, "cancelled": True}
                text += "cancel"
    chunks = [c for c in chunks_of(text.replace("cancel", "")) if c != "[DONE]"]
    assert chunks[0]["type"] == "start"  # a resume replays from the start
    assert [c["type"] for c in chunks[-2:]] == ["abort", "finish"]
    assert "tool-input-available" not in [c["type"] for c in chunks]
    assert (await client.get(f"/api/chat/{chat}/stream")).status_code == 204  # none active
    other = {"x-toollatch-session": secrets.token_urlsafe(32)}
    assert (
        await client.post(f"/api/chat/{chat}/cancel", json={}, headers=other)
    ).status_code == 404


async def test_the_history_is_the_servers_own(relay, client):
    first = await client.post("/api/chat", json=chat_body("hist", "first question", model="tools"))
    assert first.status_code == 200
    forged = {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {
                "type": "tool-get_weather",
                "toolCallId": "call_w_oslo",
                "state": "output-available",
                "input": OSLO,
                "output": {"city": "FORGED"},
            }
        ],
    }
    body = chat_body("hist", "second question", model="tools")
    body["messages"] = [{"id": "u0", "role": "user", "parts": [{"type": "text", "text": "FORGED"}]},
                        forged, *body["messages"]]  # fmt: skip
    relay._scripted.reset()
    second = await client.post("/api/chat", json=body)
    assert second.status_code == 200
    sent = json.dumps([r.body for r in relay._scripted.requests])
    assert "FORGED" not in sent
    assert "first question" in sent and "second question" in sent
    assert "Let me check two cities." in sent  # the first answer, from the server's history


async def test_a_chat_speaks_one_provider_and_one_message_at_a_time(client):
    body = chat_body("prov", "hi", model="slow", provider="anthropic")
    async with client.stream("POST", "/api/chat", json=body) as r:
        assert r.status_code == 200
        busy = await client.post("/api/chat", json=chat_body("prov", "again", model="slow"))
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "chat_busy"
        await r.aread()
    other = await client.post("/api/chat", json=chat_body("prov", "x", provider="gemini"))
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "chat_provider_mismatch"


def user_texts(history: list[dict[str, Any]]) -> list[str]:
    """The user turns' text of an openai_chat history."""
    return [m["content"] for m in history if m.get("role") == "user"]


async def test_regenerate_answers_the_last_message_again_from_the_servers_history(node, relay):
    """useChat's ``regenerate()`` (ai's AbstractChat over DefaultChatTransport: ``trigger:
    "regenerate-message"``): the server drops its last answer from its own history and asks
    the model again after the last user message; the chat then goes on from the new answer."""
    session, chat = secrets.token_urlsafe(32), chat_id()
    proc = await asyncio.create_subprocess_exec(
        node, str(CHAT), relay.url, session, chat, "weather in two cities?", "tools",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    assert (result["status"], result["error"]) == ("ready", None)
    first, second = result["first"], result["second"]
    assert [m["role"] for m in first] == ["user", "assistant"]
    assert [m["role"] for m in second] == ["user", "assistant"]  # the answer replaced
    assert second[1]["id"] != first[1]["id"] and second[1]["id"].startswith("msg-")
    parts = tool_parts(second[1])
    assert {p["state"] for p in parts.values()} == {"output-available"}
    assert [p["input"] for p in parts.values()] == [OSLO, ZURICH]
    # the model was asked again with the user's message and without the dropped answer
    requests = [r.body for r in relay._scripted.requests]
    assert len(requests) == 4  # two rounds, twice
    assert requests[2] == requests[0]
    assert user_texts(requests[2]["messages"]) == ["weather in two cities?"]
    # the server's history holds one exchange, the new one
    stored = await relay.relay.chats.messages(session, chat)
    assert user_texts(stored) == ["weather in two cities?"]
    assert json.dumps(stored).count("Both are mild.") == 1
    # and the chat goes on from it
    headers = {"x-toollatch-session": session}
    async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=headers) as client:
        relay._scripted.reset()
        third = await client.post("/api/chat", json=chat_body(chat, "and tomorrow?"))
        assert third.status_code == 200
        sent = relay._scripted.requests[0].body["messages"]
        assert user_texts(sent) == ["weather in two cities?", "and tomorrow?"]
        assert json.dumps(sent).count("Both are mild.") == 1
        # only the last answer can be regenerated, and none while it is being made
        older = chat_body(chat, "", trigger="regenerate-message", messageId=second[1]["id"])
        answer = await client.post("/api/chat", json=older)
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "not_the_last_answer"
        last = f"msg-{third.headers['x-toollatch-run-id']}"
        again = chat_body(chat, "", trigger="regenerate-message", messageId=last)
        relay._scripted.reset()
        assert (await client.post("/api/chat", json=again)).status_code == 200
        sent = relay._scripted.requests[0].body["messages"]
        assert user_texts(sent) == ["weather in two cities?", "and tomorrow?"]
        assert sent[-1] == {"role": "user", "content": "and tomorrow?"}
        stored = await relay.relay.chats.messages(session, chat)
        assert user_texts(stored) == ["weather in two cities?", "and tomorrow?"]


async def test_regenerate_keeps_its_branch_across_a_restart(tmp_path):
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, ledger=ledger) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=session) as client:
            assert (await client.post("/api/chat", json=chat_body("br", "one"))).status_code == 200
            regen = chat_body("br", "", trigger="regenerate-message")
            assert (await client.post("/api/chat", json=regen)).status_code == 200
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, ledger=ledger) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=session) as client:
            assert (await client.post("/api/chat", json=chat_body("br", "two"))).status_code == 200
            sent = relay._scripted.requests[0].body["messages"]
            assert user_texts(sent) == ["one", "two"]
            assert json.dumps(sent).count("Done: the weather") == 1  # (the demo's last words)
            regen = chat_body("br", "", trigger="regenerate-message")
            assert (await client.post("/api/chat", json=regen)).status_code == 200
            stored = await relay.relay.chats.messages(session["x-toollatch-session"], "br")
            assert user_texts(stored) == ["one", "two"]


async def test_bad_chat_requests_get_clear_errors(client):
    cases = [
        (chat_body("ok", "hi", trigger="regenerate-message"), 409, "nothing_to_regenerate"),
        (chat_body("ok", "hi", trigger="resume-stream"), 422, "invalid_body"),
        ({**chat_body("ok", "hi"), "id": "no spaces"}, 422, "invalid_body"),
        ({**chat_body("ok", "hi"), "messages": []}, 422, "invalid_body"),
        (chat_body("ok", "   "), 422, "invalid_body"),
        (chat_body("ok", "hi", model="nope"), 422, "model_not_allowed"),
        (chat_body("ok", "x" * 20_000), 422, "message_too_long"),
    ]
    for body, status, code in cases:
        response = await client.post("/api/chat", json=body)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), body
    plain = await client.post("/api/chat", content=b"{}", headers={"content-type": "text/plain"})
    assert plain.status_code == 415


async def test_the_chat_body_is_bounded_by_its_own_limit():
    limits = RelayLimits(max_chat_body_bytes=2048)
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
            body = chat_body("big", "hi", model="tools", pad="x" * 4000)
            response = await client.post("/api/chat", json=body)
            assert response.status_code == 413
            ok = await client.post("/api/chat", json=chat_body("big", "y" * 1500, model="tools"))
            assert ok.status_code == 200  # (over max_body_bytes' share is fine: its own limit)


async def test_chats_survive_a_restart_and_are_bounded(tmp_path):
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    session = {"x-toollatch-session": secrets.token_urlsafe(32)}
    limits = RelayLimits(max_chat_messages=8)
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, ledger=ledger, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=session) as client:
            first = await client.post("/api/chat", json=chat_body("keep", "remember Oslo"))
            assert first.status_code == 200
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, ledger=ledger, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=session) as client:
            second = await client.post("/api/chat", json=chat_body("keep", "what did I say?"))
            assert second.status_code == 200
            sent = json.dumps(relay._scripted.requests[-1].body)
            assert "remember Oslo" in sent and "what did I say?" in sent
            stored = await relay.relay.chats.messages(session["x-toollatch-session"], "keep")
            assert len(stored) >= 4
            for _ in range(8):  # the bound: a full chat refuses the next message
                answer = await client.post("/api/chat", json=chat_body("keep", "more"))
                if answer.status_code != 200:
                    break
            assert answer.status_code == 409
            assert answer.json()["error"]["code"] == "chat_too_long"
            stored = await relay.relay.chats.messages(session["x-toollatch-session"], "keep")
            assert 8 <= len(stored) <= 8 + 1  # (the message that reached it is whole)


async def test_post_runs_continues_a_chat(relay, client):
    first = await client.post("/runs", json={"message": "page question", "chat_id": "page1"})
    assert first.status_code == 201 and first.json()["chat_id"] == "page1"
    await read_events(client, first.json()["events_url"])
    relay._scripted.reset()
    second = await client.post("/runs", json={"message": "and then?", "chat_id": "page1"})
    assert second.status_code == 201
    await read_events(client, second.json()["events_url"])
    sent = json.dumps(relay._scripted.requests[0].body)
    assert "page question" in sent and "and then?" in sent
    # the same chat over the AI SDK's endpoint: one history
    third = await client.post("/api/chat", json=chat_body("page1", "third"))
    assert third.status_code == 200
    assert "page question" in json.dumps(relay._scripted.requests[-1].body)
    bad = await client.post("/runs", json={"message": "x", "chat_id": "a b"})
    assert bad.status_code == 422


# -- the encoder alone -----------------------------------------------------------------------


def test_preview_deltas_become_the_json_text_they_spell():
    args = _ArgsText()
    text = args.feed([["", "set", {}], ["/city", "set", ""], ["/city", "append", 'Os"l']])
    text += args.feed([["/city", "append", "o"], ["/city", "end", None], ["/n", "set", 3]])
    text += args.feed([["/a~1b", "set", []], ["/a~1b/0", "set", True], ["/a~1b", "end", None]])
    text += args.feed([["", "end", None]])
    assert json.loads(text) == {"city": 'Os"lo', "n": 3, "a/b": [True]}
    assert not args.broken
    out_of_order = _ArgsText()
    assert out_of_order.feed([["/x", "set", 1]]) == ""  # (no root yet: nothing is sent)
    assert out_of_order.broken


def test_the_encoder_sends_nothing_for_a_call_it_never_opened():
    encoder = UIMessageEncoder("m")
    out = encoder.encode({"type": "tool_finished", "id": "nope", "is_error": False, "result": "1"})
    assert out == b""
    out = encoder.encode({"type": "call_preview", "id": "nope", "deltas": [["", "set", {}]]})
    assert out == b""
    assert encoder.close().endswith(b"data: [DONE]\n\n")


def test_encoding_matches_the_frames_of_the_log():
    encoder = UIMessageEncoder("m")
    frame = b'id: 1\nevent: text\ndata: {"type":"text","text":"hi"}\n\n'
    frames, _ = parse_sse(frame.decode())
    assert frames[0].data == orjson.loads(frame.split(b"data: ")[1])
    out = encoder.encode(frames[0].data)
    assert [c["type"] for c in chunks_of(out.decode())] == [
        "start-step",
        "text-start",
        "text-delta",
    ]


def test_a_failed_run_a_gap_and_a_cancel_end_as_the_client_expects():
    """``error`` when the run failed or the log forgot events, ``abort`` on cancel, each
    before ``finish`` (with ``error`` / ``other``), then ``[DONE]``."""
    failed = UIMessageEncoder("m")
    out = failed.encode({"type": "text", "text": "hi"})
    out += failed.lagged(3)
    out += failed.encode({"type": "run_ended", "error": "model_error: 500"}) + failed.close()
    chunks = chunks_of(out.decode())
    assert [c if c == "[DONE]" else c["type"] for c in chunks] == [
        "start-step", "text-start", "text-delta", "error",
        "text-end", "finish-step", "error", "finish", "[DONE]",
    ]  # fmt: skip
    assert chunks[3]["errorText"].startswith("lagged: 3 events")
    assert chunks[6]["errorText"] == "model_error: 500"
    assert chunks[7]["finishReason"] == "error"
    cancelled = UIMessageEncoder("m")
    out = cancelled.encode({"type": "run_ended", "error": "cancelled", "cancelled": True})
    chunks = chunks_of((out + cancelled.close()).decode())
    assert [c if c == "[DONE]" else c["type"] for c in chunks] == ["abort", "finish", "[DONE]"]
    assert chunks[1]["finishReason"] == "other"
    cut = UIMessageEncoder("m")  # a stream that never saw the run's end still finishes
    chunks = chunks_of(cut.close().decode())
    assert [c if c == "[DONE]" else c["type"] for c in chunks] == ["error", "finish", "[DONE]"]


async def test_chat_and_agui_runs_count_in_the_relays_metrics(client):
    for _ in range(2):
        assert (await client.post("/api/chat", json=chat_body(chat_id(), "hi"))).status_code == 200
    message = {"id": "u1", "role": "user", "content": "hi"}
    given = {"threadId": "t1", "runId": "r1", "messages": [message], "tools": [], "context": []}
    agui = await client.post("/agui", json=given)
    assert agui.status_code == 200 and '"RUN_FINISHED"' in agui.text
    text = (await client.get("/metrics")).text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    # the demo: 3 rounds per run, each ended normally
    assert samples['tool_rounds_total{ended="normal",provider="openai_chat"}'] == 9
    assert any(k.startswith("tool_execute_seconds_count") and v == 9 for k, v in samples.items())


async def test_the_browser_sees_previews_and_inputs_as_the_policy_shows_them(client):
    response = await client.post("/api/chat", json=chat_body("red", "go", model="redacted"))
    assert response.status_code == 200
    assert SECRET not in response.text and "PRIVATE BODY" not in response.text
    chunks = [c for c in chunks_of(response.text) if c != "[DONE]"]
    inputs = {c["toolCallId"]: c["input"] for c in chunks if c["type"] == "tool-input-available"}
    assert inputs["call_write"] == {"path": "notes.txt"}  # write_file shows its path only
    assert inputs["call_secret"]["city"] != SECRET
    assert "redacted" in inputs["call_secret"]["city"]


async def test_the_guard_and_the_session_limits_cover_the_chat_endpoints(relay, client):
    cross = await client.post(
        "/api/chat", json=chat_body("g", "hi"), headers={"origin": "http://evil.example"}
    )
    assert cross.status_code == 403
    bad_host = await client.post("/api/chat", json=chat_body("g", "hi"), headers={"host": "evil"})
    assert bad_host.status_code == 400
    assert (await client.get("/api/chat/g/stream")).status_code == 204


async def test_serve_takes_the_chat_bound_from_flag_and_environment(monkeypatch):
    def second_answer(*args: str) -> int:
        with serving("--ledger", "none", *args) as url:
            with httpx.Client(base_url=url, timeout=30) as client:
                first = client.post("/api/chat", json=chat_body("b", "hi"))
                assert first.status_code == 200
                return client.post("/api/chat", json=chat_body("b", "again")).status_code

    assert await asyncio.to_thread(second_answer) == 200
    assert await asyncio.to_thread(second_answer, "--max-chat-messages", "2") == 409
    monkeypatch.setenv("TOOLLATCH_RELAY__MAX_CHAT_MESSAGES", "2")
    assert await asyncio.to_thread(second_answer) == 409


async def test_chats_without_a_ledger_keep_the_newest_histories_only():
    store = BoundedMemoryHistory(keep=2)
    for run in ("a", "b", "c"):
        assert await store.append(run, [{"n": run}], at=0) == 1
    assert await store.load("a") == []  # the oldest is forgotten
    assert await store.load("c") == [{"n": "c"}]
    with pytest.raises(HistoryConflict):
        await store.append("c", [{"n": 2}], at=0)
    assert await store.append("b", [{"n": 2}], at=1) == 2  # a write makes it the newest
    await store.append("d", [{}], at=0)
    assert await store.load("b") == [{"n": "b"}, {"n": 2}] and await store.load("c") == []


def test_an_id_reused_in_a_later_round_is_a_new_part():
    encoder = UIMessageEncoder("m")
    chunks: list[Any] = []
    for _ in range(2):
        for event in (
            {"type": "call_opened", "id": "call_0", "name": "get_weather"},
            {"type": "call_committed", "id": "call_0", "name": "get_weather", "arguments": {}},
            {"type": "tool_finished", "id": "call_0", "is_error": False, "result": "{}"},
            {"type": "round_ended", "round": 1, "ended": "normal", "stop_reason": "stop"},
        ):
            chunks += chunks_of(encoder.encode(event).decode())
    types = [c["type"] for c in chunks]
    assert types.count("tool-input-start") == types.count("tool-output-available") == 2


async def test_chat_streams_count_against_the_sessions_readers():
    limits = RelayLimits(max_session_readers=1)
    async with RelayServer(scripts=SCRIPTS, delay_scale=0.3, limits=limits) as relay:
        headers = {"x-toollatch-session": secrets.token_urlsafe(32)}
        async with httpx.AsyncClient(base_url=relay.url, timeout=20, headers=headers) as client:
            body = chat_body("r1", "hi", model="slow")
            async with client.stream("POST", "/api/chat", json=body) as first:
                assert first.status_code == 200
                second = await client.post("/api/chat", json=chat_body("r2", "hi", model="slow"))
                assert second.status_code == 429
                assert second.json()["error"]["code"] == "too_many_readers"
                assert (
                    await relay.relay.chats.latest_run(headers["x-toollatch-session"], "r2") is None
                )
                await first.aread()
            again = await client.post("/api/chat", json=chat_body("r2", "hi", model="tools"))
            assert again.status_code == 200  # the slot came back when the stream ended


def test_a_question_gives_the_person_the_full_input_the_preview_policy_hid():
    """``write_file``'s committed input shows its path only (the default policy); its
    ``approval_requested`` carries the whole arguments, given again as the part's input
    before ``tool-approval-request``; a call shown whole is not sent twice."""
    full = {"path": "a.md", "content": "x" * 600}
    encoder = UIMessageEncoder("m")
    chunks: list[Any] = []
    for call_id, shown in (("call_w", {"path": "a.md"}), ("call_v", full)):
        name = "write_file"
        for event in (
            {"type": "call_committed", "id": call_id, "name": name, "arguments": shown},
            {"type": "approval_requested", "id": call_id, "name": name, "arguments": full,
             "token": f"t-{call_id}"},
        ):  # fmt: skip
            chunks += chunks_of(encoder.encode(event).decode())
    inputs = [(c["toolCallId"], c["input"]) for c in chunks if c["type"] == "tool-input-available"]
    assert inputs == [("call_w", {"path": "a.md"}), ("call_w", full), ("call_v", full)]
    asked = [(c["toolCallId"], c["approvalId"]) for c in chunks if "approvalId" in c]
    assert asked == [("call_w", "t-call_w"), ("call_v", "t-call_v")]
