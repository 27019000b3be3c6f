"""The relay's HTTP API over real loopback HTTP: the events are the agent's, resume by
Last-Event-ID is exact, sessions are isolated, runs are bounded, bad input gets 4xx."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopback_http import gzipping, json_reply, loopback
from relay_helpers import (
    cancel,
    chatty_script,
    parse_sse,
    read_events,
    served_run,
    serving,
    slow_script,
    start_run,
)
from toollatch import Agent, ConfigError, RelayLimits, model_client
from toollatch.relay import RelayServer
from toollatch.relay._http import model_http
from toollatch.runtime import example_tools
from toollatch.scripted import Call, Script, ScriptedServer, Text, Turn

SCRIPTS = {"slow": slow_script(), "chatty": chatty_script(3000)}


@pytest.fixture
async def relay():
    async with RelayServer(scripts=SCRIPTS, delay_scale=0.2) as server:
        yield server


@pytest.fixture
async def client(relay):
    async with httpx.AsyncClient(base_url=relay.url, timeout=20) as c:
        yield c


async def reference_events(tmp_path: Path) -> list[dict]:
    """The demo run's agent events, straight from the Agent (what `toollatch run --json` prints)."""
    async with ScriptedServer(delay_scale=0) as scripted:
        client = model_client(
            "openai_chat", model="scripted", base_url=scripted.base_url("openai_chat")
        )
        async with client:
            agent = Agent(client, example_tools(tmp_path))
            return [e.to_json() async for e in agent.run("hi")]


async def test_events_are_the_agent_events_with_ids_in_order(client, tmp_path):
    run = await start_run(client)
    assert run["events_url"] == f"/runs/{run['id']}/events"
    frames = await read_events(client, run["events_url"])
    assert [f.id for f in frames] == list(range(1, len(frames) + 1))
    assert all(f.event == f.data["type"] for f in frames)
    relayed = [f.data for f in frames if f.event != "call_preview"]
    expected = await reference_events(tmp_path)
    for event in expected:  # what the relay's redaction changes, and nothing else
        if event["type"] == "run_ended":
            event["history_omitted"], event["history"] = len(event["history"]), []
        elif event["type"] == "call_committed" and event["name"] == "write_file":
            event["arguments"] = {"path": event["arguments"]["path"]}  # content left out
        elif event["type"] == "tool_finished" and event["name"] == "write_file":
            # its UI payload instead of the model-facing text (RelayLimits.result_text)
            event["ui"] = {"kind": "file_written", "path": "notes/weather.md", "bytes": 84}
            event["result"] = None
    # tools and the stream race (eager calls), so only the order within a kind is fixed
    for kind in (
        "text",
        "call_opened",
        "call_committed",
        "tool_started",
        "tool_finished",
        "round_ended",
        "run_ended",
    ):
        assert [e for e in relayed if e["type"] == kind] == [
            e for e in expected if e["type"] == kind
        ], kind
    assert len(relayed) == len(expected)
    previews = [f.data for f in frames if f.event == "call_preview"]
    assert {p["id"] for p in previews} == {
        "call_demo_weather_oslo",
        "call_demo_weather_zurich",
        "call_demo_write_notes",
    }


async def test_a_finished_run_answers_204_after_its_last_event(client):
    run = await start_run(client)
    frames = await read_events(client, run["events_url"])
    last = frames[-1].id
    response = await client.get(run["events_url"], headers={"last-event-id": str(last)})
    assert response.status_code == 204
    replay = await read_events(client, run["events_url"], last_id=last - 3)
    assert [f.id for f in replay] == [last - 2, last - 1, last]
    query = await client.get(run["events_url"] + f"?after={last - 1}")
    assert [f.id for f in parse_sse(query.text)[0]] == [last]


async def test_resume_mid_run_by_last_event_id_is_exact(client):
    run = await start_run(client, model="slow")
    pieces = []
    last = None
    while True:
        part = await read_events(client, run["events_url"], last_id=last, limit=7)
        pieces += part
        if not part or part[-1].event == "run_ended":
            break
        last = part[-1].id
    whole = await read_events(client, run["events_url"])
    assert [f.id for f in pieces] == [f.id for f in whole]
    assert [f.data for f in pieces] == [f.data for f in whole]
    assert whole[-1].event == "run_ended" and len(whole) > 3 * 7  # several reconnects


@pytest.mark.parametrize("bad", ["abc", "-1", "99999", "1" * 13])
async def test_a_bad_last_event_id_is_400(client, bad):
    run = await start_run(client)
    response = await client.get(run["events_url"], headers={"last-event-id": bad})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_last_event_id"


async def test_another_session_gets_404_for_events_and_cancel(relay, client):
    run = await start_run(client, model="slow")
    async with httpx.AsyncClient(base_url=relay.url) as other:
        page = await other.get("/")
        assert page.status_code == 200 and "toollatch_session" in page.cookies
        for method, url in (("GET", run["events_url"]), ("POST", run["cancel_url"])):
            response = await other.request(method, url, json={} if method == "POST" else None)
            assert response.status_code == 404, (method, response.text)
            assert response.json()["error"]["code"] == "not_found"
        anonymous = httpx.AsyncClient(base_url=relay.url)
        async with anonymous:
            assert (await anonymous.get(run["events_url"])).status_code == 404
        wrong = await other.get(run["events_url"].replace(run["id"], run["id"][:-1] + "x"))
        assert wrong.status_code == 404
    frames = await read_events(client, run["events_url"])  # the owner still reads it all
    assert frames[-1].event == "run_ended" and frames[-1].data["error"] is None
    assert all(not c["is_error"] for c in frames[-1].data["calls"])


async def test_the_cookie_session_owns_the_run(relay):
    async with httpx.AsyncClient(base_url=relay.url) as browser:
        await browser.get("/")
        response = await browser.post("/runs", json={"message": "hi"})
        assert response.status_code == 201
        assert "session" not in response.json()  # the cookie's token stays in the cookie
        frames = await read_events(browser, response.json()["events_url"])
        assert frames[-1].event == "run_ended"


async def test_cancel_mid_stream_pairs_every_call(client):
    run = await start_run(client, model="slow")
    head = await read_events(client, run["events_url"], limit=12)
    assert any(f.event == "call_preview" for f in head)
    response = await cancel(client, run["cancel_url"])
    assert response.status_code == 202 and response.json()["cancelled"] is True
    frames = await read_events(client, run["events_url"])
    types = [f.event for f in frames]
    assert "round_ended" in types and types[-1] == "run_ended"
    rounds = [f.data for f in frames if f.event == "round_ended"]
    assert rounds[-1]["ended"] == "cancelled"
    calls = frames[-1].data["calls"]
    assert {c["id"] for c in calls} == {"call_slow_a", "call_slow_b"}
    assert any(c["error"] == "cancelled" for c in calls)  # still streaming at the cancel
    assert all(not c["is_error"] or c["error"] == "cancelled" for c in calls)
    opened = {f.data["id"] for f in frames if f.event in ("call_opened", "call_preview")}
    failed = {f.data["id"] for f in frames if f.event == "call_failed"}
    finished = {f.data["id"] for f in frames if f.event == "tool_finished"}
    assert opened <= failed | finished  # every call the page showed got its result
    again = await cancel(client, run["cancel_url"])
    assert again.json()["cancelled"] is False


BIG = 8 << 20
"""Text of a run that a stalled reader cannot absorb: more than the loopback socket buffers
(Linux's tcp_wmem maximum is 4 MiB; the reader's receive buffer is set to 4 KiB)."""


async def test_a_stalled_reader_does_not_stall_the_run():
    scripts = {"big": chatty_script(BIG, chunk_chars=4096)}
    limits = RelayLimits(max_kept_bytes=4 * BIG)  # all kept: nothing may be lost
    async with RelayServer(scripts=scripts, delay_scale=0, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=60) as client:
            run = await start_run(client, model="big")
            cookie = client.headers["x-toollatch-session"]
            port = int(relay.url.rsplit(":", 1)[1])
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            head = (
                f"GET {run['events_url']} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"X-Toollatch-Session: {cookie}"
            )
            sock.sendall(f"{head}\r\n\r\n".encode())  # and read nothing for now
            try:
                await _stalled_reader_checks(relay, client, run, cookie, sock)
            finally:
                sock.close()


async def _stalled_reader_checks(relay, client, run, cookie, sock) -> None:
    started = time.monotonic()
    stored = relay.relay.runs.owned(run["id"], cookie)
    while not stored.done:
        assert time.monotonic() - started < 60, "the run waited for a stalled reader"
        await asyncio.sleep(0.05)
    frames = await read_events(client, run["events_url"])  # another reader is served
    assert frames[-1].event == "run_ended"
    assert sum(len(f.data["text"]) for f in frames if f.event == "text") == BIG
    # the stalled reader then reads: it gets every event, none lost while it stalled
    sock.setblocking(False)
    received = bytearray()
    deadline = time.monotonic() + 60
    while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end
        assert time.monotonic() < deadline
        try:
            part = await asyncio.get_running_loop().sock_recv(sock, 1 << 20)
        except BlockingIOError:
            continue
        assert part
        received += part
    body = received.split(b"\r\n\r\n", 1)[1]
    assert body.count(b"event: text") == len([f for f in frames if f.event == "text"])
    assert body.count(b"event: run_ended") == 1


async def test_heartbeats_while_nothing_happens():
    script = slow_script(delay_ms=400)
    async with RelayServer(scripts={"slow": script}, limits=RelayLimits(heartbeat_s=0.05)) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
            run = await start_run(client, model="slow")
            seen = ""
            async with client.stream("GET", run["events_url"]) as response:
                async for text in response.aiter_text():
                    seen += text
                    if ": heartbeat" in seen:
                        break
            assert parse_sse(seen)[1][0] == ": heartbeat"
            await cancel(client, run["cancel_url"])


async def test_runs_in_flight_are_bounded_with_429():
    limits = RelayLimits(max_active_runs=1, max_stored_runs=2)
    async with RelayServer(scripts=SCRIPTS, delay_scale=0.2, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
            first = await start_run(client, model="slow")
            other = {"x-toollatch-session": "o" * 43}  # another session: the global bound
            response = await client.post("/runs", json={"message": "again"}, headers=other)
            assert response.status_code == 429
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["code"] == "too_many_runs"
            await read_events(client, first["events_url"])
            for _ in range(3):  # finished runs make room; the oldest is forgotten
                later = await start_run(client)
                await read_events(client, later["events_url"])
            assert (await client.get(first["events_url"])).status_code == 404


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"{not json", {"content-type": "application/json"}, 400, "invalid_json"),
        (b"[1, 2]", {"content-type": "application/json"}, 422, "invalid_body"),
        (b"{}", {"content-type": "application/json"}, 422, "invalid_body"),
        (b'{"message": ""}', {"content-type": "application/json"}, 422, "invalid_body"),
        (b'{"message": 3}', {"content-type": "application/json"}, 422, "invalid_body"),
        (b'{"message": "hi", "x": 1}', {"content-type": "application/json"}, 422, "invalid_body"),
        (
            b'{"message": "hi", "provider": "nope"}',
            {"content-type": "application/json"},
            422,
            "invalid_body",
        ),
        (
            b'{"message": "hi", "model": ""}',
            {"content-type": "application/json"},
            422,
            "invalid_body",
        ),
        (b'{"message": "hi"}', {"content-type": "text/plain"}, 415, "unsupported_media_type"),
        (
            b'{"message": "' + b"a" * 70_000 + b'"}',
            {"content-type": "application/json"},
            413,
            "body_too_large",
        ),
        (
            b'{"message": "' + b"a" * 20_000 + b'"}',
            {"content-type": "application/json"},
            422,
            "message_too_long",
        ),
    ],
)
async def test_bad_input_is_4xx_with_a_message(client, body, headers, status, code):
    response = await client.post("/runs", content=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


async def test_an_oversize_chunked_body_is_413(client):
    async def chunks():
        for _ in range(100):
            yield b"a" * 1000

    response = await client.post(
        "/runs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


async def test_another_provider_plays_the_same_run(client):
    run = await start_run(client, provider="anthropic")
    frames = await read_events(client, run["events_url"])
    assert frames[-1].data["error"] is None and frames[-1].data["rounds"] == 3


async def test_a_model_the_server_does_not_know_ends_the_run_with_an_error():
    models = ("scripted", "no-such-model")  # allowed here, unknown to the model server
    async with RelayServer(delay_scale=0, models=models) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
            run = await start_run(client, model="no-such-model")
            frames = await read_events(client, run["events_url"])
    assert frames[-1].event == "run_ended" and frames[-1].data["error"]


async def test_a_run_reaching_its_event_limit_is_cancelled():
    limits = RelayLimits(max_run_events=50)
    async with RelayServer(scripts=SCRIPTS, delay_scale=0, limits=limits) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
            run = await start_run(client, model="chatty")
            frames = await read_events(client, run["events_url"])
            assert 50 <= len(frames) < 60
            assert frames[-1].event == "run_ended"
            assert [f.data["ended"] for f in frames if f.event == "round_ended"] == ["cancelled"]


def _served_limited(*args: str) -> list[Any]:
    """The frames of one run on ``toollatch serve *args``."""
    with serving("--ledger", "none", *args) as url:
        return served_run(url, "weather in Oslo and Zurich, saved to a file")[1]


@pytest.mark.parametrize("how", ["flag", "config", "env"])
async def test_serve_bounds_the_events_of_a_run(how, tmp_path, monkeypatch):
    """``--max-run-events`` / ``relay.max_run_events`` / ``TOOLLATCH_RELAY__MAX_RUN_EVENTS``
    reach the relay: the run is cancelled at 6 events, and past them only the events that
    pair its calls and end it come (the opened call still gets its ``cancelled`` result)."""
    config = tmp_path / "toollatch.yaml"
    config.write_text("relay: {max_run_events: 6}\n")
    args = {"flag": ("--max-run-events", "6"), "config": ("--config", str(config)), "env": ()}
    if how == "env":
        monkeypatch.setenv("TOOLLATCH_RELAY__MAX_RUN_EVENTS", "6")
    frames = await asyncio.to_thread(_served_limited, *args[how])
    assert frames[-1].event == "run_ended" and frames[-1].data["error"] is None
    assert [f.data["ended"] for f in frames if f.event == "round_ended"] == ["cancelled"]
    past = [f.event for f in frames[6:]]
    assert past and set(past) <= {"call_failed", "tool_finished", "round_ended", "run_ended"}
    # (how many text events come first depends on how the stream's reads fell: a call may
    # or may not have opened by the 6th event, but one that did is paired)
    opened = {f.data["id"] for f in frames if f.event == "call_opened"}
    paired = {f.data["id"] for f in frames if f.event in ("tool_finished", "call_failed")}
    assert opened <= paired and len(frames) < 12


async def test_the_page_and_its_assets_are_served(client):
    page = await client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "/static/app.js" in page.text and "http" not in page.text.replace("http-equiv", "")
    for name, kind in (("app.js", "javascript"), ("app.css", "css")):
        asset = await client.get(f"/static/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
    assert (await client.get("/static/index.html")).status_code == 404
    assert (await client.get("/static/../_app.py")).status_code == 404


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_active_runs": 0},
        {"heartbeat_s": 0},
        {"heartbeat_s": float("nan")},
        {"max_body_bytes": True},
        {"max_active_runs": 5, "max_stored_runs": 2},
    ],
)
def test_bad_limits_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        RelayLimits(**kwargs)


def test_bad_server_settings_are_config_errors():
    for kwargs in ({"port": 70000}, {"provider": "nope"}, {"base_url": "http://x"}):
        with pytest.raises(ConfigError):
            RelayServer(**kwargs)


async def test_metrics_are_served_after_runs(relay, client):
    run = await start_run(client, "weather?")
    await read_events(client, run["events_url"])
    text = (await client.get("/metrics")).text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['tool_rounds_total{ended="normal",provider="openai_chat"}'] >= 2
    assert samples['tool_execute_rejected_not_committed_total{provider="openai_chat"}'] == 0
    assert any(k.startswith("tool_execute_seconds_count") and v >= 3 for k, v in samples.items())


async def test_arguments_orjson_cannot_encode_still_reach_the_page():
    big = 123456789012345678901234567890  # valid JSON, beyond 64 bits
    call = Call(call_id="call_big", name="add", arguments=f'{{"a": {big}, "b": 1}}')
    script = Script(turns=(Turn(items=(call,)), Turn(items=(Text(text="Sum done."),))))
    async with RelayServer(scripts={"big": script}, delay_scale=0) as relay:
        async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
            run = await start_run(client, model="big")
            frames = await read_events(client, run["events_url"])
    committed = [f.data for f in frames if f.event == "call_committed"]
    assert committed[0]["arguments"] == {"a": big, "b": 1}
    assert frames[-1].event == "run_ended"
    assert frames[-1].data["error"] is None
    assert [c["is_error"] for c in frames[-1].data["calls"]] == [False]


def _cookie_once(app: Any) -> Any:
    """``app`` whose first answer sets a cookie."""
    answered: list[bool] = []

    async def reply(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start" and not answered:
                answered.append(True)
                cookie = (b"set-cookie", b"tenant=alice; Path=/")
                message = {**message, "headers": [*message["headers"], cookie]}
            await send(message)

        await app(scope, receive, sending)

    return reply


async def _runs_on(base_url: str, runs: int) -> list[dict[str, Any]]:
    """The run_ended event of ``runs`` runs, one after the other, each in a session of its
    own, on a relay whose model server is at ``base_url`` (model ``m``)."""
    ended = []
    async with RelayServer(base_url=base_url, model="m") as relay:
        for _ in range(runs):
            async with httpx.AsyncClient(base_url=relay.url, timeout=20) as client:
                run = await start_run(client, model="m")
                ended.append((await read_events(client, run["events_url"]))[-1].data)
    return ended


TEXT_ONLY = {"m": Script(turns=(Turn(items=(Text(text="Hello."),)),))}


async def test_a_cookie_the_model_server_set_for_one_run_never_goes_with_anothers_request():
    # every run's model client shares the relay's httpx client: aiohttp's jar (the transport)
    # kept a Set-Cookie from a host name (never from an IP address), and httpx's from any
    # host, and each later run's model request carried it
    scripted = ScriptedServer(TEXT_ONLY, delay_scale=0)  # (its app, served below)
    async with loopback(_cookie_once(scripted.app)) as lb:
        ended = await _runs_on(lb.url.replace("127.0.0.1", "localhost") + "/v1", 2)
    assert [e["error"] for e in ended] == [None, None]
    first, second = scripted.requests
    assert "cookie" not in first.headers and "cookie" not in second.headers


async def test_a_model_server_that_gzips_its_stream_plays_the_run():
    # the model clients accept gzip and inflate the body themselves, in bounded pieces
    # (aiohttp's transport hands httpx the body as sent: its own decompression is off)
    scripted = ScriptedServer(TEXT_ONLY, delay_scale=0)
    async with loopback(gzipping(scripted.app)) as lb:
        [ended] = await _runs_on(lb.url + "/v1", 1)
    assert ended["error"] is None
    assert scripted.requests[0].headers["accept-encoding"] == "gzip, deflate"


async def test_a_request_body_over_a_mib_reaches_the_model_server_whole():
    # aiohttp warns ResourceWarning of a raw body over 1 MiB (an error under -W error, as in
    # this suite): such a body now goes in pieces, its Content-Length kept; a body that is a
    # stream already goes as it is (chunked)
    big = bytes(range(256)) * (5 << 12)  # (5 MiB)

    async def streamed() -> Any:
        yield big[:7]
        yield big[7:]

    async with loopback() as lb:
        lb.replies += [json_reply(200, {})] * 3
        async with model_http(4) as http:
            for content in (big, b"small", streamed()):
                answer = await http.post(lb.url, content=content)
                assert answer.status_code == 200
    assert [s.body for s in lb.seen] == [big, b"small", big]
    assert [s.headers.get("content-length") for s in lb.seen] == [str(len(big)), "5", None]
    assert lb.seen[2].headers["transfer-encoding"] == "chunked"
